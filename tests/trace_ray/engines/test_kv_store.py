"""The slot store: rows keep their own keys and values through growth, leaving rows and sharing a prompt."""

import torch

from trace_ray.engines.kv_store import ROOM, SlotStore


def own(tokens: int, start: float) -> torch.Tensor:
    """[layers=2, 2, kv_heads=1, tokens, head_dim=3] with distinct values from ``start``."""
    return torch.arange(start, start + 2 * 2 * tokens * 3).view(2, 2, 1, tokens, 3)


def test_rows_keep_their_tokens_when_the_store_grows_and_when_rows_leave():
    store = SlotStore(layers=2, kv_heads=1, head_dim=3, dtype=torch.float32, device=torch.device("cpu"))
    first = store.add(own=own(5, 0))
    second = store.add(own=own(ROOM + 20, 1000))  # more than the first allocation holds
    third = store.add(own=own(2, 5000))
    assert (first, second, third) == (0, 1, 2) and store.lengths == [5, ROOM + 20, 2]
    assert torch.equal(store.take(0).own, own(5, 0)) and torch.equal(store.take(1).own, own(ROOM + 20, 1000))
    store.reserve([0, 0, 10 * ROOM])
    assert store.kv.shape[4] >= 2 + 10 * ROOM and torch.equal(store.take(2).own, own(2, 5000))
    assert store.keep([0, 2]) == [0, 2]
    assert store.lengths == [5, 2] and torch.equal(store.take(1).own, own(2, 5000))
    assert torch.equal(store.take(0, 3).own, own(5, 0)[:, :, :, :3])
    store.add(own=own(3, 9000))
    assert store.keep([1, 2]) == [2, 1]  # the first slot takes the last row: one row copied, not two
    assert store.lengths == [3, 2] and torch.equal(store.take(0).own, own(3, 9000))
    assert torch.equal(store.take(1).own, own(2, 5000))


def test_a_shared_prompt_becomes_a_prefix_and_the_row_keeps_what_follows_it():
    store = SlotStore(layers=2, kv_heads=1, head_dim=3, dtype=torch.float32, device=torch.device("cpu"))
    store.add(own=own(6, 0))
    prefix = store.share(0, (1, 2, 3, 4))
    assert prefix.tokens == (1, 2, 3, 4) and torch.equal(prefix.kv, own(6, 0)[:, :, :, :4])
    assert store.prefixes == [prefix] and store.lengths == [2] and store.position(0) == 6
    assert torch.equal(store.take(0).own, own(6, 0)[:, :, :, 4:])
    kept = store.take(0)
    assert kept.prefix is prefix and kept.length == 6


def test_the_first_tokens_of_a_prefix_are_a_prefix_of_their_own_copied_not_shared():
    store = SlotStore(layers=2, kv_heads=1, head_dim=3, dtype=torch.float32, device=torch.device("cpu"))
    store.add(own=own(4, 0))
    prefix = store.share(0, (1, 2, 3))
    start = prefix.first(2)
    assert start.tokens == (1, 2) and torch.equal(start.kv, prefix.kv[:, :, :, :2])
    start.kv.zero_()
    assert prefix.kv.abs().sum() > 0  # a copy


def test_a_row_moved_onto_a_shorter_start_of_its_prefix_keeps_every_token_in_order():
    store = SlotStore(layers=2, kv_heads=1, head_dim=3, dtype=torch.float32, device=torch.device("cpu"))
    store.add(own=own(7, 0))
    longer = store.share(0, (1, 2, 3, 4, 5))
    shorter = longer.first(3)
    store.rebase(0, shorter)
    assert store.prefixes == [shorter] and store.lengths == [4] and store.position(0) == 7
    assert torch.equal(store.take(0).own, own(7, 0)[:, :, :, 3:])  # the old prefix's last two, then its own two

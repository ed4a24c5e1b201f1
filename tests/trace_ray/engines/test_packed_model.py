"""The packed forward against the model's own forward: the same logits for rows that share a prefix (whole or in
part), have none, prefill, decode, verify several tokens, leave the batch, and mix LoRA adapters."""

import pytest
import torch

from environments.errors import TraceRayError
from tests.trace_ray.routing.test_adapters import random_adapter
from trace_ray.engines.packed_model import PackedModel, Step, check_supported


def reference_logits(network, sequence: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return network(torch.tensor([sequence])).logits[0]


def random_tokens(generator: torch.Generator, count: int) -> list[int]:
    return torch.randint(10, 1000, (count,), generator=generator).tolist()


def test_rows_with_a_prefix_a_copied_part_of_it_or_none_get_the_models_own_logits(tiny_model):
    network, _ = tiny_model
    generator = torch.Generator().manual_seed(0)
    packed = PackedModel(network)
    store = packed.new_store()
    prefix_tokens = random_tokens(generator, 40)
    store.add()
    logits = packed.forward(store, Step([prefix_tokens], [True]))
    assert torch.allclose(logits, reference_logits(network, prefix_tokens), atol=1e-5)
    store.grow(0, len(prefix_tokens))
    prefix = store.share(0, tuple(prefix_tokens))
    assert store.lengths == [0] and store.prefixes == [prefix]
    store.keep([])
    sequences = [prefix_tokens + random_tokens(generator, 7), prefix_tokens[:30] + random_tokens(generator, 12)]
    sequences.append(random_tokens(generator, 9))
    for start in (prefix, prefix.first(30), None):  # the first 30 tokens' keys and values copied, not recomputed
        store.add(start)
    logits = packed.forward(store, Step([sequences[0][40:], sequences[1][30:], sequences[2]], [True, False, True]))
    assert torch.allclose(logits[:7], reference_logits(network, sequences[0])[40:], atol=1e-5)
    assert torch.allclose(logits[7], reference_logits(network, sequences[1])[-1], atol=1e-5)  # its last token only
    assert torch.allclose(logits[8:], reference_logits(network, sequences[2]), atol=1e-5)
    for row, count in enumerate((7, 12, 9)):
        store.grow(row, count)
    for widths in ([1, 1, 1], [1, 3, 1], [2, 2, 2], [1, 1, 1]):  # one group; three groups; several tokens each
        new = [random_tokens(generator, width) for width in widths]
        logits = packed.forward(store, Step(new, [True] * 3))
        start = 0
        for row, tokens in enumerate(new):
            sequences[row] += tokens
            expected = reference_logits(network, sequences[row])[-len(tokens) :]
            assert torch.allclose(logits[start : start + len(tokens)], expected, atol=1e-5), (widths, row)
            start += len(tokens)
            store.grow(row, len(tokens))
    assert store.keep([0, 2]) == [0, 2]  # the middle row leaves; the last takes its slot
    logits = packed.forward(store, Step([[5], [6]], [False, False]))
    assert torch.allclose(logits[0], reference_logits(network, sequences[0] + [5])[-1], atol=1e-5)
    assert torch.allclose(logits[1], reference_logits(network, sequences[2] + [6])[-1], atol=1e-5)


def test_unkept_tokens_are_overwritten_by_the_next_step(tiny_model):
    """A drafted token greedy decoding rejects was written but not kept: the next step's token takes its column."""
    network, _ = tiny_model
    packed = PackedModel(network)
    store = packed.new_store()
    store.add()
    packed.forward(store, Step([[11, 12, 13, 14]], [True]))
    store.grow(0, 2)  # keeps 11, 12; 13 and 14 were rejected
    logits = packed.forward(store, Step([[20]], [False]))
    assert torch.allclose(logits[0], reference_logits(network, [11, 12, 20])[-1], atol=1e-5)


def test_a_batch_that_mixes_adapters_gets_each_rows_adapter():
    _, peft_model = random_adapter(1)  # a tiny model of its own with a non-zero adapter "trained"
    peft_model.eval()
    packed = PackedModel(peft_model.base_model.model)
    generator = torch.Generator().manual_seed(1)
    sequences = [random_tokens(generator, 6), random_tokens(generator, 6)]
    store = packed.new_store()
    store.add()
    store.add()
    mixed = packed.forward(store, Step(sequences, [True, True]), ["trained", "__base__"])
    with torch.no_grad():
        adapted = peft_model(torch.tensor([sequences[0]])).logits[0]
        with peft_model.disable_adapter():
            plain = peft_model(torch.tensor([sequences[1]])).logits[0]
            unadapted = peft_model(torch.tensor([sequences[0]])).logits[0]
    assert not torch.allclose(adapted, unadapted, atol=1e-3)  # the adapter changes the model
    assert torch.allclose(mixed[:6], adapted, atol=1e-5) and torch.allclose(mixed[6:], plain, atol=1e-5)


def test_models_outside_the_llama_family_are_refused_in_one_line():
    from transformers import GPT2Config, Qwen2Config

    with pytest.raises(TraceRayError, match="engine=hf runs decoder models of the Llama family.*not gpt2.*engine=vllm"):
        check_supported(GPT2Config())
    with pytest.raises(TraceRayError, match="sliding-window"):
        check_supported(Qwen2Config(use_sliding_window=True, sliding_window=64))
    check_supported(Qwen2Config(use_sliding_window=False))


def test_rows_of_two_prefixes_in_one_batch_each_read_their_own(tiny_model):
    """Rows that start with different prefixes (another adapter's, another prompt's) step together, each merged
    with its own prefix only."""
    network, _ = tiny_model
    generator = torch.Generator().manual_seed(2)
    packed = PackedModel(network)
    prefixes = []
    for length in (36, 44):
        tokens = random_tokens(generator, length)
        store = packed.new_store()
        store.add()
        packed.forward(store, Step([tokens], [False]))
        store.grow(0, length)
        prefixes.append(store.share(0, tuple(tokens)))
    store = packed.new_store()
    starts = [prefixes[0], prefixes[1], None, prefixes[0]]
    sequences = [list(prefix.tokens) if prefix else [] for prefix in starts]
    for prefix in starts:
        store.add(prefix)
    new = [random_tokens(generator, 3) for _ in starts]
    packed.forward(store, Step(new, [False] * 4))
    for row, tokens in enumerate(new):
        sequences[row] += tokens
        store.grow(row, 3)
    logits = packed.forward(store, Step([[7]] * 4, [False] * 4))  # one group of four rows and two prefixes
    for row, sequence in enumerate(sequences):
        assert torch.allclose(logits[row], reference_logits(network, sequence + [7])[-1], atol=1e-5), row

"""Where the transformers engine keeps keys and values: shared prefixes once, each row's own tokens in a slot.

Agent prompts share a long prefix (policy, tool list, worked example: ~750
of SmolLM2's ~800 first-turn tokens). A :class:`SharedPrefix` holds the
keys and values of such a prefix once, for every row that starts with it;
a row's own tokens (the rest of its prompt, its replies, the environment's
answers) live in a slot of the :class:`SlotStore`, one buffer for all rows
with spare columns, so a decode step writes in place and a row joining or
leaving the batch copies only its own tokens. Attention reads each prefix
once for all its rows (:func:`attend`) instead of once per row.

Layouts: a prefix is ``[layers, 2, kv_heads, length, head_dim]`` (keys,
then values); the store is ``[layers, 2, slots, kv_heads, capacity,
head_dim]``, row ``i`` of the batch in slot ``i``, its own tokens in the
first ``lengths[i]`` columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ROOM = 64  # spare columns a slot gets at least when the store grows (it grows by half its columns or more)


@dataclass(eq=False)
class SharedPrefix:
    """Tokens a row starts with, all of them (a row never uses part of a prefix), and their keys and values."""

    tokens: tuple[int, ...]
    kv: torch.Tensor  # [layers, 2, kv_heads, len(tokens), head_dim]

    def first(self, count: int) -> SharedPrefix:
        """A prefix of this one's first ``count`` tokens (its keys and values copied: nothing recomputed)."""
        return SharedPrefix(self.tokens[:count], self.kv[:, :, :, :count].clone())


def prefix_length(prefix: SharedPrefix | None) -> int:
    return 0 if prefix is None else len(prefix.tokens)


@dataclass(eq=False)
class RowKV:
    """A row's keys and values outside the store: the prefix it starts with and its own tokens' (a finished turn)."""

    prefix: SharedPrefix | None
    own: torch.Tensor  # [layers, 2, kv_heads, own tokens, head_dim]

    @property
    def length(self) -> int:
        return prefix_length(self.prefix) + self.own.shape[3]


class SlotStore:
    """The running batch's own keys and values, row ``i`` in slot ``i`` (see the module docstring)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        self.shape = (layers, 2, kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.kv = torch.empty((layers, 2, 0, kv_heads, 0, head_dim), dtype=dtype, device=device)
        self.lengths: list[int] = []  # own tokens of each row
        self.prefixes: list[SharedPrefix | None] = []  # the prefix each row starts with

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def position(self, row: int) -> int:
        """The position of the row's next token."""
        return prefix_length(self.prefixes[row]) + self.lengths[row]

    def add(self, prefix: SharedPrefix | None = None, own: torch.Tensor | None = None) -> int:
        """A new row at the end, starting with ``prefix`` and then ``own``'s keys and values ([layers, 2, kv_heads,
        tokens, head_dim]; None: none yet); returns its index."""
        row = self.rows
        count = 0 if own is None else own.shape[3]
        self.lengths.append(0)
        self.prefixes.append(prefix)
        self.reserve([count if index == row else 0 for index in range(self.rows)])
        if count:
            self.kv[:, :, row, :, :count] = own
        self.lengths[row] = count
        return row

    def reserve(self, extra: list[int]) -> None:
        """Make room for ``extra[i]`` more tokens in row ``i`` (reallocating, with spare columns, when full)."""
        needed = max((length + more for length, more in zip(self.lengths, extra)), default=0)
        slots, capacity = self.kv.shape[2], self.kv.shape[4]
        if self.rows <= slots and needed <= capacity:
            return
        layers, _, kv_heads, head_dim = self.shape
        rows = slots if self.rows <= slots else max(self.rows, 2 * slots)
        columns = capacity if needed <= capacity else max(needed + ROOM, capacity + capacity // 2)
        grown = torch.empty((layers, 2, rows, kv_heads, columns, head_dim), dtype=self.dtype, device=self.device)
        width = max(self.lengths[:slots], default=0)
        grown[:, :, :slots, :, :width] = self.kv[:, :, :, :, :width]
        # zeros, not garbage, elsewhere: attention weighs unused columns by 0, and 0 * NaN is NaN
        grown[:, :, slots:].zero_()
        grown[:, :, :slots, :, width:].zero_()
        self.kv = grown

    def write(self, layer: int, rows: torch.Tensor, columns: torch.Tensor, keys: torch.Tensor, values: torch.Tensor):
        """Store token ``t``'s ``keys[t]``/``values[t]`` ([tokens, kv_heads, head_dim]) at row ``rows[t]``, own column
        ``columns[t]``."""
        self.kv[layer, 0, rows, :, columns] = keys
        self.kv[layer, 1, rows, :, columns] = values

    def grow(self, row: int, tokens: int) -> None:
        """The row's own part now holds ``tokens`` more tokens (written by :meth:`write`)."""
        self.lengths[row] += tokens

    def take(self, row: int, length: int | None = None) -> RowKV:
        """A copy of the row's prefix use and its first ``length`` own tokens (all: None)."""
        own = self.lengths[row] if length is None else length
        return RowKV(self.prefixes[row], self.kv[:, :, row, :, :own].clone())

    def share(self, row: int, tokens: tuple[int, ...]) -> SharedPrefix:
        """Move a row that starts with no prefix onto one made of its own first ``len(tokens)`` tokens (whose token
        ids are ``tokens``); its own part keeps the tokens after them."""
        assert self.prefixes[row] is None, "the row already starts with a shared prefix"
        count = len(tokens)
        prefix = SharedPrefix(tokens, self.kv[:, :, row, :, :count].clone())
        rest = self.lengths[row] - count
        if rest:
            self.kv[:, :, row, :, :rest] = self.kv[:, :, row, :, count : count + rest].clone()
        self.lengths[row] = rest
        self.prefixes[row] = prefix
        return prefix

    def rebase(self, row: int, prefix: SharedPrefix) -> None:
        """Move a row onto ``prefix``, a shorter start of the prefix it starts with: the tokens between the two
        prefixes' ends move to the front of its own part (their keys and values copied from its old prefix)."""
        current = self.prefixes[row]
        start = len(prefix.tokens)
        assert current is not None and current.tokens[:start] == prefix.tokens, "not a start of the row's prefix"
        extra, own = len(current.tokens) - start, self.lengths[row]
        self.reserve([extra if index == row else 0 for index in range(self.rows)])
        if own:
            self.kv[:, :, row, :, extra : extra + own] = self.kv[:, :, row, :, :own].clone()
        self.kv[:, :, row, :, :extra] = current.kv[:, :, :, start:]
        self.lengths[row] = own + extra
        self.prefixes[row] = prefix

    def keep(self, rows: list[int]) -> list[int]:
        """Keep only ``rows``; returns the kept rows in their new order (new row ``i`` was row ``order[i]``).

        A dropped row's slot takes one of the last rows, so each dropped row costs at most one row's copy; rows
        before the first dropped one stay where they are."""
        count, kept = len(rows), set(rows)
        movers = iter(sorted(row for row in kept if row >= count))
        order = [slot if slot in kept else next(movers) for slot in range(count)]
        for target, source in enumerate(order):
            if target != source:
                width = self.lengths[source]
                self.kv[:, :, target, :, :width] = self.kv[:, :, source, :, :width]
        self.lengths = [self.lengths[row] for row in order]
        self.prefixes = [self.prefixes[row] for row in order]
        return order


@dataclass
class PrefixBlock:
    """The rows of a group that start with ``prefix``: their indices within the group, and how many."""

    prefix: SharedPrefix
    rows: torch.Tensor
    count: int


@dataclass
class Group:
    """Rows ``first..first+count-1`` of the batch, each with ``width`` new tokens this step: attended together, over
    their prefixes (``prefixes``) and their own tokens (the first ``own_width`` columns of their slots; ``mask``,
    [count, 1, heads_per_kv * width, own_width], additive: each new token sees its row's own tokens up to itself)."""

    first: int
    count: int
    width: int
    own_width: int
    prefixes: list[PrefixBlock]
    mask: torch.Tensor


def plan_groups(store: SlotStore, widths: list[int], heads_per_kv: int, device: torch.device) -> list[Group]:
    """Split the batch into runs of consecutive rows with the same number of new tokens, each with its mask (row
    ``i`` writes its ``widths[i]`` new tokens after its ``store.lengths[i]`` own ones)."""
    groups, first = [], 0
    while first < len(widths):
        end = first
        while end < len(widths) and widths[end] == widths[first]:
            end += 1
        groups.append(_group(store, first, end, widths[first], heads_per_kv, device))
        first = end
    return groups


def _group(store: SlotStore, first: int, end: int, width: int, heads_per_kv: int, device: torch.device) -> Group:
    lengths = torch.tensor(store.lengths[first:end])
    own_width = int(lengths.max()) + width
    # token j of a row sees its own columns up to its own position: column c <= length + j
    allowed = torch.arange(own_width)[None, None, :] <= (lengths[:, None] + torch.arange(width)[None, :])[:, :, None]
    mask = torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf"))[:, None].expand(-1, heads_per_kv, -1, -1)
    mask = mask.reshape(end - first, 1, heads_per_kv * width, own_width)
    members: dict[int, list[int]] = {}
    prefixes: dict[int, SharedPrefix] = {}
    for index in range(end - first):
        prefix = store.prefixes[first + index]
        if prefix is not None:
            members.setdefault(id(prefix), []).append(index)
            prefixes[id(prefix)] = prefix
    blocks = [PrefixBlock(prefixes[key], torch.tensor(rows, device=device), len(rows)) for key, rows in members.items()]
    return Group(first, end - first, width, own_width, blocks, mask.to(device))


def attention_part(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(q keys^T * scaling + mask) values`` and the log of the softmax's sum, per query ([batch, heads,
    queries, head_dim] and [batch, heads, queries, 1]): one part of an attention, to merge with the others.

    On a CPU, torch's fused kernel (it returns the log-sums, unlike ``scaled_dot_product_attention``), else the
    same in plain operations, the scores in float32."""
    if q.device.type == "cpu":
        output, log_sum = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, keys, values, 0.0, False, attn_mask=mask, scale=scaling
        )
        return output, log_sum.unsqueeze(-1)
    scores = torch.matmul(q, keys.transpose(-1, -2)).float() * scaling
    if mask is not None:
        scores = scores + mask
    log_sum = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.matmul(torch.exp(scores - log_sum).to(values.dtype), values), log_sum


def attend(store: SlotStore, layer: int, group: Group, queries: torch.Tensor, scaling: float) -> torch.Tensor:
    """Attention of the group's new tokens over their prefixes and own tokens (grouped-query heads kept grouped).

    The own part and each prefix's part are computed apart (a prefix is read once for all its rows) and merged by
    their softmax log-sums, as one softmax over all the columns would weigh them.
    ``queries``: [count * width, heads, head_dim], row-major (row, then token); returns the same shape.
    """
    count, width = group.count, group.width
    kv_heads, head_dim = store.shape[2], store.shape[3]
    per_kv = queries.shape[1] // kv_heads
    # [count, kv_heads, per_kv * width, head_dim]: query head h reads KV head h // per_kv (a view at width 1)
    q = queries.view(count, width, kv_heads, per_kv, head_dim).permute(0, 2, 3, 1, 4)
    q = q.reshape(count, kv_heads, per_kv * width, head_dim)
    own = store.kv[layer, :, group.first : group.first + count, :, : group.own_width]
    output, log_sum = attention_part(q, own[0], own[1], group.mask, scaling)
    for position, block in enumerate(group.prefixes):
        every = block.count == count
        part = q if every else q[block.rows]
        flat = part.transpose(0, 1).reshape(1, kv_heads, block.count * per_kv * width, head_dim)
        prefix = block.prefix.kv[layer, :, None]  # [2, 1, kv_heads, length, head_dim]
        block_output, block_log_sum = attention_part(flat, prefix[0], prefix[1], None, scaling)
        shape = (kv_heads, block.count, per_kv * width, -1)
        block_output = block_output.view(shape).transpose(0, 1)
        block_log_sum = block_log_sum.view(shape).transpose(0, 1)
        mine, mine_log_sum = (output, log_sum) if every else (output[block.rows], log_sum[block.rows])
        # the block's share of the merged softmax: e^b / (e^a + e^b)
        merged = torch.lerp(mine, block_output, torch.sigmoid(block_log_sum - mine_log_sum))
        last = position == len(group.prefixes) - 1
        total = mine_log_sum if last else torch.logaddexp(mine_log_sum, block_log_sum)  # needed by a next block
        if every:
            output, log_sum = merged, total
        else:
            output[block.rows], log_sum[block.rows] = merged, total
    return _token_major(output, width, per_kv)


def _token_major(output: torch.Tensor, width: int, per_kv: int) -> torch.Tensor:
    """[count, kv_heads, per_kv * width, head_dim] -> [count * width, heads, head_dim] (row, then token; a view at
    width 1)."""
    count, kv_heads, _, head_dim = output.shape
    if width == 1:
        return output.reshape(count, kv_heads * per_kv, head_dim)
    output = output.view(count, kv_heads, per_kv, width, head_dim).permute(0, 3, 1, 2, 4)
    return output.reshape(count * width, kv_heads * per_kv, head_dim)

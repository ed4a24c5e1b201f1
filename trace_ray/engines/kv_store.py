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
    tokens: tuple[int, ...]
    kv: torch.Tensor  # [layers, 2, kv_heads, len(tokens), head_dim]


@dataclass(eq=False)
class RowKV:
    """A row's keys and values outside the store: the prefix it uses and its own tokens' (a finished turn)."""

    prefix: SharedPrefix | None
    used: int  # leading tokens of ``prefix`` the row starts with
    own: torch.Tensor  # [layers, 2, kv_heads, own tokens, head_dim]

    @property
    def length(self) -> int:
        return self.used + self.own.shape[3]


class SlotStore:
    """The running batch's own keys and values, row ``i`` in slot ``i`` (see the module docstring)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        self.shape = (layers, 2, kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.kv = torch.empty((layers, 2, 0, kv_heads, 0, head_dim), dtype=dtype, device=device)
        self.lengths: list[int] = []  # own tokens of each row
        self.prefixes: list[tuple[SharedPrefix | None, int]] = []  # each row's prefix and how much of it it uses

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def position(self, row: int) -> int:
        """The position of the row's next token."""
        return self.prefixes[row][1] + self.lengths[row]

    def add(self, prefix: SharedPrefix | None = None, used: int = 0, own: torch.Tensor | None = None) -> int:
        """A new row at the end, starting with ``used`` tokens of ``prefix`` and then ``own``'s keys and values
        ([layers, 2, kv_heads, tokens, head_dim]; None: none yet); returns its index."""
        row = self.rows
        count = 0 if own is None else own.shape[3]
        self.lengths.append(0)
        self.prefixes.append((prefix, used))
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
        prefix, used = self.prefixes[row]
        own = self.lengths[row] if length is None else length
        return RowKV(prefix, used, self.kv[:, :, row, :, :own].clone())

    def share(self, row: int, tokens: tuple[int, ...]) -> SharedPrefix:
        """Move a row without a prefix onto one made of its own first ``len(tokens)`` tokens (whose token ids are
        ``tokens``); its own part keeps the tokens after them."""
        assert self.prefixes[row][0] is None, "the row already starts with a shared prefix"
        count = len(tokens)
        prefix = SharedPrefix(tokens, self.kv[:, :, row, :, :count].clone())
        rest = self.lengths[row] - count
        if rest:
            self.kv[:, :, row, :, :rest] = self.kv[:, :, row, :, count : count + rest].clone()
        self.lengths[row] = rest
        self.prefixes[row] = (prefix, count)
        return prefix

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (increasing), in that order; the rows after a dropped one move down one slot each."""
        for target, source in enumerate(rows):
            if target != source:
                width = self.lengths[source]
                self.kv[:, :, target, :, :width] = self.kv[:, :, source, :, :width]
        self.lengths = [self.lengths[row] for row in rows]
        self.prefixes = [self.prefixes[row] for row in rows]


@dataclass
class PrefixBlock:
    """The rows of a group that start with ``prefix`` (their indices within the group), and, when some use only part
    of it, an additive mask ([1, 1, rows * heads_per_kv * width, prefix length]: 0 where a query may look, -inf past
    the tokens its row uses)."""

    prefix: SharedPrefix
    rows: torch.Tensor
    count: int
    mask: torch.Tensor | None


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
    """Split the batch into runs of consecutive rows with the same number of new tokens, each with its masks (row
    ``i`` writes its ``widths[i]`` new tokens after its ``store.lengths[i]`` own ones)."""
    groups, first = [], 0
    while first < len(widths):
        end = first
        while end < len(widths) and widths[end] == widths[first]:
            end += 1
        groups.append(_group(store, first, end, widths[first], heads_per_kv, device))
        first = end
    return groups


def _additive(allowed: torch.Tensor) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=torch.float32).masked_fill_(~allowed, float("-inf"))


def _group(store: SlotStore, first: int, end: int, width: int, heads_per_kv: int, device: torch.device) -> Group:
    lengths = torch.tensor(store.lengths[first:end])
    own_width = int(lengths.max()) + width
    # token j of a row sees its own columns up to its own position: column c <= length + j
    allowed = torch.arange(own_width)[None, None, :] <= (lengths[:, None] + torch.arange(width)[None, :])[:, :, None]
    mask = _additive(allowed)[:, None].expand(-1, heads_per_kv, -1, -1)
    mask = mask.reshape(end - first, 1, heads_per_kv * width, own_width)
    members: dict[int, list[int]] = {}
    for index in range(end - first):
        prefix, _ = store.prefixes[first + index]
        if prefix is not None:
            members.setdefault(id(prefix), []).append(index)
    blocks = []
    for rows in members.values():
        prefix = store.prefixes[first + rows[0]][0]
        used = torch.tensor([store.prefixes[first + index][1] for index in rows])
        block_mask = None
        if bool((used < len(prefix.tokens)).any()):
            visible = torch.arange(len(prefix.tokens))[None, :] < used[:, None]
            queries = _additive(visible)[:, None].expand(-1, heads_per_kv * width, -1)
            block_mask = queries.reshape(1, 1, len(rows) * heads_per_kv * width, len(prefix.tokens)).to(device)
        blocks.append(PrefixBlock(prefix, torch.tensor(rows, device=device), len(rows), block_mask))
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
    # [count, kv_heads, per_kv * width, head_dim]: query head h reads KV head h // per_kv
    q = queries.view(count, width, kv_heads, per_kv, head_dim).permute(0, 2, 3, 1, 4)
    q = q.reshape(count, kv_heads, per_kv * width, head_dim)
    own = store.kv[layer, :, group.first : group.first + count, :, : group.own_width]
    output, log_sum = attention_part(q, own[0], own[1], group.mask, scaling)
    for block in group.prefixes:
        every = block.count == count
        part = q if every else q[block.rows]
        flat = part.transpose(0, 1).reshape(1, kv_heads, block.count * per_kv * width, head_dim)
        prefix = block.prefix.kv[layer, :, None]  # [2, 1, kv_heads, length, head_dim]
        block_output, block_log_sum = attention_part(flat, prefix[0], prefix[1], block.mask, scaling)
        shape = (kv_heads, block.count, per_kv * width, -1)
        block_output = block_output.view(shape).transpose(0, 1)
        block_log_sum = block_log_sum.view(shape).transpose(0, 1)
        mine, mine_log_sum = (output, log_sum) if every else (output[block.rows], log_sum[block.rows])
        total = torch.logaddexp(mine_log_sum, block_log_sum)
        merged = mine * torch.exp(mine_log_sum - total) + block_output * torch.exp(block_log_sum - total)
        if every:
            output, log_sum = merged, total
        else:
            output[block.rows], log_sum[block.rows] = merged, total
    return _token_major(output, width, per_kv)


def _token_major(output: torch.Tensor, width: int, per_kv: int) -> torch.Tensor:
    """[count, kv_heads, per_kv * width, head_dim] -> [count * width, heads, head_dim] (row, then token)."""
    count, kv_heads, _, head_dim = output.shape
    output = output.view(count, kv_heads, per_kv, width, head_dim).permute(0, 3, 1, 2, 4)
    return output.reshape(count * width, kv_heads * per_kv, head_dim)

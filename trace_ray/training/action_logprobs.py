"""The policy's log-probs of the action tokens of a micro-batch: shared prefixes encoded once, ``lm_head`` only where
used.

Every member of a GRPO group starts with the same prompt (the policy, the tool
schemas, the worked example, the task: ~800 tokens on the device target) and
differs only in its replies (tens of tokens). :class:`ActionLogprobs` runs
each group's longest common token prefix once through the network, with
gradients, and every member's remaining tokens (later turns included) on top
of the prefix's keys and values; the result is the same as running every
member whole (tested to 1e-5 in float32, gradients included), at a fraction
of the cost (Prefix Grouper, arXiv 2506.05433, shows the same identity).

Only the hidden states at positions that predict an action token go through
``lm_head``, in chunks of ``CHUNK_TOKENS`` whose full-vocabulary logits are
recomputed in the backward pass rather than kept: memory holds no
``[tokens, vocabulary]`` tensor of the sequence. Prompt, tool-result and user
tokens are never scored.

The module wraps the PEFT policy so that DDP or FSDP (``parallel.py``) wraps
one ``forward`` that does all of this; ``reference=True`` scores with the
adapter disabled (the KL reference).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache

CHUNK_TOKENS = 512  # action positions per lm_head + log-softmax chunk


@dataclass
class ScoredRow:
    """One trajectory to score: its token ids and the indices of its action tokens (each >= 1)."""

    token_ids: list[int]
    actions: list[int]
    group: int = -1  # rows of one group (>= 0) may share a prefix; -1: none


@dataclass
class PrefixGroup:
    """Rows whose first ``prefix`` tokens are identical (a plain row: ``prefix`` 0)."""

    rows: list[int]
    prefix: int


def common_prefix(sequences: list[list[int]]) -> int:
    """Length of the longest common prefix of ``sequences``."""
    shortest = min(len(sequence) for sequence in sequences)
    for index in range(shortest):
        token = sequences[0][index]
        if any(sequence[index] != token for sequence in sequences[1:]):
            return index
    return shortest


def prefix_groups(rows: list[ScoredRow], shared_prefix: bool) -> list[PrefixGroup]:
    """Rows of one group with at least two members share their longest common prefix (each keeps >= 1 token of its own);
    the other rows, and every row without ``shared_prefix``, form one plain group."""
    plain: list[int] = []
    shared: list[PrefixGroup] = []
    by_group: dict[int, list[int]] = {}
    for index, row in enumerate(rows):
        if shared_prefix and row.group >= 0:
            by_group.setdefault(row.group, []).append(index)
        else:
            plain.append(index)
    for members in by_group.values():
        if len(members) < 2:
            plain += members
            continue
        sequences = [rows[index].token_ids for index in members]
        prefix = min(common_prefix(sequences), min(len(sequence) for sequence in sequences) - 1)
        if prefix < 1:
            plain += members
        else:
            shared.append(PrefixGroup(members, prefix))
    return ([PrefixGroup(sorted(plain), 0)] if plain else []) + shared


def forward_tokens(group: PrefixGroup, rows: list[ScoredRow]) -> int:
    """Tokens the network runs for ``group``: its prefix once plus every row's remainder, padded to the longest."""
    lengths = [len(rows[index].token_ids) - group.prefix for index in group.rows]
    return group.prefix + len(lengths) * max(lengths)


def forward_cost(rows: list[ScoredRow], shared_prefix: bool) -> int:
    """Tokens the network runs to score ``rows``."""
    return sum(forward_tokens(group, rows) for group in prefix_groups(rows, shared_prefix))


def pack_micro_batches(rows: list[ScoredRow], max_tokens: int, shared_prefix: bool) -> list[list[int]]:
    """Consecutive rows packed into micro-batches whose forward runs at most ``max_tokens`` tokens (a row that alone
    exceeds it is a micro-batch of its own); rows of one group next to each other share their prefix."""
    batches: list[list[int]] = []
    for index in range(len(rows)):
        if batches and forward_cost([rows[i] for i in batches[-1] + [index]], shared_prefix) <= max_tokens:
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches


def _logits(lm_head: torch.nn.Module, hidden: torch.Tensor, temperature: float) -> torch.Tensor:
    """Temperature-scaled logits, in float32 at least (bf16 logits lose log-prob precision)."""
    logits = lm_head(hidden)
    return (logits.float() if logits.element_size() < 4 else logits) / temperature


def _action_logprobs(
    lm_head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    logits = _logits(lm_head, hidden, temperature)
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


@torch.no_grad()
def _entropy(lm_head: torch.nn.Module, hidden: torch.Tensor, temperature: float) -> torch.Tensor:
    logp = torch.log_softmax(_logits(lm_head, hidden, temperature), dim=-1)
    return -(logp.exp() * logp).sum(-1)


class PrefixRecorder(DynamicCache):
    """The prefix pass's cache: keeps each layer's keys and values as computed. A gradient-checkpointing replay of a
    layer computes them again and overwrites them with equal ones, where an appending cache would double them."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        layer = self.layers[layer_idx]
        if not layer.is_initialized:
            layer.lazy_initialization(key_states, value_states)
        layer.keys, layer.values = key_states, value_states
        return key_states, value_states


class SharedPrefix(DynamicCache):
    """The members' pass's cache: the prefix's keys and values, one copy per member, read and never appended to
    (a replay reads the same)."""

    def __init__(self, config, recorded: PrefixRecorder, members: int):
        super().__init__(config=config)
        for layer, source in zip(self.layers, recorded.layers):
            layer.lazy_initialization(source.keys, source.values)
            layer.keys = source.keys.repeat_interleave(members, dim=0)
            layer.values = source.values.repeat_interleave(members, dim=0)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        layer = self.layers[layer_idx]
        return torch.cat([layer.keys, key_states], dim=-2), torch.cat([layer.values, value_states], dim=-2)


class ActionLogprobs(torch.nn.Module):
    """``forward(rows, shared_prefix, reference)`` -> (log-probs, entropies), each flat over the rows' action tokens in
    order.

    ``gradient_checkpointing``: every decoder layer's activations are recomputed in the backward pass instead of
    kept (transformers' layer checkpointing; the prefix's key-value caches here are replay-safe, see
    :class:`PrefixRecorder` and :class:`SharedPrefix`).
    """

    def __init__(self, policy: torch.nn.Module, temperature: float, gradient_checkpointing: bool = False):
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.policy = policy
        self.temperature = temperature
        causal_lm = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        self.decoder = causal_lm.get_decoder()
        self.lm_head = causal_lm.get_output_embeddings()
        if gradient_checkpointing:
            causal_lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            for layer in self.decoder.layers:
                layer._can_checkpoint_with_cache = True  # our caches are replay-safe

    def forward(
        self, rows: list[ScoredRow], shared_prefix: bool = True, reference: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if reference:
            with self.policy.disable_adapter():
                return self._score(rows, shared_prefix)
        return self._score(rows, shared_prefix)

    def _score(self, rows: list[ScoredRow], shared_prefix: bool) -> tuple[torch.Tensor, torch.Tensor]:
        device = self.lm_head.weight.device
        pieces: dict[int, torch.Tensor] = {}
        for group in prefix_groups(rows, shared_prefix):
            counts = [len(rows[index].actions) for index in group.rows]
            pieces.update(zip(group.rows, torch.split(self._hidden_at_actions(group, rows, device), counts)))
        hidden = torch.cat([pieces[index] for index in range(len(rows))])
        targets = torch.tensor(
            [row.token_ids[position] for row in rows for position in row.actions], dtype=torch.long, device=device
        )
        logprobs, entropies = [], []
        for start in range(0, hidden.shape[0], CHUNK_TOKENS):
            chunk, chunk_targets = hidden[start : start + CHUNK_TOKENS], targets[start : start + CHUNK_TOKENS]
            if torch.is_grad_enabled():  # the chunk's logits are recomputed in backward instead of kept
                logprobs.append(
                    checkpoint(
                        _action_logprobs, self.lm_head, chunk, chunk_targets, self.temperature, use_reentrant=False
                    )
                )
            else:
                logprobs.append(_action_logprobs(self.lm_head, chunk, chunk_targets, self.temperature))
            entropies.append(_entropy(self.lm_head, chunk.detach(), self.temperature))
        if not logprobs:
            empty = hidden.new_zeros(0, dtype=torch.float32)
            return empty, empty
        return torch.cat(logprobs), torch.cat(entropies)

    def _hidden_at_actions(self, group: PrefixGroup, rows: list[ScoredRow], device: torch.device) -> torch.Tensor:
        """The hidden states that predict the group's action tokens (position t - 1 for action t), row after row:
        ``[actions, H]``."""
        prefix = group.prefix
        members = [rows[index] for index in group.rows]
        width = max(len(row.token_ids) for row in members) - prefix
        ids = torch.zeros((len(members), width), dtype=torch.long, device=device)
        mask = torch.zeros((len(members), prefix + width), dtype=torch.long, device=device)
        mask[:, :prefix] = 1
        for slot, row in enumerate(members):
            rest = row.token_ids[prefix:]
            ids[slot, : len(rest)] = torch.tensor(rest, dtype=torch.long, device=device)
            mask[slot, prefix : prefix + len(rest)] = 1
        positions = torch.arange(prefix, prefix + width, device=device).expand(len(members), width)
        if prefix:
            recorder = PrefixRecorder(config=self.decoder.config)
            head = torch.tensor([members[0].token_ids[:prefix]], dtype=torch.long, device=device)
            prefix_hidden = self.decoder(input_ids=head, past_key_values=recorder, use_cache=True).last_hidden_state[0]
            rest_hidden = self.decoder(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=SharedPrefix(self.decoder.config, recorder, len(members)),
                use_cache=True,
            ).last_hidden_state
        else:
            rest_hidden = self.decoder(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
            ).last_hidden_state
            prefix_hidden = rest_hidden.new_zeros((0, rest_hidden.shape[-1]))
        # the shared prefix's, then each member's
        table = torch.cat([prefix_hidden, rest_hidden.reshape(-1, rest_hidden.shape[-1])])
        where = [
            t if t < prefix else prefix + slot * width + (t - prefix)
            for slot, row in enumerate(members)
            for t in (position - 1 for position in row.actions)  # t predicts t + 1
        ]
        return table[torch.tensor(where, dtype=torch.long, device=device)]

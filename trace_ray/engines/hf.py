"""The transformers engine: continuous batching on CPU or GPU, LoRA adapters, prefix caching.

Requests join the running batch as they arrive and leave it as soon as they
finish (see ``engine_loop.py``); a decode step runs every row of the batch
at once, each with its own sampling settings, random generator and LoRA
adapter (PEFT's mixed-adapter batches). Rows are left-padded in one shared
KV cache; positions are given explicitly, so padding never shifts them.

Agent prompts share a long prefix (policy, tool list, worked example): on a
CPU its prefill dominates. The engine keeps the KV cache of recent shared
prefixes (per adapter version) and prefills only each prompt's own suffix.
It also keeps the KV cache of finished generations for a while: an
episode's next prompt extends its last one (the reply and the environment's
answer appended), so only the new tokens are prefilled.

The model runs where it was loaded: on the CPU, or on the GPU of a rollout
worker given one (``models.assigned_device``; ``model.dtype=auto`` is bf16
there).

Adapters are PEFT LoRA adapters held beside the frozen base model, each
known by ``(name, version)``. Replacing or unloading an adapter never
changes a generation already running: the old weights stay until its last
row finishes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from trace_ray.engines.base import AdapterNotLoadedError, AdapterRef, Generation
from trace_ray.engines.cpu_attention import use_grouped_attention
from trace_ray.engines.cpu_linear import use_packed_linears
from trace_ray.engines.engine_loop import LoopedEngine, Request
from trace_ray.engines.kv_cache import ROOM, RoomyLayer, roomy_cache
from trace_ray.engines.sampling import sample_next

__all__ = ["AdapterNotLoadedError", "HFEngine", "end_of_turn_ids"]

MIN_CACHED_PREFIX = 32  # shorter shared prefixes are cheaper to recompute than to copy
PREFIX_CACHE_ENTRIES = 4
CONTINUATION_CACHE_TOKENS = 32768  # tokens of finished generations kept for the episodes' next turns
BASE = "__base__"  # PEFT's name for "no adapter" in a mixed-adapter batch
SPECULATIVE_ROWS = 4  # greedy batches of at most this many rows verify drafted tokens (the step is weight-bound there)
DRAFT_TOKENS = 8  # tokens drafted per row and step
DRAFT_NGRAMS = (3, 2)  # a draft continues the latest earlier occurrence of the row's last 3 (else 2) tokens


def draft_tokens(sequence: list[int], count: int) -> list[int]:
    """Up to ``count`` tokens that followed the latest earlier occurrence of ``sequence``'s last few tokens in it."""
    for size in DRAFT_NGRAMS:
        if len(sequence) <= size:
            continue
        tail = sequence[-size:]
        for start in range(len(sequence) - size - 1, -1, -1):
            if sequence[start : start + size] == tail:
                return sequence[start + size : start + size + count]
    return []


def common_prefix_length(prompts: list[list[int]]) -> int:
    first = prompts[0]
    length = min(len(prompt) for prompt in prompts)
    for prompt in prompts[1:]:
        index = 0
        while index < length and prompt[index] == first[index]:
            index += 1
        length = index
    return length


def stack_right_aligned(first: torch.Tensor, second: torch.Tensor, dim: int, room: int = 0) -> torch.Tensor:
    """``first`` and ``second`` stacked along dim 0, each right-aligned along ``dim`` and zero-padded on the left,
    followed by ``room`` unset columns.

    One allocation and one copy of each input (the running batch's KV cache
    is large: this runs whenever a request joins).
    """
    width = max(first.shape[dim], second.shape[dim])
    shape = list(first.shape)
    shape[0], shape[dim] = first.shape[0] + second.shape[0], width + room
    stacked = first.new_empty(shape)
    for rows, part in ((slice(0, first.shape[0]), first), (slice(first.shape[0], None), second)):
        target = stacked[rows]
        padding = width - part.shape[dim]
        target.narrow(dim, 0, padding).zero_()
        target.narrow(dim, padding, part.shape[dim]).copy_(part)
    return stacked


def end_of_turn_ids(tokenizer, configured_eos: int | list[int] | None) -> list[int]:
    """The tokenizer's eos plus the model's configured eos token(s)."""
    configured = configured_eos if isinstance(configured_eos, list) else [configured_eos]
    return sorted({tokenizer.eos_token_id, *[token for token in configured if token is not None]})


@dataclass(eq=False)
class _Row:
    request: Request
    peft_name: str | None  # the PEFT adapter generating this row; None: the base model
    tokens: list[int]
    logprobs: list[float]


class HFEngine(LoopedEngine):
    def __init__(
        self,
        model,
        tokenizer,
        stop_token_ids: list[int] | None = None,
        max_batch_rows: int = 32,
        continuation_cache_tokens: int = CONTINUATION_CACHE_TOKENS,
    ):
        self.base_model = model
        if self.device.type == "cpu":
            use_grouped_attention(model)
            use_packed_linears(model)
        self.peft_model = None  # wraps base_model once an adapter is loaded
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id
        self.stop_token_ids = set(stop_token_ids or end_of_turn_ids(tokenizer, model.generation_config.eos_token_id))
        self.max_batch_rows = max_batch_rows
        self._adapters: dict[str, tuple[int, str]] = {}  # name -> (version, PEFT-internal name)
        self._retired: set[str] = set()  # PEFT names replaced or unloaded, deleted once no row uses them
        self._loads = 0
        self._prefix_caches: OrderedDict[tuple, object] = OrderedDict()
        self._recent_prompt: dict[AdapterRef | None, list[int]] = {}
        self._recent_kv: dict[AdapterRef | None, tuple[tuple[int, ...], list]] = {}  # the last prompt prefilled whole
        self.continuation_cache_tokens = continuation_cache_tokens
        self._continuations: OrderedDict[tuple, list] = OrderedDict()  # (adapter, tokens) -> per-layer (keys, values)
        self._continuation_tokens = 0
        self._rows: list[_Row] = []
        self._cache = None  # KV cache of the running batch
        self._mask: torch.Tensor | None = None  # [rows, cache width]: 1 on real tokens
        super().__init__()

    @property
    def device(self) -> torch.device:
        return next(self.base_model.parameters()).device

    # -- adapters ---------------------------------------------------------------------
    def adapters(self) -> dict[str, int]:
        return {name: version for name, (version, _) in self._adapters.items()}

    def _load_adapter(self, name: str, version: int, weights: dict[str, torch.Tensor], lora_config: dict) -> None:
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

        self._loads += 1
        internal = f"adapter{self._loads}"  # fresh PEFT name per load: running rows keep the old version
        config = LoraConfig(**lora_config)
        if self.peft_model is None:
            self.peft_model = get_peft_model(self.base_model, config, adapter_name=internal)
            self.peft_model.eval()
        else:
            self.peft_model.add_adapter(internal, config)
        result = set_peft_model_state_dict(self.peft_model, weights, adapter_name=internal)
        if getattr(result, "unexpected_keys", None):
            self._retired.add(internal)
            self._release_retired()
            raise ValueError(f"adapter {name!r} has weights that fit no LoRA module: {result.unexpected_keys[:3]}")
        previous = self._adapters.get(name)
        self._adapters[name] = (version, internal)
        if previous:
            self._retired.add(previous[1])
        self._drop_prefix_caches(name)
        self._release_retired()

    def _unload_adapter(self, name: str) -> None:
        self._retired.add(self._adapters.pop(name)[1])
        self._drop_prefix_caches(name)
        self._release_retired()

    def _release_retired(self) -> None:
        """Delete retired adapters no running row uses; unwrap PEFT once no adapter is left."""
        in_use = {row.peft_name for row in self._rows}
        if not self._adapters and not in_use - {None} and self.peft_model is not None:
            self.base_model = self.peft_model.unload()  # PEFT cannot run without an adapter
            self.peft_model = None
            self._retired.clear()
            return
        for internal in sorted(self._retired - in_use):
            self.peft_model.delete_adapter(internal)
            self._retired.discard(internal)

    def _drop_prefix_caches(self, name: str) -> None:
        for key in [key for key in self._prefix_caches if key[0] and key[0][0] == name]:
            del self._prefix_caches[key]
        for key in [key for key in self._recent_kv if key and key[0] == name]:
            del self._recent_kv[key]
        for key in [key for key in self._continuations if key[0] and key[0][0] == name]:
            self._continuation_tokens -= len(key[1])
            del self._continuations[key]

    def _peft_name(self, adapter: AdapterRef | None) -> str | None:
        self.check_loaded(adapter)
        return None if adapter is None else self._adapters[adapter[0]][1]

    def _forward(self, peft_names: list[str | None], **inputs):
        """One forward pass, row i through adapter ``peft_names[i]`` (None: the base model).

        A batch whose rows all share one adapter (the common case in training
        rollouts) runs with that adapter active, or with adapters disabled for
        the base; PEFT's mixed-adapter path, which splits every LoRA layer's
        batch by adapter, is kept for batches that really mix them.
        """
        if self.peft_model is None:
            return self.base_model(**inputs, use_cache=True)
        names = set(peft_names)
        if names == {None}:
            with self.peft_model.disable_adapter():
                return self.peft_model(**inputs, use_cache=True)
        if len(names) == 1:
            (name,) = names
            if self.peft_model.active_adapter != name:
                self.peft_model.set_adapter(name)
            return self.peft_model(**inputs, use_cache=True)
        return self.peft_model(**inputs, use_cache=True, adapter_names=[name or BASE for name in peft_names])

    # -- the engine core (run by the engine loop) --------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self._rows)

    @property
    def room(self) -> int:
        return self.max_batch_rows - len(self._rows)

    @torch.no_grad()
    def admit(self, requests: list[Request]) -> list[tuple[Request, Generation | BaseException]]:
        """Prefill the requests (one group per adapter), sample their first token, join the batch."""
        ended: list[tuple[Request, Generation | BaseException]] = []
        groups: dict[AdapterRef | None, list[Request]] = {}
        for request in requests:
            try:
                self._peft_name(request.adapter)
            except AdapterNotLoadedError as error:
                ended.append((request, error))
                continue
            groups.setdefault(request.adapter, []).append(request)
        for adapter, group in groups.items():
            fresh = []
            for request in group:
                continued = self._continuation(adapter, request.prompt)
                if continued:
                    ended += self._prefill(adapter, [request], *continued)
                else:
                    fresh.append(request)
            if fresh:
                ended += self._prefill(
                    adapter, fresh, *self._cached_prefix(adapter, self._peft_name(adapter), [r.prompt for r in fresh])
                )
        return ended

    def _prefill(
        self, adapter: AdapterRef | None, requests: list[Request], prefix_length: int, prefix: list | None
    ) -> list[tuple[Request, Generation]]:
        """Prefill the prompts past their cached ``prefix_length`` tokens (``prefix``: that prefix's per-layer
        ``(keys, values)`` for one row), sample their first token, join the batch."""
        peft_name = self._peft_name(adapter)
        prompts = [request.prompt for request in requests]
        width = max(len(prompt) for prompt in prompts) - prefix_length
        count = len(prompts)
        layers = [  # every row's copy of the prefix, with room for the suffix and the first decode steps
            RoomyLayer.copy_of(keys.expand(count, -1, -1, -1), values.expand(count, -1, -1, -1), width + ROOM)
            for keys, values in prefix or []
        ]
        cache = roomy_cache(layers)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), prefix_length + width), dtype=torch.long)
        mask[:, :prefix_length] = 1
        for row, prompt in enumerate(prompts):
            suffix = prompt[prefix_length:]
            input_ids[row, width - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            mask[row, prefix_length + width - len(suffix) :] = 1
        positions = (mask.cumsum(1) - 1).clamp(min=0)[:, prefix_length:]
        output = self._forward(
            [peft_name] * len(prompts),
            input_ids=input_ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            past_key_values=cache,
            logits_to_keep=1,
        )
        if len(prompts) == 1 and prefix_length == 0:  # its KV may hold the prefix the next prompts share
            self._recent_kv[adapter] = (tuple(prompts[0]), [(layer.keys, layer.values) for layer in cache.layers])
        rows = [_Row(request, peft_name, [], []) for request in requests]
        return self._join(rows, output.past_key_values, mask.to(self.device), output.logits[:, -1])

    def _continuation(self, adapter: AdapterRef | None, prompt: list[int]) -> tuple[int, list] | None:
        """(length, per-layer ``(keys, values)``) of a finished generation this prompt continues (an episode's next
        turn), taken from the store."""
        best = None
        for key in self._continuations:
            cached_adapter, tokens = key
            if cached_adapter == adapter and len(tokens) < len(prompt) and (best is None or len(tokens) > len(best[1])):
                if tuple(prompt[: len(tokens)]) == tokens:
                    best = key
        if best is None:
            return None
        layers = self._continuations.pop(best)
        self._continuation_tokens -= len(best[1])
        return len(best[1]), layers

    def _keep_continuation(self, row: _Row, cache, index: int, row_mask: torch.Tensor) -> None:
        """Store the KV of a finished row's real tokens (prompt + reply but its last token), evicting the oldest."""
        tokens = tuple(row.request.prompt + row.tokens[:-1])
        real = row_mask.bool()
        layers = [
            (layer.keys[index : index + 1, :, real], layer.values[index : index + 1, :, real]) for layer in cache.layers
        ]
        self._continuations[(row.request.adapter, tokens)] = layers
        self._continuation_tokens += len(tokens)
        while self._continuation_tokens > self.continuation_cache_tokens:
            (_, evicted), _ = self._continuations.popitem(last=False)
            self._continuation_tokens -= len(evicted)

    def _cached_prefix(self, adapter, peft_name, prompts: list[list[int]]) -> tuple[int, list | None]:
        """(length, per-layer ``(keys, values)`` of one row) of a stored prefix the prompts all share, storing a new one
        if worth it.

        A single prompt is compared with the adapter's previous prompt, so
        that requests arriving one by one still share their prefix. At
        least one token of every prompt stays uncached for the forward pass.
        """
        usable = min(common_prefix_length(prompts), min(len(prompt) for prompt in prompts) - 1)
        best: tuple[int, ...] = ()
        for cached_adapter, prefix in self._prefix_caches:
            if (
                cached_adapter == adapter
                and len(best) < len(prefix) <= usable
                and tuple(prompts[0][: len(prefix)]) == prefix
            ):
                best = prefix
        peers = (
            prompts
            if len(prompts) > 1
            else prompts + ([self._recent_prompt[adapter]] if adapter in self._recent_prompt else [])
        )
        self._recent_prompt[adapter] = prompts[-1]
        shared = min(usable, common_prefix_length(peers))
        if not best and len(peers) > 1 and shared >= MIN_CACHED_PREFIX:
            best = tuple(prompts[0][:shared])
            recent_tokens, recent_layers = self._recent_kv.pop(adapter, ((), []))
            if recent_tokens[:shared] == best:  # the previous prompt, prefilled whole, holds this prefix's KV
                layers = [(k[:, :, :shared].clone(), v[:, :, :shared].clone()) for k, v in recent_layers]
            else:
                output = self._forward([peft_name], input_ids=torch.tensor([best], device=self.device))
                layers = [(layer.keys, layer.values) for layer in output.past_key_values.layers]
            self._prefix_caches[(adapter, best)] = layers
            while len(self._prefix_caches) > PREFIX_CACHE_ENTRIES:
                self._prefix_caches.popitem(last=False)
        if not best:
            return 0, None
        self._prefix_caches.move_to_end((adapter, best))
        return len(best), self._prefix_caches[(adapter, best)]

    @torch.no_grad()
    def step(self) -> list[tuple[Request, Generation]]:
        """One decode step for every running row: its last token, and in a small greedy batch its draft too (prompt
        lookup). Every row keeps as many tokens as greedy decoding confirms for all rows, plus one (one without
        drafts): the tokens one-token steps would give, in fewer passes."""
        drafts = self._drafts() or [[] for _ in self._rows]
        width = len(drafts[0]) + 1
        inputs = torch.tensor([[row.tokens[-1], *draft] for row, draft in zip(self._rows, drafts)], device=self.device)
        positions = self._mask.sum(dim=1, keepdim=True) + torch.arange(width, device=self.device)
        mask = torch.cat(
            [self._mask, torch.ones((len(self._rows), width), dtype=self._mask.dtype, device=self._mask.device)], dim=1
        )
        output = self._forward(
            [row.peft_name for row in self._rows],
            input_ids=inputs,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=self._cache,
        )
        logits = output.logits.cpu()
        rows, self._rows = self._rows, []
        self._cache, self._mask = None, None
        picks = [self._sample(rows, logits[:, column]) for column in range(width)]
        confirmed = min(  # leading draft tokens every row's greedy choice agrees with
            next((column for column in range(width - 1) if picks[column][0][index] != draft[column]), width - 1)
            for index, draft in enumerate(drafts)
        )
        taken = confirmed + 1
        cache = output.past_key_values
        if taken < width:
            for layer in cache.layers:
                layer.drop_right(width - taken)  # columns of draft tokens past the kept ones
            mask = mask[:, : mask.shape[1] - (width - taken)]
        tokens = [[picks[column][0][index] for column in range(taken)] for index in range(len(rows))]
        logprobs = [[picks[column][1][index] for column in range(taken)] for index in range(len(rows))]
        return self._advance(rows, cache, mask, tokens, logprobs)

    def _drafts(self) -> list[list[int]] | None:
        """Equal-length drafts for every row of a small greedy batch (prompt lookup), or None."""
        if len(self._rows) > SPECULATIVE_ROWS or any(row.request.params.temperature != 0 for row in self._rows):
            return None
        drafts = []
        for row in self._rows:
            room = row.request.params.max_new_tokens - len(row.tokens) - 1  # the verified step adds one more
            drafts.append(draft_tokens(row.request.prompt + row.tokens, min(DRAFT_TOKENS, room)) if room > 0 else [])
        width = min(len(draft) for draft in drafts)
        return [draft[:width] for draft in drafts] if width else None

    def abort(self) -> list[Request]:
        rows, self._rows, self._cache, self._mask = self._rows, [], None, None
        self._release_retired()
        return [row.request for row in rows]

    def _join(
        self, rows: list[_Row], cache, mask: torch.Tensor, logits: torch.Tensor
    ) -> list[tuple[Request, Generation]]:
        """Sample each row's next token; finished rows leave, the others join the running batch."""
        tokens, logprobs = self._sample(rows, logits)
        return self._advance(rows, cache, mask, [[token] for token in tokens], [[logprob] for logprob in logprobs])

    @staticmethod
    def _sample(rows: list[_Row], logits: torch.Tensor) -> tuple[list[int], list[float]]:
        """One token per row from ``logits`` ([rows, vocab]) with the row's own settings, on the CPU, where the
        requests' seeded generators live."""
        return sample_next(
            logits.cpu(),
            [row.request.params.temperature for row in rows],
            [row.request.params.top_p for row in rows],
            [row.request.generator for row in rows],
        )

    def _advance(
        self, rows: list[_Row], cache, mask: torch.Tensor, tokens: list[list[int]], logprobs: list[list[float]]
    ) -> list[tuple[Request, Generation]]:
        """Give each row its new tokens (the cache holds all but the last); finished rows leave, the others join the
        running batch."""
        finished, keep = [], []
        for index, row in enumerate(rows):
            for count, (token, logprob) in enumerate(zip(tokens[index], logprobs[index]), start=1):
                row.tokens.append(token)
                row.logprobs.append(logprob)
                wanted = row.request.wants_more(token)
                if not wanted or token in self.stop_token_ids or len(row.tokens) >= row.request.params.max_new_tokens:
                    reason = "stop" if not wanted or token in self.stop_token_ids else "length"
                    finished.append((row.request, Generation(row.tokens, row.logprobs, reason)))
                    if self.continuation_cache_tokens:
                        row_mask = mask[index].clone()
                        row_mask[row_mask.shape[0] - (len(tokens[index]) - count) :] = 0  # columns past its end
                        self._keep_continuation(row, cache, index, row_mask)
                    break
            else:
                keep.append(index)
        if keep:
            if len(keep) < len(rows):
                cache.batch_select_indices(torch.tensor(keep, device=mask.device))
                mask = mask[keep]
            self._merge([rows[index] for index in keep], cache, mask)
        self._release_retired()
        return finished

    def _merge(self, rows: list[_Row], cache, mask: torch.Tensor) -> None:
        """Add rows (with their cache and mask) to the running batch, right-aligned, trimming shared padding."""
        if self._cache is not None:
            width = max(self._mask.shape[1], mask.shape[1])
            cache = roomy_cache(
                [
                    RoomyLayer.in_buffers(
                        stack_right_aligned(ours.keys, theirs.keys, dim=2, room=ROOM),
                        stack_right_aligned(ours.values, theirs.values, dim=2, room=ROOM),
                        width,
                    )
                    for ours, theirs in zip(self._cache.layers, cache.layers)
                ]
            )
            mask = stack_right_aligned(self._mask, mask, dim=1)
        padding = int((mask.sum(dim=0) == 0).long().cumprod(dim=0).sum())  # columns empty in every row
        if padding:
            for layer in cache.layers:
                layer.drop_left(padding)
            mask = mask[:, padding:]
        self._rows += rows
        self._cache, self._mask = cache, mask

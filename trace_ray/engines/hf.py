"""The transformers engine: continuous batching on CPU or GPU, LoRA adapters, shared prefixes.

Requests join the running batch as they arrive and leave it as soon as they
finish (see ``engine_loop.py``); each step runs one forward pass over the
new tokens of every row at once (a joining row's prompt, every other row's
last token), each row with its own sampling settings, random generator and
LoRA adapter (PEFT's mixed-adapter batches). The pass runs the model's own
modules on the tokens packed end to end (``packed_model.py``), so a row
joining costs no second pass over the weights and rows of different lengths
need no padding.

Agent prompts share a long prefix (policy, tool list, worked example): on a
CPU its prefill dominates. The engine keeps the keys and values of recent
shared prefixes once (per adapter version, ``kv_store.py``): every row that
starts with one prefills only its own suffix and reads the prefix in place.
A prompt prefilled with no stored prefix becomes one, for the prompts that
follow it. The engine also keeps the own keys and values of finished
generations for a while: an episode's next prompt extends its last one (the
reply and the environment's answer appended), so only the new tokens are
prefilled.

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
from dataclasses import dataclass, field

import torch

from trace_ray.engines.base import AdapterNotLoadedError, AdapterRef, Generation
from trace_ray.engines.engine_loop import LoopedEngine, Request
from trace_ray.engines.kv_store import RowKV, SharedPrefix, prefix_length
from trace_ray.engines.packed_model import PackedModel, Step
from trace_ray.engines.sampling import sample_one, scaled_logprobs

__all__ = ["AdapterNotLoadedError", "HFEngine", "end_of_turn_ids"]

MIN_CACHED_PREFIX = 32  # shorter shared prefixes are cheaper to recompute than to keep
MERGED_PREFIX_TAIL = 64  # rows whose prefixes differ by at most this many last tokens read the shorter one
PREFIX_CACHE_ENTRIES = 8
CONTINUATION_CACHE_TOKENS = 32768  # own tokens of finished generations kept for the episodes' next turns
BASE = "__base__"  # PEFT's name for "no adapter" in a mixed-adapter batch
SPECULATIVE_ROWS = 4  # batches of at most this many rows verify drafted tokens (the step is weight-bound there)
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


def common_prefix_length(prompts: list[list[int]] | list[tuple[int, ...]]) -> int:
    first = prompts[0]
    length = min(len(prompt) for prompt in prompts)
    for prompt in prompts[1:]:
        index = 0
        while index < length and prompt[index] == first[index]:
            index += 1
        length = index
    return length


def end_of_turn_ids(tokenizer, configured_eos: int | list[int] | None) -> list[int]:
    """The tokenizer's eos plus the model's configured eos token(s)."""
    configured = configured_eos if isinstance(configured_eos, list) else [configured_eos]
    return sorted({tokenizer.eos_token_id, *[token for token in configured if token is not None]})


@dataclass(eq=False)
class _Row:
    request: Request
    peft_name: str | None  # the PEFT adapter generating this row; None: the base model
    pending: list[int]  # tokens whose keys and values the next step computes
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


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
        self.packed = PackedModel(model)  # on the CPU it also packs the model's linear layers' weights
        self.peft_model = None  # wraps base_model once an adapter is loaded
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id
        self.stop_token_ids = set(stop_token_ids or end_of_turn_ids(tokenizer, model.generation_config.eos_token_id))
        self.max_batch_rows = max_batch_rows
        self._adapters: dict[AdapterRef, str] = {}  # (name, version) -> PEFT-internal name
        self._retired: set[str] = set()  # PEFT names replaced or unloaded, deleted once no row uses them
        self._loads = 0
        self._prefix_caches: OrderedDict[tuple, SharedPrefix] = OrderedDict()  # (adapter, tokens) -> prefix
        self.continuation_cache_tokens = continuation_cache_tokens
        self._continuations: OrderedDict[tuple, RowKV] = OrderedDict()  # (adapter, tokens) -> the finished row's KV
        self._continuation_tokens = 0
        self._rows: list[_Row] = []  # row i of the batch is row i of the store
        self._store = self.packed.new_store()
        super().__init__()

    @property
    def device(self) -> torch.device:
        return next(self.base_model.parameters()).device

    # -- adapters ---------------------------------------------------------------------
    def _held(self) -> set[AdapterRef]:
        return set(self._adapters)

    def _load_adapter(self, name: str, version: int, weights: dict[str, torch.Tensor], lora_config: dict) -> None:
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

        self._loads += 1
        internal = f"adapter{self._loads}"  # fresh PEFT name per load: running rows keep the old weights
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
        if (name, version) in self._adapters:
            self._retire([(name, version)])
        self._adapters[(name, version)] = internal

    def _retire(self, refs: list[AdapterRef]) -> None:
        gone = {tuple(ref) for ref in refs}
        for ref in gone:
            self._retired.add(self._adapters.pop(ref))
        for key in [key for key in self._prefix_caches if key[0] is not None and tuple(key[0]) in gone]:
            del self._prefix_caches[key]
        for key in [key for key in self._continuations if key[0] is not None and tuple(key[0]) in gone]:
            self._continuation_tokens -= self._continuations.pop(key).own.shape[3]
        self._release_retired()

    def _release_retired(self) -> None:
        """Delete retired adapters no running row uses; unwrap PEFT once no adapter is left."""
        in_use = {row.peft_name for row in self._rows}
        if not self._adapters and not in_use - {None} and self.peft_model is not None:
            self.base_model = self.peft_model.unload()  # PEFT cannot run without an adapter
            self.packed.model = self.base_model
            self.peft_model = None
            self._retired.clear()
            return
        for internal in sorted(self._retired - in_use):
            self.peft_model.delete_adapter(internal)
            self._retired.discard(internal)

    def _peft_name(self, adapter: AdapterRef | None) -> str | None:
        self.check_loaded(adapter)
        return None if adapter is None else self._adapters[tuple(adapter)]

    def _forward(self, store, step: Step, peft_names: list[str | None]) -> torch.Tensor:
        """One packed forward pass (``packed_model.py``), row i through adapter ``peft_names[i]`` (None: the base).

        A batch whose rows all share one adapter (the common case in training
        rollouts) runs with that adapter active, or with adapters disabled for
        the base; PEFT's mixed-adapter path, which splits every LoRA layer's
        tokens by adapter, is kept for batches that really mix them.
        """
        if self.peft_model is None:
            return self.packed.forward(store, step)
        names = set(peft_names)
        if names == {None}:
            with self.peft_model.disable_adapter():
                return self.packed.forward(store, step)
        if len(names) == 1:
            (name,) = names
            if self.peft_model.active_adapter != name:
                self.peft_model.set_adapter(name)
            return self.packed.forward(store, step)
        return self.packed.forward(store, step, [name or BASE for name in peft_names])

    # -- the engine core (run by the engine loop) --------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self._rows)

    @property
    def room(self) -> int:
        return self.max_batch_rows - len(self._rows)

    @torch.no_grad()
    def admit(self, requests: list[Request]) -> list[tuple[Request, Generation | BaseException]]:
        """Add the requests to the batch with the stored keys and values they start with (a finished turn they
        continue, else a shared prefix); the next step prefills the rest. Requests for adapters not loaded end."""
        ended: list[tuple[Request, Generation | BaseException]] = []
        fresh: dict[AdapterRef | None, list[Request]] = {}
        for request in requests:
            try:
                peft_name = self._peft_name(request.adapter)
            except AdapterNotLoadedError as error:
                ended.append((request, error))
                continue
            continued = self._continuation(request.adapter, request.prompt)
            if continued:
                self._store.add(continued.prefix, continued.own)
                self._rows.append(_Row(request, peft_name, request.prompt[continued.length :]))
            else:
                fresh.setdefault(request.adapter, []).append(request)
        for adapter, group in fresh.items():
            peft_name = self._peft_name(adapter)
            for request, prefix in zip(group, self._cached_prefixes(adapter, peft_name, group)):
                self._store.add(prefix)
                self._rows.append(_Row(request, peft_name, request.prompt[prefix_length(prefix) :]))
        self._merge_prefixes()
        return ended

    def _merge_prefixes(self) -> None:
        """Move each row whose prefix only extends, by at most ``MERGED_PREFIX_TAIL`` tokens, a shorter prefix that
        other rows of its adapter read onto that shorter one: every prefix in the batch is one more pass of
        attention each layer (and a gather of its rows when it serves only some), where a few more own tokens a row
        cost next to nothing. (A row prefilled alone and then shared with prompts that match it a little less far
        would otherwise read its own longer copy for the rest of its episode.)"""
        used = {(row.peft_name, id(prefix)): prefix for row, prefix in zip(self._rows, self._store.prefixes) if prefix}
        for index, (row, prefix) in enumerate(zip(self._rows, self._store.prefixes)):
            if prefix is None:
                continue
            shorter = [
                other
                for (peft_name, _), other in used.items()
                if peft_name == row.peft_name
                and len(prefix.tokens) - MERGED_PREFIX_TAIL <= len(other.tokens) < len(prefix.tokens)
                and prefix.tokens[: len(other.tokens)] == other.tokens
            ]
            if shorter:
                self._store.rebase(index, min(shorter, key=lambda other: len(other.tokens)))

    def _continuation(self, adapter: AdapterRef | None, prompt: list[int]) -> RowKV | None:
        """The keys and values of a finished generation this prompt continues (an episode's next turn), taken from
        the store."""
        best = None
        for key in self._continuations:
            cached_adapter, tokens = key
            if cached_adapter == adapter and len(tokens) < len(prompt) and (best is None or len(tokens) > len(best[1])):
                if tuple(prompt[: len(tokens)]) == tokens:
                    best = key
        if best is None:
            return None
        kv = self._continuations.pop(best)
        self._continuation_tokens -= kv.own.shape[3]
        return kv

    def _keep_continuation(self, adapter: AdapterRef | None, tokens: list[int], kv: RowKV) -> None:
        """Store a finished row's keys and values (its prompt and reply but the reply's last token), evicting the
        oldest."""
        self._continuations[(adapter, tuple(tokens))] = kv
        self._continuation_tokens += kv.own.shape[3]
        while self._continuation_tokens > self.continuation_cache_tokens and self._continuations:
            _, evicted = self._continuations.popitem(last=False)
            self._continuation_tokens -= evicted.own.shape[3]

    def _remember_prefix(self, adapter: AdapterRef | None, prefix: SharedPrefix) -> None:
        self._prefix_caches[(adapter, prefix.tokens)] = prefix
        while len(self._prefix_caches) > PREFIX_CACHE_ENTRIES:
            self._prefix_caches.popitem(last=False)

    def _cached_prefixes(
        self, adapter: AdapterRef | None, peft_name: str | None, requests: list[Request]
    ) -> list[SharedPrefix | None]:
        """The shared prefix each fresh prompt starts with (None: none), all of it (one of the prompt's own length
        at most, less one token).

        The longest stored prefix a prompt begins with serves it: the part the prompt matches, as a prefix of its
        own (copied from the stored one). Else the start it shares with a row prefilled with none (running, or
        its finished turn kept) becomes one, from that row's keys and values, and the row starts with it too.
        Prompts admitted together start with one prefix where they can (the start their prefixes share): each
        prefix is a separate pass of attention. Prompts left without one that share at least
        ``MIN_CACHED_PREFIX`` tokens among themselves get it prefilled once, here. Every prefix made is stored for
        the prompts that follow."""
        found = [self._stored_prefix(adapter, request.prompt) for request in requests]
        distinct = {id(prefix): prefix for prefix in found if prefix is not None}
        if len(distinct) > 1:
            length = common_prefix_length([prefix.tokens for prefix in distinct.values()])
            if length >= MIN_CACHED_PREFIX:
                common = self._cut(adapter, next(iter(distinct.values())), length)
                found = [None if prefix is None else common for prefix in found]
        alone = [index for index, prefix in enumerate(found) if prefix is None]
        if len(alone) > 1:
            prompts = [requests[index].prompt for index in alone]
            shared = min(common_prefix_length(prompts), min(len(prompt) for prompt in prompts) - 1)
            if shared >= MIN_CACHED_PREFIX:
                prefix = self._prefill_prefix(adapter, peft_name, tuple(prompts[0][:shared]))
                for index in alone:
                    found[index] = prefix
        return found

    def _stored_prefix(self, adapter: AdapterRef | None, prompt: list[int]) -> SharedPrefix | None:
        """The stored prefix of this adapter that covers most of ``prompt`` (at least ``MIN_CACHED_PREFIX`` tokens, at
        most all but its last), cut to the tokens the prompt matches; else one made from a row prefilled with none
        (:meth:`_prefix_from_unshared`); else None."""
        best, best_length = None, MIN_CACHED_PREFIX - 1
        for (cached_adapter, tokens), prefix in self._prefix_caches.items():
            if cached_adapter == adapter:
                length = min(common_prefix_length([tokens, prompt]), len(prompt) - 1)
                if length > best_length:
                    best, best_length = prefix, length
        if best is None:
            return self._prefix_from_unshared(adapter, prompt)
        return self._cut(adapter, best, best_length)

    def _cut(self, adapter: AdapterRef | None, prefix: SharedPrefix, length: int) -> SharedPrefix:
        """The stored prefix of ``prefix``'s first ``length`` tokens, made (copied from it) if not stored yet."""
        key = (adapter, prefix.tokens[:length])
        if key not in self._prefix_caches:
            self._remember_prefix(adapter, prefix if length == len(prefix.tokens) else prefix.first(length))
        self._prefix_caches.move_to_end(key)
        return self._prefix_caches[key]

    def _prefix_from_unshared(self, adapter: AdapterRef | None, prompt: list[int]) -> SharedPrefix | None:
        """The longest prefix (of at least ``MIN_CACHED_PREFIX`` tokens) ``prompt`` shares with a row of this adapter
        that starts with no shared prefix, made from that row's keys and values (the row starts with it from now
        on); None if there is none."""
        limit = len(prompt) - 1
        best, best_length = None, MIN_CACHED_PREFIX - 1
        for index, row in enumerate(self._rows):
            if row.request.adapter == adapter and self._store.prefixes[index] is None:
                known = row.request.prompt + row.tokens  # the row's tokens whose keys and values are stored
                length = min(common_prefix_length([known[: self._store.lengths[index]], prompt]), limit)
                if length > best_length:
                    best, best_length = ("running", index), length
        for key, kv in self._continuations.items():
            if key[0] == adapter and kv.prefix is None:
                length = min(common_prefix_length([key[1], prompt]), limit)
                if length > best_length:
                    best, best_length = ("finished", key), length
        if best is None:
            return None
        tokens = tuple(prompt[:best_length])
        kind, where = best
        if kind == "running":
            prefix = self._store.share(where, tokens)
        else:
            kv = self._continuations[where]
            prefix = SharedPrefix(tokens, kv.own[:, :, :, : len(tokens)].clone())
            self._continuations[where] = RowKV(prefix, kv.own[:, :, :, len(tokens) :].clone())
            self._continuation_tokens -= len(tokens)
        self._remember_prefix(adapter, prefix)
        return prefix

    def _prefill_prefix(
        self, adapter: AdapterRef | None, peft_name: str | None, tokens: tuple[int, ...]
    ) -> SharedPrefix:
        """The shared prefix of ``tokens``, stored: their keys and values computed in a store of their own."""
        store = self.packed.new_store()
        store.add()
        self._forward(store, Step([list(tokens)], [False]), [peft_name])
        store.grow(0, len(tokens))
        prefix = store.share(0, tokens)
        self._remember_prefix(adapter, prefix)
        return prefix

    @torch.no_grad()
    def step(self) -> list[tuple[Request, Generation]]:
        """One forward pass over every row's pending tokens: a joining row's prompt (past what is stored), every
        other row's last token and, in a small batch, its draft too (prompt lookup). A drafted row keeps the tokens
        its own one-token steps would give, as long as they match the draft, plus one: the same tokens in fewer
        passes."""
        drafts = self._drafts()
        if drafts:
            for row, draft in zip(self._rows, drafts):
                row.pending = row.pending + draft
        step = Step([row.pending for row in self._rows], [bool(drafts)] * len(self._rows))
        logits = self._forward(self._store, step, [row.peft_name for row in self._rows]).cpu()
        positions = [len(row.pending) if drafts else 1 for row in self._rows]
        owners = [row for row, count in zip(self._rows, positions) for _ in range(count)]
        logprobs = scaled_logprobs(logits, [row.request.params.temperature for row in owners])
        finished, keep, start = [], [], 0
        for index, (row, count) in enumerate(zip(self._rows, positions)):
            draft = row.pending[len(row.pending) - count + 1 :]  # the drafted tokens (none for a one-token step)
            generation, taken = self._advance(row, logprobs[start : start + count], draft)
            start += count
            self._store.grow(index, len(row.pending) - count + taken)  # the tokens' keys and values it keeps
            if generation is None:
                row.pending = [row.tokens[-1]]
                keep.append(index)
                continue
            finished.append((row.request, generation))
            if self.continuation_cache_tokens:
                kv = self._store.take(index)
                self._keep_continuation(row.request.adapter, row.request.prompt + row.tokens[:-1], kv)
        if len(keep) < len(self._rows):
            self._rows = [self._rows[index] for index in self._store.keep(keep)]
        self._release_retired()
        return finished

    def _drafts(self) -> list[list[int]] | None:
        """Equal-length drafts for every row of a small batch with no prompt to prefill (prompt lookup), or None. A
        row with a shorter draft is padded with its last token: the step costs the same, and a padded token is kept
        only where the row's own draw picks it too."""
        if len(self._rows) > SPECULATIVE_ROWS or any(len(row.pending) != 1 for row in self._rows):
            return None
        drafts = []
        for row in self._rows:
            room = row.request.params.max_new_tokens - len(row.tokens) - 1  # the verified step adds one more
            drafts.append(draft_tokens(row.request.prompt + row.tokens, min(DRAFT_TOKENS, room)) if room > 0 else [])
        width = max(len(draft) for draft in drafts)
        if not width:
            return None
        return [draft + [(draft or row.pending)[-1]] * (width - len(draft)) for row, draft in zip(self._rows, drafts)]

    def abort(self) -> list[Request]:
        rows, self._rows, self._store = self._rows, [], self.packed.new_store()
        self._release_retired()
        return [row.request for row in rows]

    def _advance(self, row: _Row, logprobs: torch.Tensor, draft: list[int]) -> tuple[Generation | None, int]:
        """Draw the row's next tokens in order, one per position of ``logprobs`` (:func:`scaled_logprobs` of its
        logits: the position after its last token, then after each drafted token) until one ends the row or differs
        from the draft: (its generation if it ended, tokens taken).

        Each draw takes the row's next random number, as a one-token step would, so a draft changes how many passes
        the tokens take, not which tokens they are (sampled or greedy)."""
        params = row.request.params
        for column, drafted in enumerate([*draft, None]):  # None: the position after the draft, always taken
            token, logprob = sample_one(logprobs[column], params.temperature, params.top_p, row.request.generator)
            row.tokens.append(token)
            row.logprobs.append(logprob)
            wanted = row.request.wants_more(token)
            if not wanted or token in self.stop_token_ids or len(row.tokens) >= params.max_new_tokens:
                reason = "stop" if not wanted or token in self.stop_token_ids else "length"
                return Generation(row.tokens, row.logprobs, reason), column + 1
            if token != drafted:
                return None, column + 1

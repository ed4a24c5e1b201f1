"""The transformers engine: batched generation on CPU or GPU, LoRA adapters, prefix caching.

Adapters are PEFT LoRA adapters held beside the frozen base model, each
known by ``(name, version)``; a request names one (or none for the base
model) and the batch is generated one adapter group at a time.

Agent prompts share a long prefix (policy, tool list, worked example): on a
CPU its prefill dominates generation. The engine therefore keeps the KV
cache of the longest prefix shared by a batch's prompts and prefills only
each prompt's own suffix. Rows are laid out as
``[shared prefix][padding][suffix]``; positions come from the attention
mask, so padding in the middle does not shift them.
"""

from __future__ import annotations

import contextlib
import copy
from collections import OrderedDict

import torch

from trace_ray.engines.base import AdapterRef, Generation, SamplingParams
from trace_ray.errors import TraceRayError

MIN_CACHED_PREFIX = 32  # shorter shared prefixes are cheaper to recompute than to copy
PREFIX_CACHE_ENTRIES = 4


def common_prefix_length(prompts: list[list[int]]) -> int:
    first = prompts[0]
    length = min(len(prompt) for prompt in prompts)
    for prompt in prompts[1:]:
        index = 0
        while index < length and prompt[index] == first[index]:
            index += 1
        length = index
    return length


class AdapterNotLoadedError(TraceRayError):
    """A request named an adapter (or version) the engine does not hold."""


def end_of_turn_ids(model, tokenizer) -> list[int]:
    """The tokenizer's eos plus the generation config's eos tokens."""
    configured = model.generation_config.eos_token_id
    configured = configured if isinstance(configured, list) else [configured]
    return sorted({tokenizer.eos_token_id, *[token for token in configured if token is not None]})


class HFEngine:
    def __init__(self, model, tokenizer, stop_token_ids: list[int] | None = None):
        self.base_model = model
        self.peft_model = None  # wraps base_model once an adapter is loaded
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id
        self.stop_token_ids = stop_token_ids or end_of_turn_ids(model, tokenizer)
        self._adapters: dict[str, tuple[int, str]] = {}  # name -> (version, PEFT-internal name)
        self._loads = 0
        self._prefix_caches: OrderedDict[tuple, object] = OrderedDict()

    @property
    def device(self) -> torch.device:
        return next(self.base_model.parameters()).device

    # -- adapters ---------------------------------------------------------------------
    def adapters(self) -> dict[str, int]:
        """Loaded adapters: name -> version."""
        return {name: version for name, (version, _) in self._adapters.items()}

    def load_adapter(self, name: str, version: int, weights: dict[str, torch.Tensor], lora_config: dict) -> None:
        """Load (or replace) adapter ``name`` at ``version`` from a PEFT state dict and LoRA settings."""
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

        self._loads += 1
        internal = f"adapter{self._loads}"  # fresh PEFT name per load: the old version stays usable until replaced
        config = LoraConfig(**lora_config)
        if self.peft_model is None:
            self.peft_model = get_peft_model(self.base_model, config, adapter_name=internal)
        else:
            self.peft_model.add_adapter(internal, config)
        result = set_peft_model_state_dict(self.peft_model, weights, adapter_name=internal)
        if getattr(result, "unexpected_keys", None):
            self.peft_model.delete_adapter(internal)
            raise ValueError(f"adapter {name!r} has weights that fit no LoRA module: {result.unexpected_keys[:3]}")
        previous = self._adapters.get(name)
        self._adapters[name] = (version, internal)
        if previous:
            self.peft_model.delete_adapter(previous[1])
        self._drop_prefix_caches(name)

    def unload_adapter(self, name: str) -> None:
        if name not in self._adapters:
            raise KeyError(f"adapter {name!r} is not loaded (loaded: {', '.join(sorted(self._adapters)) or 'none'})")
        _, internal = self._adapters.pop(name)
        if self._adapters:
            self.peft_model.delete_adapter(internal)
        else:  # PEFT cannot run without an adapter: unwrap back to the plain base model
            self.base_model = self.peft_model.unload()
            self.peft_model = None
        self._drop_prefix_caches(name)

    def _drop_prefix_caches(self, name: str) -> None:
        for key in [key for key in self._prefix_caches if key[0] and key[0][0] == name]:
            del self._prefix_caches[key]

    def _network(self, adapter: AdapterRef | None):
        """The module that generates with ``adapter`` (None: the base model) and a context to run it in."""
        if adapter is None:
            if self.peft_model is None:
                return self.base_model, contextlib.nullcontext()
            return self.peft_model, self.peft_model.disable_adapter()
        name, version = adapter
        loaded = self._adapters.get(name)
        if loaded is None or loaded[0] != version:
            have = ", ".join(f"{n} v{v}" for n, v in sorted(self.adapters().items())) or "none"
            raise AdapterNotLoadedError(f"adapter {name!r} version {version} is not loaded (loaded: {have}); load it first")
        self.peft_model.set_adapter(loaded[1])
        return self.peft_model, contextlib.nullcontext()

    # -- generation -------------------------------------------------------------------
    def _cached_prefix(self, network, adapter, prompts: list[list[int]]) -> tuple[int, object | None]:
        """(length, KV cache) of a stored prefix shared by every prompt, computing one if worth it.

        Caches are per adapter version. At least one token of every prompt
        stays uncached so that generation has an input.
        """
        shared = common_prefix_length(prompts)
        shared = min(shared, min(len(prompt) for prompt in prompts) - 1)
        best: tuple[int, ...] = ()
        for cached_adapter, prefix in self._prefix_caches:
            if cached_adapter == adapter and len(best) < len(prefix) <= shared and tuple(prompts[0][: len(prefix)]) == prefix:
                best = prefix
        if not best and len(prompts) > 1 and shared >= MIN_CACHED_PREFIX:
            best = tuple(prompts[0][:shared])
            output = network(torch.tensor([best], device=self.device), use_cache=True)
            self._prefix_caches[(adapter, best)] = output.past_key_values
            while len(self._prefix_caches) > PREFIX_CACHE_ENTRIES:
                self._prefix_caches.popitem(last=False)
        if not best:
            return 0, None
        self._prefix_caches.move_to_end((adapter, best))
        cache = copy.deepcopy(self._prefix_caches[(adapter, best)])
        cache.batch_repeat_interleave(len(prompts))
        return len(best), cache

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, adapters: list[AdapterRef | None] | None = None
    ) -> list[Generation]:
        """One generation per prompt; ``adapters[i]`` = (name, version) for prompt i, or None for the base model."""
        adapters = adapters or [None] * len(prompts)
        groups: dict[AdapterRef | None, list[int]] = {}
        for index, adapter in enumerate(adapters):
            groups.setdefault(adapter, []).append(index)
        outputs: list[Generation | None] = [None] * len(prompts)
        for number, (adapter, indices) in enumerate(groups.items()):
            seed = None if params.seed is None else params.seed + number
            group_params = SamplingParams(params.temperature, params.top_p, params.max_new_tokens, seed)
            for index, generation in zip(indices, self._generate_group([prompts[i] for i in indices], group_params, adapter)):
                outputs[index] = generation
        return outputs

    @torch.no_grad()
    def _generate_group(self, prompts: list[list[int]], params: SamplingParams, adapter) -> list[Generation]:
        if not prompts:
            return []
        network, context = self._network(adapter)
        with context:
            return self._sample(network, adapter, prompts, params)

    def _sample(self, network, adapter, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        prefix_length, cache = self._cached_prefix(network, adapter, prompts)
        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):
            suffix = prompt[prefix_length:]
            input_ids[row, :prefix_length] = torch.tensor(prompt[:prefix_length], dtype=torch.long)
            input_ids[row, width - len(suffix):] = torch.tensor(suffix, dtype=torch.long)
            attention_mask[row, :prefix_length] = 1
            attention_mask[row, width - len(suffix):] = 1
        greedy = params.temperature == 0
        sampling = {} if greedy else {"temperature": params.temperature, "top_p": params.top_p, "top_k": 0}
        with torch.random.fork_rng(devices=[]):
            if params.seed is not None:
                torch.manual_seed(params.seed)
            output = network.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                past_key_values=cache,
                do_sample=not greedy,
                max_new_tokens=params.max_new_tokens,
                eos_token_id=self.stop_token_ids,
                pad_token_id=self.pad_token_id,
                return_dict_in_generate=True,
                output_logits=True,
                **sampling,
            )
        new_tokens = output.sequences[:, width:].cpu()
        scale = 1.0 if greedy else params.temperature
        logprobs = torch.empty(new_tokens.shape)
        for step, logits in enumerate(output.logits):
            step_logprobs = torch.log_softmax(logits.float().cpu() / scale, dim=-1)
            logprobs[:, step] = step_logprobs.gather(-1, new_tokens[:, step : step + 1]).squeeze(-1)
        return [self._trim(new_tokens[row].tolist(), logprobs[row].tolist()) for row in range(len(prompts))]

    def _trim(self, token_ids: list[int], logprobs: list[float]) -> Generation:
        for index, token in enumerate(token_ids):
            if token in self.stop_token_ids:
                return Generation(token_ids[: index + 1], logprobs[: index + 1], "stop")
        return Generation(token_ids, logprobs, "length")

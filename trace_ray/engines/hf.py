"""The transformers engine: batched generation on CPU or GPU, with prefix caching.

Agent prompts share a long prefix (policy, tool list, worked example): on a
CPU its prefill dominates generation. The engine therefore keeps the KV
cache of the longest prefix shared by a batch's prompts and prefills only
each prompt's own suffix. Rows are laid out as
``[shared prefix][padding][suffix]``; positions come from the attention
mask, so padding in the middle does not shift them.
"""

from __future__ import annotations

import copy
from collections import OrderedDict

import torch

from trace_ray.engines.base import Generation, SamplingParams

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


def end_of_turn_ids(model, tokenizer) -> list[int]:
    """The tokenizer's eos plus the generation config's eos tokens."""
    configured = model.generation_config.eos_token_id
    configured = configured if isinstance(configured, list) else [configured]
    return sorted({tokenizer.eos_token_id, *[token for token in configured if token is not None]})


class HFEngine:
    def __init__(self, model, tokenizer, stop_token_ids: list[int] | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id
        self.stop_token_ids = stop_token_ids or end_of_turn_ids(model, tokenizer)
        self._prefix_caches: OrderedDict[tuple[int, ...], object] = OrderedDict()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _cached_prefix(self, prompts: list[list[int]]) -> tuple[int, object | None]:
        """(length, KV cache) of a stored prefix shared by every prompt, computing one if worth it.

        At least one token of every prompt stays uncached so that generation has an input.
        """
        shared = common_prefix_length(prompts)
        shared = min(shared, min(len(prompt) for prompt in prompts) - 1)
        best: tuple[int, ...] = ()
        for prefix in self._prefix_caches:
            if len(best) < len(prefix) <= shared and tuple(prompts[0][: len(prefix)]) == prefix:
                best = prefix
        if not best and len(prompts) > 1 and shared >= MIN_CACHED_PREFIX:
            best = tuple(prompts[0][:shared])
            with torch.no_grad():
                output = self.model(torch.tensor([best], device=self.device), use_cache=True)
            self._prefix_caches[best] = output.past_key_values
            while len(self._prefix_caches) > PREFIX_CACHE_ENTRIES:
                self._prefix_caches.popitem(last=False)
        if not best:
            return 0, None
        self._prefix_caches.move_to_end(best)
        cache = copy.deepcopy(self._prefix_caches[best])
        cache.batch_repeat_interleave(len(prompts))
        return len(best), cache

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if not prompts:
            return []
        prefix_length, cache = self._cached_prefix(prompts)
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
            output = self.model.generate(
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

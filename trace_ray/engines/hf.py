"""The transformers engine: batched generation with left padding on CPU or GPU."""

from __future__ import annotations

import torch

from trace_ray.engines.base import Generation, SamplingParams


class HFEngine:
    def __init__(self, model, tokenizer, stop_token_ids: list[int] | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id
        self.stop_token_ids = sorted(set(stop_token_ids or [tokenizer.eos_token_id]))

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if not prompts:
            return []
        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt):] = 1
        greedy = params.temperature == 0
        sampling = {} if greedy else {"temperature": params.temperature, "top_p": params.top_p, "top_k": 0}
        device = next(self.model.parameters()).device
        with torch.random.fork_rng(devices=[]):
            if params.seed is not None:
                torch.manual_seed(params.seed)
            output = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
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

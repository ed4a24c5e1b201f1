"""The language models that environments ask for text (``environments.responder.Responder``), built from config.

``env.user`` (kind ``model`` or ``endpoint``) plays the τ²-bench user; ``env.judge`` grades natural-language
assertions. A local model is loaded once per process on the transformers engine and shared by every
environment instance in it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from environments.responder import Responder
from trace_ray.config import JudgeConfig, UserSimulatorConfig
from trace_ray.engines.base import SamplingParams
from trace_ray.engines.hf import HFEngine
from trace_ray.llm_client import LLMClient
from trace_ray.models import load_model, model_config_by_name

SHARED_ENGINE_ROWS = 8  # generations a shared local-model engine batches together

_ENGINES: dict[str, tuple[HFEngine, Any]] = {}
_ENGINES_LOCK = threading.Lock()


def shared_engine(model_name: str) -> tuple[HFEngine, Any]:
    """(engine, tokenizer) of ``conf/model/<model_name>.yaml``, loaded once per process."""
    with _ENGINES_LOCK:
        if model_name not in _ENGINES:
            network, tokenizer = load_model(model_config_by_name(model_name))
            _ENGINES[model_name] = (HFEngine(network, tokenizer, max_batch_rows=SHARED_ENGINE_ROWS), tokenizer)
        return _ENGINES[model_name]


class ModelResponder:
    """A local model (a ``conf/model`` name); its engine is loaded on the first chat, so the responder pickles small."""

    def __init__(self, model_name: str, max_tokens: int):
        self.model_name = model_name
        self.max_tokens = max_tokens

    def chat(self, messages: list[dict[str, str]], seed: int, temperature: float) -> str:
        engine, tokenizer = shared_engine(self.model_name)
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompt = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
        generation = engine.generate([prompt], SamplingParams(temperature, 1.0, self.max_tokens, seed=seed))[0]
        return tokenizer.decode(generation.token_ids, skip_special_tokens=True)


def user_responder(settings: UserSimulatorConfig | None) -> Responder | None:
    """The model ``env.user`` names; None for the scripted user."""
    if settings is None or settings.kind == "scripted":
        return None
    if settings.kind == "model":
        return ModelResponder(settings.model, settings.max_tokens)
    if settings.kind == "endpoint":
        return LLMClient(
            settings.base_url,
            settings.model,
            os.environ.get(settings.api_key_env or ""),
            config_key="env.user",
            response_format="text",
            max_tokens=settings.max_tokens,
        )
    raise ValueError(f"env.user.kind={settings.kind!r} is not one of scripted, model, endpoint")


def judge_responder(settings: JudgeConfig | None) -> Responder | None:
    """The endpoint ``env.judge`` names; None when it is off (no base_url)."""
    if settings is None or not settings.base_url:
        return None
    return LLMClient(
        settings.base_url,
        settings.model,
        os.environ.get(settings.api_key_env or ""),
        config_key="env.judge",
        response_format="json_object",
    )

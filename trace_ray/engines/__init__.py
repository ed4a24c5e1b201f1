"""Generation engines behind one interface: token ids in, sampled token ids and log-probs out."""

from trace_ray.engines.base import AdapterRef, Engine, Generation, SamplingParams

__all__ = ["AdapterRef", "Engine", "Generation", "SamplingParams", "make_engine"]


def make_engine(model, engine: str = "hf") -> Engine:
    """Load the configured model (a ``ModelConfig``) into the named engine (validated by the config)."""
    from trace_ray.engines.hf import HFEngine
    from trace_ray.models import load_model

    network, tokenizer = load_model(model)
    return HFEngine(network, tokenizer)

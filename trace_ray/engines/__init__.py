"""Generation engines behind one interface: token ids in, sampled token ids and log-probs out."""

from trace_ray.engines.base import Engine, Generation, SamplingParams

__all__ = ["Engine", "Generation", "SamplingParams"]

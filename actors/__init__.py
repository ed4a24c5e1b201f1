"""Ray actors: rollout workers (an engine holding the base model and adapters)
and environment actors (many environment instances each; the isolation
boundary for generated environment code). Pure logic lives in ``trace_ray``.
"""

"""Where a decode step's time goes: the transformers engine's step under torch's profiler, split by kind of op.

Admits ``rows`` prompts of ``context`` tokens whose first ``shared`` are the
same (as agent prompts share their policy, tools and example; stop tokens
off, so every row keeps generating), runs a few warm-up steps, then profiles ``steps`` decode
steps and prints per step: wall ms, and the ms in matrix products (linear
layers), attention, KV copies (cat/copy), and everything else (norms,
rotary, activations, Python and dispatch). Run it against another commit's
engine with ``PYTHONPATH=<worktree of that commit>``.

    python benchmarks/decode_profile.py [rows=1,4,16] [context=800] [shared=750] [steps=10]
"""

from __future__ import annotations

import random
import sys
import time

from torch.profiler import ProfilerActivity, profile, record_function

from trace_ray.config_compose import compose_config
from trace_ray.engines import SamplingParams, make_engine
from trace_ray.engines.engine_loop import Request, request_generator

KINDS = {  # events by name: the linear layers' kernels, the engine's attention (timed whole), the KV copies
    "matrix products": ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise", "aten::linear"),
    "attention": ("attention", "aten::_scaled_dot_product_flash_attention_for_cpu"),
    "KV copies": ("aten::cat", "aten::copy_", "aten::index", "aten::index_select", "aten::index_put_"),
}


def time_attention() -> None:
    """Put the packed engine's attention in the profile as one event, "attention" (the sdpa kernel of an older
    engine shows under its own name)."""
    try:
        from trace_ray.engines import kv_store, packed_model
    except ImportError:
        return
    attend = kv_store.attend

    def timed(*args, **kwargs):
        with record_function("attention"):
            return attend(*args, **kwargs)

    packed_model.attend = timed


def main() -> None:
    options = dict(argument.split("=", 1) for argument in sys.argv[1:])
    all_rows = [int(rows) for rows in options.get("rows", "1,4,16").split(",")]
    context, steps = int(options.get("context", 800)), int(options.get("steps", 10))
    shared = int(options.get("shared", 750))
    time_attention()
    config = compose_config("evaluate", ["model=smollm2_135m"])
    engine = make_engine(config.model, config.engine)
    engine.stop_token_ids = set()
    generator = random.Random(0)
    print("rows | step ms | matrix products | attention | KV copies | other")
    for rows in all_rows:
        prefix = [generator.randrange(1000, 20000) for _ in range(shared)]
        prompts = [prefix + [generator.randrange(1000, 20000) for _ in range(context - shared)] for _ in range(rows)]
        params = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=10**6)
        engine.admit([Request(prompt, params, None, request_generator(0)) for prompt in prompts])
        for _ in range(3):
            engine.step()
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            started = time.perf_counter()
            for _ in range(steps):
                engine.step()
            wall = (time.perf_counter() - started) / steps * 1e3
        split = dict.fromkeys(KINDS, 0.0)
        events = profiler.key_averages()
        timed_whole = any(event.key == "attention" for event in events)
        for event in events:
            for kind, names in KINDS.items():
                if event.key not in names or (timed_whole and kind == "attention" and event.key != "attention"):
                    continue  # the packed engine's attention is timed whole, its kernels inside it
                took = event.cpu_time_total if event.key == "attention" else event.self_cpu_time_total
                split[kind] += took / 1e3 / steps
        other = wall - sum(split.values())
        print(f"{rows} | {wall:.1f} | " + " | ".join(f"{value:.1f}" for value in split.values()) + f" | {other:.1f}")
        engine.abort()


if __name__ == "__main__":
    main()

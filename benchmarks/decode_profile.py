"""Where a decode step's time goes: the transformers engine's step under torch's profiler, split by kind of op.

Admits ``rows`` prompts of ``context`` tokens (stop tokens off, so every row
keeps generating), runs a few warm-up steps, then profiles ``steps`` decode
steps and prints per step: wall ms, and the ms in matrix products (linear
layers), attention, KV copies (cat/copy), and everything else (norms,
rotary, activations, Python and dispatch). Run it against another commit's
engine with ``PYTHONPATH=<worktree of that commit>``.

    python benchmarks/decode_profile.py [rows=1,4,16] [context=800] [steps=10]
"""

from __future__ import annotations

import random
import sys
import time

from torch.profiler import ProfilerActivity, profile

from trace_ray.config_compose import compose_config
from trace_ray.engines import SamplingParams, make_engine
from trace_ray.engines.engine_loop import Request, request_generator

KINDS = {
    "matrix products": ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise", "aten::bmm"),
    "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math"),
    "KV copies": ("aten::cat", "aten::copy_", "aten::index", "aten::index_select"),
}


def main() -> None:
    options = dict(argument.split("=", 1) for argument in sys.argv[1:])
    all_rows = [int(rows) for rows in options.get("rows", "1,4,16").split(",")]
    context, steps = int(options.get("context", 800)), int(options.get("steps", 10))
    config = compose_config("evaluate", ["model=smollm2_135m"])
    engine = make_engine(config.model, config.engine)
    engine.stop_token_ids = set()
    generator = random.Random(0)
    print("rows | step ms | matrix products | attention | KV copies | other")
    for rows in all_rows:
        prompts = [[generator.randrange(1000, 20000) for _ in range(context)] for _ in range(rows)]
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
        for event in profiler.key_averages():
            for kind, names in KINDS.items():
                if event.key in names:
                    split[kind] += event.self_cpu_time_total / 1e3 / steps
        other = wall - sum(split.values())
        print(f"{rows} | {wall:.1f} | " + " | ".join(f"{value:.1f}" for value in split.values()) + f" | {other:.1f}")
        engine.abort()


if __name__ == "__main__":
    main()

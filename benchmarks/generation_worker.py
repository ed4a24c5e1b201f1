"""One side of ``benchmarks/generation_throughput.py``: the generation path of the tree on ``PYTHONPATH``.

Run in its own process with ``PYTHONPATH`` set to a checkout (today's tree,
or a worktree of the commit before a change), so the two sides never share
a process, a thread pool or a cache. Plays, on the transformers engine:
  - greedy evaluation: the first ``tasks`` held-out device tasks, ``batch_size`` live episodes;
  - training rollouts: ``rollouts`` sampled episodes (groups of 4 on analysis tasks) at the model's sampling
    settings and a fixed seed;
  - a decode probe: ``probe_rows`` first-turn prompts generated together, timing every decode step.
Prints one JSON object (timings, token counts, every episode's reward and tokens).

    PYTHONPATH=TREE python benchmarks/generation_worker.py tasks=16 batch_size=16 rollouts=16 probe_rows=16
"""

from __future__ import annotations

import json
import sys
import time

from trace_ray.agent_prompt import AgentPrompt
from trace_ray.config_compose import compose_config
from trace_ray.engines import SamplingParams, hf, make_engine
from trace_ray.engines.hf import HFEngine
from trace_ray.environment_setup import environment_maker
from trace_ray.rollout_loop import LocalBackend, benchmark_tasks, run_rollouts

ROLLOUT_SEED = 1234
GROUP = 4  # samples of each task, as in a GRPO group


class StepClock:
    """Where an evaluation's time goes: the engine's prefill and decode (and sampling within them), the rows of each
    decode step, and, on the rollout threads beside the engine, environment steps and prompt rendering.

    Engines that prefill in ``admit`` (before the packed forward) count ``admit`` as prefill and every ``step``
    as decode; the packed engine prefills joining rows inside ``step``, so a step with a row that has more than
    one pending token and no draft counts as prefill there."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.prefill_s = self.decode_s = self.sampling_s = self.env_s = self.render_s = 0.0
        self.steps: list[tuple[int, float]] = []  # (rows, seconds) of each decode step

    def timed(self, function, field: str):
        clock = self

        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                setattr(clock, field, getattr(clock, field) + time.perf_counter() - started)

        return wrapper

    def install(self, environment_class) -> None:
        step = HFEngine.step
        clock = self

        def timed_step(engine):
            rows, started = len(engine._rows), time.perf_counter()
            joining = any(len(getattr(row, "pending", ())) > 1 for row in engine._rows)
            try:
                return step(engine)
            finally:
                seconds = time.perf_counter() - started
                if joining:
                    clock.prefill_s += seconds
                else:
                    clock.decode_s += seconds
                    clock.steps.append((rows, seconds))

        HFEngine.admit = self.timed(HFEngine.admit, "prefill_s")
        HFEngine.step = timed_step
        for sampler in ("sample_next", "sample_one"):  # an older engine samples the batch at once, today's per token
            if hasattr(hf, sampler):
                setattr(hf, sampler, self.timed(getattr(hf, sampler), "sampling_s"))
        environment_class.reset = self.timed(environment_class.reset, "env_s")
        environment_class.step = self.timed(environment_class.step, "env_s")
        AgentPrompt.prompt_ids = self.timed(AgentPrompt.prompt_ids, "render_s")


def play(tasks, make_env, engine, prompt, params, batch_size, config, clock):
    clock.reset()
    started = time.perf_counter()
    results = run_rollouts(
        tasks,
        LocalBackend(make_env, engine),
        prompt,
        params,
        batch_size,
        config.model.max_context_tokens,
        max_episode_tokens=config.rollout.max_episode_tokens,
    )
    seconds = time.perf_counter() - started
    generated = sum(result.record.action_tokens for result in results)
    return {
        "seconds": seconds,
        "episodes": len(results),
        "generated_tokens": generated,
        "record_tokens": sum(len(result.record.token_ids) for result in results),
        "prefill_s": clock.prefill_s,
        "decode_s": clock.decode_s,
        "sampling_s": clock.sampling_s,
        "env_s": clock.env_s,
        "render_s": clock.render_s,
        "decode_steps": len(clock.steps),
        "mean_rows": sum(rows for rows, _ in clock.steps) / max(len(clock.steps), 1),
        "rewards": {result.key: result.reward for result in results},
        "tokens": {result.key: result.record.token_ids for result in results},
    }


def main() -> None:
    options = dict(argument.split("=", 1) for argument in sys.argv[1:])
    count, batch_size = int(options.pop("tasks", 16)), int(options.pop("batch_size", 16))
    rollouts, probe_rows = int(options.pop("rollouts", 16)), int(options.pop("probe_rows", 16))
    config = compose_config("evaluate", ["env=device", "model=smollm2_135m", *(f"{k}={v}" for k, v in options.items())])
    make_env = environment_maker(config.env)
    env = make_env()
    engine = make_engine(config.model, config.engine)
    prompt = AgentPrompt.for_model(config.model, engine.tokenizer)
    clock = StepClock()
    clock.install(type(env))
    sampling = config.model.sampling
    greedy = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=sampling.max_new_tokens)
    report = {
        "evaluation": play(
            benchmark_tasks(env, "eval", limit=count), make_env, engine, prompt, greedy, batch_size, config, clock
        )
    }
    sampled = SamplingParams(sampling.temperature, sampling.top_p, sampling.max_new_tokens, seed=ROLLOUT_SEED)
    groups = benchmark_tasks(env, "analysis", samples_per_task=GROUP, limit=max(rollouts // GROUP, 1))
    report["rollouts"] = play(groups, make_env, engine, prompt, sampled, batch_size, config, clock)
    example = env.example_exchange()
    first_prompts = []
    for task in benchmark_tasks(env, "eval", limit=probe_rows):
        reset = env.reset(task.seed)
        first_prompts.append(prompt.prompt_ids(reset.messages, reset.tools, example))
    clock.reset()
    engine.generate(first_prompts, SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=64))
    full = [seconds for rows, seconds in clock.steps if rows == probe_rows]
    report["decode_probe"] = {
        "rows": probe_rows,
        "context_tokens": sum(len(p) for p in first_prompts) / len(first_prompts),
        "full_steps": len(full),
        "step_s": sorted(full)[len(full) // 2] if full else None,
    }
    engine.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main()

"""GRPO signal per rollout against group size, on one device capability's synthetic environment.

GRPO learns only from informative groups (rollouts of one seed whose rewards
differ). A larger group is informative more often but costs more rollouts.
This samples ``group`` rollouts of each of ``seeds`` task seeds once (the
model's sampling temperature, as training samples), then, for every group
size K that divides into it, computes exactly from those rewards the chance
that K rollouts drawn from a seed's ``group`` are informative, and the
informative groups per 100 rollouts it buys, side by side with K=8 (the
evidence budget's group size) as the ratio.

    python benchmarks/group_signal.py capability=tool_calling_precision [level=0] [seeds=4] [group=16]
    [model=smollm2_135m]
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from math import comb

from environments.device.synthetic import DeviceTemplateEnvironment
from trace_ray.agent_prompt import AgentPrompt
from trace_ray.config_compose import compose_config
from trace_ray.console import print_table
from trace_ray.engines import SamplingParams, make_engine
from trace_ray.rollout_loop import EpisodeTask, LocalBackend, run_rollouts

BASELINE_K = 8  # conf/budget/evidence.yaml's grpo.group_size


def informative_chance(rewards: list[float], k: int) -> float:
    """The chance that ``k`` of ``rewards`` drawn without replacement are not all equal."""
    all_equal = sum(comb(count, k) for count in Counter(rewards).values())
    return 1.0 - all_equal / comb(len(rewards), k)


def main() -> None:
    options = dict(argument.split("=", 1) for argument in sys.argv[1:])
    capability = options.pop("capability", "tool_calling_precision")
    level, seeds, group = int(options.pop("level", 0)), int(options.pop("seeds", 4)), int(options.pop("group", 16))
    config = compose_config("train", [f"{key}={value}" for key, value in options.items()])

    def make_env() -> DeviceTemplateEnvironment:
        return DeviceTemplateEnvironment(capability, level)

    engine = make_engine(config.model, config.engine)
    prompt = AgentPrompt.for_model(config.model, engine.tokenizer)
    chosen = [make_env().train_seed(index) for index in range(seeds)]  # the seeds training would draw first
    tasks = [EpisodeTask(f"{capability}-{seed}#{sample}", seed, sample) for seed in chosen for sample in range(group)]
    params = SamplingParams(config.grpo.temperature, 1.0, config.model.sampling.max_new_tokens, seed=config.seed)
    started = time.perf_counter()
    results = run_rollouts(
        tasks,
        LocalBackend(make_env, engine),
        prompt,
        params,
        config.batch_size,
        config.model.max_context_tokens,
        max_episode_tokens=config.rollout.max_episode_tokens,
    )
    seconds = time.perf_counter() - started
    by_seed = [[result.reward for result in results if result.seed == seed] for seed in chosen]
    mean = sum(result.reward for result in results) / len(results)
    success = sum(result.success for result in results) / len(results)
    print(
        f"{capability} level {level}: {len(results)} rollouts ({seeds} seeds x {group}) in {seconds:.0f} s "
        f"({seconds / len(results):.1f} s each); mean reward {mean:.3f}, success {success:.2f}"
    )
    print("rewards per seed: " + "; ".join(" ".join(f"{reward:.2f}" for reward in rewards) for rewards in by_seed))
    sizes = [k for k in (2, 4, 8, 16, 32) if k <= group]
    per_100 = {k: 100 * sum(informative_chance(rewards, k) for rewards in by_seed) / len(by_seed) / k for k in sizes}
    rows = []
    for k in sizes:
        chance = sum(informative_chance(rewards, k) for rewards in by_seed) / len(by_seed)
        ratio = f"{per_100[k] / per_100[BASELINE_K]:.2f}" if BASELINE_K in per_100 and per_100[BASELINE_K] else "-"
        rows.append((k, f"{chance:.3f}", f"{per_100[k]:.2f}", ratio))
    print_table(
        f"informative groups by group size K ({config.model.name}, temperature {config.grpo.temperature})",
        ["K", "P(group informative)", "informative groups per 100 rollouts", f"per rollout vs K={BASELINE_K}"],
        rows,
    )


if __name__ == "__main__":
    main()

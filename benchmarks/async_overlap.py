"""Rollouts overlapping the update (``grpo.max_staleness=1``) against the synchronous loop, in one run.

Three ``trace-ray train`` runs (Ray Train, Ray rollout workers, the HF engine), one after another, on the synthetic
``tool_calling_precision`` environment of the device target (its templates, at ``--difficulty``), with the same
model, LoRA, seed, iterations and rollouts per iteration (one batch each: no resampling), gradient checkpointing on
as in ``budget=evidence``:

  sync, shared cores   today's default: rollout worker and trainer each use every core, taking turns;
  sync, 1 + 1 cores    the rollout worker pinned to core 0 (``rollout.cpu_cores=[0]``), the trainer to core 1
                       (``trainer.cpu_cores=[1]``), one torch thread each: the placement the overlap needs;
  async, 1 + 1 cores   the same placement with ``grpo.max_staleness=1``: the next iteration's batch plays while the
                       trainer updates.

Per run, from its ``metrics.parquet``: wall seconds per iteration (the first iteration's start to the last one's
end, over the iterations), the mean seconds of rollouts played, of the update and of the weight sync per iteration,
the trainer's idle fraction (waiting for rollouts, over the wall time) and the rollout worker's (1 - rollouts played
over the wall time), the staleness of the rollouts trained on, the largest importance ratio, and the reward of every
iteration.

Once the async run samples with a version behind, its batches (and so its work) differ from the synchronous run's:
shorter or longer trajectories make its updates shorter or longer. ``speedup_same_work`` removes that: the async
run's own work (its generated tokens and its update's forward tokens) priced at the pinned synchronous run's seconds
per generated token and per forward token, plus that run's other seconds per iteration, over the async run's wall
time. Last line JSON:

  {"speedup_same_placement": sync 1+1 s / async 1+1 s, "speedup_vs_default": sync shared s / async 1+1 s,
   "speedup_same_work": (as above), "reward_last3": [sync 1+1, async 1+1]}
   (reward_last3: the mean reward of the last 3 iterations)

    python benchmarks/async_overlap.py [--quick] [--model smollm2_135m] [--iterations 8] [--group-size 8]
        [--groups 2] [--difficulty 0] [--keep DIR]

``--quick``: 5 iterations of 2 groups of 4 (about 15 minutes on 2 cores with the embedded model).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trace_ray.config_compose import compose_config  # noqa: E402
from trace_ray.console import print_table  # noqa: E402

CAPABILITY = "tool_calling_precision"
PINNED = ["rollout.cpu_cores=[0]", "trainer.cpu_cores=[1]", "rollout.worker_threads=1", "trainer.torch_threads=1"]
RUNS = {
    "sync, shared cores": [],
    "sync, 1 + 1 cores": PINNED,
    "async, 1 + 1 cores": [*PINNED, "grpo.max_staleness=1"],
}


def train_once(run_dir: Path, args, overrides: list[str]) -> list[dict]:
    """One ``trace-ray train`` run in ``run_dir``; the metrics of its iterations."""
    import pyarrow.parquet as pq

    from trace_ray.app import train

    spec = run_dir / "environments" / CAPABILITY / "spec.json"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(
        json.dumps({"capability": CAPABILITY, "target": "device", "source": "templates", "difficulty": args.difficulty})
    )
    config = compose_config(
        "train",
        [
            f"run_dir={run_dir}",
            f"model={args.model}",
            "train_on=env",
            "env=synthetic",
            f"env.capability={CAPABILITY}",
            "adapter=bench",
            f"grpo.iterations={args.iterations}",
            f"grpo.checkpoint_every={args.iterations}",
            f"grpo.group_size={args.group_size}",
            f"grpo.groups_per_batch={args.groups}",
            f"grpo.mini_batch_size={args.group_size * args.groups}",
            "grpo.max_resample_batches=0",
            "grpo.plateau_patience=1000",
            "grpo.lr=1e-4",
            "lora.rank=8",
            "lora.alpha=16",
            "rollout.max_episode_tokens=512",
            "trainer.gradient_checkpointing=true",  # an update of ~9k tokens needs ~19 GiB without it
            *overrides,
        ],
    )
    train.run(config)
    return pq.read_table(run_dir / "adapters" / "bench" / "metrics.parquet").to_pylist()


def summary(history: list[dict]) -> dict:
    wall = history[-1]["finished_at"] - history[0]["started_at"]
    played = sum(row["rollout_s"] for row in history)
    updating = sum(row["update_s"] for row in history)
    stale = sum(row.get("staleness_1", 0) for row in history)
    rewards = [row["reward_mean"] for row in history]
    return {
        "wall_s": wall,
        "played_s": played,
        "updating_s": updating,
        "generated_tokens": sum(row["rollout_tokens_per_s"] * row["rollout_s"] for row in history),
        "forward_tokens": sum(row.get("forward_tokens") or 0 for row in history),
        "iteration_s": wall / len(history),
        "rollout_s": played / len(history),
        "update_s": updating / len(history),
        "sync_s": statistics.fmean(row.get("sync_s", 0.0) for row in history),
        "trainer_idle": sum(row["rollout_wait_s"] for row in history) / wall,
        "rollout_idle": max(0.0, 1.0 - played / wall),
        "stale_share": stale / sum(row["rollouts"] for row in history),
        "ratio_max": max(row.get("importance_ratio_max") or 1.0 for row in history),
        "rollouts": sum(row["rollouts"] for row in history),
        "rewards": rewards,
        "reward_last3": statistics.fmean(rewards[-3:]),
    }


def same_work_seconds(pinned: dict, overlapped: dict) -> float:
    """What the pinned synchronous loop would take for the async run's work: its generated tokens and forward tokens
    at the synchronous run's seconds per token, plus the synchronous run's other seconds (sync, logging)."""
    per_generated = pinned["played_s"] / max(1.0, pinned["generated_tokens"])
    per_forward = pinned["updating_s"] / max(1, pinned["forward_tokens"])
    other = pinned["wall_s"] - pinned["played_s"] - pinned["updating_s"]
    return per_generated * overlapped["generated_tokens"] + per_forward * overlapped["forward_tokens"] + other


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 iterations of 2 groups of 4")
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--difficulty", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="keep the run folders here (default: a temporary folder)")
    args = parser.parse_args()
    if args.quick:
        args.iterations, args.group_size, args.groups = 5, 4, 2
    folder = args.keep or Path(tempfile.mkdtemp(prefix="async-overlap-"))
    results = {
        name: summary(train_once(folder / f"run{i}", args, overrides))
        for i, (name, overrides) in enumerate(RUNS.items())
    }
    print_table(
        f"{args.iterations} iterations of {args.groups} x {args.group_size} rollouts, {args.model}, "
        f"{CAPABILITY} level {args.difficulty}",
        [
            "run",
            "s / iteration",
            "rollouts s",
            "update s",
            "sync s",
            "trainer idle",
            "rollout idle",
            "stale rollouts",
            "max ratio",
            "rollouts",
        ],
        [
            [
                name,
                f"{r['iteration_s']:.1f}",
                f"{r['rollout_s']:.1f}",
                f"{r['update_s']:.1f}",
                f"{r['sync_s']:.2f}",
                f"{r['trainer_idle']:.0%}",
                f"{r['rollout_idle']:.0%}",
                f"{r['stale_share']:.0%}",
                f"{r['ratio_max']:.2f}",
                r["rollouts"],
            ]
            for name, r in results.items()
        ],
    )
    print_table(
        "mean reward per iteration",
        ["run", *[str(i + 1) for i in range(args.iterations)], "last 3"],
        [[name, *[f"{x:.3f}" for x in r["rewards"]], f"{r['reward_last3']:.3f}"] for name, r in results.items()],
    )
    shared, pinned, overlapped = (results[name] for name in RUNS)
    print(
        f"work: generated tokens {pinned['generated_tokens']:.0f} (sync 1+1) / {overlapped['generated_tokens']:.0f} "
        f"(async 1+1); update forward tokens {pinned['forward_tokens']} / {overlapped['forward_tokens']}"
    )
    print(
        json.dumps(
            {
                "speedup_same_placement": round(pinned["iteration_s"] / overlapped["iteration_s"], 3),
                "speedup_vs_default": round(shared["iteration_s"] / overlapped["iteration_s"], 3),
                "speedup_same_work": round(same_work_seconds(pinned, overlapped) / overlapped["wall_s"], 3),
                "reward_last3": [round(pinned["reward_last3"], 4), round(overlapped["reward_last3"], 4)],
            }
        )
    )


if __name__ == "__main__":
    main()

"""Peak memory of one GRPO update on long trajectories: today's path against the old one, side by side, as ratios.

A group of ``--members`` trajectories of L tokens each (L = each of
``--lengths``): a shared prompt of L - 2 x ``--reply-tokens`` tokens, then a
reply (actions), a tool result, a second reply (actions): the shape of a
multi-turn tau2 episode. One ``update()`` step (forward, backward, optimizer
step) per path, each in a fresh process, SmolLM2 by default, LoRA rank 16 on
every projection, float32, CPU:

  old       every trajectory run whole in one padded micro-batch, the full
            ``[B, T, V]`` logits, a full-vocabulary log-softmax of every position
            (the update before the shared-prefix path: ``grpo.shared_prefix=false``
            plus full logits);
  new       ``update()`` as trained: the shared prompt encoded once, ``lm_head`` at
            the action positions only, in recomputed chunks;
  new+ckpt  the same with ``trainer.gradient_checkpointing=true``.

Memory: the process's peak resident set during the update (``VmHWM`` after
``/proc/self/clear_refs``) minus its resident set just before it (model,
optimizer and rows already in memory); a path the kernel kills for memory is
shown as OOM. Prints a table and each path's ratio to the old one (target:
new <= 0.4x at 8k tokens).

    python benchmarks/update_memory.py [--lengths 2048 4096 8192] [--members 2] [--reply-tokens 64] [--model
    smollm2_135m]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time

PATHS = ("old", "new", "new+ckpt")


def resident_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def old_update(policy, optimizer, rows, temperature: float) -> None:
    """The update before the shared-prefix path: whole rows, full logits, full-vocabulary log-softmax."""
    import torch

    from trace_ray.training.grpo import policy_loss

    width = max(len(row.token_ids) for row in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros((len(rows), width - 1))
    old = torch.zeros((len(rows), width - 1))
    for index, row in enumerate(rows):
        ids[index, : len(row.token_ids)] = torch.tensor(row.token_ids)
        attention[index, : len(row.token_ids)] = 1
        mask[index, : len(row.token_ids) - 1] = torch.tensor(row.action_mask[1:], dtype=torch.float32)
        old[index, : len(row.token_ids) - 1] = torch.tensor(row.logprobs[1:])
    optimizer.zero_grad(set_to_none=True)
    logits = policy(input_ids=ids, attention_mask=attention).logits
    new = torch.stack(
        [
            (logits[b, :-1].float() / temperature).gather(-1, ids[b, 1:, None]).squeeze(-1)
            - torch.logsumexp(logits[b, :-1].float() / temperature, -1)
            for b in range(len(rows))
        ]
    )
    loss, _ = policy_loss(new, old, torch.tensor([row.advantage for row in rows]), mask)
    loss.backward()
    optimizer.step()


def measure(path: str, length: int, members: int, reply_tokens: int, model: str) -> dict:
    """In this process: one update of ``path`` on the group; its peak memory increase and its seconds."""
    import torch

    from trace_ray.config_compose import compose_config
    from trace_ray.training.action_logprobs import ActionLogprobs
    from trace_ray.training.groups import TrainingRow
    from trace_ray.training.grpo_iteration import update
    from trace_ray.training.lora_model import lora_parameters, trainable_model

    overrides = [
        f"model={model}",
        "lora.rank=16",
        f"grpo.mini_batch_size={members}",
        "grpo.max_tokens_per_micro_batch=1000000",
    ]
    overrides.append(f"trainer.gradient_checkpointing={'true' if path == 'new+ckpt' else 'false'}")
    config = compose_config("train", overrides)
    policy, _ = trainable_model(config.model, config.lora, config.seed)
    optimizer = torch.optim.AdamW(lora_parameters(policy), lr=1e-5)
    rng = random.Random(0)
    tokens = lambda count: [rng.randrange(3, 40000) for _ in range(count)]  # noqa: E731
    prompt, result = tokens(length - 2 * reply_tokens - 16), 16
    rows = []
    for k in range(members):
        ids = prompt + tokens(reply_tokens) + tokens(result) + tokens(reply_tokens)
        mask = [0] * len(prompt) + [1] * reply_tokens + [0] * result + [1] * reply_tokens
        logprobs = [-2.0 if flag else 0.0 for flag in mask]
        rows.append(TrainingRow(ids, mask, logprobs, advantage=1.0 if k % 2 else -1.0, group=0))
    before = resident_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM, the peak resident set, to the current one
    started = time.perf_counter()
    if path == "old":
        old_update(policy, optimizer, rows, config.grpo.temperature)
    else:
        update(
            ActionLogprobs(policy, config.grpo.temperature, config.trainer.gradient_checkpointing),
            policy,
            optimizer,
            rows,
            config,
            torch.Generator().manual_seed(0),
        )
    seconds = time.perf_counter() - started
    return {"peak_mib": (resident_kib("VmHWM") - before) / 1024, "seconds": seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--members", type=int, default=2, help="trajectories of the group (>= 2)")
    parser.add_argument("--reply-tokens", type=int, default=64, help="action tokens of each of the two replies")
    parser.add_argument("--model", default="smollm2_135m", choices=["smollm2_135m", "tiny_random"])
    parser.add_argument("--measure", nargs=2, metavar=("PATH", "LENGTH"), help=argparse.SUPPRESS)  # the child's job
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure[0], int(args.measure[1]), args.members, args.reply_tokens, args.model)))
        return
    if args.members < 2 or min(args.lengths) <= 2 * args.reply_tokens + 16:
        parser.error("--members must be >= 2 and every length above 2 x --reply-tokens + 16")

    from trace_ray.console import print_table

    print(
        f"settings: model={args.model}, {args.members} trajectories sharing a prompt, 2 x {args.reply_tokens} action "
        "tokens each, "
        "LoRA rank 16, float32, one update step per path, each in a fresh process",
        flush=True,
    )
    rows, results = [], {}
    for length in args.lengths:
        for path in PATHS:
            child = [
                sys.executable,
                __file__,
                "--measure",
                path,
                str(length),
                "--members",
                str(args.members),
                "--reply-tokens",
                str(args.reply_tokens),
                "--model",
                args.model,
            ]
            done = subprocess.run(child, capture_output=True, text=True)
            if done.returncode in (-9, 137):  # the kernel's out-of-memory killer
                results[(length, path)] = None
                print(f"  {length} tokens, {path}: killed, out of memory", flush=True)
                continue
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                sys.exit(f"update_memory: {path} at {length} tokens failed (exit {done.returncode}): {last}")
            results[(length, path)] = json.loads(done.stdout.strip().splitlines()[-1])
            print(
                f"  {length} tokens, {path}: {results[(length, path)]['peak_mib']:.0f} MiB, "
                f"{results[(length, path)]['seconds']:.1f} s",
                flush=True,
            )
        measured = [results[(length, path)] for path in PATHS]
        old = measured[0]
        rows.append(
            (
                str(length),
                *(f"{found['peak_mib']:.0f}" if found else "OOM" for found in measured),
                *(f"{found['peak_mib'] / old['peak_mib']:.2f}x" if found and old else "-" for found in measured[1:]),
                *(f"{found['seconds']:.1f}" if found else "-" for found in measured),
            )
        )
    print_table(
        "peak memory of one update (MiB above the resident set before it) and its seconds",
        ["tokens", "old MiB", "new MiB", "new+ckpt MiB", "new/old", "new+ckpt/old", "old s", "new s", "new+ckpt s"],
        rows,
    )
    longest = max(args.lengths)
    old, new = results[(longest, "old")], results[(longest, "new")]
    if old and new:
        ratio = new["peak_mib"] / old["peak_mib"]
        print(f"target at {longest} tokens: new <= 0.4x old: {'met' if ratio <= 0.4 else 'NOT met'} ({ratio:.2f}x)")
    else:
        print(
            f"at {longest} tokens: old {'out of memory' if not old else 'ran'}, new "
            f"{'out of memory' if not new else 'ran'}: no ratio"
        )


if __name__ == "__main__":
    main()

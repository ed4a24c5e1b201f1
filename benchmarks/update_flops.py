"""The GRPO update against the machine's matrix bound: its FLOPs, its seconds, its GFLOP/s.

Builds one batch as the evidence run trains it (``budget=evidence``: 2 groups of 8 rollouts of the device
environment's real first-turn prompts, ~800 tokens, LoRA rank 8, gradient checkpointing on; completions from the
HF engine; rewards by completion length so every group is informative), then:
  - counts the update's FLOPs with torch's ``FlopCounterMode`` (every matrix product and attention kernel of
    the forward, the backward through the frozen base and the LoRA weights, and checkpointing's recompute), and
    those of one forward of the same rows, to split them;
  - times ``update()`` (``trace_ray/training/grpo_iteration.py``) ``--repeats`` times on the same batch, from the
    same starting weights, and keeps the fastest;
  - measures this machine's fp32 matrix peak at the model's shapes (``benchmarks/roofline.py``) and prints the
    update's GFLOP/s as a fraction of it, beside the forward tokens it ran (a group's prompt counted once).

    python benchmarks/update_flops.py [--repeats 2] [--checkpointing true|false] [--groups 2] [--group-size 8]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.grpo_iteration import ADAPTER, device_prompts, our_rollouts  # noqa: E402
from benchmarks.roofline import ModelShape, measure  # noqa: E402
from trace_ray.config_compose import compose_config  # noqa: E402
from trace_ray.console import print_table  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--checkpointing", default="true", choices=["true", "false"])
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()

    from transformers import AutoConfig

    from trace_ray.engines import make_engine
    from trace_ray.models import model_folder
    from trace_ray.training.action_logprobs import ActionLogprobs
    from trace_ray.training.groups import training_rows
    from trace_ray.training.grpo_iteration import update
    from trace_ray.training.lora_model import adapter_weights, lora_parameters, peft_settings, trainable_model

    config = compose_config(
        "train",
        [
            "model=smollm2_135m",
            "budget=evidence",
            f"grpo.groups_per_batch={args.groups}",
            f"grpo.group_size={args.group_size}",
            f"grpo.mini_batch_size={args.groups * args.group_size}",
            f"trainer.gradient_checkpointing={args.checkpointing}",
        ],
    )
    grpo = config.grpo
    policy, tokenizer = trainable_model(config.model, config.lora, config.seed)
    engine = make_engine(config.model, config.engine)
    engine.load_adapter(ADAPTER, 0, adapter_weights(policy), peft_settings(config.lora))
    prompts = device_prompts(args.groups, "device", config)
    groups = our_rollouts(engine, tokenizer, prompts, config, 0, 0, "length")
    engine.close()
    rows = training_rows(groups, grpo.advantage, grpo.advantage_eps, grpo.max_tokens_per_trajectory)
    start = copy.deepcopy(adapter_weights(policy))

    def one_update() -> tuple[float, dict]:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(policy, start, adapter_name="default")
        optimizer = torch.optim.AdamW(lora_parameters(policy), lr=grpo.lr, weight_decay=grpo.weight_decay)
        scorer = ActionLogprobs(policy, grpo.temperature, config.trainer.gradient_checkpointing)
        generator = torch.Generator().manual_seed(config.seed)
        started = time.perf_counter()
        metrics = update(scorer, policy, optimizer, rows, grpo, generator)
        return time.perf_counter() - started, metrics

    with FlopCounterMode(display=False) as counter:
        one_update()
    flops = counter.get_total_flops()
    from trace_ray.training.grpo_iteration import scored_row

    with FlopCounterMode(display=False) as counter, torch.no_grad():  # one forward of the same rows
        ActionLogprobs(policy, grpo.temperature)([scored_row(row) for row in rows], shared_prefix=grpo.shared_prefix)
    forward = counter.get_total_flops()
    recompute = forward if config.trainer.gradient_checkpointing else 0
    seconds, metrics = min((one_update() for _ in range(args.repeats)), key=lambda timed: timed[0])
    shape = ModelShape.of(AutoConfig.from_pretrained(model_folder(config.model)))
    machine = measure(shape)
    peak = machine.peak_fp32
    achieved = flops / seconds / 1e9
    print_table(
        f"one GRPO update of {len(rows)} trajectories ({args.groups} x {args.group_size}), LoRA rank "
        f"{config.lora.rank}, gradient checkpointing {args.checkpointing}",
        ["forward tokens", "action tokens", "GFLOP", "seconds", "GFLOP/s", "fp32 matrix peak GFLOP/s", "of the peak"],
        [
            (
                str(metrics["forward_tokens"]),
                str(metrics["trained_tokens"]),
                f"{flops / 1e9:.1f}",
                f"{seconds:.1f}",
                f"{achieved:.1f}",
                f"{peak:.0f}",
                f"{achieved / peak:.0%}",
            )
        ],
    )
    print(
        f"split: forward {forward / 1e9:.1f} GFLOP, checkpointing's recompute {recompute / 1e9:.1f}, backward "
        f"through the frozen base and the LoRA weights {(flops - forward - recompute) / 1e9:.1f}"
    )


if __name__ == "__main__":
    main()

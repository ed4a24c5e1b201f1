"""Run directories for tests and benchmarks: played episodes as trajectory rows; READY capabilities with template
environments
and trained-looking adapters."""

import json
from pathlib import Path

import torch

from environments.self_checks import oracle, play_recorded
from trace_ray.config_compose import compose_config
from trace_ray.training.lora_model import export_adapter, trainable_model


def played_episode(env, seed: int, follow_oracle: bool) -> tuple[list[dict], object, object]:
    """A finished episode of ``env``: the oracle's, or an agent that replies at once; (messages, reset result, last
    step)."""
    return play_recorded(env, seed, oracle if follow_oracle else lambda _: {"role": "assistant", "content": "Done."})


def episode_row(env_name: str, seed: int, sample_index: int, messages: list[dict], reset, step) -> dict:
    """A played episode as a row of the collect stage's trajectory store (analysis split, tiny model)."""
    return {
        "task_id": reset.info["task_id"],
        "family": reset.info["family"],
        "split": "analysis",
        "seed": seed,
        "sample_index": sample_index,
        "env": env_name,
        "model": "tiny_random",
        "adapter_name": None,
        "adapter_version": None,
        "messages": json.dumps(messages),
        "tools": json.dumps(reset.tools),
        "tool_calls": [],
        "token_ids": [1],
        "action_mask": [0],
        "logprobs": [0.0],
        "reward": step.reward,
        "success": step.info["success"],
        "reward_info": json.dumps(step.info, default=str),
        "termination": "agent_reply",
        "turns": 1,
        "generated_tokens": 0,
        "seconds": 0.1,
        "finished_at": 0.0,
    }


def write_capability_run(run_dir: Path, names: list[str], model: str = "tiny_random", scale: float = 0.5) -> None:
    """Per name: a READY entry with a description, a template environment spec, and an exported adapter whose
    LoRA B is drawn from N(0, scale) by its own seeded generator (non-zero, so the adapter changes the model)."""
    config = compose_config("train", [f"model={model}", "lora.rank=4", "lora.alpha=8"])
    (run_dir / "capabilities").mkdir(parents=True)
    entries = [
        {"name": n, "description": f"the {n} skill", "status": "READY", "environment": f"synthetic/{n}"} for n in names
    ]
    (run_dir / "capabilities" / "selected.json").write_text(json.dumps(entries))
    for seed, name in enumerate(names):
        folder = run_dir / "environments" / name
        folder.mkdir(parents=True)
        (folder / "spec.json").write_text(
            json.dumps({"capability": name, "target": "device", "source": "templates", "difficulty": 1})
        )
        policy, _ = trainable_model(config.model, config.lora, seed=seed)
        generator = torch.Generator().manual_seed(seed)  # the same adapters whatever ran before
        with torch.no_grad():
            for parameter_name, parameter in policy.named_parameters():
                if "lora_B" in parameter_name:
                    parameter.normal_(0, scale, generator=generator)
        export_adapter(policy, run_dir / "adapters" / name)

"""The trained adapters of a run directory, as routing options and as engine loads."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from environments.errors import TraceRayError
from trace_ray.capabilities.selection_file import read_selection, synthesized_entries

LORA_KEYS = ("r", "lora_alpha", "lora_dropout", "target_modules", "bias", "task_type")


@dataclass
class TrainedAdapter:
    name: str
    folder: Path
    description: str
    environment: str | None  # synthetic/<capability> it was trained in (None: not a capability adapter)


def read_peft_folder(folder: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(weights, LoraConfig keywords) of a PEFT adapter folder, as engines' ``load_adapter`` takes them."""
    from safetensors.torch import load_file

    settings = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    lora_config = {key: settings[key] for key in LORA_KEYS if key in settings}
    if isinstance(lora_config.get("target_modules"), list):
        lora_config["target_modules"] = sorted(lora_config["target_modules"])
    return load_file(str(folder / "adapter_model.safetensors")), lora_config


def routable_adapters(run_dir: Path) -> list[TrainedAdapter]:
    """Every exported adapter of ``run_dir/adapters/`` whose capability has an environment in selected.json
    (READY, or OUT_OF_BAND trained under ``synthesis.accept_out_of_band``), in selection order; none before training."""
    return [
        TrainedAdapter(e["name"], run_dir / "adapters" / e["name"], e.get("description", ""), e.get("environment"))
        for e in synthesized_entries(run_dir)
        if (run_dir / "adapters" / e["name"] / "adapter_model.safetensors").is_file()
    ]


def trained_adapters(run_dir: Path) -> list[TrainedAdapter]:
    """The routable adapters (:func:`routable_adapters`); an error naming the missing step when there are none."""
    read_selection(run_dir, "run trace-ray identify, synthesize and train run_dir=DIR first")
    adapters = routable_adapters(run_dir)
    if not adapters:
        raise TraceRayError(
            f"no trained capability adapter in {run_dir / 'adapters'}; run trace-ray train run_dir={run_dir} first"
        )
    return adapters


def served_adapters(run_dir: Path) -> list[TrainedAdapter]:
    """Every PEFT folder of ``run_dir/adapters/`` (one with adapter_model.safetensors), for serving.

    Capabilities with an environment in selected.json (READY or OUT_OF_BAND) come first, in selection order, with
    their descriptions (the routable ones); any other adapter folder follows by
    name with no description (served only when a request names it).
    """
    folder = run_dir / "adapters"
    found = sorted(path.parent.name for path in folder.glob("*/adapter_model.safetensors"))
    ready = {e["name"]: e for e in synthesized_entries(run_dir) if e["name"] in found}
    described = [
        TrainedAdapter(name, folder / name, e.get("description", ""), e.get("environment")) for name, e in ready.items()
    ]
    others = [TrainedAdapter(name, folder / name, "", None) for name in found if name not in ready]
    return described + others

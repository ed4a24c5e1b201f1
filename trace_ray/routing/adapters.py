"""The trained adapters of a run directory, as routing options and as engine loads."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from trace_ray.errors import TraceRayError

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


def trained_adapters(run_dir: Path) -> list[TrainedAdapter]:
    """Every exported adapter of ``run_dir/adapters/`` whose capability is READY in selected.json, in selection order."""
    selected = run_dir / "capabilities" / "selected.json"
    if not selected.is_file():
        raise TraceRayError(f"no {selected}; run trace-ray identify, synthesize and train run_dir={run_dir} first")
    entries = [e for e in json.loads(selected.read_text(encoding="utf-8")) if e.get("status") == "READY"]
    adapters = [
        TrainedAdapter(e["name"], run_dir / "adapters" / e["name"], e.get("description", ""), e.get("environment"))
        for e in entries
        if (run_dir / "adapters" / e["name"] / "adapter_model.safetensors").is_file()
    ]
    if not adapters:
        raise TraceRayError(f"no trained capability adapter in {run_dir / 'adapters'}; run trace-ray train run_dir={run_dir} first")
    return adapters


def served_adapters(run_dir: Path) -> list[TrainedAdapter]:
    """Every PEFT folder of ``run_dir/adapters/`` (one with adapter_model.safetensors), for serving.

    Capabilities READY in selected.json come first, in selection order, with
    their descriptions (the routable ones); any other adapter folder follows by
    name with no description (served only when a request names it).
    """
    folder = run_dir / "adapters"
    found = sorted(path.parent.name for path in folder.glob("*/adapter_model.safetensors"))
    selected = run_dir / "capabilities" / "selected.json"
    try:
        entries = json.loads(selected.read_text(encoding="utf-8")) if selected.is_file() else []
    except json.JSONDecodeError as exc:
        raise TraceRayError(f"{selected} is not valid JSON ({exc.msg}); fix it or rerun trace-ray identify run_dir={run_dir}") from None
    ready = {e["name"]: e for e in entries if e.get("status") == "READY" and e.get("name") in found}
    described = [TrainedAdapter(name, folder / name, e.get("description", ""), e.get("environment")) for name, e in ready.items()]
    others = [TrainedAdapter(name, folder / name, "", None) for name in found if name not in ready]
    return described + others

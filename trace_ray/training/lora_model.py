"""The trainable policy: the frozen base model with one LoRA adapter, and the adapter's export."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from trace_ray.config import LoRAConfig, ModelConfig


def peft_settings(lora: LoRAConfig) -> dict:
    """The adapter's settings as ``peft.LoraConfig`` keywords (what engines' ``load_adapter`` takes)."""
    return {
        "r": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
        "target_modules": list(lora.target_modules), "bias": "none", "task_type": "CAUSAL_LM",
    }


def trainable_model(model: ModelConfig, lora: LoRAConfig, seed: int, device: str = "cpu"):
    """(PEFT model on ``device`` with a fresh adapter ``default``, tokenizer); every rank with the same seed starts
    identical. ``model.dtype=auto`` is bfloat16 on a GPU, float32 on the CPU."""
    from peft import LoraConfig, get_peft_model

    from trace_ray.models import load_model

    network, tokenizer = load_model(model, device)
    for parameter in network.parameters():
        parameter.requires_grad_(False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(network, LoraConfig(**peft_settings(lora)))
    peft_model.train()
    return peft_model, tokenizer


def lora_parameters(peft_model) -> list[torch.nn.Parameter]:
    return [parameter for parameter in peft_model.parameters() if parameter.requires_grad]


def adapter_weights(peft_model) -> dict[str, torch.Tensor]:
    """The adapter's PEFT state dict on CPU (what rollout workers load)."""
    from peft import get_peft_model_state_dict

    return {key: tensor.detach().to("cpu").clone() for key, tensor in get_peft_model_state_dict(peft_model).items()}


def load_adapter_weights(peft_model, weights: dict[str, torch.Tensor]) -> None:
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(peft_model, weights)
    unexpected = getattr(result, "unexpected_keys", None)
    if unexpected:
        raise ValueError(f"checkpointed adapter weights fit no LoRA module: {unexpected[:3]}")


def export_adapter(peft_model, folder: Path) -> None:
    """A standard PEFT folder (adapter_config.json + adapter_model.safetensors) that peft and vLLM load.

    The files are written to a scratch folder and moved into ``folder`` one by
    one, so a reader never sees a half-written file; other files in ``folder``
    (the training metrics) stay.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".export-", dir=folder) as scratch:
        peft_model.save_pretrained(scratch, safe_serialization=True)
        for path in sorted(Path(scratch).iterdir()):
            if path.is_file():
                os.replace(path, folder / path.name)

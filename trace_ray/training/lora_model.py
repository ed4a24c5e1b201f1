"""The trainable policy: the frozen base model with one LoRA adapter, and the adapter's export."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from trace_ray.config import LoRAConfig, ModelConfig
from trace_ray.models import load_model
from trace_ray.training.parallel import whole


def peft_settings(lora: LoRAConfig) -> dict:
    """The adapter's settings as ``peft.LoraConfig`` keywords (what engines' ``load_adapter`` takes)."""
    return {
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": list(lora.target_modules),
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }


def trainable_model(
    model: ModelConfig, lora: LoRAConfig, seed: int, device: str = "cpu", dtype: torch.dtype | None = None
):
    """(PEFT model on ``device`` with a fresh adapter ``default``, tokenizer); every rank with the same seed starts
    identical. ``dtype`` (None: ``model.dtype`` on ``device``; ``auto`` is bfloat16 on a GPU, float32 on the CPU)."""
    from peft import LoraConfig, get_peft_model

    network, tokenizer = load_model(model, device, dtype)
    for parameter in network.parameters():
        parameter.requires_grad_(False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(network, LoraConfig(**peft_settings(lora)))
    peft_model.train()
    return peft_model, tokenizer


def lora_parameters(peft_model) -> list[torch.nn.Parameter]:
    return [parameter for parameter in peft_model.parameters() if parameter.requires_grad]


def lora_state(peft_model) -> dict[str, torch.Tensor]:
    """The LoRA parameters by their names in the model, whole (FSDP shards gathered: every Ray Train worker calls
    it)."""
    return {name: whole(parameter.detach()) for name, parameter in peft_model.named_parameters() if "lora_" in name}


def adapter_weights(peft_model) -> dict[str, torch.Tensor]:
    """The adapter's PEFT state dict on CPU (what rollout workers load); every Ray Train worker calls it together."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(peft_model, state_dict=lora_state(peft_model))
    return {key: tensor.to("cpu").clone() for key, tensor in state.items()}


def load_adapter_weights(peft_model, weights: dict[str, torch.Tensor]) -> None:
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(peft_model, weights)
    unexpected = getattr(result, "unexpected_keys", None)
    if unexpected:
        raise ValueError(f"checkpointed adapter weights fit no LoRA module: {unexpected[:3]}")


def export_adapter(peft_model, folder: Path, state: dict[str, torch.Tensor] | None = None) -> None:
    """A standard PEFT folder (adapter_config.json + adapter_model.safetensors) that peft and vLLM load; ``state``:
    :func:`lora_state`, gathered beforehand by every worker when the model is sharded.

    The files are written to a scratch folder and moved into ``folder`` one by
    one, so a reader never sees a half-written file; other files in ``folder``
    (the training metrics) stay.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".export-", dir=folder) as scratch:
        peft_model.save_pretrained(
            scratch,
            safe_serialization=True,
            state_dict={
                name: tensor.to("cpu")
                for name, tensor in (state if state is not None else lora_state(peft_model)).items()
            },
        )
        for path in sorted(Path(scratch).iterdir()):
            if path.is_file():
                os.replace(path, folder / path.name)

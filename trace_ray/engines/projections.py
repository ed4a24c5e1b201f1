"""Projections of a layer that read the same input, as one matrix product: queries, keys and values; gate and up.

On the CPU a decode step's matrix products are small and many (211 for
SmolLM2); joining the three attention projections into one and the MLP's
two into one cuts that to 121, and a larger matrix keeps the kernel busier
(all of them at 16 rows: 28.3 -> 26.0 ms on the 2-core machine). The
prepacked kernel computes each output column on its own, so every
projection's output is the same bits as its own layer's.

A projection wrapped by a PEFT LoRA layer gets its adapter's delta added the
way PEFT adds it (the base output plus ``B(A(dropout(x))) * scaling`` per
active adapter, or per token's adapter in a mixed batch). Any other wrapper
(the LoRA-MoE's gated layers) makes the group run each module's own forward.
"""

from __future__ import annotations

import torch

from trace_ray.engines.cpu_linear import pack, packed_linear, packing_available, weight_source


def is_peft_lora(module: torch.nn.Module) -> bool:
    return isinstance(getattr(module, "lora_A", None), torch.nn.ModuleDict) and isinstance(
        getattr(module, "base_layer", None), torch.nn.Linear
    )


def base_linear(module: torch.nn.Module) -> torch.nn.Linear | None:
    """The plain linear layer under ``module`` (itself, or a PEFT LoRA layer's base); None for anything else."""
    if isinstance(module, torch.nn.Linear):
        return module
    return module.base_layer if is_peft_lora(module) else None


def add_lora(module: torch.nn.Module, x: torch.Tensor, output: torch.Tensor, per_token: list[str] | None) -> None:
    """Add ``module``'s LoRA delta for input ``x`` to its base output ``output`` in place (nothing for a plain
    linear layer or disabled adapters); ``per_token``: each token's PEFT adapter name in a mixed batch."""
    if not is_peft_lora(module) or module.disable_adapters:
        return
    if module.merged:
        raise RuntimeError("a merged LoRA layer's base weight is not the fused one; unmerge it first")
    if per_token is None:
        for name in module.active_adapters:
            if name in module.lora_A:
                output += module.lora_B[name](module.lora_A[name](module.lora_dropout[name](x))) * module.scaling[name]
        return
    for name in set(per_token):
        if name in module.lora_A:
            rows = [index for index, token_name in enumerate(per_token) if token_name == name]
            lora = module.lora_B[name](module.lora_A[name](module.lora_dropout[name](x[rows])))
            output[rows] += lora * module.scaling[name]


class FusedProjections:
    """The base weights of linear layers that read the same input, packed side by side as one matrix."""

    def __init__(self, bases: list[torch.nn.Linear]):
        self.bases = bases
        self.sources = [weight_source(base.weight) for base in bases]
        self.packed = pack(torch.cat([base.weight for base in bases]))
        self.bias = None
        if any(base.bias is not None for base in bases):
            self.bias = torch.cat(
                [torch.zeros(base.out_features) if base.bias is None else base.bias.detach() for base in bases]
            )

    @classmethod
    def of(cls, modules: list[torch.nn.Module]) -> FusedProjections | None:
        """The fused base weights of ``modules`` (plain or PEFT LoRA linear layers, fp32 on the CPU), else None."""
        bases = [base_linear(module) for module in modules]
        if not packing_available() or any(
            base is None or base.weight.dtype != torch.float32 or not base.weight.is_cpu for base in bases
        ):
            return None
        return cls(bases)

    def holds(self, bases: list[torch.nn.Linear | None]) -> bool:
        """Whether ``bases`` are the layers fused here, their weights unchanged."""
        return all(
            base is fused and weight_source(base.weight) == source
            for base, fused, source in zip(bases, self.bases, self.sources)
        )


def joined(
    modules: list[torch.nn.Module], fused: FusedProjections | None, x: torch.Tensor, per_token: list[str] | None
) -> torch.Tensor:
    """``modules``' outputs for ``x`` side by side: one product on ``fused`` where it holds their base layers, else
    each module's own forward (``per_token``: each token's PEFT adapter name in a mixed batch)."""
    bases = [base_linear(module) for module in modules]
    if fused is None or not fused.holds(bases) or torch.is_grad_enabled() or x.dtype != torch.float32:
        return torch.cat([run(module, x, per_token) for module in modules], dim=-1)
    output = packed_linear(x, fused.packed, fused.bias)
    start = 0
    for module, base in zip(modules, bases):
        add_lora(module, x, output[:, start : start + base.out_features], per_token)
        start += base.out_features
    return output


def run(module: torch.nn.Module, x: torch.Tensor, per_token: list[str] | None) -> torch.Tensor:
    """``module(x)``; a PEFT LoRA layer of a mixed batch gets each token's adapter."""
    return module(x, adapter_names=per_token) if per_token and is_peft_lora(module) else module(x)

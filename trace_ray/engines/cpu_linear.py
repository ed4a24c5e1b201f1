"""Linear layers on prepacked oneDNN weights (CPU, fp32 inference).

``torch.nn.functional.linear`` on a CPU repacks the weight matrix into the
matrix kernel's blocked layout on every call. A decode step multiplies a
few rows by every weight of the model, so that repacking, a full extra pass
over ~540 MB of SmolLM2's weights, was most of the step: all 211 linear
layers of the model took 69-71 ms at 4-16 rows with ``F.linear`` and 25-35 ms
with the weights packed once (``benchmarks/roofline.py`` measures both).
The packed kernel also computes each row on its own, so a row's output does
not depend on which other rows share its batch.

The packed copy is made when the layer is switched and kept while the weight is
unchanged: the engine's base weights are frozen (LoRA adapters are separate
modules that wrap these layers and keep their own weights). With gradients
enabled the layer runs ``F.linear`` on its own weight. The copy costs as
much memory as the weight (~540 MB for SmolLM2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ([out, in], fp32) in the matrix kernel's blocked layout, for :func:`packed_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` on the weight's :func:`pack`; each output column computed on its own, so a
    layer's columns come out the same inside a larger packed matrix (``projections.py``)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def weight_source(weight: torch.Tensor) -> tuple[int, int]:
    """What a packed copy was made from: the weight tensor and its version (moved by any in-place write)."""
    return id(weight), weight._version


class PackedLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose inference forward runs on a prepacked copy of its weight.

    The copy is remade if the weight changes (replaced, or written in place: its version counter moves), so a
    stale copy is never used."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.dtype != torch.float32:
            return F.linear(x, self.weight, self.bias)
        return packed_linear(x, self.packed(), self.bias)

    def packed(self) -> torch.Tensor:
        source = weight_source(self.weight)
        if getattr(self, "_packed_source", None) != source:
            self._packed_weight = pack(self.weight)
            self._packed_source = source
        return self._packed_weight


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def use_packed_linears(model: torch.nn.Module, later: frozenset = frozenset()) -> int:
    """Switch every fp32 ``nn.Linear`` of ``model`` on the CPU to :class:`PackedLinear`; returns how many.

    Each is packed now, not in the first generation's time, except those in ``later`` (packed on first use: their
    work usually runs fused with their siblings')."""
    if not packing_available():
        return 0
    switched = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and module.weight.dtype == torch.float32 and module.weight.is_cpu:
            module.__class__ = PackedLinear
            if module not in later:
                module.packed()
            switched += 1
    return switched

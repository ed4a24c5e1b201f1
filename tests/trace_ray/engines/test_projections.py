"""Projections joined into one product give each layer's own output, bit for bit, with PEFT's LoRA deltas added as
PEFT adds them; anything else (another wrapper, a changed weight) runs each layer's own forward."""

import pytest
import torch
from peft import LoraConfig, get_peft_model

from trace_ray.engines.cpu_linear import packing_available, use_packed_linears
from trace_ray.engines.projections import FusedProjections, joined

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN")


class Projections(torch.nn.Module):
    """Three projections of one input, on prepacked weights as in the engine."""

    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(48, 64, bias=True)
        self.k_proj = torch.nn.Linear(48, 16, bias=False)
        self.v_proj = torch.nn.Linear(48, 16, bias=True)
        use_packed_linears(self)

    def layers(self) -> list[torch.nn.Module]:
        return [self.q_proj, self.k_proj, self.v_proj]


def own_outputs(modules, x, adapter_names=None) -> torch.Tensor:
    """Each module's own forward, PEFT's LoRA layers given each row's adapter."""
    own = [
        module(x, adapter_names=adapter_names) if adapter_names and hasattr(module, "lora_A") else module(x)
        for module in modules
    ]
    return torch.cat(own, dim=-1)


@torch.no_grad()
def test_joined_plain_layers_give_each_layers_own_bits_for_any_number_of_rows():
    torch.manual_seed(0)
    network = Projections()
    fused = FusedProjections.of(network.layers())
    assert fused is not None
    for rows in (1, 3, 16, 70):
        x = torch.randn(rows, 48)
        assert torch.equal(joined(network.layers(), fused, x, None), own_outputs(network.layers(), x))


@torch.no_grad()
def test_peft_lora_deltas_are_added_as_peft_adds_them_single_mixed_and_disabled():
    torch.manual_seed(99)
    elsewhere = FusedProjections.of(Projections().layers())  # another network's layers
    torch.manual_seed(1)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(Projections(), config, adapter_name="one")
    model.add_adapter("two", config)
    torch.nn.init.normal_(model.base_model.model.v_proj.lora_B["two"].weight)
    model.eval()
    network = model.base_model.model
    x = torch.randn(6, 48)
    assert torch.equal(joined(network.layers(), elsewhere, x, None), own_outputs(network.layers(), x))
    fused = FusedProjections.of(network.layers())
    model.set_adapter("one")
    adapted = joined(network.layers(), fused, x, None)
    assert torch.equal(adapted, own_outputs(network.layers(), x))
    with model.disable_adapter():
        plain = joined(network.layers(), fused, x, None)
        assert torch.equal(plain, own_outputs(network.layers(), x))
    assert not torch.allclose(adapted, plain)
    names = ["one", "two", "__base__", "two", "one", "__base__"]
    mixed = joined(network.layers(), fused, x, names)
    assert torch.equal(mixed, own_outputs(network.layers(), x, adapter_names=names))
    assert torch.equal(mixed[2], plain[2]) and not torch.equal(mixed[1], mixed[4])


class Doubled(torch.nn.Module):
    def __init__(self, base: torch.nn.Linear):
        super().__init__()
        self.base = base

    def forward(self, x):
        return 2 * self.base(x)


@torch.no_grad()
def test_another_wrapper_or_a_changed_weight_runs_each_layers_own_forward():
    torch.manual_seed(2)
    network = Projections()
    fused = FusedProjections.of(network.layers())
    x = torch.randn(5, 48)
    network.k_proj.weight.mul_(3.0)  # written in place after fusing
    assert torch.equal(joined(network.layers(), fused, x, None), own_outputs(network.layers(), x))
    network.k_proj = Doubled(network.k_proj)
    assert FusedProjections.of(network.layers()) is None
    assert torch.equal(joined(network.layers(), fused, x, None), own_outputs(network.layers(), x))

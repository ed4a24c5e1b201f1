import pytest
import torch
import torch.nn.functional as F

from trace_ray.engines.cpu_linear import PackedLinear, packing_available, use_packed_linears

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN")


def packed_copy(linear: torch.nn.Linear) -> torch.nn.Linear:
    copy = torch.nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
    copy.load_state_dict(linear.state_dict())
    assert use_packed_linears(copy) == 1
    return copy


@pytest.mark.parametrize("bias", [False, True])
def test_a_packed_layer_computes_the_linear_map_and_each_row_on_its_own(bias):
    torch.manual_seed(0)
    plain = torch.nn.Linear(96, 160, bias=bias)
    packed = packed_copy(plain)
    rows = torch.randn(7, 96)
    with torch.no_grad():
        together = packed(rows)
        alone = torch.cat([packed(rows[index : index + 1]) for index in range(7)])
        assert torch.allclose(together, plain(rows), atol=1e-5)
        assert torch.equal(together, alone)  # a row's output does not depend on the rows beside it
        assert packed(rows.view(7, 1, 96)).shape == (7, 1, 160)


def test_a_changed_weight_is_repacked_and_gradients_flow_through_the_plain_path():
    torch.manual_seed(1)
    packed = packed_copy(torch.nn.Linear(32, 48))
    rows = torch.randn(3, 32)
    with torch.no_grad():
        before = packed(rows)
        packed.weight.mul_(2.0)  # written in place
        assert torch.allclose(packed(rows), F.linear(rows, packed.weight, packed.bias), atol=1e-5)
        assert not torch.allclose(packed(rows), before)
    packed.weight = torch.nn.Parameter(torch.zeros(48, 32))  # replaced
    with torch.no_grad():
        assert torch.equal(packed(rows), packed.bias.expand(3, 48))
    output = packed(rows).sum()
    output.backward()
    assert packed.weight.grad is not None and packed.weight.grad.abs().sum() > 0


def test_only_fp32_linears_are_switched():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4).to(torch.bfloat16))
    assert use_packed_linears(model) == 1
    assert type(model[0]) is PackedLinear and type(model[2]) is torch.nn.Linear

"""This machine's limits for the model: matrix GFLOP/s, memory bandwidth, and the prefill and decode bounds.

Measures, on this machine's CPU threads:
  - matrix products at the model's shapes (every linear layer's weight against 512 rows, as in a prefill):
    ``F.linear`` on fp32, the engine's prepacked fp32 kernel (``trace_ray/engines/cpu_linear.py``) and bf16;
  - memory bandwidth: reading a 1 GiB tensor, and copying it;
  - one pass over all the model's linear layers at 1, 8, 16 and 32 rows (what a decode step multiplies),
    with ``F.linear`` and with the packed kernel.
From the model's config it then derives the bounds the engine figures are set against:
  - prefill tokens/s <= peak GFLOP/s / FLOPs per token (linear layers and attention over ``context`` tokens);
  - decode tokens/s at batch B <= B / max(FLOPs / peak, bytes / bandwidth), the bytes being every weight once
    plus B rows of keys and values over ``context`` tokens.
The peak is the best fp32 kernel measured (the engine's default numerics), the bandwidth the read figure.

    python benchmarks/roofline.py [model=smollm2_135m] [context=850]
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trace_ray.console import print_table
from trace_ray.engines.cpu_linear import packing_available

BATCHES = (1, 8, 16, 32)
PREFILL_ROWS = 512


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    linear_weights: list[tuple[int, int]]  # (out, in) of every linear layer a token passes, lm_head last

    @classmethod
    def of(cls, config) -> ModelShape:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        q, kv, hidden = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim, config.hidden_size
        per_layer = [(q, hidden), (kv, hidden), (kv, hidden), (hidden, q)]
        per_layer += [(config.intermediate_size, hidden)] * 2 + [(hidden, config.intermediate_size)]
        return cls(
            config.num_hidden_layers,
            hidden,
            config.num_attention_heads,
            config.num_key_value_heads,
            head_dim,
            per_layer * config.num_hidden_layers + [(config.vocab_size, hidden)],
        )

    @property
    def weight_count(self) -> int:
        return sum(out * inner for out, inner in self.linear_weights)

    def flops_per_token(self, context: int, with_head: bool = True) -> float:
        """Linear layers (2 FLOPs a weight) plus attention (QK^T and PV) over ``context`` keys."""
        weights = self.weight_count - (0 if with_head else self.linear_weights[-1][0] * self.linear_weights[-1][1])
        return 2 * weights + 4 * self.layers * self.heads * self.head_dim * context

    def kv_bytes_per_token(self, element_bytes: int = 4) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * element_bytes


def decode_bound(shape: ModelShape, batch: int, context: int, gflops: float, bandwidth_gbs: float) -> float:
    """Tokens/s a decode step of ``batch`` rows over ``context`` tokens cannot beat on this machine (fp32)."""
    flops = batch * shape.flops_per_token(context)
    moved = 4 * shape.weight_count + batch * context * shape.kv_bytes_per_token()
    return batch / max(flops / (gflops * 1e9), moved / (bandwidth_gbs * 1e9))


def prefill_bound(shape: ModelShape, context: int, gflops: float) -> float:
    """Prompt tokens/s a prefill cannot beat: compute-bound, no lm_head (only the last position's logits)."""
    return gflops * 1e9 / shape.flops_per_token(context, with_head=False)


def seconds(function, repeats: int) -> float:
    function()
    started = time.perf_counter()
    for _ in range(repeats):
        function()
    return (time.perf_counter() - started) / repeats


def linear_kernels() -> dict[str, callable]:
    """name -> (weights -> function(x, index)) for each matrix kernel measured."""
    kernels = {"F.linear fp32": lambda weights: lambda x, index: F.linear(x, weights[index])}
    if packing_available():

        def packed(weights):
            packs = [torch.ops.mkldnn._reorder_linear_weight(weight, None) for weight in weights]
            return lambda x, index: torch.ops.mkldnn._linear_pointwise(x, packs[index], None, "none", [], "")

        kernels["packed fp32 (engine)"] = packed
    return kernels


@dataclass
class Machine:
    gflops: dict[str, float]  # kernel -> GFLOP/s at the prefill shapes
    read_gbs: float
    copy_gbs: float
    pass_ms: dict[str, dict[int, float]]  # kernel -> rows -> ms for one pass over every linear layer

    @property
    def peak_fp32(self) -> float:
        return max(value for name, value in self.gflops.items() if "fp32" in name)


def measure(shape: ModelShape) -> Machine:
    torch.manual_seed(0)
    weights = [torch.randn(out, inner) * 0.02 for out, inner in shape.linear_weights]
    distinct = sorted(set(shape.linear_weights[:7]))  # one layer's shapes, for the compute-bound figure
    gflops, pass_ms = {}, {}
    for name, make in linear_kernels().items():
        sample = [torch.randn(out, inner) * 0.02 for out, inner in distinct]
        run = make(sample)
        inputs = [torch.randn(PREFILL_ROWS, inner) for _, inner in distinct]
        took = seconds(lambda run=run, inputs=inputs: [run(x, index) for index, x in enumerate(inputs)], 5)
        gflops[name] = sum(2 * PREFILL_ROWS * out * inner for out, inner in distinct) / took / 1e9
        run = make(weights)
        pass_ms[name] = {}
        for rows in BATCHES:
            inputs = {inner: torch.randn(rows, inner) for _, inner in shape.linear_weights}
            pass_ms[name][rows] = 1e3 * seconds(
                lambda run=run, inputs=inputs: [
                    run(inputs[inner], index) for index, (_, inner) in enumerate(shape.linear_weights)
                ],
                5,
            )
    bf16 = [torch.randn(out, inner, dtype=torch.bfloat16) for out, inner in distinct]
    inputs = [torch.randn(PREFILL_ROWS, inner, dtype=torch.bfloat16) for _, inner in distinct]
    took = seconds(lambda: [F.linear(inputs[index], bf16[index]) for index in range(len(distinct))], 5)
    gflops["F.linear bf16"] = sum(2 * PREFILL_ROWS * out * inner for out, inner in distinct) / took / 1e9
    big = torch.randn(256 * 1024 * 1024)  # 1 GiB
    read = big.numel() * 4 / seconds(big.sum, 5) / 1e9
    target = torch.empty_like(big)
    copied = 2 * big.numel() * 4 / seconds(lambda: target.copy_(big), 5) / 1e9
    return Machine(gflops, read, copied, pass_ms)


def main() -> None:
    from trace_ray.config_compose import compose_config
    from trace_ray.models import load_model

    options = dict(argument.split("=", 1) for argument in sys.argv[1:])
    context = int(options.pop("context", 850))
    config = compose_config("evaluate", [f"{key}={value}" for key, value in options.items()])
    network, _ = load_model(config.model)
    shape = ModelShape.of(network.config)
    del network
    machine = measure(shape)
    weights_mb = 4 * shape.weight_count / 1e6
    print_table(
        f"this machine ({torch.get_num_threads()} threads)",
        ["figure", "value"],
        [
            *[
                (f"{name} GFLOP/s ({PREFILL_ROWS} rows x the model's shapes)", f"{v:.0f}")
                for name, v in machine.gflops.items()
            ],
            ("memory read GB/s (1 GiB)", f"{machine.read_gbs:.1f}"),
            ("memory copy GB/s (read + write)", f"{machine.copy_gbs:.1f}"),
        ],
    )
    print_table(
        f"one pass over every linear layer ({len(shape.linear_weights)} layers, {weights_mb:.0f} MB fp32), ms",
        ["kernel", *[f"{rows} rows" for rows in BATCHES], "GB/s at 1 row"],
        [
            (name, *[f"{by_rows[rows]:.1f}" for rows in BATCHES], f"{weights_mb / by_rows[1]:.1f}")
            for name, by_rows in machine.pass_ms.items()
        ],
    )
    print_table(
        f"bounds of {config.model.name} at {context} tokens of context (fp32, peak {machine.peak_fp32:.0f} GFLOP/s, "
        f"{machine.read_gbs:.1f} GB/s)",
        ["batch", "decode tokens/s bound", "bound on a step, ms"],
        [
            (batch, f"{bound:.0f}", f"{1e3 * batch / bound:.1f}")
            for batch in BATCHES
            for bound in [decode_bound(shape, batch, context, machine.peak_fp32, machine.read_gbs)]
        ],
    )
    print(f"prefill bound: {prefill_bound(shape, context, machine.peak_fp32):.0f} prompt tokens/s at {context} tokens")


if __name__ == "__main__":
    main()

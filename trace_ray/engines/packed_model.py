"""One forward pass over the new tokens of every row of a batch, packed, through a Llama-family model's own modules.

transformers' forward takes a rectangular batch: rows padded to one width,
a padding mask, and a KV cache that every row holds whole. A continuous
batch is ragged (most rows add one token, a joining row its whole prompt)
and its rows share a long prefix, so that shape costs a copy of the prefix
per row, attention over it per row, a mask rebuilt per layer and a second
pass over the weights whenever a row joins. :class:`PackedModel` runs the
same modules (embeddings, norms, projections, MLP, head; PEFT's LoRA layers
and the engine's prepacked linears wrap them) on the batch's new tokens laid
end to end, ``[tokens, hidden]``: the projections and the MLP see every
token of every row in one matrix product (on the CPU, queries, keys and
values joined into one, and the MLP's gate and up: ``projections.py``),
rotary embeddings come from a table, and attention runs per group of rows
over the shared prefixes and the rows' own tokens (``kv_store.attend``). The
numbers are those of the model's own forward up to float rounding in
attention. On the CPU the model's linear layers are switched to prepacked
weights (``cpu_linear.py``) when the packed model is made.

Supported: decoder-only models of the Llama family (``llama``, ``qwen2``,
``qwen3``) without sliding-window attention; others are refused with one
line naming ``engine=vllm``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from environments.errors import TraceRayError
from trace_ray.engines.cpu_linear import use_packed_linears
from trace_ray.engines.kv_store import SlotStore, attend, plan_groups
from trace_ray.engines.projections import FusedProjections, joined, run

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


def check_supported(config) -> None:
    """Refuse a model the packed forward cannot run, in one line."""
    sliding = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    if config.model_type not in SUPPORTED_MODEL_TYPES or sliding:
        what = f"{config.model_type} with sliding-window attention" if sliding else config.model_type
        raise TraceRayError(
            f"engine=hf runs decoder models of the Llama family ({', '.join(SUPPORTED_MODEL_TYPES)}), not "
            f"{what}; use engine=vllm for this model"
        )


@dataclass
class Step:
    """The new tokens of each row of the batch, and the rows whose logits are wanted at every new token (the others:
    at their last one)."""

    tokens: list[list[int]]
    every_position: list[bool]


def swap_halves(x: torch.Tensor) -> torch.Tensor:
    """``x`` with the two halves of its last dimension swapped (the rotary embedding's rotation, its sign kept in
    the sine table)."""
    half = x.shape[-1] // 2
    return x.unflatten(-1, (2, half)).flip(-2).flatten(-2)


def rms_norm(module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` for the model's RMS norm; in float32 torch's own op, which gives the same numbers in fewer
    steps (in other dtypes the module casts to float32 and back, which the op does not)."""
    if x.dtype == torch.float32:
        return torch.nn.functional.rms_norm(x, x.shape[-1:], module.weight, module.variance_epsilon)
    return module(x)


class PackedModel:
    """A causal LM's forward over packed new tokens, keeping keys and values in a :class:`SlotStore`."""

    def __init__(self, model):
        check_supported(model.config)
        self.model = model  # LlamaForCausalLM (or a sibling), PEFT layers injected in place when adapters load
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.layers = config.num_hidden_layers
        self._cos = self._sin = None  # rotary tables, grown as positions need (the sine's first half negated)
        self.fused = [(None, None)] * self.layers  # per layer: queries-keys-values and gate-up joined, on the CPU
        if self.device.type == "cpu":
            self.fused = [
                (
                    FusedProjections.of([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]),
                    FusedProjections.of([layer.mlp.gate_proj, layer.mlp.up_proj]),
                )
                for layer in model.model.layers
            ]
            joined_bases = frozenset(base for pair in self.fused for fused in pair if fused for base in fused.bases)
            use_packed_linears(model, later=joined_bases)

    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.lm_head.weight.dtype

    def new_store(self) -> SlotStore:
        return SlotStore(self.layers, self.kv_heads, self.head_dim, self.dtype, self.device)

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ([tokens, 1, head_dim]) at ``positions``, from the model's rotary embedding."""
        needed = int(positions.max()) + 1
        if self._cos is None or self._cos.shape[0] < needed:
            size = max(needed, 2 * (0 if self._cos is None else self._cos.shape[0]), 1024)
            probe = torch.zeros((), dtype=self.dtype, device=self.device)
            cos, sin = self.model.model.rotary_emb(probe, torch.arange(size, device=self.device)[None])
            half = sin.shape[-1] // 2
            self._cos, self._sin = cos[0], torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)
        return self._cos[positions][:, None], self._sin[positions][:, None]

    @torch.no_grad()
    def forward(self, store: SlotStore, step: Step, adapter_names: list[str] | None = None) -> torch.Tensor:
        """Run every row's new tokens (row ``i`` of the batch is slot ``i`` of ``store``), write their keys and
        values after the row's own tokens (the caller counts those it keeps: ``store.grow``), and return the logits
        wanted ([sum over rows of 1 or its token count, vocab], row by row).

        ``adapter_names``: a PEFT adapter per row for a batch that mixes them (None: as the model is set)."""
        device = self.device
        widths = [len(tokens) for tokens in step.tokens]
        store.reserve(widths)
        rows, columns, positions, wanted = [], [], [], []
        for row, (tokens, every) in enumerate(zip(step.tokens, step.every_position)):
            own, start = store.lengths[row], store.position(row)
            rows += [row] * len(tokens)
            columns += range(own, own + len(tokens))
            positions += range(start, start + len(tokens))
            end = len(positions)
            wanted += range(end - len(tokens), end) if every else [end - 1]
        rows_t = torch.tensor(rows, device=device)
        columns_t = torch.tensor(columns, device=device)
        positions_t = torch.tensor(positions, device=device)
        flat = torch.tensor([token for tokens in step.tokens for token in tokens], device=device)
        groups = plan_groups(store, widths, self.heads // self.kv_heads, device)
        spans = [(sum(widths[: group.first]), group.count * group.width) for group in groups]
        per_token = None
        if adapter_names is not None:
            per_token = [name for name, width in zip(adapter_names, widths) for _ in range(width)]

        cos, sin = self._rotary(positions_t)
        model = self.model.model
        hidden = model.embed_tokens(flat)
        attended = self.heads + self.kv_heads  # heads of queries and keys, side by side in the joined projection
        for index, layer in enumerate(model.layers):
            attention, mlp = layer.self_attn, layer.mlp
            joined_qkv, joined_gate_up = self.fused[index]
            normed = rms_norm(layer.input_layernorm, hidden)
            qkv = joined([attention.q_proj, attention.k_proj, attention.v_proj], joined_qkv, normed, per_token)
            qkv = qkv.view(len(flat), attended + self.kv_heads, self.head_dim)
            both, values = qkv[:, :attended], qkv[:, attended:]
            if hasattr(attention, "q_norm"):
                queries, keys = both.split([self.heads, self.kv_heads], dim=1)
                both = torch.cat([attention.q_norm(queries), attention.k_norm(keys)], dim=1)
            # the rotary embedding of queries and keys in one go
            queries, keys = (both * cos + swap_halves(both) * sin).split([self.heads, self.kv_heads], dim=1)
            store.write(index, rows_t, columns_t, keys, values)
            if len(groups) == 1:
                mixed = attend(store, index, groups[0], queries, attention.scaling)
            else:
                mixed = torch.cat(
                    [
                        attend(store, index, group, queries[start : start + size], attention.scaling)
                        for group, (start, size) in zip(groups, spans)
                    ]
                )
            hidden = hidden + run(attention.o_proj, mixed.reshape(len(flat), -1), per_token)
            normed = rms_norm(layer.post_attention_layernorm, hidden)
            gate, up = joined([mlp.gate_proj, mlp.up_proj], joined_gate_up, normed, per_token).chunk(2, dim=-1)
            hidden = hidden + run(mlp.down_proj, mlp.act_fn(gate) * up, per_token)
        return self.model.lm_head(rms_norm(model.norm, hidden[torch.tensor(wanted, device=device)]))

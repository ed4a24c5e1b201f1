"""``router=moe``: a LoRA mixture-of-experts, a learned gate at every adapted layer over frozen capability adapters.

The gated model is the base causal LM with every linear layer that some
adapter adapts replaced, in place, by a :class:`GatedLoRALinear`::

    y = W x + sum over e in topk(gate(x)) of  w_e * s_e * B_e A_e x

Each layer offers the adapters that adapt it (PEFT LoRA state dicts; each
adapter keeps its own rank, ``s_e = lora_alpha / r`` and target modules),
then ``base`` (no delta). ``gate`` is the layer's own ``nn.Linear(in_features,
options)`` in float32 over each token's input, RMS-normalized first (the
inputs of ``o_proj`` and ``down_proj`` are orders of magnitude smaller than
the others), so every token picks its options at every layer. With
``top_k`` = 1 the chosen option's weight is 1; with k > 1 the weights are the
softmax of the top-k gate logits. The base weights and the adapters are
frozen; only the gates train. It is a plain torch wrap: PEFT is needed
neither to build nor to run it.

Training (:func:`fit_moe`) uses oracle labels, one option per task prompt.
Each gate learns, at the prompt's last token (the position the reply is
generated from), to name the label: cross-entropy of every gate's logits
against the label (``base`` at layers the label's adapter leaves alone),
plus ``load_balance_coef`` times the Switch-Transformer balance loss per
layer (options * sum_i f_i P_i over the batch: f_i the share of prompts
whose top gate logit is i, P_i the mean gate probability of i), averaged
over layers. AdamW on the gates only, ``epochs`` passes over the prompts in
shuffled mini-batches; the same seed gives the same gates.

Two choices differ from plain teacher forcing, both measured on the test
setup (tiny random model, 54 prompts of three topics, chance 33%; accuracy
of the free-routing decision on the training prompts): (1) in training,
every token of a prompt runs through one option at every layer, drawn at
random (seeded) per prompt and step, not the label's: on the label's own
path a gate learns to read the adapter's imprint on the hidden states
instead of the task (100% right when the path is forced to the label, 67%
when the gates route freely), while random paths teach it the task on
whatever path free routing takes (100%). (2) Only the last token trains
and decides: earlier tokens see only the text before them, and a shared
prefix (system prompt, policy) reads the same for every task, so training
on all tokens mostly teaches the label prior (57%).

The decision per task (:class:`MoERouter`, for accuracy against the oracle
labels) runs the gated model with free routing over the task's first
observation rendered with the chat template and the generation prompt, and
reads the routing slots (one per adapted layer) of the prompt's last token.
``scores[o]`` is the share of the slots offering ``o`` that chose it,
``probabilities[o]`` the mean gate probability of ``o`` over those slots;
the highest score wins, ties to ``base``. When all adapters adapt the same
modules every slot offers every option and the scores are plain shares.

Generation runs on the HF engine (:func:`moe_engine`): the gated network is
handed to ``HFEngine`` and generates with ``adapter=None``. A gate reads
only its own token's input, so a token routes the same way in a prefill, a
decode step or a cached prefix, and the engine's KV caches stay valid. That
engine loads no PEFT adapters besides: the modules they target are gated
layers now. vLLM's multi-LoRA serves one adapter per request and cannot mix
adapters per token or per layer, so the MoE cannot run on vLLM. The cost:
the HF engine's throughput, far below vLLM's on a GPU, plus a gate and
every adapter's delta at every adapted layer, for every token. Measured on
one CPU thread of a busy machine, 4 rows, the two adapters of the tests
(r = 4 on q_proj, v_proj, down_proj; r = 2 on q_proj, o_proj, up_proj),
against the plain model: SmolLM2-135M prefill of 256 tokens 1.15x (one PEFT
adapter: 1.03x), decode step 1.24x (PEFT: 1.07x); the tiny random model
1.5x and 1.65x.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from environments.errors import TraceRayError
from trace_ray.artifacts import atomic_path
from trace_ray.config import MoEConfig
from trace_ray.engines.hf import HFEngine
from trace_ray.models import assigned_device, load_model
from trace_ray.routing.adapters import read_peft_folder
from trace_ray.routing.learned_gate import check_labels
from trace_ray.routing.logit_router import BASE, RouteDecision, decide

__all__ = [
    "BASE",
    "GatedLoRALinear",
    "LoRAMoE",
    "MoERouter",
    "fit_moe",
    "gate_model",
    "load_moe",
    "moe_engine",
    "prompt_ids",
    "save_moe",
]

GATE_WEIGHTS = "moe_gates.safetensors"
MOE_CARD = "moe.json"
PEFT_KEY = re.compile(r"base_model\.model\.(.+)\.lora_([AB])\.weight")

Adapters = dict[str, tuple[dict[str, torch.Tensor], dict]]  # name -> (PEFT state dict, LoRA settings), in option order


def routing_weights(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """[..., options] weight of each option: 1 on the top option (k = 1), else the softmax over the top k, 0
    elsewhere."""
    top = logits.topk(top_k, dim=-1)
    weights = torch.ones_like(top.values) if top_k == 1 else torch.softmax(top.values, dim=-1)
    return torch.zeros_like(logits).scatter(-1, top.indices, weights)


class GatedLoRALinear(nn.Module):
    """A frozen linear layer plus its adapters' LoRA deltas, mixed per token by a trainable gate."""

    def __init__(
        self, base: nn.Linear, options: list[str], loras: list[tuple[torch.Tensor, torch.Tensor, float]], top_k: int
    ):
        super().__init__()
        self.base = base
        self.options = options  # the adapters that adapt this layer, then BASE
        self.lora_A = nn.ParameterList([nn.Parameter(a, requires_grad=False) for a, _, _ in loras])
        self.lora_B = nn.ParameterList([nn.Parameter(b, requires_grad=False) for _, b, _ in loras])
        self.scales = [scale for _, _, scale in loras]
        self.gate = nn.Linear(base.in_features, len(options), device=base.weight.device, dtype=torch.float32)
        self.top_k = min(top_k, len(options))
        self.route_to: str | list[str] | None = None  # forced routing: one option for all rows, or one per row
        # when a list, each forward appends its last position's gate logits
        self.record: list[torch.Tensor] | None = None

    def gate_logits(self, x: torch.Tensor) -> torch.Tensor:
        """[..., options] gate logits of the RMS-normalized inputs (float32)."""
        x = x.float()
        return self.gate(x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6))

    def forced_weights(self, x: torch.Tensor) -> torch.Tensor:
        """One-hot weights of ``route_to`` (the base where this layer does not offer the option)."""
        names = [self.route_to] if isinstance(self.route_to, str) else self.route_to
        index = [self.options.index(name) if name in self.options else len(self.options) - 1 for name in names]
        weights = nn.functional.one_hot(torch.tensor(index, device=x.device), len(self.options)).float()
        return weights if isinstance(self.route_to, str) else weights.view(len(index), *[1] * (x.dim() - 2), -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.record is not None:
            self.record.append(self.gate_logits(x[..., -1, :]))
        weights = (
            self.forced_weights(x) if self.route_to is not None else routing_weights(self.gate_logits(x), self.top_k)
        )
        weights = weights.to(x.dtype)
        output = self.base(x)
        for index, (a, b, scale) in enumerate(zip(self.lora_A, self.lora_B, self.scales)):
            output = output + (weights[..., index : index + 1] * scale) * ((x @ a.T) @ b.T)
        return output


@dataclass
class LoRAMoE:
    """A base network with its adapted linear layers gated in place."""

    network: nn.Module
    names: list[str]  # the adapters, then BASE
    layers: dict[str, GatedLoRALinear]  # module name -> gated layer, in network order
    top_k: int
    metrics: dict = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return next(self.network.parameters()).device

    def gate_parameters(self) -> list[nn.Parameter]:
        return [parameter for layer in self.layers.values() for parameter in layer.gate.parameters()]

    @contextlib.contextmanager
    def forced(self, route_to: str | list[str]):
        """Route every token to ``route_to`` (an option, or one per batch row) at every layer, gates ignored."""
        unknown = sorted(({route_to} if isinstance(route_to, str) else set(route_to)) - set(self.names))
        if unknown:
            raise ValueError(f"cannot route to {unknown}: the options are {self.names}")
        for layer in self.layers.values():
            layer.route_to = route_to
        try:
            yield
        finally:
            for layer in self.layers.values():
                layer.route_to = None

    @contextlib.contextmanager
    def recording(self):
        """{layer name: [gate logits of the last position, one per forward]} filled while the context is open."""
        records = {name: [] for name in self.layers}
        for name, layer in self.layers.items():
            layer.record = records[name]
        try:
            yield records
        finally:
            for layer in self.layers.values():
                layer.record = None


def _adapter_modules(
    name: str, weights: dict[str, torch.Tensor], lora_config: dict
) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
    """{module name: (A, B, scale)} of one PEFT LoRA state dict."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in weights.items():
        match = PEFT_KEY.fullmatch(key)
        if match is None:
            raise TraceRayError(
                f"adapter {name!r} has weight {key!r}, not a LoRA A/B of a linear layer; the MoE mixes "
                "plain LoRA adapters only"
            )
        pairs.setdefault(match[1], {})[match[2]] = tensor
    rank, alpha = lora_config.get("r"), lora_config.get("lora_alpha")
    if not rank or alpha is None:
        raise TraceRayError(
            f"adapter {name!r} has no r and lora_alpha in its LoRA settings; read it with read_peft_folder"
        )
    modules = {}
    for module, pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise TraceRayError(
                f"adapter {name!r} has lora_{''.join(pair)} but not both A and B for {module}; re-export the adapter"
            )
        if pair["A"].shape[0] != rank or pair["B"].shape[1] != rank:
            raise TraceRayError(
                f"adapter {name!r} has rank {pair['A'].shape[0]} at {module}, not r={rank}; per-module "
                "ranks are not supported"
            )
        modules[module] = (pair["A"], pair["B"], alpha / rank)
    return modules


def gate_model(network: nn.Module, adapters: Adapters, top_k: int = 1, seed: int = 0) -> LoRAMoE:
    """Gate ``network`` in place over ``adapters``; every network weight is frozen, the gates (seeded) are not."""
    if not adapters or BASE in adapters:
        raise TraceRayError(f"the MoE needs at least one adapter and none named {BASE!r}; got {list(adapters)}")
    if top_k < 1:
        raise ValueError(f"router.moe.top_k must be at least 1, not {top_k}")
    if any(isinstance(module, GatedLoRALinear) for module in network.modules()):
        raise TraceRayError("the network is already gated; load a fresh base model for another MoE")
    per_adapter = {name: _adapter_modules(name, *pair) for name, pair in adapters.items()}
    targets = {module for modules in per_adapter.values() for module in modules}
    linears = {name: module for name, module in network.named_modules() if name in targets}
    missing = sorted(targets - set(linears))
    if missing:
        raise TraceRayError(
            f"adapter modules {missing[:3]} are not in the network; the adapters were trained on another model"
        )
    for module_name, base in linears.items():
        if type(base) is not nn.Linear:
            raise TraceRayError(
                f"{module_name} is a {type(base).__name__}, not a plain nn.Linear; the MoE gates linear layers only"
            )
    for name, modules in per_adapter.items():
        for module_name, (a, b, _) in modules.items():
            if a.shape[1] != linears[module_name].in_features or b.shape[0] != linears[module_name].out_features:
                raise TraceRayError(
                    f"adapter {name!r} does not fit {module_name}: shapes {tuple(a.shape)}, {tuple(b.shape)}; it was "
                    "trained on another model"
                )
    for parameter in network.parameters():
        parameter.requires_grad_(False)
    layers = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for module_name, base in linears.items():
            offered = [name for name in adapters if module_name in per_adapter[name]]
            loras = []
            for name in offered:
                a, b, scale = per_adapter[name][module_name]
                loras.append((a.to(base.weight), b.to(base.weight), scale))
            layers[module_name] = GatedLoRALinear(base, [*offered, BASE], loras, top_k)
    for module_name, layer in layers.items():
        parent, _, child = module_name.rpartition(".")
        setattr(network.get_submodule(parent), child, layer)
    return LoRAMoE(network, [*adapters, BASE], layers, top_k)


def prompt_ids(tokenizer, first_observation: list[dict]) -> list[int]:
    """A task's first observation (system policy + first user message) with the chat template and generation prompt."""
    messages = [message for message in first_observation if isinstance(message, dict)]
    if not messages:
        raise ValueError("the first observation has no messages; route an episode's first messages (system + user)")
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def _batch(prompts: list[list[int]], pad_token_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Left-padded ``input_ids``, ``attention_mask`` and ``position_ids`` (the last column is every prompt's last
    token)."""
    width = max(len(prompt) for prompt in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    return {"input_ids": input_ids.to(device), "attention_mask": mask.to(device), "position_ids": positions.to(device)}


def _pad_id(tokenizer) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    return pad if pad is not None else (getattr(tokenizer, "eos_token_id", None) or 0)


def _last_logits(moe: LoRAMoE, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """{layer: [rows, options] gate logits at each prompt's last token} of one forward pass of the gated network."""
    with moe.recording() as records:
        moe.network(**batch, use_cache=False, logits_to_keep=1)
    return {name: logits[0] for name, logits in records.items()}


def _loss(
    moe: LoRAMoE, logits: dict[str, torch.Tensor], labels: list[str], balance: float
) -> tuple[torch.Tensor, float]:
    """(cross-entropy against the labels + ``balance`` x load balancing, averaged over layers; share of slots right)."""
    losses, right, slots = [], 0, 0
    for name, layer_logits in logits.items():
        options = moe.layers[name].options
        targets = torch.tensor(
            [options.index(label) if label in options else len(options) - 1 for label in labels],
            device=layer_logits.device,
        )
        top = layer_logits.argmax(dim=-1)
        share = nn.functional.one_hot(top, len(options)).float().mean(dim=0)
        balance_loss = len(options) * (share * layer_logits.softmax(dim=-1).mean(dim=0)).sum()
        losses.append(nn.functional.cross_entropy(layer_logits, targets) + balance * balance_loss)
        right += int((top == targets).sum())
        slots += len(labels)
    return torch.stack(losses).mean(), right / slots


def fit_moe(
    network: nn.Module,
    tokenizer,
    adapters: Adapters,
    examples: list[list[int]],
    labels: list[str],
    settings: MoEConfig,
    seed: int = 0,
    batch_size: int = 8,
) -> LoRAMoE:
    """Gate ``network`` in place over ``adapters`` and train the gates on prompts ``examples`` labelled with options.

    ``examples`` are token ids (see :func:`prompt_ids`); ``labels`` name an adapter or ``base`` each.
    """
    if len(examples) != len(labels) or any(not example for example in examples):
        raise ValueError(f"{len(examples)} examples and {len(labels)} labels: give one non-empty prompt per label")
    check_labels(labels, [*adapters, BASE])
    if settings.epochs < 1 or settings.lr <= 0:
        raise ValueError(
            f"router.moe.epochs must be at least 1 and router.moe.lr positive, not {settings.epochs} and {settings.lr}"
        )
    moe = gate_model(network, adapters, settings.top_k, seed)
    network.eval()
    optimizer = torch.optim.AdamW(moe.gate_parameters(), lr=settings.lr)
    order = torch.Generator().manual_seed(seed)
    pad = _pad_id(tokenizer)
    for _ in range(settings.epochs):
        losses, accuracies = [], []
        for rows in torch.randperm(len(examples), generator=order).split(batch_size):
            batch = _batch([examples[row] for row in rows], pad, moe.device)
            paths = [moe.names[int(index)] for index in torch.randint(len(moe.names), (len(rows),), generator=order)]
            with moe.forced(paths):
                logits = _last_logits(moe, batch)
            loss, accuracy = _loss(moe, logits, [labels[row] for row in rows], settings.load_balance_coef)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            accuracies.append(accuracy)
    decisions = _decisions(moe, examples, pad, batch_size)
    moe.metrics = {
        "train_loss": sum(losses) / len(losses),
        "train_slot_accuracy": sum(accuracies) / len(accuracies),  # last epoch, on the random paths
        "train_accuracy": sum(d.choice == label for d, label in zip(decisions, labels)) / len(labels),
        "label_counts": {name: labels.count(name) for name in moe.names},
    }
    return moe


@torch.no_grad()
def _decisions(moe: LoRAMoE, prompts: list[list[int]], pad_token_id: int, batch_size: int) -> list[RouteDecision]:
    """Each prompt's decision from the routing slots of its last token (free routing, gates as trained)."""
    offered = {name: sum(name in layer.options for layer in moe.layers.values()) for name in moe.names}
    decisions = []
    for start in range(0, len(prompts), batch_size):
        batch = _batch(prompts[start : start + batch_size], pad_token_id, moe.device)
        rows = [({name: 0 for name in moe.names}, {name: 0.0 for name in moe.names}) for _ in batch["input_ids"]]
        for name, logits in _last_logits(moe, batch).items():
            layer = moe.layers[name]
            weights, probabilities = routing_weights(logits, layer.top_k).tolist(), logits.softmax(dim=-1).tolist()
            for (chosen, probability), row_weights, row_probabilities in zip(rows, weights, probabilities):
                for option, weight, option_probability in zip(layer.options, row_weights, row_probabilities):
                    chosen[option] += weight > 0
                    probability[option] += option_probability
        for chosen, probability in rows:
            scores = {name: chosen[name] / offered[name] for name in moe.names}
            decisions.append(
                RouteDecision(
                    decide(scores).choice, scores, {name: probability[name] / offered[name] for name in moe.names}
                )
            )
    return decisions


class MoERouter:
    """Routes a task by the MoE's gates on its first observation; the same interface as ``LogitRouter``."""

    def __init__(self, moe: LoRAMoE, tokenizer, batch_size: int = 8):
        self.moe, self.tokenizer, self.batch_size = moe, tokenizer, batch_size
        self.names = moe.names

    def route(self, first_observation: list[dict]) -> RouteDecision:
        return self.route_many([first_observation])[0]

    def route_many(self, observations: list[list[dict]]) -> list[RouteDecision]:
        prompts = [prompt_ids(self.tokenizer, observation) for observation in observations]
        return _decisions(self.moe, prompts, _pad_id(self.tokenizer), self.batch_size)


def save_moe(folder: Path, moe: LoRAMoE, adapter_folders: dict[str, str]) -> None:
    """``folder/moe_gates.safetensors`` (each gate's weight and bias, keyed by layer) and ``moe.json`` (options,
    layers, metrics)."""
    from safetensors.torch import save_file

    if set(adapter_folders) != set(moe.names[:-1]):
        raise ValueError(f"adapter folders {sorted(adapter_folders)} do not match the MoE's adapters {moe.names[:-1]}")
    state = {
        f"{name}.{key}": value.detach().cpu().contiguous()
        for name, layer in moe.layers.items()
        for key, value in layer.gate.state_dict().items()
    }
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / GATE_WEIGHTS) as scratch:
        save_file(state, scratch)
    card = {
        "router": "moe",
        "options": moe.names,
        "top_k": moe.top_k,
        "adapters": {name: str(adapter_folders[name]) for name in moe.names[:-1]},
        "layers": {name: layer.options for name, layer in moe.layers.items()},
        "metrics": moe.metrics,
    }
    with atomic_path(folder / MOE_CARD) as scratch:
        Path(scratch).write_text(json.dumps(card, indent=2), encoding="utf-8")


def load_moe(folder: Path, network: nn.Module, adapters: Adapters) -> LoRAMoE:
    """Gate ``network`` in place with the gates saved in ``folder``; one-line errors for other adapters or layers."""
    from safetensors.torch import load_file

    card_path = folder / MOE_CARD
    if not card_path.is_file() or not (folder / GATE_WEIGHTS).is_file():
        raise TraceRayError(f"no MoE gates in {folder}; run trace-ray route run_dir=... first, or use router=logit")
    card = json.loads(card_path.read_text(encoding="utf-8"))
    if sorted(card["options"][:-1]) != sorted(adapters):
        raise TraceRayError(
            f"the MoE in {folder} mixes {card['options'][:-1]}, but the adapters given are {sorted(adapters)}; rerun "
            "trace-ray route"
        )
    moe = gate_model(network, {name: adapters[name] for name in card["options"][:-1]}, card["top_k"])
    layers = {name: layer.options for name, layer in moe.layers.items()}
    if layers != card["layers"]:
        changed = sorted(
            name for name in set(layers) | set(card["layers"]) if layers.get(name) != card["layers"].get(name)
        )
        raise TraceRayError(
            f"the MoE in {folder} gates other layers than these adapters adapt ({changed[:3]}); rerun trace-ray route"
        )
    state = load_file(str(folder / GATE_WEIGHTS))
    for name, layer in moe.layers.items():
        gate = {key: state[f"{name}.{key}"] for key in ("weight", "bias")}
        if gate["weight"].shape != layer.gate.weight.shape:
            raise TraceRayError(
                f"the MoE gate of {name} in {folder} has shape {tuple(gate['weight'].shape)}, not "
                f"{tuple(layer.gate.weight.shape)}; "
                "it was trained on another model"
            )
        layer.gate.load_state_dict(gate)
    moe.metrics = card["metrics"]
    return moe


def moe_engine(model_config, engine_config, adapters, folder: Path):
    """An ``HFEngine`` over the base model gated with the MoE saved in ``folder`` (``adapters``: TrainedAdapter
    list)."""
    if engine_config.name != "hf":
        raise TraceRayError(
            "router=moe mixes adapters per token, which only the HF engine can run; set engine=hf, not "
            f"engine={engine_config.name}"
        )
    network, tokenizer = load_model(model_config, assigned_device())
    load_moe(folder, network, {adapter.name: read_peft_folder(adapter.folder) for adapter in adapters})
    return HFEngine(network, tokenizer, max_batch_rows=engine_config.max_batch_rows)

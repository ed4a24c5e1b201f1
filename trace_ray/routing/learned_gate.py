"""``router=learned``: one gate over the frozen adapters, a small classifier on the base model's hidden states.

Features: the task's first user request, rendered alone with the chat
template, run through the frozen base model (adapters disabled); the last
layer's hidden states are mean-pooled over the request's tokens. (The
system policy is left out: it is the same for every task of an environment
and would only dilute the pool.)

Gate: the features standardized with the training set's mean and standard
deviation, then a linear layer to one logit per option (``router.gate.hidden``
= 0) or one tanh hidden layer first. Options are the capability adapters,
then ``base``. Trained with cross-entropy on oracle labels (for each
training task, the option whose greedy rollout scored best; ties to base),
full-batch AdamW for ``router.gate.epochs`` steps. The base model and the
adapters stay frozen.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from environments.errors import TraceRayError
from trace_ray.artifacts import atomic_path
from trace_ray.capabilities.llm_labeler import cut_middle
from trace_ray.config import GateConfig
from trace_ray.routing.logit_router import RouteDecision, decide

REQUEST_CHARS = 2000
GATE_WEIGHTS = "learned_gate.safetensors"
GATE_CARD = "learned_gate.json"


def first_request(first_observation: list[dict]) -> str:
    """The first user message's text, cut in the middle to ``REQUEST_CHARS``."""
    for message in first_observation:
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content") or ""
            if isinstance(content, list):  # OpenAI content parts
                content = "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
            return cut_middle(str(content).strip(), REQUEST_CHARS)
    raise ValueError("the first observation has no user message; route an episode's first messages (system + user)")


def _model_device(model) -> torch.device:
    parameter = next(iter(model.parameters()), None)
    return parameter.device if parameter is not None else torch.device("cpu")


@torch.no_grad()
def pooled_features(model, tokenizer, observations: list[list[dict]], batch_size: int = 8) -> torch.Tensor:
    """[len(observations), hidden] mean of the base model's last hidden states over each request's tokens."""
    prompts = []
    for observation in observations:
        encoded = tokenizer.apply_chat_template(
            [{"role": "user", "content": first_request(observation)}], tokenize=True
        )
        prompts.append(list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = _model_device(model)
    disable = getattr(model, "disable_adapter", None)
    was_training = model.training
    model.eval()
    pooled = []
    try:
        with disable() if callable(disable) else contextlib.nullcontext():
            for start in range(0, len(prompts), batch_size):
                batch = prompts[start : start + batch_size]
                width = max(len(prompt) for prompt in batch)
                input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
                mask = torch.zeros((len(batch), width), dtype=torch.long)
                for row, prompt in enumerate(batch):
                    input_ids[row, : len(prompt)] = torch.tensor(prompt)
                    mask[row, : len(prompt)] = 1
                output = model(
                    input_ids=input_ids.to(device),
                    attention_mask=mask.to(device),
                    output_hidden_states=True,
                    use_cache=False,
                )
                hidden = output.hidden_states[-1].float().cpu()
                weights = mask.unsqueeze(-1).float()
                pooled.append((hidden * weights).sum(dim=1) / weights.sum(dim=1))
    finally:
        if was_training:
            model.train()
    return torch.cat(pooled)


class GateNetwork(nn.Module):
    """Standardized features -> (tanh hidden layer) -> one logit per option."""

    def __init__(self, features: int, options: int, hidden: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(features))
        self.register_buffer("std", torch.ones(features))
        self.layers = (
            nn.Linear(features, options)
            if hidden == 0
            else nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, options))
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.layers((features - self.mean) / self.std)


@dataclass
class TrainedGate:
    network: GateNetwork
    names: list[str]  # option of each logit: the adapters, then base
    hidden: int
    metrics: dict


def check_labels(labels: list[str], names: list[str]) -> None:
    """One-line errors for labels a gate cannot learn from: unknown options, or a single option throughout."""
    unknown = sorted(set(labels) - set(names))
    if unknown:
        raise TraceRayError(
            f"gate labels {unknown} are not routing options {names}; label tasks with adapter names or base"
        )
    if len(set(labels)) < 2:
        only = labels[0] if labels else "nothing"
        raise TraceRayError(
            f"all {len(labels)} training labels are {only!r}: a gate would learn a constant; "
            "route more training tasks (router.train_limit) or train adapters that win some of them"
        )


def fit_gate(
    features: torch.Tensor, labels: list[str], names: list[str], settings: GateConfig, seed: int = 0
) -> TrainedGate:
    """Train a gate on ``features`` [n, d] with option-name ``labels``; names order the gate's logits."""
    if features.ndim != 2 or features.shape[0] != len(labels):
        raise ValueError(f"features {tuple(features.shape)} do not match {len(labels)} labels")
    check_labels(labels, names)
    torch.manual_seed(seed)
    network = GateNetwork(features.shape[1], len(names), settings.hidden)
    network.mean.copy_(features.mean(dim=0))
    network.std.copy_(features.std(dim=0, unbiased=False).clamp(min=1e-6))
    targets = torch.tensor([names.index(label) for label in labels])
    optimizer = torch.optim.AdamW(network.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    for _ in range(settings.epochs):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(network(features), targets)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        logits = network(features)
        loss = nn.functional.cross_entropy(logits, targets).item()
        accuracy = (logits.argmax(dim=1) == targets).float().mean().item()
    counts = {name: labels.count(name) for name in names}
    return TrainedGate(
        network, list(names), settings.hidden, {"train_loss": loss, "train_accuracy": accuracy, "label_counts": counts}
    )


def gate_decisions(gate: TrainedGate, features: torch.Tensor) -> list[RouteDecision]:
    with torch.no_grad():
        logits = gate.network(features)
    return [decide(dict(zip(gate.names, row.tolist()))) for row in logits]


class LearnedRouter:
    """Routes a task by the gate's logits over the base model's pooled features of its request."""

    def __init__(self, model, tokenizer, gate: TrainedGate):
        self.model, self.tokenizer, self.gate = model, tokenizer, gate
        self.names = gate.names

    def route(self, first_observation: list[dict]) -> RouteDecision:
        return self.route_many([first_observation])[0]

    def route_many(self, observations: list[list[dict]]) -> list[RouteDecision]:
        return gate_decisions(self.gate, pooled_features(self.model, self.tokenizer, observations))


def save_gate(folder: Path, gate: TrainedGate, model_name: str) -> None:
    """``folder/learned_gate.safetensors`` (weights) and ``learned_gate.json`` (options, shape, model, metrics)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {key: value.contiguous() for key, value in gate.network.state_dict().items()}
    with atomic_path(folder / GATE_WEIGHTS) as scratch:
        save_file(state, str(scratch))
    card = {
        "router": "learned",
        "model": model_name,
        "names": gate.names,
        "features": int(gate.network.mean.shape[0]),
        "hidden": gate.hidden,
        "metrics": gate.metrics,
    }
    with atomic_path(folder / GATE_CARD) as scratch:
        Path(scratch).write_text(json.dumps(card, indent=2), encoding="utf-8")


def load_gate(folder: Path, model_name: str, adapter_names: list[str]) -> TrainedGate:
    """The gate saved in ``folder``; one-line errors when it is missing or was trained for another model or adapters."""
    from safetensors.torch import load_file

    card_path = folder / GATE_CARD
    if not card_path.is_file() or not (folder / GATE_WEIGHTS).is_file():
        raise TraceRayError(f"no learned gate in {folder}; run trace-ray route run_dir=... first, or use router=logit")
    card = json.loads(card_path.read_text(encoding="utf-8"))
    if card["model"] != model_name:
        raise TraceRayError(
            f"the learned gate in {folder} was trained on model={card['model']}, not {model_name}; "
            "rerun trace-ray route"
        )
    if sorted(card["names"][:-1]) != sorted(adapter_names):
        raise TraceRayError(
            f"the learned gate in {folder} routes {card['names'][:-1]}, but the run's adapters are {adapter_names}; "
            "rerun trace-ray route"
        )
    network = GateNetwork(card["features"], len(card["names"]), card["hidden"])
    network.load_state_dict(load_file(str(folder / GATE_WEIGHTS)))
    return TrainedGate(network, card["names"], card["hidden"], card["metrics"])

"""The training-free logit router (``router=logit``, the paper's).

The frozen base model reads one routing prompt per task::

    system: You choose the skill that helps an AI agent with a task. ...
    user:   Task
            Policy (shortened): <the episode's system policy, first POLICY_CHARS characters>
            User request: <the episode's first user message>

            Options:
            A. <name>: <description>
               example:
               <one successful trajectory of its synthetic environment, compacted, indented>
            B. ...
            C. base: none of these: answer with the base model

            Answer with the letter of one option (A, B or C) only.
    assistant: Answer:

The chat template renders the two messages with the generation prompt; the
tokens of ``Answer:`` follow, as if the model had begun its reply with them.
Each option's label is the single token of `` A``, `` B``, ... (with the
leading space, which is how the label follows ``Answer:``); the label token
with the highest next-token logit at the last position wins. Every option's
logit and the softmax over them are kept.
"""

from __future__ import annotations

import contextlib
import math
import string
import textwrap
from dataclasses import dataclass
import torch

from trace_ray.capabilities.llm_labeler import compact_messages, cut_middle

__all__ = [
    "ANSWER_PREFIX", "BASE", "BASE_OPTION", "LogitRouter", "RouteDecision", "RouteOption",
    "compact_messages", "decide", "label_tokens", "routing_messages",
]

BASE = "base"
LABELS = string.ascii_uppercase
ANSWER_PREFIX = "Answer:"  # the assistant turn starts with it; the label token comes next
POLICY_CHARS = 800  # the task's system policy, shortened to its head
REQUEST_CHARS = 2000  # the task's user request, cut in the middle beyond this
BASE_DESCRIPTION = "none of these: answer with the base model"
ROUTING_SYSTEM = (
    "You choose the skill that helps an AI agent with a task. The agent uses tools to carry out the user's request "
    "under the policy shown. Each option below is a skill, with what it does and one example of it at work. "
    "Choose the skill that helps most with this task, or the base model if none of the skills fits. "
    "Answer with the letter of one option only."
)


@dataclass(frozen=True)
class RouteOption:
    name: str  # capability / adapter name, or BASE
    description: str
    example: str  # a compacted successful trajectory ("" for base)


BASE_OPTION = RouteOption(BASE, BASE_DESCRIPTION, "")


# -- labels -----------------------------------------------------------------------------------
def _pieces(tokenizer, ids: list[int]) -> list[str]:
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    return list(convert(ids)) if convert else [str(i) for i in ids]


def label_tokens(tokenizer, count: int) -> list[tuple[str, int]]:
    """The first ``count`` labels (``A``, ``B``, ...) with the one token id each takes right after ``Answer:``.

    The label follows ``Answer:`` as `` A`` (space included). Raises ValueError
    when a label is not exactly one token there, when two labels share a token,
    or when ``count`` is not 1 to 26.
    """
    if not 1 <= count <= len(LABELS):
        raise ValueError(f"the logit router labels 1 to {len(LABELS)} options (A to Z), not {count}; route fewer capabilities")
    prefix = tokenizer.encode(ANSWER_PREFIX, add_special_tokens=False)
    labels: list[tuple[str, int]] = []
    for label in LABELS[:count]:
        alone = tokenizer.encode(" " + label, add_special_tokens=False)
        in_context = tokenizer.encode(f"{ANSWER_PREFIX} {label}", add_special_tokens=False)
        if len(alone) != 1 or in_context != prefix + alone:
            raise ValueError(
                f"routing label {label!r} is not one token after {ANSWER_PREFIX!r}: ' {label}' tokenizes as "
                f"{_pieces(tokenizer, alone)} {alone} and '{ANSWER_PREFIX} {label}' as "
                f"{_pieces(tokenizer, in_context)} {in_context} (prefix {prefix}); the logit router needs a tokenizer "
                "with single-token capital letters"
            )
        labels.append((label, alone[0]))
    ids = [token for _, token in labels]
    if len(set(ids)) != len(ids):
        raise ValueError(f"routing labels share tokens ({labels}); the logit router needs one distinct token per label")
    return labels


# -- the prompt -------------------------------------------------------------------------------
def _content(message: dict) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, list):  # OpenAI content parts
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def _with_base(options: list[RouteOption]) -> list[RouteOption]:
    names = [option.name for option in options]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"routing options must have distinct names; repeated: {duplicates}")
    return list(options) if BASE in names else [*options, BASE_OPTION]


def _either(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " or " + labels[-1]


def routing_messages(first_observation: list[dict], options: list[RouteOption], max_example_chars: int = 1500) -> list[dict]:
    """The routing prompt as chat messages (system instruction, user message listing task and options).

    ``first_observation`` is an episode's first messages (system policy + first
    user message). ``options`` are shown in order, labelled A, B, ...; the
    base option is appended last unless one named :data:`BASE` is given. Each
    example is cut in the middle to ``max_example_chars``.
    """
    messages = [m for m in first_observation if isinstance(m, dict)]
    policy = next((_content(m) for m in messages if m.get("role") == "system"), "").strip()
    request = next((_content(m) for m in messages if m.get("role") == "user"), None)
    if request is None:
        raise ValueError("the first observation has no user message; route an episode's first messages (system + user)")
    options = _with_base(options)
    if len(options) > len(LABELS):
        raise ValueError(f"the logit router labels at most {len(LABELS)} options (base included), not {len(options)}")
    if len(policy) > POLICY_CHARS:
        policy = policy[:POLICY_CHARS].rstrip() + " [...]"
    task = ["Task"]
    if policy:
        task.append(f"Policy (shortened): {policy}")
    task.append(f"User request: {cut_middle(request.strip(), REQUEST_CHARS)}")
    lines = ["\n".join(task), "", "Options:"]
    for label, option in zip(LABELS, options):
        if option.name == BASE:
            lines.append(f"{label}. {BASE}: {BASE_DESCRIPTION}")
            continue
        lines.append(f"{label}. {option.name}: {option.description.strip()}")
        example = cut_middle(option.example.strip(), max_example_chars)
        lines.append("   example:" + ("\n" + textwrap.indent(example, "   ") if example else " (none)"))
    lines += ["", f"Answer with the letter of one option ({_either(list(LABELS[:len(options)]))}) only."]
    return [{"role": "system", "content": ROUTING_SYSTEM}, {"role": "user", "content": "\n".join(lines)}]


# -- the decision -----------------------------------------------------------------------------
@dataclass
class RouteDecision:
    choice: str  # option name (BASE or a capability)
    scores: dict[str, float]  # option name -> logit of its label token
    probabilities: dict[str, float]  # softmax over the label logits


def decide(label_logits: dict[str, float], tie_break: str = BASE) -> RouteDecision:
    """The option with the highest logit; an exact tie goes to ``tie_break`` if tied, else to the first tied option."""
    if not label_logits:
        raise ValueError("no label logits to decide from")
    scores = {name: float(value) for name, value in label_logits.items()}
    if any(math.isnan(value) for value in scores.values()):
        raise ValueError(f"a routing logit is NaN: {scores}")
    best = max(scores.values())
    tied = [name for name, value in scores.items() if value == best]
    choice = tie_break if tie_break in tied else tied[0]
    exponents = {name: math.exp(value - best) for name, value in scores.items()}
    total = sum(exponents.values())
    return RouteDecision(choice, scores, {name: value / total for name, value in exponents.items()})


# -- the model --------------------------------------------------------------------------------
class LogitRouter:
    """Routes a task with one forward pass of the frozen base model over its routing prompt.

    ``options`` are the capabilities (no base option: the router appends it
    last). A PEFT model is run with its adapters disabled.
    """

    def __init__(self, model, tokenizer, options: list[RouteOption], max_example_chars: int = 1500, batch_size: int = 8):
        if any(option.name == BASE for option in options):
            raise ValueError(f"pass the capabilities only: the router appends the {BASE!r} option itself")
        self.model = model
        self.tokenizer = tokenizer
        self.options = _with_base(options)
        self.labels = label_tokens(tokenizer, len(self.options))
        self.max_example_chars = max_example_chars
        self.batch_size = batch_size
        self.answer_ids = list(tokenizer.encode(ANSWER_PREFIX, add_special_tokens=False))
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = pad if pad is not None else (getattr(tokenizer, "eos_token_id", None) or 0)

    @property
    def names(self) -> list[str]:
        return [option.name for option in self.options]

    def messages(self, first_observation: list[dict]) -> list[dict]:
        return routing_messages(first_observation, self.options, self.max_example_chars)

    def prompt_ids(self, first_observation: list[dict]) -> list[int]:
        """The routing prompt's tokens: the chat template with the generation prompt, then ``Answer:``."""
        encoded = self.tokenizer.apply_chat_template(
            self.messages(first_observation), add_generation_prompt=True, tokenize=True
        )
        ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
        return list(ids) + self.answer_ids

    def _device(self) -> torch.device:
        device = getattr(self.model, "device", None)
        if isinstance(device, torch.device):
            return device
        parameter = next(iter(self.model.parameters()), None) if hasattr(self.model, "parameters") else None
        return parameter.device if parameter is not None else torch.device("cpu")

    @torch.no_grad()
    def label_logits(self, prompts: list[list[int]]) -> torch.Tensor:
        """[len(prompts), options] logits of the label tokens after each prompt (one left-padded forward pass)."""
        device = self._device()
        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt):] = 1
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
        disable = getattr(self.model, "disable_adapter", None)
        was_training = bool(getattr(self.model, "training", False))
        self.model.eval()
        try:
            with disable() if callable(disable) else contextlib.nullcontext():
                output = self.model(
                    input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                    position_ids=position_ids.to(device), use_cache=False, logits_to_keep=1,
                )
        finally:
            if was_training:
                self.model.train()
        last = output.logits[:, -1, :].float()
        label_ids = torch.tensor([token for _, token in self.labels], device=last.device)
        return last.index_select(1, label_ids).cpu()

    def _decision(self, row: torch.Tensor) -> RouteDecision:
        return decide(dict(zip(self.names, row.tolist())))

    def route(self, first_observation: list[dict]) -> RouteDecision:
        """The decision for one task, from its first observation (system policy + first user message)."""
        return self._decision(self.label_logits([self.prompt_ids(first_observation)])[0])

    def route_many(self, observations: list[list[dict]]) -> list[RouteDecision]:
        """The decisions for many tasks, ``batch_size`` prompts per forward pass; the same as :meth:`route` one by one."""
        prompts = [self.prompt_ids(observation) for observation in observations]
        decisions: list[RouteDecision] = []
        for start in range(0, len(prompts), self.batch_size):
            logits = self.label_logits(prompts[start:start + self.batch_size])
            decisions += [self._decision(row) for row in logits]
        return decisions


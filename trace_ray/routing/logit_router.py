"""The training-free logit router (``router=logit``, the paper's).

The frozen base model reads one routing prompt per task::

    system: You choose the skill that helps an AI agent with a task. ...
    user:   Options:
            A. <name>: <description>
               example:
               <one successful trajectory of its synthetic environment, compacted, indented>
            B. ...
            C. base: none of these: answer with the base model

            Task
            Policy (shortened): <the episode's system policy, first POLICY_CHARS characters>
            User request: <the episode's first user message>

            Answer with the letter of one option (A, B or C) only.
    assistant: Answer:

The chat template renders the two messages with the generation prompt; the
tokens of ``Answer:`` follow, as if the model had begun its reply with them.
Each option's label is the single token of `` A``, `` B``, ... (with the
leading space, which is how the label follows ``Answer:``); the label token
with the highest next-token logit at the last position wins. Every option's
logit and the softmax over them are kept.

Contextual calibration (``calibration="content_free"``, the default; Zhao et
al. 2021, "Calibrate Before Use"): a small model's label scores carry a bias
toward some labels whatever the task says. The router measures it once per
policy on content-free requests (:data:`CONTENT_FREE_REQUESTS` in the task's
place) as the mean softmax over the options, and decides on
``log p(option | task) - log p_content_free(option)``. ``calibration="fitted"``
adds one offset per option to those scores, fitted by ``trace-ray route`` on
the training split's tasks (:mod:`trace_ray.routing.offsets`).

The options come before the task, and the task's policy before its request,
so the prompts of one environment's tasks share their head: the instruction,
the options with their examples and the policy, most of the prompt. The
router runs a head once and keeps its keys and values; each decision then
runs the model over its request's tokens only. The paper's prompt puts the
task first; this order reads the same options and task and saves most of
every routing prefill (``benchmarks/routing_prefill.py``).
"""

from __future__ import annotations

import contextlib
import copy
import math
import string
import textwrap
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from trace_ray.capabilities.llm_labeler import compact_messages, cut_middle

__all__ = [
    "ANSWER_PREFIX",
    "BASE",
    "BASE_OPTION",
    "LogitRouter",
    "RouteDecision",
    "RouteOption",
    "compact_messages",
    "decide",
    "label_tokens",
    "options_block",
    "routing_messages",
    "task_block",
    "task_head",
]

BASE = "base"
LABELS = string.ascii_uppercase
ANSWER_PREFIX = "Answer:"  # the assistant turn starts with it; the label token comes next
POLICY_CHARS = 800  # the task's system policy, shortened to its head
REQUEST_CHARS = 2000  # the task's user request, cut in the middle beyond this
PREFIX_CACHE_ENTRIES = 4  # prompt heads (options + one policy) whose keys and values a router keeps
CONTENT_FREE_REQUESTS = ("N/A", "", "[MASK]")  # contextual calibration's requests that say nothing
CALIBRATIONS = ("content_free", "fitted", "none")
TIE_TOLERANCE = 1e-6  # scores this close count as a tie
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
        raise ValueError(
            f"the logit router labels 1 to {len(LABELS)} options (A to Z), not {count}; route fewer capabilities"
        )
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


def options_block(options: list[RouteOption], max_example_chars: int = 1500) -> str:
    """The options, labelled A, B, ... (base last unless one named :data:`BASE` is given), each example cut in the
    middle.

    The same for every task: the routing prompt's shared head (see the module's docstring).
    """
    options = _with_base(options)
    if len(options) > len(LABELS):
        raise ValueError(f"the logit router labels at most {len(LABELS)} options (base included), not {len(options)}")
    lines = ["Options:"]
    for label, option in zip(LABELS, options):
        if option.name == BASE:
            lines.append(f"{label}. {BASE}: {BASE_DESCRIPTION}")
            continue
        lines.append(f"{label}. {option.name}: {option.description.strip()}")
        example = cut_middle(option.example.strip(), max_example_chars)
        lines.append("   example:" + ("\n" + textwrap.indent(example, "   ") if example else " (none)"))
    return "\n".join(lines) + "\n\n"


def _policy_and_request(first_observation: list[dict]) -> tuple[str, str]:
    messages = [m for m in first_observation if isinstance(m, dict)]
    policy = next((_content(m) for m in messages if m.get("role") == "system"), "").strip()
    request = next((_content(m) for m in messages if m.get("role") == "user"), None)
    if request is None:
        raise ValueError("the first observation has no user message; route an episode's first messages (system + user)")
    if len(policy) > POLICY_CHARS:
        policy = policy[:POLICY_CHARS].rstrip() + " [...]"
    return policy, request


def with_request(first_observation: list[dict], request: str) -> list[dict]:
    """The first observation with its user message's content replaced (the same policy, another request)."""
    user = next(index for index, message in enumerate(first_observation) if message.get("role") == "user")
    return [*first_observation[:user], {**first_observation[user], "content": request}, *first_observation[user + 1 :]]


def task_head(first_observation: list[dict]) -> str:
    """``Task`` and the shortened policy: the part of the task that every task of one environment shares."""
    policy, _ = _policy_and_request(first_observation)
    return "Task\n" + (f"Policy (shortened): {policy}\n" if policy else "")


def task_block(first_observation: list[dict], option_count: int) -> str:
    """The task (shortened policy and the user's request) and the answer instruction: the routing prompt's tail."""
    _, request = _policy_and_request(first_observation)
    instruction = f"Answer with the letter of one option ({_either(list(LABELS[:option_count]))}) only."
    return task_head(first_observation) + f"User request: {cut_middle(request.strip(), REQUEST_CHARS)}\n\n{instruction}"


def routing_messages(
    first_observation: list[dict], options: list[RouteOption], max_example_chars: int = 1500
) -> list[dict]:
    """The routing prompt as chat messages: the system instruction, then one user message of options and task.

    ``first_observation`` is an episode's first messages (system policy + first
    user message). ``options`` are shown in order, labelled A, B, ...; the
    base option is appended last unless one named :data:`BASE` is given. Each
    example is cut in the middle to ``max_example_chars``.
    """
    head = options_block(options, max_example_chars)
    tail = task_block(first_observation, len(_with_base(options)))
    return [{"role": "system", "content": ROUTING_SYSTEM}, {"role": "user", "content": head + tail}]


# -- the decision -----------------------------------------------------------------------------
@dataclass
class RouteDecision:
    choice: str  # option name (BASE or a capability)
    # option name -> logit of its label token (calibrated: log-prob minus the content-free one)
    scores: dict[str, float]
    probabilities: dict[str, float]  # softmax over the scores


def decide(label_logits: dict[str, float], tie_break: str = BASE) -> RouteDecision:
    """The option with the highest score; a tie (within :data:`TIE_TOLERANCE`: calibrated scores that should be equal
    differ by rounding) goes to ``tie_break`` if tied, else to the first tied option."""
    if not label_logits:
        raise ValueError("no label logits to decide from")
    scores = {name: float(value) for name, value in label_logits.items()}
    if any(math.isnan(value) for value in scores.values()):
        raise ValueError(f"a routing logit is NaN: {scores}")
    best = max(scores.values())
    tied = [name for name, value in scores.items() if value >= best - TIE_TOLERANCE]
    choice = tie_break if tie_break in tied else tied[0]
    exponents = {name: math.exp(value - best) for name, value in scores.items()}
    total = sum(exponents.values())
    return RouteDecision(choice, scores, {name: value / total for name, value in exponents.items()})


# -- the model --------------------------------------------------------------------------------
class LogitRouter:
    """Routes a task with one forward pass of the frozen base model over its routing prompt.

    ``options`` are the capabilities (no base option: the router appends it
    last). A PEFT model is run with its adapters disabled. With
    ``reuse_prefix`` (the default) a prompt's head, the options and the task's
    policy, is run once per distinct policy and its keys and values are kept
    (the last :data:`PREFIX_CACHE_ENTRIES` policies) for every later task
    under that policy, which then runs its request's tokens only; the model
    must stay frozen meanwhile. ``calibration``: ``content_free`` (see the
    module's docstring; each policy's bias is measured once and kept) or
    ``none`` (the raw label logits, the paper's) or ``fitted`` (content-free,
    plus ``offsets``: option name -> the offset added to its score).
    """

    def __init__(
        self,
        model,
        tokenizer,
        options: list[RouteOption],
        max_example_chars: int = 1500,
        batch_size: int = 8,
        reuse_prefix: bool = True,
        calibration: str = "content_free",
        offsets: dict[str, float] | None = None,
    ):
        if any(option.name == BASE for option in options):
            raise ValueError(f"pass the capabilities only: the router appends the {BASE!r} option itself")
        if calibration not in CALIBRATIONS:
            raise ValueError(f"calibration={calibration!r} is not one of {', '.join(CALIBRATIONS)}")
        names = [option.name for option in _with_base(options)]
        if calibration == "fitted" and (offsets is None or sorted(offsets) != sorted(names)):
            raise ValueError(f"calibration='fitted' needs one offset per option {names}, got {offsets}")
        self.calibration = calibration
        self.offsets = offsets
        self._biases: dict[str, torch.Tensor] = {}  # policy -> log of the options' content-free probabilities
        self.model = model
        self.tokenizer = tokenizer
        self.options = _with_base(options)
        self.labels = label_tokens(tokenizer, len(self.options))
        self.max_example_chars = max_example_chars
        self.batch_size = batch_size
        self.reuse_prefix = reuse_prefix
        self.answer_ids = list(tokenizer.encode(ANSWER_PREFIX, add_special_tokens=False))
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = pad if pad is not None else (getattr(tokenizer, "eos_token_id", None) or 0)
        self._options_text = options_block(self.options, max_example_chars)
        # head tokens -> the model's keys and values
        self._prefixes: OrderedDict[tuple[int, ...], object] = OrderedDict()
        self._prefix_lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return [option.name for option in self.options]

    def messages(self, first_observation: list[dict]) -> list[dict]:
        return routing_messages(first_observation, self.options, self.max_example_chars)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt(self, first_observation: list[dict]) -> tuple[list[int], int]:
        """(the routing prompt's tokens, how many of the first ones are its head: the options and the task's policy).

        The tokens are the chat template's with the generation prompt, then
        ``Answer:``. The head's last tokens may merge with the request's first
        ones, so the head counts the tokens that the head alone shares with the
        whole prompt; 0 without ``reuse_prefix`` or when the chat template does
        not keep the options at the start of the prompt's text.
        """
        rendered = self.tokenizer.apply_chat_template(
            self.messages(first_observation), add_generation_prompt=True, tokenize=False
        )
        ids = self._encode(rendered) + self.answer_ids
        head = self._options_text + task_head(first_observation)
        end = rendered.find(head)
        if not self.reuse_prefix or end < 0:
            return ids, 0
        head_ids = self._encode(rendered[: end + len(head)])
        shared = 0
        while shared < min(len(head_ids), len(ids) - 1) and head_ids[shared] == ids[shared]:
            shared += 1
        return ids, shared

    def prompt_ids(self, first_observation: list[dict]) -> list[int]:
        """The routing prompt's tokens: the chat template with the generation prompt, then ``Answer:``."""
        return self.prompt(first_observation)[0]

    def _device(self) -> torch.device:
        device = getattr(self.model, "device", None)
        if isinstance(device, torch.device):
            return device
        parameter = next(iter(self.model.parameters()), None) if hasattr(self.model, "parameters") else None
        return parameter.device if parameter is not None else torch.device("cpu")

    @contextlib.contextmanager
    def _frozen_base(self):
        """The model in eval mode with its adapters disabled; its mode is restored after."""
        disable = getattr(self.model, "disable_adapter", None)
        was_training = bool(getattr(self.model, "training", False))
        self.model.eval()
        try:
            with disable() if callable(disable) else contextlib.nullcontext():
                yield
        finally:
            if was_training:
                self.model.train()

    @torch.no_grad()
    def label_logits(self, prompts: list[list[int]], head: int = 0) -> torch.Tensor:
        """[len(prompts), options] logits of the label tokens after each prompt (one forward pass).

        With ``head`` > 0 every prompt starts with the same ``head`` tokens,
        whose keys and values come from the router's cache (made on first
        use) and the pass runs over the rest of each prompt only.
        """
        if head and any(prompt[:head] != prompts[0][:head] or len(prompt) <= head for prompt in prompts):
            raise ValueError(
                f"prompts batched after a shared head must all start with the same {head} tokens and go beyond them"
            )
        with self._frozen_base():
            past = self._cached_head(prompts[0][:head]) if head else None
            last = self._last_logits([prompt[head:] for prompt in prompts], past)
        label_ids = torch.tensor([token for _, token in self.labels], device=last.device)
        return last.float().index_select(1, label_ids).cpu()

    def _cached_head(self, head: list[int]):
        """A copy of the model's keys and values over ``head``, from the cache (kept most recently used first)."""
        key = tuple(head)
        with self._prefix_lock:
            if key in self._prefixes:
                self._prefixes.move_to_end(key)
            else:
                ids = torch.tensor([head], dtype=torch.long, device=self._device())
                self._prefixes[key] = self.model(input_ids=ids, use_cache=True, logits_to_keep=1).past_key_values
                while len(self._prefixes) > PREFIX_CACHE_ENTRIES:
                    self._prefixes.popitem(last=False)
            return copy.deepcopy(self._prefixes[key])  # the forward pass appends the tails' keys and values to the copy

    def _last_logits(self, tails: list[list[int]], past) -> torch.Tensor:
        """The next-token logits after each of ``tails``, left-padded, after the keys and values ``past`` (None:
        none)."""
        device = self._device()
        past_length = past.get_seq_length() if past is not None else 0
        if past is not None:
            past.batch_repeat_interleave(len(tails))
        width = max(len(tail) for tail in tails)
        input_ids = torch.full((len(tails), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(tails), past_length + width), dtype=torch.long)
        attention_mask[:, :past_length] = 1
        for row, tail in enumerate(tails):
            input_ids[row, width - len(tail) :] = torch.tensor(tail, dtype=torch.long)
            attention_mask[row, past_length + width - len(tail) :] = 1
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)[:, past_length:]
        output = self.model(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            position_ids=position_ids.to(device),
            past_key_values=past,
            use_cache=past is not None,
            logits_to_keep=1,
        )
        return output.logits[:, -1, :]

    def route(self, first_observation: list[dict]) -> RouteDecision:
        """The decision for one task, from its first observation (system policy + first user message)."""
        return self.route_many([first_observation])[0]

    def route_many(self, observations: list[list[dict]]) -> list[RouteDecision]:
        """The decisions for many tasks, the same as :meth:`route` one by one.

        Tasks sharing a head (the same policy) go ``batch_size`` per forward pass.
        """
        return self.decide_many(observations, self.raw_label_logits(observations))

    def decide_many(self, observations: list[list[dict]], raw: torch.Tensor) -> list[RouteDecision]:
        """The decisions from the tasks' uncalibrated label logits ``raw`` (:meth:`raw_label_logits`), calibrated as
        set."""
        return [decide(dict(zip(self.names, row.tolist()))) for row in self.scores(observations, raw)]

    def scores(self, observations: list[list[dict]], raw: torch.Tensor, calibration: str | None = None) -> torch.Tensor:
        """[tasks, options] scores of the raw label logits under ``calibration`` (None: the router's own)."""
        calibration = calibration or self.calibration
        if calibration == "none":
            return raw
        scores = torch.log_softmax(raw, dim=-1) - torch.stack([self.content_free_bias(o) for o in observations])
        if calibration == "fitted":
            scores = scores + torch.tensor([self.offsets[name] for name in self.names])
        return scores

    def raw_label_logits(self, observations: list[list[dict]]) -> torch.Tensor:
        """[tasks, options] label logits of each task's routing prompt, uncalibrated."""
        prompts = [self.prompt(observation) for observation in observations]
        groups: dict[tuple[int, ...], list[int]] = {}
        for index, (ids, head) in enumerate(prompts):
            groups.setdefault(tuple(ids[:head]), []).append(index)
        rows: dict[int, torch.Tensor] = {}
        for head, indices in groups.items():
            for start in range(0, len(indices), self.batch_size):
                batch = indices[start : start + self.batch_size]
                logits = self.label_logits([prompts[index][0] for index in batch], len(head))
                rows.update(zip(batch, logits))
        return torch.stack([rows[index] for index in range(len(observations))])

    def content_free_bias(self, first_observation: list[dict]) -> torch.Tensor:
        """Log of the options' mean softmax over the content-free requests under this task's policy (measured once per
        policy)."""
        policy, _ = _policy_and_request(first_observation)
        with self._prefix_lock:
            known = self._biases.get(policy)
        if known is None:
            free = [with_request(first_observation, request) for request in CONTENT_FREE_REQUESTS]
            known = torch.log(torch.softmax(self.raw_label_logits(free), dim=-1).mean(dim=0))
            with self._prefix_lock:
                self._biases[policy] = known
        return known

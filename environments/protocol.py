"""The one environment protocol, in OpenAI chat format.

Every environment in trace-ray (target environments, synthetic capability
environments) implements :class:`Environment`. Rollouts, training,
evaluation and serving speak only this protocol:

- ``reset(seed)`` starts the episode for one task and returns the initial
  messages (system policy + user request) and the OpenAI tool schemas.
- ``step(assistant_message)`` takes one OpenAI assistant message
  (``{"role": "assistant", "content": str | None, "tool_calls": [...]}``),
  executes its tool calls, or treats plain text as the reply to the user, and
  returns the new messages (tool results or the user's reply), the reward,
  whether the episode is over, and an info dict. When the episode is over,
  the reward is the episode's score in [0, 1] and ``info["success"]`` says
  whether it reached the environment's success threshold.

An episode is deterministic given its seed and the assistant messages.
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]
ToolSchema = dict[str, Any]

SPLITS = ("analysis", "eval", "train")


def tool_call_message(name: str, arguments: dict[str, Any], call_id: str) -> Message:
    """An assistant message making one call of tool ``name`` (the moves of oracles and adversaries)."""
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


@dataclass
class ResetResult:
    messages: list[Message]
    tools: list[ToolSchema]
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepResult:
    messages: list[Message]
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class Environment(abc.ABC):
    """One episode at a time; create one instance per concurrent episode."""

    name: str = ""

    @abc.abstractmethod
    def task_seeds(self, split: str) -> list[int]:
        """Fixed task seeds of a benchmark split (``analysis`` or ``eval``).

        ``train`` has unlimited seeds; ask with :meth:`train_seed`.
        """

    @abc.abstractmethod
    def train_seed(self, index: int) -> int:
        """The ``index``-th training seed; disjoint from every benchmark seed."""

    @abc.abstractmethod
    def reset(self, seed: int) -> ResetResult: ...

    @abc.abstractmethod
    def step(self, assistant_message: Message) -> StepResult: ...

    @abc.abstractmethod
    def oracle_message(self) -> Message:
        """The next assistant message of a policy that solves the current task.

        Used by the self-checks (the oracle must reach reward 1.0) and as the
        source of successful demonstrations.
        """

    @abc.abstractmethod
    def task_fingerprint(self) -> str:
        """A digest of everything that defines the current task, hidden state included.

        The same seed gives the same fingerprint; different seeds must differ.
        """

    def capability_turns(self) -> list[int]:
        """The oracle's turns (0-based) in the current task that exercise the environment's capability.

        Synthetic capability environments implement it: the self-checks play
        the oracle with these turns broken (see :meth:`broken_step`) and
        require a lower reward than the oracle's (the capability is
        necessary). Target environments train no single capability and keep
        the default.
        """
        raise NotImplementedError(f"{type(self).__name__} targets no single capability")

    def broken_step(self, turn: int) -> Message | None:
        """The wrong message that breaks only the capability's own part of oracle ``turn`` (a template's own choice,
        e.g. a reminder a day late); None: the self-checks corrupt the oracle's message themselves. Model-written
        environments are never asked: the checks derive their broken steps."""
        return None

    def capability_detectors(self) -> list[str]:
        """Names of the rule-based capabilities (``trace_ray.capabilities.rules.CATALOGUE``) whose detectors apply here.

        Only these may be labeled with ``labeler=rules`` on this environment;
        the default, none, means the environment gives no ground truth for them.
        """
        return []

    def capability_evidence(self, seed: int) -> dict[str, Any]:
        """The ground truth the rule-based detectors need for the task of ``seed``, as plain JSON-able data.

        It depends on the seed only, never on the current episode. ``needs``
        lists the capabilities of :meth:`capability_detectors` the task needs
        (the others are labeled NA). The other keys are what those detectors
        read: ``actions`` (the state changes the task requires: tool, expected
        arguments, each argument's role, whether the user asked for it),
        ``blockers`` (calls the state refuses at first), ``prechecks`` (tool ->
        checks due before calling it), ``reports``, ``time_reports`` and
        ``choice_reports`` (names of report milestones); the formats are in
        ``trace_ray.capabilities.rules``. Default: none.
        """
        return {}

    def adversaries(self) -> list[tuple[str, Any]]:
        """Reward farmers of this environment's own kind, ``(name, policy)``: a policy maps the environment to the next
        assistant message (as the oracle does). The self-checks play them beside the shared ones and require a mean
        near 0, e.g. an agent that rewrites the tests of a code-repair task. Default: none."""
        return []

    def example_exchange(self) -> list[Message]:
        """A worked example of the tool-call format, rendered before the task.

        A short exchange (user -> assistant tool call -> tool result ->
        assistant reply) on a neutral request. Small models only call tools
        reliably when they are shown one.
        """
        return []

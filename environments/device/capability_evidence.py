"""The ground truth the rule-based capability detectors need for one device task.

``device_capability_evidence(seed)`` (``DeviceEnvironment.capability_evidence``)
replays the scenario's oracle script on a copy of its phone and reads off, as
plain JSON-able data:

- ``actions``: the distinct state changes the oracle makes (tool, expected
  arguments, each argument's role), each marked ``requested`` unless it only
  fixes a call that failed before it (turning cellular service on to send).
- ``blockers``: the oracle calls the device state refuses at first (permission
  or no-service errors), in the same form plus the ``error``.
- ``prechecks``: gated tool -> the checks the oracle makes right before it
  (read tools such as ``search_contacts``, or ``ask_user`` for a question).
- ``reports``: the report milestones (facts the reply must tell), and among
  them ``time_reports`` (of a task that computes times) and ``choice_reports``
  (of a task whose oracle reads a search result with several records).
- ``needs``: the catalogue capabilities the task needs, from the above.

An argument's role says which capability judges it: ``literal`` (spelled out
by the request), ``text`` (free text; expected: the words it must contain),
``entity`` (an id or number taken from a tool result), ``time`` (a computed
timestamp).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from environments.device.milestones import Milestone, reports_facts
from environments.device.scenarios import make_scenario
from environments.device.tools import DeviceTools
from environments.tool_environment import EpisodeLog, ToolError

ASK_USER = "ask_user"
CHECK_TOOLS = ("get_current_timestamp", "search_contacts", "search_messages", "search_reminder")
CLOCK_TOOLS = ("get_current_timestamp", "timestamp_to_datetime_info", "datetime_info_to_timestamp", "shift_timestamp")
STATE_TOOL_PREFIXES = ("set_", "add_", "modify_", "remove_", "send_")
ROLES = {
    "send_message_with_phone_number": {"phone_number": "entity", "content": "text"},
    "add_reminder": {"content": "text", "reminder_timestamp": "time"},
    "add_contact": {"name": "literal", "phone_number": "literal", "relationship": "literal"},
    "modify_contact": {"person_id": "entity", "phone_number": "literal"},
    "remove_reminder": {"reminder_id": "entity"},
}


@dataclass
class _Step:
    """One oracle tool call as replayed (or, with tool ``ask_user``, a question to the user)."""

    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)
    result: Any = None
    error: str | None = None
    words: list[str] = field(default_factory=list)  # of the milestones this call newly satisfied

    @property
    def key(self) -> str:
        return json.dumps([self.tool, self.arguments], sort_keys=True)

    def action(self) -> dict[str, Any]:
        """The call as an action: expected arguments (a text's words) and their roles."""
        roles = {"on": "literal"} if self.tool.startswith("set_") else ROLES.get(self.tool, {})
        roles = {name: role for name, role in roles.items() if name in self.arguments}
        expected = {name: self.words if role == "text" else self.arguments[name] for name, role in roles.items()}
        return {"tool": self.tool, "arguments": expected, "roles": roles}


def _is_check(step: _Step) -> bool:
    return step.error is None and (
        step.tool in (ASK_USER, *CHECK_TOOLS) or (step.tool.startswith("get_") and step.tool.endswith("_status"))
    )


def _replay(oracle: list[dict[str, Any]], milestones: list[Milestone], tools: DeviceTools) -> list[_Step]:
    """Run the oracle's tool calls on ``tools``' phone, noting results, errors and newly satisfied milestones."""
    functions = {tool.name: tool.fn for tool in tools.tools()}
    holding = {milestone.name for milestone in milestones if milestone.holds(tools.state, EpisodeLog())}
    steps: list[_Step] = []
    for index, message in enumerate(oracle):
        if not message.get("tool_calls"):
            if "?" in (message.get("content") or "") and index < len(oracle) - 1:
                steps.append(_Step(ASK_USER))
            continue
        for call in message["tool_calls"]:
            step = _Step(call["function"]["name"], json.loads(call["function"]["arguments"]))
            try:
                step.result = functions[step.tool](**step.arguments)
            except ToolError as exc:
                step.error = str(exc)
            satisfied = [
                milestone
                for milestone in milestones
                if milestone.holds(tools.state, EpisodeLog()) and milestone.name not in holding
            ]
            step.words = sorted({word for milestone in satisfied for word in getattr(milestone.holds, "words", ())})
            holding |= {milestone.name for milestone in satisfied}
            steps.append(step)
    return steps


def device_capability_evidence(seed: int) -> dict[str, Any]:
    """The detectors' ground truth for the device task of ``seed`` (see the module docstring)."""
    scenario = make_scenario(seed)
    steps = _replay(scenario.oracle, scenario.milestones, DeviceTools(scenario.state.copy()))
    actions: dict[str, dict[str, Any]] = {}
    blockers: list[dict[str, Any]] = []
    prechecks: dict[str, set[str]] = {}
    refused: set[str] = set()  # oracle calls refused and not yet retried successfully
    checked: set[str] = set()  # checks since the last state change
    for step in steps:
        if _is_check(step):
            checked.add(step.tool)
        if step.error is not None:
            blockers.append({**step.action(), "error": step.error})
            refused.add(step.key)
        if step.tool.startswith(STATE_TOOL_PREFIXES):
            if checked:
                prechecks.setdefault(step.tool, set()).update(checked)
                checked = set()
            if step.error is None and step.key not in actions:
                # else it fixes a refused call
                actions[step.key] = {**step.action(), "requested": not refused - {step.key}}
        if step.error is None:
            refused.discard(step.key)
    reports = [milestone.name for milestone in scenario.milestones if reports_facts(milestone.holds)]
    uses_clock = any(step.tool in CLOCK_TOOLS for step in steps)
    reads_several = any(isinstance(step.result, list) and len(step.result) >= 2 for step in steps)
    evidence = {
        "family": scenario.family,
        "actions": list(actions.values()),
        "blockers": blockers,
        "prechecks": {tool: sorted(checks) for tool, checks in prechecks.items()},
        "reports": reports,
        "time_reports": reports if uses_clock else [],
        "choice_reports": reports if reads_several else [],
    }
    evidence["needs"] = [name for name in DETECTORS if _NEEDED[name](evidence)]
    return evidence


def _has_role(evidence: dict[str, Any], *roles: str) -> bool:
    return any(role in roles for action in evidence["actions"] for role in action["roles"].values())


# When a task needs each catalogue capability, judged from its evidence.
_NEEDED = {
    "permission_error_recovery": lambda evidence: bool(evidence["blockers"]),
    "datetime_reasoning": lambda evidence: _has_role(evidence, "time") or bool(evidence["time_reports"]),
    "tool_calling_precision": lambda evidence: _has_role(evidence, "literal", "text"),
    "multi_step_task_completion": lambda evidence: sum(action["requested"] for action in evidence["actions"]) >= 2,
    "precondition_verification": lambda evidence: bool(evidence["prechecks"]),
    "structured_data_reasoning": lambda evidence: _has_role(evidence, "entity") or bool(evidence["choice_reports"]),
    "information_reporting": lambda evidence: bool(evidence["reports"]),
}
DETECTORS = list(_NEEDED)

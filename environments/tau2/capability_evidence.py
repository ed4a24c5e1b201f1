"""The ground truth the rule-based capability detectors need for one τ²-bench task.

``tau2_capability_evidence(domain, task)`` replays the task's gold actions on a
fresh domain database (the task's initial state applied first) with the
agent's own tools, and reads off, as plain JSON-able data:

- ``actions``: the gold calls of WRITE tools that succeed (tool, the gold
  arguments, each argument's role), all ``requested``.
- ``prechecks``: write tool -> the READ tools the gold calls successfully
  before it and since the previous write (merged over the tool's calls).
- ``reports``: one milestone per ``communicate_info`` string, named
  ``communicate_info:<i>`` (``i`` counts from 0), and among them
  ``choice_reports``: those whose fact the gold reads off one record among
  several in a result (a variant's price, an order item's name).
- ``failed_calls``: gold calls the package refuses (some retail tasks read a
  product id that is in no product), kept as errors and otherwise skipped;
  an agent making the same call has picked no wrong entity.
- ``blockers`` and ``time_reports``: always empty on τ²-bench.
- ``needs``: the capabilities of :data:`DETECTORS` the task needs, from the above.

An argument's role is judged on its scalar values (a list's or object's leaves):

- ``entity`` when a string value is not spelled out in the user's instructions
  and the agent can only have read it from a tool: it is a record id of the
  domain's database (a key of a map of records: an order, item, user,
  reservation, flight, date or payment method id; this covers the many gold
  action lists that leave out the reads that find it), or it has a digit (an
  id, a date, a street line, a zip code) and is in a result the gold obtained
  before the call. Plain words found in results (``economy``, ``no``, a
  cancellation reason) are not entities: they are the user's choices;
- else ``literal`` when a value is spelled out in the user's instructions
  (reason for call, known info, task instructions; case aside, an id's ``#``
  prefix aside, numbers as written);
- else ``derived``: computed by the agent (a refund amount, a bag count, a date
  from "next Friday"); no detector judges it. Numbers are never entities: a
  count or amount that equals a number in some result is a computation.

The user's own gold actions (requestor ``user``) are not the agent's to make:
they are left out of the replay and of the evidence.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from environments.tau2.package import agent_tools, fresh_environment
from environments.tool_environment import ToolError

LITERAL, ENTITY, DERIVED = "literal", "entity", "derived"


@dataclass
class _Step:
    """One gold agent call as replayed."""

    tool: str
    arguments: dict[str, Any]
    tool_type: str  # the package's: read, write, think or generic
    result: Any = None  # the parsed JSON result
    error: str | None = None


def _parsed(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _replay(domain: str, task: Any) -> list[_Step]:
    """Run the task's gold agent actions on a fresh database, noting results and refusals."""
    environment = fresh_environment(domain)
    state = task.initial_state
    if state is not None:
        environment.set_state(state.initialization_data, state.initialization_actions, state.message_history or [])
    tools = {tool.name: tool.fn for tool in agent_tools(environment)}
    criteria = task.evaluation_criteria
    steps = []
    for action in (criteria.actions if criteria is not None else None) or []:
        if action.requestor != "assistant":
            continue
        step = _Step(action.name, copy.deepcopy(action.arguments), environment.tools.tool_type(action.name).value)
        try:
            step.result = _parsed(tools[action.name](**action.arguments))
        except ToolError as exc:
            step.error = str(exc)
        steps.append(step)
    return steps


# -- values ---------------------------------------------------------------------------------
def _text(value: Any) -> str:
    """A scalar as the user would write it: lower case, integral numbers without ``.0``."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip().casefold()


def _leaves(value: Any, keys: bool = False) -> list[Any]:
    """The scalars inside ``value`` (and, with ``keys``, the keys of its objects, such as record ids)."""
    if isinstance(value, dict):
        return [*(value if keys else ()), *(leaf for item in value.values() for leaf in _leaves(item, keys))]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item, keys)]
    return [] if value is None else [value]


def _record_ids(value: Any) -> set[str]:
    """The keys of every map of records (an object whose values are all objects) inside ``value``."""
    found: set[str] = set()
    if isinstance(value, dict):
        if value and all(isinstance(item, dict) for item in value.values()):
            found.update(_text(key) for key in value)
        for item in value.values():
            found |= _record_ids(item)
    elif isinstance(value, list):
        for item in value:
            found |= _record_ids(item)
    return found


@functools.cache
def _database_ids(domain: str) -> frozenset[str]:
    """The record ids of ``domain``'s database as the package ships it."""
    return frozenset(_record_ids(fresh_environment(domain).tools.db.model_dump()))


def _spelled_out(value: Any, request: str) -> bool:
    word = _text(value).lstrip("#")
    return bool(word) and re.search(r"(?<!\w)" + re.escape(word) + r"(?!\w)", request) is not None


def _read(value: Any, ids: frozenset[str], seen: set[str]) -> bool:
    """Whether a string the request does not spell out is a record id, or an identifier (it has a digit) of an earlier
    result."""
    text = _text(value)
    return text in ids or (text in seen and any(char.isdigit() for char in text))


def _role(value: Any, request: str, ids: frozenset[str], seen: set[str]) -> str:
    leaves = _leaves(value)
    if any(isinstance(leaf, str) and not _spelled_out(leaf, request) and _read(leaf, ids, seen) for leaf in leaves):
        return ENTITY
    return LITERAL if any(_spelled_out(leaf, request) for leaf in leaves) else DERIVED


def _request_text(task: Any) -> str:
    """What the user's instructions spell out, lower case."""
    instructions = task.user_scenario.instructions
    if isinstance(instructions, str):
        return instructions.casefold()
    parts = (instructions.reason_for_call, instructions.known_info, instructions.task_instructions)
    return "\n".join(part for part in parts if part).casefold()


def _same(value: Any, fact: str) -> bool:
    """Whether a result's scalar states ``fact`` (numbers compared as numbers: 481.5 states "481.50")."""
    if _text(value) == _text(fact):
        return True
    try:
        return not isinstance(value, bool) and float(value) == float(fact)
    except (TypeError, ValueError):
        return False


def _in_record_among_several(value: Any, fact: str, in_record: bool = False) -> bool:
    """Whether ``fact`` is a scalar of a record (object) that sits beside other records in a list or object."""
    if isinstance(value, (dict, list)):
        items = list(value.values() if isinstance(value, dict) else value)
        several = sum(isinstance(item, dict) for item in items) >= 2
        return any(
            _in_record_among_several(item, fact, in_record or (several and isinstance(item, dict))) for item in items
        )
    return in_record and value is not None and _same(value, fact)


# -- the evidence ---------------------------------------------------------------------------
def tau2_capability_evidence(domain: str, task: Any) -> dict[str, Any]:
    """The detectors' ground truth for the package ``Task`` ``task`` of ``domain`` (see the module docstring)."""
    request = _request_text(task)
    actions: list[dict[str, Any]] = []
    prechecks: dict[str, set[str]] = {}
    failed: list[dict[str, Any]] = []
    ids = _database_ids(domain)
    seen: set[str] = set()  # the string values and keys of earlier results
    checked: set[str] = set()  # read tools called since the last write
    steps = _replay(domain, task)
    for step in steps:
        if step.error is not None:
            failed.append({"tool": step.tool, "arguments": step.arguments, "error": step.error})
            continue
        if step.tool_type == "read":
            checked.add(step.tool)
        elif step.tool_type == "write":
            roles = {name: _role(value, request, ids, seen) for name, value in step.arguments.items()}
            actions.append({"tool": step.tool, "arguments": step.arguments, "roles": roles, "requested": True})
            if checked:
                prechecks.setdefault(step.tool, set()).update(checked)
                checked = set()
        seen.update(_text(leaf) for leaf in _leaves(step.result, keys=True) if isinstance(leaf, str))
    facts = (task.evaluation_criteria.communicate_info if task.evaluation_criteria is not None else None) or []
    reports = [f"communicate_info:{index}" for index in range(len(facts))]
    results = [step.result for step in steps if step.error is None]
    evidence = {
        "actions": actions,
        "blockers": [],
        "prechecks": {tool: sorted(checks) for tool, checks in prechecks.items()},
        "reports": reports,
        "time_reports": [],
        "choice_reports": [
            name
            for name, fact in zip(reports, facts)
            if any(_in_record_among_several(result, fact) for result in results)
        ],
        "failed_calls": failed,
    }
    evidence["needs"] = [name for name in DETECTORS if _NEEDED[name](evidence)]
    return evidence


def _has_role(evidence: dict[str, Any], role: str) -> bool:
    return any(role in action["roles"].values() for action in evidence["actions"])


# When a task needs each capability, judged from its evidence.
_NEEDED = {
    "structured_data_reasoning": lambda evidence: _has_role(evidence, ENTITY) or bool(evidence["choice_reports"]),
    "tool_calling_precision": lambda evidence: _has_role(evidence, LITERAL),
    "multi_step_task_completion": lambda evidence: len(evidence["actions"]) >= 2,
    "precondition_verification": lambda evidence: bool(evidence["prechecks"]),
    "information_reporting": lambda evidence: bool(evidence["reports"]),
}
DETECTORS = list(_NEEDED)

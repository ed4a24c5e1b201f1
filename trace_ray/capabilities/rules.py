"""The rule-based labeler (``labeler=rules``): a catalogue of tool-use capabilities with deterministic detectors.

A detector reads one trajectory and the environment's ground truth for its
task (``Environment.capability_evidence(seed)``) and returns NA, PRESENT or
LACKING. It is NA when the task does not need the capability, i.e. the
capability is missing from ``evidence["needs"]``. Otherwise it judges the
trajectory's tool calls (paired with their results), its plain-text replies
and ``reward_info["milestones"]``; a trajectory without usable tool calls or
replies (malformed calls, text only, truncated) is LACKING.

The evidence describes each state change the task needs as an action
``{"tool", "arguments", "roles", "requested"}``; an argument's role is
``literal`` (spelled out by the request), ``text`` (expected: words the text
must contain), ``entity`` (taken from a tool result) or ``time`` (a computed
timestamp); other roles (``derived``) are judged by no detector. Values other
than strings compare as data: numbers by value, lists as multisets, objects
key by key, strings inside them without case. The other fields are
``blockers`` (actions the environment's state refuses at first),
``prechecks`` (tool -> checks due before it; ``ask_user`` is a question to the
user), ``reports``, ``time_reports`` and ``choice_reports`` (milestone names).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from environments.capabilities import CAPABILITIES
from environments.errors import TraceRayError
from trace_ray.capabilities.trajectories import LACKING, NA, PRESENT, Trajectory

TIME_TOLERANCE_S = 60
ASK_USER = "ask_user"


@dataclass(frozen=True)
class Capability:
    name: str
    description: str
    detect: Callable[[Trajectory, dict], str]  # (trajectory, evidence) -> NA | PRESENT | LACKING


# -- reading a trajectory -------------------------------------------------------------------
@dataclass
class Call:
    """One tool call the agent made; ``arguments`` is None when they are not a JSON object."""

    name: str
    arguments: dict[str, Any] | None
    ok: bool = False  # a result came back and it is not an error
    result: str = ""  # the result's text


def _arguments(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return None
    return raw if isinstance(raw, dict) else None


def events(trajectory: Trajectory) -> list[Call | str]:
    """The agent's tool calls and plain-text replies, in order; each call paired with its result by position."""
    found: list[Call | str] = []
    waiting: list[Call] = []
    for message in trajectory.messages if isinstance(trajectory.messages, list) else []:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            tool_calls = message.get("tool_calls")
            waiting = []  # results come right after their message; calls left waiting got none
            if isinstance(tool_calls, list) and tool_calls:
                for call in tool_calls:
                    function = call.get("function") if isinstance(call, dict) else None
                    function = function if isinstance(function, dict) else {}
                    name = function.get("name") if isinstance(function.get("name"), str) else ""
                    found.append(Call(name, _arguments(function.get("arguments"))))
                    waiting.append(found[-1])
            else:
                content = message.get("content")
                found.append(content if isinstance(content, str) else "")
        elif message.get("role") == "tool" and waiting:
            content = message.get("content")
            answered = waiting.pop(0)
            answered.ok = isinstance(content, str) and not content.startswith("Error:")
            answered.result = content if isinstance(content, str) else ""
    return found


def calls(trajectory: Trajectory) -> list[Call]:
    return [event for event in events(trajectory) if isinstance(event, Call)]


def reached(trajectory: Trajectory) -> set[str]:
    """Names of the milestones the episode reached, from ``reward_info``."""
    milestones = trajectory.reward_info.get("milestones") if isinstance(trajectory.reward_info, dict) else None
    return {
        milestone["name"]
        for milestone in (milestones if isinstance(milestones, list) else [])
        if isinstance(milestone, dict) and milestone.get("reached") is True and isinstance(milestone.get("name"), str)
    }


# -- matching arguments ---------------------------------------------------------------------
_PHONE = re.compile(r"^\+?[\d\s().\-]{7,}$")


def _phone_digits(text: str) -> str | None:
    """The digits of a phone number, without a leading ``1`` country code."""
    if not _PHONE.match(text.strip()):
        return None
    digits = re.sub(r"\D", "", text)
    return digits[1:] if len(digits) == 11 and digits.startswith("1") else digits


def _normalise(text: str) -> str:
    """Lower case, ``5pm`` -> ``5 pm``, hyphens and commas as spaces."""
    text = text.casefold().replace("a.m.", "am").replace("p.m.", "pm")
    text = re.sub(r"(\d)\s*(am|pm)\b", r"\1 \2", text)
    return " ".join(re.sub(r"[-,]", " ", text).split())


def _mentions(text: str, word: str) -> bool:
    return re.search(r"(?<!\w)" + re.escape(_normalise(word)) + r"(?!\w)", _normalise(text)) is not None


def _matches(role: str, given: Any, expected: Any) -> bool:
    if role == "text":
        return isinstance(given, str) and all(_mentions(given, word) for word in expected)
    if role == "time":
        return (
            isinstance(given, (int, float))
            and not isinstance(given, bool)
            and abs(given - expected) <= TIME_TOLERANCE_S
        )
    if isinstance(expected, str):
        if not isinstance(given, str):
            return False
        digits = _phone_digits(expected)
        return given.strip().casefold() == expected.strip().casefold() or (
            digits is not None and _phone_digits(given) == digits
        )
    return _canonical(given) == _canonical(expected)


def _canonical(value: Any) -> str:
    """A value as a comparable string: strings without case, integers equal to floats, lists as multisets, objects by
    key."""
    if isinstance(value, str):
        return json.dumps(value.strip().casefold())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return json.dumps(float(value))
    if isinstance(value, list):
        return "[" + ",".join(sorted(_canonical(item) for item in value)) + "]"
    if isinstance(value, dict):
        return (
            "{" + ",".join(sorted(json.dumps(str(key)) + ":" + _canonical(item) for key, item in value.items())) + "}"
        )
    return json.dumps(value)


def agrees(call: Call, action: dict[str, Any], roles: Iterable[str]) -> bool:
    """Whether ``call`` is the action's tool with every argument of the given roles as expected."""
    if call.name != action["tool"] or call.arguments is None:
        return False
    return all(
        _matches(role, call.arguments.get(name), action["arguments"][name])
        for name, role in action["roles"].items()
        if role in roles
    )


def _with_role(evidence: dict[str, Any], *roles: str) -> list[dict[str, Any]]:
    return [action for action in evidence.get("actions", []) if any(role in roles for role in action["roles"].values())]


# -- the detectors --------------------------------------------------------------------------
def permission_error_recovery(trajectory: Trajectory, evidence: dict) -> str:
    """Needed when the environment's state refuses some of the oracle's calls at first (``blockers``).

    PRESENT when every blocked call succeeds in the trajectory (a successful call
    of its tool with its literal arguments), which takes fixing the blocking state
    first; LACKING when one never does (the agent gave up, or retried without the fix).
    """
    if "permission_error_recovery" not in evidence.get("needs", []):
        return NA
    made = calls(trajectory)
    recovered = all(
        any(call.ok and agrees(call, blocker, ["literal"]) for call in made) for blocker in evidence["blockers"]
    )
    return PRESENT if recovered else LACKING


def datetime_reasoning(trajectory: Trajectory, evidence: dict) -> str:
    """Needed when the task computes a timestamp (an action with a ``time`` argument) or reports a date or time
    (``time_reports``).

    PRESENT when each time-carrying action the agent called was called at least once
    with the expected timestamp (within 60 s) and every time report was reached;
    LACKING when a time was wrong on every call, a time report was missed, or the
    task has no time report and no time-carrying action was called.
    """
    if "datetime_reasoning" not in evidence.get("needs", []):
        return NA
    made, actions = calls(trajectory), _with_role(evidence, "time")
    attempted = [action for action in actions if any(call.name == action["tool"] for call in made)]
    right_times = all(any(agrees(call, action, ["time"]) for call in made) for action in attempted)
    reports = evidence.get("time_reports", [])
    exercised = bool(attempted or reports)
    return PRESENT if exercised and right_times and set(reports) <= reached(trajectory) else LACKING


def tool_calling_precision(trajectory: Trajectory, evidence: dict) -> str:
    """Needed when the task's actions take arguments spelled out by the request (``literal`` and ``text`` roles).

    Judged on those actions whose tool the agent called: PRESENT when each got at
    least one call with every literal argument equal to the expected value (case
    and phone-number format aside) and every text argument containing its words;
    LACKING when a called tool never got them right (wrong value, missing or
    malformed arguments), or when the agent called none of those tools.
    """
    if "tool_calling_precision" not in evidence.get("needs", []):
        return NA
    made = calls(trajectory)
    attempted = [
        action
        for action in _with_role(evidence, "literal", "text")
        if any(call.name == action["tool"] for call in made)
    ]
    precise = all(any(agrees(call, action, ["literal", "text"]) for call in made) for action in attempted)
    return PRESENT if attempted and precise else LACKING


def multi_step_task_completion(trajectory: Trajectory, evidence: dict) -> str:
    """Needed when the request asks for two or more actions (``requested`` actions).

    PRESENT when every requested action got its own successful call of its tool
    (two cancellations take two; any arguments: their precision is judged apart);
    LACKING when the agent stopped before one of them.
    """
    if "multi_step_task_completion" not in evidence.get("needs", []):
        return NA
    done = Counter(call.name for call in calls(trajectory) if call.ok)
    requested = Counter(action["tool"] for action in evidence["actions"] if action["requested"])
    return PRESENT if all(done[tool] >= count for tool, count in requested.items()) else LACKING


def precondition_verification(trajectory: Trajectory, evidence: dict) -> str:
    """Needed when a state change must follow checks (``prechecks``: tool -> read tools, or ``ask_user``).

    PRESENT when the agent called a gated tool, and before its first call of each
    gated tool every one of that tool's checks was made (a successful call of the
    read tool; for ``ask_user`` a reply to the user with a question mark); LACKING
    when it changed state without a required check, or made no gated change at all.
    """
    if "precondition_verification" not in evidence.get("needs", []):
        return NA
    prechecks: dict[str, list[str]] = evidence["prechecks"]
    checked: set[str] = set()
    changed = False
    for event in events(trajectory):
        if isinstance(event, str):
            if "?" in event:
                checked.add(ASK_USER)
        elif event.name in prechecks:
            if not set(prechecks[event.name]) <= checked:
                return LACKING
            changed = True
        elif event.ok:
            checked.add(event.name)
    return PRESENT if changed else LACKING


def structured_data_reasoning(trajectory: Trajectory, evidence: dict) -> str:
    """Needed when an action takes an ``entity`` from tool results or the answer is chosen among records
    (``choice_reports``).

    An entity is e.g. a contact's number or a reminder's id. PRESENT when every call of an entity-taking tool that
    names the entity names
    an expected one, at least one such call was made (unless the task only has
    choice reports), and every choice report was reached; LACKING when the agent
    picked a wrong entity even once, never used one, or reported a wrong choice.
    A call the task's own reference solution makes and the environment refuses
    (``failed_calls``, e.g. a τ²-bench refund the tool rejects) is no wrong pick.
    """
    if "structured_data_reasoning" not in evidence.get("needs", []):
        return NA
    actions = _with_role(evidence, "entity")
    entity_arguments = {
        (action["tool"], name) for action in actions for name, role in action["roles"].items() if role == "entity"
    }
    refused = {(failed["tool"], _canonical(failed["arguments"])) for failed in evidence.get("failed_calls", [])}
    used = [
        call
        for call in calls(trajectory)
        if call.arguments is not None
        and any((call.name, name) in entity_arguments for name in call.arguments)
        and (call.name, _canonical(call.arguments)) not in refused
    ]
    right = all(any(agrees(call, action, ["entity"]) for action in actions) for call in used)
    reports = evidence.get("choice_reports", [])
    exercised = bool(used) or (not actions and bool(reports))
    return PRESENT if exercised and right and set(reports) <= reached(trajectory) else LACKING


def information_reporting(trajectory: Trajectory, evidence: dict) -> str:
    """Needed when the task has report milestones (``reports``: facts the reply must tell the user).

    PRESENT when every report milestone was reached; LACKING when the user was
    told nothing, or a wrong or incomplete fact (the state may be entirely right).
    """
    if "information_reporting" not in evidence.get("needs", []):
        return NA
    return PRESENT if set(evidence["reports"]) <= reached(trajectory) else LACKING


# -- code repair (env=code_repair) -----------------------------------------------------------------
# Evidence: ``bug_file`` and ``bug_function`` (where the bug is), ``function_lines`` ([first, last] line of that
# function in the buggy file), ``function_source`` (its buggy text), ``fail_to_pass`` (the test ids that reveal it).
EDIT, RUN, READ = "replace_in_file", "run_tests", "read_file"


def _code_calls(trajectory: Trajectory, evidence: dict, capability: str) -> tuple[list[Call], list[int]] | None:
    """(the calls, the indices of the edits), or None when the task does not need ``capability``."""
    if capability not in evidence.get("needs", []):
        return None
    found = calls(trajectory)
    return found, [index for index, call in enumerate(found) if call.name == EDIT]


def _around_edits(
    trajectory: Trajectory, evidence: dict, capability: str, done: Callable[[Call], bool], after: bool
) -> str:
    """NA when not needed; PRESENT when some call satisfies ``done`` before the first edit (``after``: after the last
    one); LACKING otherwise, and always when the agent never edited."""
    found = _code_calls(trajectory, evidence, capability)
    if found is None:
        return NA
    sequence, edits = found
    if not edits:
        return LACKING
    window = sequence[edits[-1] + 1 :] if after else sequence[: edits[0]]
    return PRESENT if any(done(call) for call in window) else LACKING


def _reads_lines(call: Call, path: str, lines: list[int]) -> bool:
    arguments = call.arguments or {}
    start, end = arguments.get("start_line", 1), arguments.get("end_line")
    if not isinstance(start, int) or not isinstance(end, (int, type(None))):
        return False
    end = start + 79 if end is None else end
    return call.name == READ and call.ok and arguments.get("path") == path and start <= lines[1] and end >= lines[0]


def _runs_failing_tests(call: Call, failing: list[str]) -> bool:
    target = (call.arguments or {}).get("target") or ""
    return (
        call.name == RUN
        and call.ok
        and (not target or any(test == target or test.startswith(target + "::") for test in failing))
    )


def code_localisation(trajectory: Trajectory, evidence: dict) -> str:
    """Needed by every code-repair task: the buggy function was read (a line range that overlaps it) before the first
    edit."""
    return _around_edits(
        trajectory,
        evidence,
        "code_localisation",
        lambda call: _reads_lines(call, evidence["bug_file"], evidence["function_lines"]),
        after=False,
    )


def failure_reproduction(trajectory: Trajectory, evidence: dict) -> str:
    """Needed by every code-repair task: tests that show the failure were run before the first edit."""
    return _around_edits(
        trajectory,
        evidence,
        "failure_reproduction",
        lambda call: _runs_failing_tests(call, evidence["fail_to_pass"]),
        after=False,
    )


def fix_verification(trajectory: Trajectory, evidence: dict) -> str:
    """Needed by every code-repair task: the tests that showed the failure were run after the last edit."""
    return _around_edits(
        trajectory,
        evidence,
        "fix_verification",
        lambda call: _runs_failing_tests(call, evidence["fail_to_pass"]),
        after=True,
    )


def edit_precision(trajectory: Trajectory, evidence: dict) -> str:
    """Needed by every code-repair task: every edit applied (its snippet found once) and left the file parsing."""
    found = _code_calls(trajectory, evidence, "edit_precision")
    if found is None:
        return NA
    sequence, edits = found
    good = [sequence[index].ok and "no longer parses" not in sequence[index].result for index in edits]
    return PRESENT if good and all(good) else LACKING


def minimal_change(trajectory: Trajectory, evidence: dict) -> str:
    """Needed by every code-repair task: every applied edit stays inside the buggy function (its file, a snippet of
    it)."""
    found = _code_calls(trajectory, evidence, "minimal_change")
    if found is None:
        return NA
    sequence, edits = found
    applied = [sequence[index].arguments or {} for index in edits if sequence[index].ok]
    inside = [
        edit.get("path") == evidence["bug_file"] and str(edit.get("old", "")) in evidence["function_source"]
        for edit in applied
    ]
    return PRESENT if inside and all(inside) else LACKING


DETECTORS: dict[str, Callable[[Trajectory, dict], str]] = {
    "permission_error_recovery": permission_error_recovery,
    "datetime_reasoning": datetime_reasoning,
    "tool_calling_precision": tool_calling_precision,
    "multi_step_task_completion": multi_step_task_completion,
    "precondition_verification": precondition_verification,
    "structured_data_reasoning": structured_data_reasoning,
    "information_reporting": information_reporting,
    "code_localisation": code_localisation,
    "failure_reproduction": failure_reproduction,
    "fix_verification": fix_verification,
    "edit_precision": edit_precision,
    "minimal_change": minimal_change,
}

CATALOGUE: dict[str, Capability] = {
    name: Capability(name, CAPABILITIES[name], detect) for name, detect in DETECTORS.items()
}


def label_trajectories(
    trajectories: list[Trajectory], evidence_by_task: dict[str, dict], names: list[str]
) -> dict[str, dict[str, str]]:
    """Capability -> trajectory id -> label; a task without evidence gets NA."""
    unknown = [name for name in names if name not in CATALOGUE]
    if unknown:
        raise TraceRayError(f"unknown rule capabilities {', '.join(unknown)}; the catalogue has {', '.join(CATALOGUE)}")
    return {
        name: {
            trajectory.id: CATALOGUE[name].detect(trajectory, evidence_by_task.get(trajectory.task_id, {}))
            for trajectory in trajectories
        }
        for name in names
    }

"""The LLM labeler (``labeler=llm``): an analysis model proposes candidate capabilities, then labels trajectories.

The model sits behind any OpenAI-compatible endpoint (vLLM's server, a hosted
API). It first proposes up to N candidates from compacted successes and
failures, then labels every (trajectory, capability) pair NA, PRESENT or
LACKING, one request per trajectory. Each answer must be strict JSON of a
fixed schema; an invalid one is sent back with the validation error for a
corrected answer, a bounded number of times.

Only the proposal sees outcomes (it contrasts successes with failures). A
labeling prompt shows the conversation alone: no id, success, reward or
termination, so a label cannot echo the outcome that Cov and Delta are then
computed against.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable
from typing import Any

from environments.errors import TraceRayError
from trace_ray.capabilities.trajectories import LABELS, Trajectory
from trace_ray.llm_client import LLMClient, one_line

RESULT_CHARS = 300  # a tool call's arguments and result, each, in a compacted trajectory
CUT_MARKER = "\n[... cut ...]\n"
PROPOSAL_PROMPT_CHARS = 60_000  # the trajectories shown to propose candidates, in all
PROPOSAL_MAX_PER_OUTCOME = 8
MAX_EXAMPLES = 4
NAME_CHARS = 64  # longest capability name a proposal may give
DESCRIPTION_CHARS = 400  # longest description a proposal may give
_SNAKE_CASE = re.compile(r"^[a-z][a-z0-9_]*$")


class LabelerError(TraceRayError):
    """The labeler endpoint or model failed; the message names the cause and the fix."""


# -- compacting trajectories ------------------------------------------------------------------
def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _text(content: Any) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else json.dumps(content)


def cut_middle(text: str, max_chars: int) -> str:
    """``text`` if it fits ``max_chars``, else its head (2/3) and tail (1/3) around :data:`CUT_MARKER`."""
    if len(text) <= max_chars:
        return text
    keep = max(0, max_chars - len(CUT_MARKER))
    head = keep * 2 // 3
    return text[:head] + CUT_MARKER + text[len(text) - (keep - head) :]


def _message_lines(messages: Any) -> list[str]:
    """The user requests, tool calls with (clipped) results and replies of an OpenAI conversation, one per line.

    The system message is left out; the last plain assistant reply is the "final reply".
    """
    messages = [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []
    replies = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and not m.get("tool_calls")]
    lines = []
    for index, message in enumerate(messages):
        role, content = message.get("role"), _text(message.get("content"))
        if role == "user":
            lines.append(f"user: {content}")
        elif role == "tool":
            lines.append(f"  -> {_clip(content, RESULT_CHARS)}")
        elif role == "assistant":
            speaker = "final reply" if replies and index == replies[-1] else "assistant"
            if content:
                lines.append(f"{speaker}: {content}")
            for call in message.get("tool_calls") or []:
                function = call.get("function") if isinstance(call, dict) else None
                function = function if isinstance(function, dict) else {}
                arguments = _text(function.get("arguments"))
                lines.append(f"call {function.get('name', '?')}({_clip(arguments, RESULT_CHARS)})")
    return lines


def compact_messages(messages: list[dict], max_chars: int) -> str:
    """An OpenAI conversation as prompt text: requests, tool calls with results, final reply.

    Like :func:`compact_trajectory` without its header line: the system message
    is left out and a text over ``max_chars`` loses its middle.
    """
    return cut_middle("\n".join(_message_lines(messages)), max_chars)


def compact_trajectory(trajectory: Trajectory, max_chars: int) -> str:
    """One trajectory as proposal text: outcome, request, tool calls with results, final reply.

    A text over ``max_chars`` loses its middle (the request and the final reply
    matter most), replaced by a marker. The header states the outcome: never put
    this in a labeling prompt (:func:`labeling_request` shows the conversation alone).
    """
    outcome = "success" if trajectory.success else "failure"
    header = f"trajectory {trajectory.id}: {outcome} (reward {trajectory.reward:.2f}, {trajectory.termination})"
    return cut_middle("\n".join([header, *_message_lines(trajectory.messages)]), max_chars)


# -- asking for strict JSON -------------------------------------------------------------------
def _parse_json(answer: str) -> Any:
    """The JSON in ``answer`` (a surrounding ``` fence tolerated); raises ValueError."""
    text = answer.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", text, flags=re.DOTALL)
    try:
        return json.loads(fenced.group(1) if fenced else text)
    except json.JSONDecodeError as error:
        raise ValueError(f"the answer is not valid JSON ({error})") from None


def _ask(
    client: LLMClient,
    messages: list[dict],
    seed: int,
    temperature: float,
    schema: dict,
    validate: Callable[[Any], Any],
    max_repairs: int,
    what: str,
) -> Any:
    """``validate``'s result for the model's answer, after at most ``max_repairs`` corrections.

    ``schema`` constrains the answer where the endpoint supports it; ``validate``
    checks it either way (it also checks what a schema cannot, such as unique names).
    """
    messages = list(messages)
    for _repair in range(max_repairs + 1):
        answer = client.chat(messages, seed=seed, temperature=temperature, schema=schema)
        try:
            return validate(_parse_json(answer))
        except ValueError as error:
            problem = str(error)
        messages += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": f"Your answer is invalid: {problem}. Reply with the corrected JSON only."},
        ]
    raise LabelerError(
        f"the labeler model's {what} stayed invalid after {max_repairs} repairs ({one_line(problem)}); "
        "use a stronger labeler.model or allow more labeler.max_repairs"
    )


# -- proposing candidates ---------------------------------------------------------------------
PROPOSE_SYSTEM = (
    "You analyse trajectories of an LLM agent that uses tools to carry out user requests. "
    "Contrast the successful and the failed trajectories and name the capabilities the agent lacks in the failures: "
    "general skills (such as recovering from a tool error or computing a date), not single tasks. "
    "Answer with strict JSON only."
)


def _shown(trajectories: list[Trajectory], max_chars: int, seed: int) -> list[Trajectory]:
    """A seeded, balanced sample of failures and successes that fits the proposal prompt."""
    per_outcome = max(1, min(PROPOSAL_MAX_PER_OUTCOME, PROPOSAL_PROMPT_CHARS // (2 * max_chars)))
    rng = random.Random(seed)
    shown = []
    for success in (False, True):
        group = sorted((t for t in trajectories if t.success == success), key=lambda t: t.id)
        shown += sorted(rng.sample(group, min(per_outcome, len(group))), key=lambda t: t.id)
    return shown


def candidates_schema(max_candidates: int, known_ids: list[str]) -> dict:
    """The JSON schema of a proposal answer: 1 to ``max_candidates`` named capabilities citing shown ids."""
    candidate = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": f"^[a-z][a-z0-9_]{{0,{NAME_CHARS - 1}}}$"},
            "description": {"type": "string", "minLength": 1, "maxLength": DESCRIPTION_CHARS},
            "example_trajectories": {
                "type": "array",
                "items": {"type": "string", "enum": known_ids},
                "minItems": 1,
                "maxItems": MAX_EXAMPLES,
            },
        },
        "required": ["name", "description", "example_trajectories"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"candidates": {"type": "array", "items": candidate, "minItems": 1, "maxItems": max_candidates}},
        "required": ["candidates"],
        "additionalProperties": False,
    }


def _candidates_validator(max_candidates: int, known_ids: set[str]) -> Callable[[Any], dict[str, dict]]:
    def validate(document: Any) -> dict[str, dict]:
        entries = document.get("candidates") if isinstance(document, dict) else None
        if not isinstance(entries, list):
            raise ValueError('the answer must be an object {"candidates": [...]}')
        if not 1 <= len(entries) <= max_candidates:
            raise ValueError(f"give 1 to {max_candidates} candidates, not {len(entries)}")
        found: dict[str, dict] = {}
        for number, entry in enumerate(entries, start=1):
            if not isinstance(entry, dict):
                raise ValueError(f"candidate {number} is not an object")
            name, description, examples = entry.get("name"), entry.get("description"), entry.get("example_trajectories")
            if not isinstance(name, str) or not _SNAKE_CASE.match(name):
                raise ValueError(f"candidate {number} name {name!r} is not snake_case (^[a-z][a-z0-9_]*$)")
            if name in found:
                raise ValueError(f"candidate name {name!r} appears twice")
            if not isinstance(description, str) or not description.strip():
                raise ValueError(f"candidate {name!r} needs a non-empty description string")
            if not isinstance(examples, list) or not examples or not all(isinstance(i, str) for i in examples):
                raise ValueError(f"candidate {name!r} needs example_trajectories, a non-empty list of trajectory ids")
            unknown = [i for i in examples if i not in known_ids]
            if unknown:
                raise ValueError(f"candidate {name!r} cites unknown trajectory ids {unknown}; use only the ids shown")
            found[name] = {"description": description.strip(), "example_trajectories": examples}
        return found

    return validate


def propose_candidates(
    client: LLMClient,
    trajectories: list[Trajectory],
    max_candidates: int,
    seed: int,
    temperature: float,
    max_chars: int,
    max_repairs: int = 2,
) -> dict[str, dict]:
    """Name -> {"description", "example_trajectories"}: up to ``max_candidates`` capabilities the failures lack."""
    if not trajectories:
        raise LabelerError("no trajectories to propose capabilities from; run trace-ray collect first")
    shown = _shown(trajectories, max_chars, seed)
    sections = [
        f"{title} trajectories:\n\n" + "\n\n".join(compact_trajectory(t, max_chars) for t in group)
        for title, group in (
            ("Failed", [t for t in shown if not t.success]),
            ("Successful", [t for t in shown if t.success]),
        )
        if group
    ]
    request = (
        "\n\n".join(sections)
        + f"\n\nPropose at most {max_candidates} candidate capabilities that the failed trajectories lack and the "
        "successful ones show. Answer with strict JSON only, of this form:\n"
        '{"candidates": [{"name": "snake_case_name", "description": "one sentence: what the agent must be able to do", '
        f'"example_trajectories": ["2 to {MAX_EXAMPLES} ids of the trajectories above that lack it"]}}]}}\n'
        "Names are unique and snake_case (lower-case letters, digits, underscores, starting with a letter)."
    )
    messages = [{"role": "system", "content": PROPOSE_SYSTEM}, {"role": "user", "content": request}]
    schema = candidates_schema(max_candidates, [t.id for t in shown])
    validate = _candidates_validator(max_candidates, {t.id for t in shown})
    return _ask(client, messages, seed, temperature, schema, validate, max_repairs, "candidates")


# -- labeling trajectories --------------------------------------------------------------------
LABEL_SYSTEM = (
    "You judge one trajectory of an LLM agent that uses tools to carry out a user request. "
    "For each capability give one label:\n"
    "NA: the task does not need the capability;\n"
    "PRESENT: the task needs it and the agent exercised it;\n"
    "LACKING: the task needs it but the agent did not exercise it (or got it wrong).\n"
    "Answer with strict JSON only."
)


def seed_offset(trajectory_id: str) -> int:
    """A stable offset for a trajectory's labeling seed, from its id."""
    return int(hashlib.sha256(trajectory_id.encode()).hexdigest()[:7], 16)


def labels_schema(names: list[str]) -> dict:
    """The JSON schema of a labeling answer: every capability in ``names`` labeled NA, PRESENT or LACKING."""
    labels = {
        "type": "object",
        "properties": {name: {"type": "string", "enum": list(LABELS)} for name in names},
        "required": list(names),
        "additionalProperties": False,
    }
    return {"type": "object", "properties": {"labels": labels}, "required": ["labels"], "additionalProperties": False}


def _labels_validator(names: list[str]) -> Callable[[Any], dict[str, str]]:
    def validate(document: Any) -> dict[str, str]:
        labels = document.get("labels") if isinstance(document, dict) else None
        if not isinstance(labels, dict):
            raise ValueError('the answer must be an object {"labels": {capability: label}}')
        unknown = [name for name in labels if name not in names]
        if unknown:
            raise ValueError(f"unknown capabilities {unknown}; label exactly {names}")
        missing = [name for name in names if name not in labels]
        if missing:
            raise ValueError(f"missing capabilities {missing}; label every one of {names}")
        result = {}
        for name in names:
            value = labels[name]
            if not isinstance(value, str) or value.strip().upper() not in LABELS:
                raise ValueError(f"label {value!r} of {name!r} is not one of NA, PRESENT, LACKING")
            result[name] = value.strip().upper()
        return result

    return validate


def labeling_request(candidates: dict[str, str], trajectory: Trajectory, max_chars: int) -> str:
    """The labeling prompt of one trajectory: the capabilities, then its conversation without any outcome."""
    return (
        f"Capabilities (name: description):\n{json.dumps(candidates, indent=1)}\n\n"
        "Trajectory (requests, tool calls with results, final "
        f"reply):\n{compact_messages(trajectory.messages, max_chars)}\n\n"
        "Label every capability above, and no other, with NA, PRESENT or LACKING. Answer with strict JSON only: "
        '{"labels": {"capability_name": "NA" | "PRESENT" | "LACKING"}}'
    )


def label_trajectories_llm(
    client: LLMClient,
    trajectories: list[Trajectory],
    candidates: dict[str, str],
    seed: int,
    temperature: float,
    max_chars: int,
    max_repairs: int = 2,
) -> dict[str, dict[str, str]]:
    """Capability -> trajectory id -> label, one request per trajectory (seed + the trajectory's offset)."""
    names = list(candidates)
    schema, validate = labels_schema(names), _labels_validator(names)
    labels: dict[str, dict[str, str]] = {name: {} for name in names}
    for trajectory in trajectories:
        request = labeling_request(candidates, trajectory, max_chars)
        messages = [{"role": "system", "content": LABEL_SYSTEM}, {"role": "user", "content": request}]
        found = _ask(
            client,
            messages,
            seed + seed_offset(trajectory.id),
            temperature,
            schema,
            validate,
            max_repairs,
            f"labels of {trajectory.id}",
        )
        for name, label in found.items():
            labels[name][trajectory.id] = label
    return labels

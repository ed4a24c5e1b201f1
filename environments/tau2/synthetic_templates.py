"""Templates of synthetic capability environments on the τ²-bench airline and retail targets: the shared machinery.

A template builds one task on a :class:`Tau2Draft` at a difficulty (1-3;
higher = more records, distractors or steps) and returns the user's request,
which states everything the agent needs (identity, order or reservation
numbers, choices, payment method). The draft collects the generated database,
the oracle (one tool call per turn as the policies ask, a confirmation
question before any write, a final reply), the facts the final reply must
report and the oracle turns that exercise the capability; ``finish`` runs the
oracle's calls with the package's toolkit on a copy of the database to get the
expected final state. Every template draws all its randomness from
``draft.rng``.

This module holds what the templates share: the facts the final reply must
report (:class:`Fact` and its helpers), :class:`Tau2Task`, :class:`Tau2Draft`,
:class:`~environments.synthetic.template.CapabilityTemplate`, the multi-step :class:`Action` with the confirmation
helpers, and the capability descriptions. The templates themselves are in
``airline_templates.py`` (``AIRLINE_TEMPLATES``) and ``retail_templates.py``
(``RETAIL_TEMPLATES``).
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from environments.protocol import Message
from environments.synthetic.template import CapabilityTemplate
from environments.tau2.package import agent_tools, domain_module
from environments.tau2.synthetic_data import AirlineData, RetailData, empty_database
from environments.tool_environment import check_arguments

DIFFICULTIES = (1, 2, 3)


# -- facts the final reply must report -----------------------------------------------------------
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
# an amount or count: at most six digits before the point, not part of an id, a date, a time or a long number
_AMOUNT = re.compile(r"(?<![\w#/:.-])(\d{1,3}(?:,\d{3})+|\d{1,6})(\.\d+)?(?![\w/:-]|\.\d|,\d{3})")
NEGATIONS = (
    "cannot",
    "can't",
    "can not",
    "could not",
    "couldn't",
    "unable",
    "not able",
    "not eligible",
    "ineligible",
    "not possible",
    "not allowed",
    "won't",
    "did not",
    "didn't",
    "declined",
    "denied",
)


def mentions(text: str, phrase: str) -> bool:
    """``phrase`` in ``text`` as whole words, ignoring case and curly apostrophes."""
    text, phrase = text.casefold().replace("\u2019", "'"), phrase.casefold()
    return re.search(r"(?<!\w)" + re.escape(phrase) + r"(?!\w)", text) is not None


def stated_amounts(text: str) -> set[float]:
    """Every amount or count ``text`` states (ids, dates, times and numbers of seven or more digits aside)."""
    return {round(float(whole.replace(",", "") + fraction), 2) for whole, fraction in _AMOUNT.findall(text)}


@dataclass(frozen=True)
class Fact:
    """A fact the final reply must tell: ``amount`` among its numbers (to the cent), and one phrase of every group.

    ``rivals``: phrases of the other values of the fact's kind (the other statuses).
    """

    name: str
    groups: tuple[tuple[str, ...], ...] = ()
    amount: float | None = None
    rivals: tuple[str, ...] = ()

    def found_in(self, text: str) -> bool:
        if self.amount is not None:
            numbers = [float(number.replace(",", "")) for number in _NUMBER.findall(text)]
            if not any(abs(number - self.amount) < 0.005 for number in numbers):
                return False
        return all(any(mentions(text, phrase) for phrase in group) for group in self.groups)

    def reported_in(self, text: str, reference: str) -> bool:
        """``text`` tells the fact and no other value of its kind than ``reference`` (the oracle's reply) tells:
        no amount or count beside the reference's, no rival phrase the reference does not use."""
        if not self.found_in(text):
            return False
        if self.amount is not None and not stated_amounts(text) <= stated_amounts(reference) | {self.amount}:
            return False
        return not any(mentions(text, rival) and not mentions(reference, rival) for rival in self.rivals)


def amount_fact(name: str, amount: float) -> Fact:
    return Fact(name, amount=round(abs(amount), 2))


def text_fact(name: str, *alternatives: str, rivals: tuple[str, ...] = ()) -> Fact:
    return Fact(name, (alternatives,), rivals=rivals)


def denial_fact(identifier: str) -> Fact:
    """The reply names ``identifier`` and says it could not be done."""
    return Fact(f"told the user {identifier} cannot be done", ((identifier.lstrip("#"),), NEGATIONS))


def money(amount: float) -> str:
    return f"${abs(amount):,.2f}"


# -- a task and its draft ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Tau2Task:
    domain: str
    capability: str
    request: str
    db: dict[str, Any]  # the initial database, as the package model's dump
    oracle: tuple[Message, ...]
    facts: tuple[Fact, ...]
    capability_turns: tuple[int, ...]
    broken_turns: dict[int, Message]  # capability turns broken by a wrong action rather than by corrupting them
    initial_hash: str
    expected_hash: str

    @property
    def writes(self) -> bool:
        return self.initial_hash != self.expected_hash


def package_environment(domain: str, db: Any) -> Any:
    """The package's Environment of ``domain`` over ``db`` (its toolkit and policy)."""
    return domain_module(domain).get_environment(db=db)


@functools.cache
def tool_parameters(domain: str) -> dict[str, dict[str, Any]]:
    """Tool name -> its JSON-schema parameters (the same for every database; building them is the slow part)."""
    return {tool.name: tool.parameters for tool in agent_tools(package_environment(domain, empty_database(domain)))}


def tool_call(name: str, arguments: dict[str, Any], call_id: str) -> Message:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


class Tau2Draft:
    """A task under construction: the generated records, the oracle, the facts and the capability turns."""

    def __init__(self, domain: str, rng: random.Random):
        self.domain = domain
        self.rng = rng
        self.data = AirlineData(rng) if domain == "airline" else RetailData(rng)
        self.oracle: list[Message] = []
        self.facts: list[Fact] = []
        self.capability_turns: list[int] = []
        self.broken_turns: dict[int, Message] = {}

    def call(self, tool: str, /, **arguments: Any) -> None:
        """Append an oracle turn with one tool call."""
        self.oracle.append(tool_call(tool, arguments, f"call_{len(self.oracle)}"))

    def say(self, text: str) -> None:
        self.oracle.append({"role": "assistant", "content": text})

    def mark_capability_step(self, instead: tuple[str, dict[str, Any]] | None = None) -> None:
        """Mark the last oracle turn as the capability's step; ``instead``: the wrong call that breaks it (else
        corrupted)."""
        turn = len(self.oracle) - 1
        self.capability_turns.append(turn)
        if instead is not None:
            self.broken_turns[turn] = tool_call(instead[0], instead[1], f"call_broken_{turn}")

    def report(self, *facts: Fact) -> None:
        self.facts.extend(facts)

    def finish(self, capability: str, request: str) -> Tau2Task:
        """The task, with the expected final state from the oracle's calls run on a copy of the database."""
        db = self.data.db()
        dump = db.model_dump()
        environment = package_environment(self.domain, type(db).model_validate(dump))
        initial_hash = environment.get_db_hash()
        parameters = tool_parameters(self.domain)
        for message in self.oracle:
            for call in message.get("tool_calls") or []:
                name, arguments = call["function"]["name"], json.loads(call["function"]["arguments"])
                try:
                    problem = check_arguments(arguments, parameters[name])
                    if problem:
                        raise ValueError(problem)
                    environment.use_tool(name, **arguments)
                except Exception as exc:  # the package refuses by raising
                    raise RuntimeError(
                        f"the {capability} template's oracle call {name}({arguments}) failed: {exc}"
                    ) from None
        return Tau2Task(
            self.domain,
            capability,
            request,
            dump,
            tuple(self.oracle),
            tuple(self.facts),
            tuple(self.capability_turns),
            dict(self.broken_turns),
            initial_hash,
            environment.get_db_hash(),
        )


@dataclass(frozen=True)
class Action:
    """One write of a multi-step request: how the user asks, the confirmation item, the reply sentence, the call, its
    fact."""

    clause: str
    confirmation: str
    reply: str
    tool: str
    arguments: dict[str, Any]
    fact: Fact


def _check(difficulty: int) -> None:
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {list(DIFFICULTIES)}, got {difficulty!r}")


def _join(clauses: list[str]) -> str:
    return clauses[0] if len(clauses) == 1 else ", ".join(clauses[:-1]) + " and " + clauses[-1]


def _confirm(draft: Tau2Draft, actions: list[str]) -> None:
    draft.say(f"Here is what I will do: {'; '.join(actions)}. Do you confirm (yes/no)?")


def _do_all(draft: Tau2Draft, actions: list[Action]) -> str:
    """One confirmation for every action, the writes (each after the first marked), one reply; returns the request's
    list."""
    _confirm(draft, [action.confirmation for action in actions])
    for index, action in enumerate(actions):
        draft.call(action.tool, **action.arguments)
        if index:
            draft.mark_capability_step()
        draft.report(action.fact)
    draft.say(" ".join(action.reply for action in actions))
    clauses = [action.clause for action in actions]
    return f"{'; '.join(clauses[:-1])}; and finally {clauses[-1]}"


DESCRIPTIONS = {
    "structured_data_reasoning": (
        "Find the record the user means in nested tool results (order, variant, reservation) and use its exact fields "
        "with the policy's rules."
    ),
    "tool_calling_precision": (
        "Call the right write tool with exactly the values the user gave, in the tool's formats (ids, enums, dates, "
        "addresses, whole lists)."
    ),
    "multi_step_task_completion": (
        "Carry out every action of a request that asks for several, across orders or reservations, instead of stopping "
        "after the first."
    ),
    "precondition_verification": (
        "Check the policy's preconditions (status, ownership, cancellation rules) before writing, act only where they "
        "hold, and say where not."
    ),
    "information_reporting": "Tell the user the facts asked for (statuses, amounts, balances, prices) correctly in the "
    "final reply.",
}


def _templates(builders: dict[str, Callable[[Tau2Draft, int], str]]) -> dict[str, CapabilityTemplate[Tau2Draft, str]]:
    return {name: CapabilityTemplate(name, DESCRIPTIONS[name], build, DIFFICULTIES) for name, build in builders.items()}

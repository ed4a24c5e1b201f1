"""Scoring: weighted milestones checked against the final state and the episode log.

A milestone is a name, a weight and a predicate ``(state, log) -> bool``. The
predicates are state checks (a setting, a sent message, a reminder, a
contact), read checks (a lookup with the task's own arguments), report checks
(the agent's replies state the asked facts and no rival value of their kind)
and question checks. Minefields use the same predicates: any minefield that
holds makes the score 0; every task has one for changes it did not ask for.

Some predicates are judged against the task's reference solution, its oracle:
a report may state what the oracle's replies state, a lookup may repeat any
of the oracle's lookups, and the oracle's final state says which changes the
task asks for. A scenario binds them once it is built (:func:`bind_to_oracle`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from environments.device.clock import to_datetime
from environments.device.facts import Fact, mentions_all, states_only_allowed
from environments.device.phone_numbers import same_phone
from environments.device.state import SETTINGS, Contact, DeviceState
from environments.protocol import Message
from environments.tool_environment import EpisodeLog

Predicate = Callable[[DeviceState, EpisodeLog], bool]


@dataclass(frozen=True)
class Milestone:
    name: str
    holds: Predicate
    weight: float = 1.0


@dataclass(frozen=True)
class Oracle:
    """What a predicate may be judged against: the oracle's replies (joined) and its tool calls (name, JSON
    arguments)."""

    replies: str
    calls: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, messages: list[Message]) -> Oracle:
        replies = "\n".join(message["content"] for message in messages if message.get("content"))
        calls = tuple(
            (call["function"]["name"], call["function"]["arguments"])
            for message in messages
            for call in message.get("tool_calls") or []
        )
        return cls(replies, calls)


def bind_to_oracle(predicate: Predicate, oracle: Oracle) -> Predicate:
    """``predicate`` judged against ``oracle`` where it needs one (see :class:`Reported`, :class:`LookedUp`,
    :class:`All`)."""
    bind = getattr(predicate, "bound_to", None)
    return bind(oracle) if bind is not None else predicate


# -- state predicates ---------------------------------------------------------------------
@dataclass(frozen=True)
class SettingIs:
    setting: str
    value: bool

    def __call__(self, state: DeviceState, log: EpisodeLog) -> bool:
        return getattr(state.settings, self.setting) == self.value


@dataclass(frozen=True)
class MessageSent:
    """The owner sent ``phone_number`` a message mentioning every word."""

    phone_number: str
    words: tuple[str, ...] = ()

    def __call__(self, state: DeviceState, log: EpisodeLog) -> bool:
        return any(
            same_phone(message.recipient_phone_number, self.phone_number)
            and message.sender_phone_number == state.owner.phone_number
            and mentions_all(message.content, self.words)
            for message in state.messages
        )


@dataclass(frozen=True)
class ReminderSet:
    """A reminder mentioning every word, at ``timestamp`` (within a minute) when one is given."""

    words: tuple[str, ...]
    timestamp: int | None = None

    def __call__(self, state: DeviceState, log: EpisodeLog) -> bool:
        return any(
            mentions_all(reminder.content, self.words)
            and (self.timestamp is None or abs(reminder.reminder_timestamp - self.timestamp) <= 60)
            for reminder in state.reminders
        )


@dataclass(frozen=True)
class ReminderGone:
    reminder_id: str

    def __call__(self, state: DeviceState, log: EpisodeLog) -> bool:
        return all(reminder.reminder_id != self.reminder_id for reminder in state.reminders)


@dataclass(frozen=True)
class ContactSaved:
    """A contact with this name (case-insensitive) and number, and relationship when given."""

    name: str
    phone_number: str
    relationship: str | None = None

    def __call__(self, state: DeviceState, log: EpisodeLog) -> bool:
        return any(
            contact.name.casefold() == self.name.casefold()
            and same_phone(contact.phone_number, self.phone_number)
            and (self.relationship is None or contact.relationship.casefold() == self.relationship.casefold())
            for contact in state.contacts
        )


@dataclass(frozen=True)
class Collateral:
    """The agent changed something the task does not ask for: something the oracle leaves as it found it.

    ``initial`` is the task's starting state, ``expected`` the state the
    oracle's calls leave. Changes: a setting, or an existing contact, the
    oracle does not touch; more new contacts or reminders than the oracle
    makes; a message to someone the oracle does not text; a reminder the
    oracle keeps, removed.
    """

    initial: DeviceState
    expected: DeviceState

    def __call__(self, state: DeviceState, log: EpisodeLog) -> bool:
        return bool(collateral_changes(self.initial, self.expected, state))


def _card(contact: Contact) -> tuple[str, str, str]:
    return contact.name, contact.phone_number, contact.relationship


def collateral_changes(initial: DeviceState, expected: DeviceState, final: DeviceState) -> list[str]:
    """What ``final`` changed of ``initial`` that ``expected`` leaves unchanged (see :class:`Collateral`)."""
    changes = [
        f"setting {name}"
        for name in SETTINGS
        if getattr(final.settings, name) != getattr(initial.settings, name)
        and getattr(expected.settings, name) == getattr(initial.settings, name)
    ]
    before = {contact.person_id: _card(contact) for contact in initial.contacts}
    kept = {contact.person_id: _card(contact) for contact in expected.contacts}
    now = {contact.person_id: _card(contact) for contact in final.contacts}
    changes += [
        f"contact {person}" for person, card in before.items() if now.get(person) != card and kept.get(person) == card
    ]
    if len(set(now) - set(before)) > len(set(kept) - set(before)):
        changes.append("new contacts")
    old_messages = {message.message_id for message in initial.messages}
    texted = [message.recipient_phone_number for message in expected.messages if message.message_id not in old_messages]
    changes += [
        f"message to {message.recipient_phone_number}"
        for message in final.messages
        if message.message_id not in old_messages
        and not any(same_phone(message.recipient_phone_number, number) for number in texted)
    ]
    old_reminders = {reminder.reminder_id for reminder in initial.reminders}
    expected_reminders = {reminder.reminder_id for reminder in expected.reminders}
    final_reminders = {reminder.reminder_id for reminder in final.reminders}
    changes += [
        f"reminder {reminder} removed" for reminder in sorted((old_reminders & expected_reminders) - final_reminders)
    ]
    if len(final_reminders - old_reminders) > len(expected_reminders - old_reminders):
        changes.append("new reminders")
    return changes


# -- read predicates ------------------------------------------------------------------------
def _same_argument(key: str, given: Any, expected: Any) -> bool:
    """Equal values; strings ignoring case (phone numbers by digits); a timestamp to read anywhere in the same UTC
    day."""
    if isinstance(given, str) and isinstance(expected, str):
        return given.strip().casefold() == expected.strip().casefold() or same_phone(given, expected)
    if key == "timestamp" and isinstance(given, int) and isinstance(expected, int) and not isinstance(given, bool):
        try:
            return to_datetime(given).date() == to_datetime(expected).date()
        except ValueError:
            return False
    return given == expected


def _has_arguments(given: dict[str, Any] | None, expected: dict[str, Any]) -> bool:
    return given is not None and all(
        key in given and _same_argument(key, given[key], value) for key, value in expected.items()
    )


@dataclass(frozen=True)
class LookedUp:
    """A successful ``tool`` call with the task's own ``arguments``, and no call of it that found other records.

    A call without arguments (read everything) earns nothing. A call with
    other arguments than any of the oracle's calls of ``tool`` that returned
    something (another contact, another day) voids the milestone: trying
    every value in turn is not looking the task's record up.
    """

    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)
    oracle_arguments: tuple[str, ...] = ()  # JSON arguments of the oracle's calls of ``tool``

    def bound_to(self, oracle: Oracle) -> LookedUp:
        return replace(self, oracle_arguments=tuple(arguments for name, arguments in oracle.calls if name == self.tool))

    def __call__(self, state: DeviceState, log: EpisodeLog) -> bool:
        calls = [call for call in log.tool_calls if call.ok and call.name == self.tool and call.arguments]
        allowed = [self.arguments, *(json.loads(arguments) for arguments in self.oracle_arguments)]
        strays = [
            call
            for call in calls
            if call.result.strip() not in ("[]", "")
            and not any(_has_arguments(call.arguments, expected) for expected in allowed)
        ]
        return any(_has_arguments(call.arguments, self.arguments) for call in calls) and not strays


@dataclass(frozen=True)
class SentToOther:
    """A message was sent to any number but ``phone_number``."""

    phone_number: str

    def __call__(self, state: DeviceState, log: EpisodeLog) -> bool:
        return any(
            call.ok
            and call.name == "send_message_with_phone_number"
            and not same_phone(call.arguments["phone_number"], self.phone_number)
            for call in log.tool_calls
        )


# -- conversation predicates --------------------------------------------------------------
@dataclass(frozen=True)
class Asked:
    """Before the first successful ``before_tool`` call (None: any time) and before its last reply, the agent asked the
    user a question (a reply with '?') naming at least two of the ``candidates`` and no value of their kind outside
    them.
    """

    candidates: tuple[Fact, ...]
    before_tool: str | None = None

    def __call__(self, state: DeviceState, log: EpisodeLog) -> bool:
        called = {call.turn for call in log.tool_calls}
        # one reply per turn without calls
        reply_turns = [turn for turn in range(1, log.turns + 1) if turn not in called]
        acted = min(
            (call.turn for call in log.tool_calls if call.ok and call.name == self.before_tool), default=log.turns + 1
        )
        allowed = {candidate.value for candidate in self.candidates}
        return any(
            "?" in reply
            and turn < acted
            and sum(candidate.found_in(reply) for candidate in self.candidates) >= 2
            and all(candidate.stated(reply) <= allowed for candidate in self.candidates)
            for turn, reply in zip(reply_turns[:-1], log.replies[:-1])
        )


@dataclass(frozen=True)
class Reported:
    """The agent's replies state every fact, and no value of a fact's kind that the oracle's replies do not state."""

    facts: tuple[Fact, ...]
    oracle_replies: str = ""

    def bound_to(self, oracle: Oracle) -> Reported:
        return replace(self, oracle_replies=oracle.replies)

    def __call__(self, state: DeviceState, log: EpisodeLog) -> bool:
        said = "\n".join(log.replies)
        return all(states_only_allowed(fact, said, self.oracle_replies) for fact in self.facts)


@dataclass(frozen=True)
class All:
    """Every predicate holds (a report of a change counts only when the change was made)."""

    predicates: tuple[Predicate, ...]

    def bound_to(self, oracle: Oracle) -> All:
        return All(tuple(bind_to_oracle(predicate, oracle) for predicate in self.predicates))

    def __call__(self, state: DeviceState, log: EpisodeLog) -> bool:
        return all(predicate(state, log) for predicate in self.predicates)


def reports_facts(predicate: Predicate) -> bool:
    """Whether the predicate is (or includes) a report to the user."""
    return isinstance(predicate, Reported) or (
        isinstance(predicate, All) and any(map(reports_facts, predicate.predicates))
    )


# -- the score ---------------------------------------------------------------------------
def score_episode(
    milestones: list[Milestone],
    minefields: list[Milestone],
    state: DeviceState,
    log: EpisodeLog,
    success_threshold: float,
    family: str,
) -> tuple[float, dict[str, Any]]:
    """Weight of the reached milestones over the total weight; 0 when any minefield holds."""
    reached = [(milestone, milestone.holds(state, log)) for milestone in milestones]
    hit = [minefield.name for minefield in minefields if minefield.holds(state, log)]
    total = sum(milestone.weight for milestone in milestones)
    score = 0.0 if hit else sum(milestone.weight for milestone, ok in reached if ok) / total
    return score, {
        "milestones": [{"name": milestone.name, "reached": ok} for milestone, ok in reached],
        "minefields_hit": hit,
        "score": score,
        "success": score >= success_threshold,
        "family": family,
    }

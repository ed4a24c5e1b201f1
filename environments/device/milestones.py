"""Scoring: weighted milestones checked against the final state and the episode log.

A milestone is a name, a weight and a predicate ``(state, log) -> bool``. The
predicates are state checks (a setting, a sent message, a reminder, a contact),
action checks (a successful tool call with given arguments) and report checks
(the agent's replies contain required facts). Minefields use the same
predicates: any minefield that holds makes the score 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable

from environments.device.clock import MONTHS, WEEKDAYS
from environments.device.phone_numbers import same_phone
from environments.device.state import DeviceState
from environments.tool_environment import EpisodeLog

Predicate = Callable[[DeviceState, EpisodeLog], bool]


@dataclass(frozen=True)
class Milestone:
    name: str
    holds: Predicate
    weight: float = 1.0


# -- text matching ----------------------------------------------------------------------
def normalise(text: str) -> str:
    """Lower case, ``p.m.`` -> ``pm``, ``5pm`` -> ``5 pm``, hyphens and commas as spaces, single spaces."""
    text = text.casefold().replace("a.m.", "am").replace("p.m.", "pm")
    text = re.sub(r"(\d)\s*(am|pm)\b", r"\1 \2", text)
    return " ".join(re.sub(r"[-,]", " ", text).split())


def mentions(text: str, phrase: str) -> bool:
    """Whether ``phrase`` occurs in ``text`` as whole words, after :func:`normalise`."""
    pattern = r"(?<!\w)" + re.escape(normalise(phrase)) + r"(?!\w)"
    return re.search(pattern, normalise(text)) is not None


def mentions_all(text: str, words: tuple[str, ...]) -> bool:
    return all(mentions(text, word) for word in words)


_PHONE_SPAN = re.compile(r"\+?\(?\d[\d\s().\-]{5,}\d")


@dataclass(frozen=True)
class PhoneFact:
    """A phone number, found in any common format (compared by its digits)."""

    phone_number: str

    def found_in(self, text: str) -> bool:
        return any(same_phone(span, self.phone_number) for span in _PHONE_SPAN.findall(text))


@dataclass(frozen=True)
class TextFact:
    """Found when any one of its phrasings is mentioned."""

    phrasings: tuple[str, ...]

    def found_in(self, text: str) -> bool:
        return any(mentions(text, phrasing) for phrasing in self.phrasings)


def _ordinal(day: int) -> str:
    suffix = "th" if 10 <= day % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


def weekday_fact(moment: datetime) -> TextFact:
    return TextFact((WEEKDAYS[moment.weekday()],))


def date_fact(moment: datetime) -> TextFact:
    month, day = MONTHS[moment.month - 1], moment.day
    return TextFact((
        f"{month} {day}", f"{month} {_ordinal(day)}", f"{day} {month}", f"{_ordinal(day)} {month}",
        f"{_ordinal(day)} of {month}", f"{month[:3]} {day}", f"{moment.year}-{moment.month:02d}-{day:02d}",
    ))


def time_fact(moment: datetime) -> TextFact:
    """12-hour (``5:00 pm``, ``5 pm``) or 24-hour (``17:00``) phrasings of the clock time."""
    hour, minute = moment.hour % 12 or 12, f"{moment.minute:02d}"
    half = "am" if moment.hour < 12 else "pm"
    phrasings = [f"{hour}:{minute} {half}", f"{moment.hour:02d}:{minute}"]
    if moment.minute == 0:
        phrasings.append(f"{hour} {half}")
    if (moment.hour, moment.minute) == (12, 0):
        phrasings.append("noon")
    if (moment.hour, moment.minute) == (0, 0):
        phrasings.append("midnight")
    return TextFact(tuple(phrasings))


Fact = PhoneFact | TextFact


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


# -- action predicates ----------------------------------------------------------------------
def _same_argument(given: Any, expected: Any) -> bool:
    if isinstance(given, str) and isinstance(expected, str):
        return given.strip().casefold() == expected.strip().casefold() or same_phone(given, expected)
    return given == expected


@dataclass(frozen=True)
class ToolCalled:
    """A successful call of ``tool`` whose arguments include ``arguments``."""

    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def __call__(self, state: DeviceState, log: EpisodeLog) -> bool:
        return any(
            call.ok and call.name == self.tool
            and all(key in call.arguments and _same_argument(call.arguments[key], value) for key, value in self.arguments.items())
            for call in log.tool_calls
        )


@dataclass(frozen=True)
class SentToOther:
    """A message was sent to any number but ``phone_number``."""

    phone_number: str

    def __call__(self, state: DeviceState, log: EpisodeLog) -> bool:
        return any(
            call.ok and call.name == "send_message_with_phone_number"
            and not same_phone(call.arguments["phone_number"], self.phone_number)
            for call in log.tool_calls
        )


# -- conversation predicates --------------------------------------------------------------
@dataclass(frozen=True)
class AskedUser:
    """The agent asked the user a question (a reply with '?') and carried on afterwards."""

    def __call__(self, state: DeviceState, log: EpisodeLog) -> bool:
        return any("?" in reply for reply in log.replies[:-1])


@dataclass(frozen=True)
class Reported:
    """The agent's replies to the user contain every fact."""

    facts: tuple[Fact, ...]

    def __call__(self, state: DeviceState, log: EpisodeLog) -> bool:
        said = "\n".join(log.replies)
        return all(fact.found_in(said) for fact in self.facts)


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

"""Facts an agent's reply states: phone numbers, dates, clock times, weekdays, names, message and task words.

A fact is found in a text when one of its phrasings occurs there (whole
words, after :func:`normalise`). It also has a *kind* and lists every value
of that kind a text states (:meth:`stated`): all phone numbers, all calendar
days, all clock times, all weekdays, all of a text fact's rivals. A grader
uses both: the fact must be found, and the text must state no other value of
its kind than the task allows, so that a reply listing every weekday (or
every contact's number) does not report the asked one.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import datetime

from environments.device.clock import MONTHS, WEEKDAYS
from environments.device.phone_numbers import national_digits, same_phone


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
    kind = "phone number"

    @property
    def value(self) -> Hashable:
        return national_digits(self.phone_number)

    def found_in(self, text: str) -> bool:
        return any(same_phone(span, self.phone_number) for span in _PHONE_SPAN.findall(text))

    def stated(self, text: str) -> set[Hashable]:
        """Every number of ten digits (a phone number, or anything that reads as one)."""
        return {digits for span in _PHONE_SPAN.findall(text) if (digits := national_digits(span)) is not None}


@dataclass(frozen=True)
class TextFact:
    """Found when any one of its phrasings is mentioned; ``rivals``: the phrasings of the other values of its kind."""

    phrasings: tuple[str, ...]
    kind: str = ""
    rivals: tuple[tuple[str, ...], ...] = ()

    @property
    def value(self) -> Hashable:
        return normalise(self.phrasings[0])

    def found_in(self, text: str) -> bool:
        return any(mentions(text, phrasing) for phrasing in self.phrasings)

    def stated(self, text: str) -> set[Hashable]:
        return {
            normalise(group[0])
            for group in (self.phrasings, *self.rivals)
            if any(mentions(text, phrasing) for phrasing in group)
        }


def rival_text_fact(phrasings: tuple[str, ...], kind: str, values: tuple[str, ...]) -> TextFact:
    """A text fact whose rivals are the other ``values`` of its kind (one phrasing each)."""
    own = {normalise(phrasing) for phrasing in phrasings}
    return TextFact(phrasings, kind, tuple((value,) for value in values if normalise(value) not in own))


def _ordinal(day: int) -> str:
    suffix = "th" if 10 <= day % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


def weekday_fact(moment: datetime) -> TextFact:
    return rival_text_fact((WEEKDAYS[moment.weekday()],), "weekday", WEEKDAYS)


_MONTH_WORDS = {month.casefold(): index + 1 for index, month in enumerate(MONTHS)}
_MONTH_WORDS.update({month[:3].casefold(): index + 1 for index, month in enumerate(MONTHS)}, sept=9)
_MONTH = "(" + "|".join(sorted(_MONTH_WORDS, key=len, reverse=True)) + ")"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_MONTH_DAY = re.compile(rf"(?<!\w){_MONTH}\.? {_DAY}(?!\w)")
_DAY_MONTH = re.compile(rf"(?<!\w){_DAY} (?:of )?{_MONTH}(?!\w)")
_ISO_DATE = re.compile(r"(?<!\d)\d{4}-(\d{1,2})-(\d{1,2})(?!\d)")


@dataclass(frozen=True)
class DateFact:
    """A calendar day (month and day), in the usual phrasings; every day a text names is stated."""

    year: int
    month: int
    day: int
    kind = "date"

    @property
    def value(self) -> Hashable:
        return (self.month, self.day)

    def found_in(self, text: str) -> bool:
        month, day = MONTHS[self.month - 1], self.day
        phrasings = (
            f"{month} {day}",
            f"{month} {_ordinal(day)}",
            f"{day} {month}",
            f"{_ordinal(day)} {month}",
            f"{_ordinal(day)} of {month}",
            f"{month[:3]} {day}",
            f"{self.year}-{self.month:02d}-{day:02d}",
        )
        return any(mentions(text, phrasing) for phrasing in phrasings)

    def stated(self, text: str) -> set[Hashable]:
        plain = normalise(text)
        days = {(_MONTH_WORDS[month], int(day)) for month, day in _MONTH_DAY.findall(plain)}
        days |= {(_MONTH_WORDS[month], int(day)) for day, month in _DAY_MONTH.findall(plain)}
        days |= {(int(month), int(day)) for month, day in _ISO_DATE.findall(text)}
        return days


def date_fact(moment: datetime) -> DateFact:
    return DateFact(moment.year, moment.month, moment.day)


_CLOCK = re.compile(r"(?<![\w:])(\d{1,2}):(\d{2})(?::\d{2})?(?: (am|pm))?(?![\w:])")
_HOUR = re.compile(r"(?<![\w:])(\d{1,2}) (am|pm)(?!\w)")


def _hour24(hour: int, half: str) -> int:
    return hour % 12 + (12 if half == "pm" else 0)


@dataclass(frozen=True)
class TimeFact:
    """A clock time: 12-hour (``5:00 pm``, ``5 pm``), 24-hour (``17:00``), noon, midnight; every time a text names is
    stated."""

    hour: int
    minute: int
    kind = "time"

    @property
    def value(self) -> Hashable:
        return (self.hour, self.minute)

    def found_in(self, text: str) -> bool:
        return self.value in self.stated(text)

    def stated(self, text: str) -> set[Hashable]:
        plain = normalise(text)
        times = set()
        for hour, minute, half in _CLOCK.findall(plain):
            if half and 1 <= int(hour) <= 12:
                times.add((_hour24(int(hour), half), int(minute)))
            elif not half and int(hour) < 24:
                times.add((int(hour), int(minute)))
        times |= {(_hour24(int(hour), half), 0) for hour, half in _HOUR.findall(plain) if 1 <= int(hour) <= 12}
        times |= {(12, 0) for _ in re.findall(r"(?<!\w)noon(?!\w)", plain)}
        times |= {(0, 0) for _ in re.findall(r"(?<!\w)midnight(?!\w)", plain)}
        return times


def time_fact(moment: datetime) -> TimeFact:
    return TimeFact(moment.hour, moment.minute)


Fact = PhoneFact | TextFact | DateFact | TimeFact


def states_only_allowed(fact: Fact, text: str, allowed_text: str) -> bool:
    """``text`` states ``fact`` and no value of its kind that ``allowed_text`` (the reference answer) does not state."""
    return fact.found_in(text) and fact.stated(text) <= fact.stated(allowed_text) | {fact.value}

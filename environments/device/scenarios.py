"""The device tasks: seven seeded scenario families and the fixed 128-scenario benchmark.

``make_scenario(seed)`` draws everything from ``random.Random(seed)``; the
family is ``FAMILIES[seed % 7]``, so benchmark seeds 0..127 interleave the
families and both splits hold every family. Each family builds its request,
initial phone state, milestones, minefields and an oracle script (the
assistant messages that score exactly 1.0).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from environments.device.clock import MONTHS, WEEKDAYS, clock_text, date_text, to_datetime, to_timestamp, utc
from environments.device.draft import DAY, Draft
from environments.device.facts import PhoneFact, TextFact, date_fact, rival_text_fact, time_fact, weekday_fact
from environments.device.milestones import (
    All,
    Asked,
    ContactSaved,
    LookedUp,
    MessageSent,
    Milestone,
    ReminderGone,
    ReminderSet,
    Reported,
    SentToOther,
    SettingIs,
)
from environments.device.phone_numbers import national_digits
from environments.device.state import SETTINGS, Contact, DeviceState
from environments.device.vocabulary import (
    CHAT_MESSAGES,
    CLOSE_RELATIONSHIPS,
    COMMON_RELATIONSHIPS,
    FIRST_NAMES,
    LAST_NAMES,
    OUTGOING_MESSAGES,
    SETTING_NAMES,
    TASKS,
    TEMPLATE_CHAT_MESSAGES,
)
from environments.protocol import Message

FAMILIES = (
    "simple_settings",
    "blocked_settings",
    "message_contact",
    "relative_reminder",
    "compound_request",
    "lookup_report",
    "ambiguous_contact",
)
BENCHMARK_SEEDS = tuple(range(128))
SPLIT_SEEDS = {"analysis": BENCHMARK_SEEDS[:64], "eval": BENCHMARK_SEEDS[64:]}
# a split larger than its 64 benchmark seeds goes on in its own range; every range is MAX_SPLIT_SIZE wide at most,
# so analysis, eval and train seeds never meet
SPLIT_EXTENSIONS = {"analysis": 200_000, "eval": 300_000}
MAX_SPLIT_SIZE = 100_000
TRAIN_SEED_OFFSET = 1_000_000


def split_seeds(split: str, size: int) -> list[int]:
    """The first ``size`` seeds of ``split``: its 64 benchmark seeds, then consecutive seeds of its own range (every
    family's share stays 1 in 7 within one task, since the family is the seed modulo 7)."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"unknown split {split!r}; choose analysis, eval or train")
    if not 1 <= size <= MAX_SPLIT_SIZE:
        raise ValueError(f"a device split holds 1 to {MAX_SPLIT_SIZE} tasks, not {size}")
    benchmark = list(SPLIT_SEEDS[split][:size])
    return benchmark + list(range(SPLIT_EXTENSIONS[split], SPLIT_EXTENSIONS[split] + size - len(benchmark)))


@dataclass
class Scenario:
    seed: int
    family: str
    request: str
    state: DeviceState
    milestones: list[Milestone]
    minefields: list[Milestone]
    oracle: list[Message]
    clarification: str | None = None
    capability_turns: tuple[int, ...] = ()  # oracle turns of a synthetic environment's capability step
    # capability turns' wrong messages, where not corrupted
    broken_turns: dict[int, Message] = field(default_factory=dict)


def make_scenario(seed: int) -> Scenario:
    family = FAMILIES[seed % len(FAMILIES)]
    draft = Draft(random.Random(seed))
    request = _FAMILIES[family](draft)
    draft.finish()
    return Scenario(
        seed, family, request, draft.state, draft.milestones, draft.minefields, draft.oracle, draft.clarification
    )


# -- wording ------------------------------------------------------------------------------
def capital(text: str) -> str:
    return text[0].upper() + text[1:]


def sentence(*clauses: str) -> str:
    """``a``, ``a and b``, ``a, b, and c`` as one capitalised sentence."""
    if len(clauses) == 1:
        text = clauses[0]
    else:
        text = ", ".join(clauses[:-1]) + (", and " if len(clauses) > 2 else " and ") + clauses[-1]
    return capital(text) + "."


def _on_off(on: bool) -> str:
    return "on" if on else "off"


def spoken_clock(hour: int, minute: int) -> str:
    """``5pm``, ``8:30am``, ``noon``."""
    if (hour, minute) == (12, 0):
        return "noon"
    suffix = "am" if hour < 12 else "pm"
    return f"{hour % 12 or 12}{suffix}" if minute == 0 else f"{hour % 12 or 12}:{minute:02d}{suffix}"


def as_typed(rng: random.Random, phone_number: str) -> str:
    """A phone number the way a person types it."""
    d = national_digits(phone_number)
    return rng.choice([f"({d[:3]}) {d[3:6]}-{d[6:]}", f"{d[:3]}-{d[3:6]}-{d[6:]}", f"{d[:3]} {d[3:6]} {d[6:]}", d])


def contact_reference(draft: Draft, contact: Contact) -> tuple[str, dict[str, str]]:
    """How the user names a contact (full name, or "my sister"), and the oracle's matching search."""
    if contact.relationship in CLOSE_RELATIONSHIPS and draft.rng.random() < 0.5:
        return f"my {contact.relationship}", {"relationship": contact.relationship}
    return contact.name, {"name": contact.name}


def outgoing_message(rng: random.Random) -> tuple[str, str, tuple[str, ...]]:
    """A message to send: request wording, message text, words the sent text must contain."""
    wording, text, words, fillers = rng.choice(OUTGOING_MESSAGES)
    filler = rng.choice(fillers)
    return wording.format(x=filler), text.format(x=filler), tuple(word.format(x=filler) for word in words)


# -- facts replies must state, with the rival values of their kind ------------------------------
_CHAT_WORDS = tuple(word for _, word in CHAT_MESSAGES + TEMPLATE_CHAT_MESSAGES)


def message_fact(word: str) -> TextFact:
    """A text on the phone, by the word that identifies it; rivals: every other text's word."""
    return rival_text_fact((word,), "message", _CHAT_WORDS)


def task_fact(word: str) -> TextFact:
    """A reminder's task, by its word; rivals: every other task's word."""
    return rival_text_fact((word,), "task", tuple(word for _, word in TASKS))


def name_fact(contact: Contact) -> TextFact:
    """A contact's full name; rivals: every other first and last name."""
    own = contact.name.split()
    return TextFact((contact.name,), "name", tuple((name,) for name in FIRST_NAMES + LAST_NAMES if name not in own))


def candidate_facts(group: list[Contact], contacts: list[Contact]) -> tuple[TextFact, ...]:
    """Look-alike contacts a question must name (by full name or relationship); rivals: every other contact's name."""
    return tuple(
        TextFact(
            (contact.name, contact.relationship),
            "contact",
            tuple((other.name,) for other in contacts if other is not contact),
        )
        for contact in group
    )


# -- actions shared by the families: each returns (request clause, reply sentence) ----------------
def set_setting(draft: Draft, setting: str, on: bool) -> tuple[str, str]:
    name = draft.rng.choice(SETTING_NAMES[setting])
    verb = draft.rng.choice(["turn on", "switch on", "enable"] if on else ["turn off", "switch off", "disable"])
    setattr(draft.state.settings, setting, not on)
    draft.milestone(f"{setting} {_on_off(on)}", SettingIs(setting, on), 2)
    draft.call(f"set_{setting}_status", on=on)
    return f"{verb} {name}", f"{capital(name)} is now {_on_off(on)}."


def send(draft: Draft, phone_number: str, content: str) -> str:
    """The oracle's send. With cellular off it fails first, restores service and retries; returns a note for the
    user."""
    settings = draft.state.settings
    draft.call("send_message_with_phone_number", phone_number=phone_number, content=content)
    if settings.cellular_service:
        return ""
    draft.milestone("cellular_service on", SettingIs("cellular_service", True))
    note = " I turned on cellular service to send it."
    if settings.low_battery_mode:
        draft.milestone("low_battery_mode off", SettingIs("low_battery_mode", False))
        draft.call("set_cellular_service_status", on=True)  # refused while low battery mode is on
        draft.call("set_low_battery_mode_status", on=False)
        note = " I turned off low battery mode and turned on cellular service to send it."
    draft.call("set_cellular_service_status", on=True)
    draft.call("send_message_with_phone_number", phone_number=phone_number, content=content)
    return note


def text_contact(draft: Draft, contact: Contact) -> tuple[str, str]:
    reference, search = contact_reference(draft, contact)
    wording, content, words = outgoing_message(draft.rng)
    draft.milestone(f"looked up {contact.name}", LookedUp("search_contacts", search))
    draft.milestone(f"texted {contact.name}", MessageSent(contact.phone_number, words), 2)
    draft.minefield("texted someone else", SentToOther(contact.phone_number))
    draft.call("search_contacts", **search)
    note = send(draft, contact.phone_number, content)
    return f"text {reference} {wording}", f'I texted {contact.name}: "{content}"{note}'


def remind(draft: Draft, kind: str) -> tuple[str, str]:
    """A reminder at a time relative to now: ``tomorrow``, ``in_hours``, ``next_weekday`` or ``first_of_next_month``."""
    rng, now = draft.rng, draft.now
    task, word = draft.take_task()
    hour, minute = rng.randint(6, 21), rng.choice([0, 0, 15, 30, 45])
    draft.call("get_current_timestamp")
    if kind == "in_hours":
        unit, amount = rng.choice([("hours", rng.randint(2, 9)), ("minutes", rng.choice([20, 30, 45, 90]))])
        when = f"in {amount} {unit}"
        target = draft.state.now + amount * (3600 if unit == "hours" else 60)
        draft.call("shift_timestamp", timestamp=draft.state.now, **{unit: amount})
    elif kind == "tomorrow":
        day = to_datetime(draft.state.now + DAY)
        when = f"tomorrow at {spoken_clock(hour, minute)}"
        draft.call("shift_timestamp", timestamp=draft.state.now, days=1)
        draft.call("timestamp_to_datetime_info", timestamp=draft.state.now + DAY)
        target = _timestamp_call(draft, day.year, day.month, day.day, hour, minute)
    elif kind == "next_weekday":
        weekday = rng.randrange(7)
        days = (weekday - now.weekday() - 1) % 7 + 1
        day = to_datetime(draft.state.now + days * DAY)
        when = f"next {WEEKDAYS[weekday]} at {spoken_clock(hour, minute)}"
        draft.call("timestamp_to_datetime_info", timestamp=draft.state.now)
        draft.call("shift_timestamp", timestamp=draft.state.now, days=days)
        draft.call("timestamp_to_datetime_info", timestamp=draft.state.now + days * DAY)
        target = _timestamp_call(draft, day.year, day.month, day.day, hour, minute)
    else:
        year, month = (now.year + 1, 1) if now.month == 12 else (now.year, now.month + 1)
        when = f"on the 1st of next month at {spoken_clock(hour, minute)}"
        draft.call("timestamp_to_datetime_info", timestamp=draft.state.now)
        target = _timestamp_call(draft, year, month, 1, hour, minute)
    content = capital(task)
    draft.call("add_reminder", content=content, reminder_timestamp=target)
    draft.milestone(f"reminder about {word}", ReminderSet((word,)))
    draft.milestone(f"reminder about {word} at {to_datetime(target).isoformat()}", ReminderSet((word,), target), 2)
    moment = to_datetime(target)
    return f"remind me to {task} {when}", f"I set a reminder to {task} for {date_text(moment)} at {clock_text(moment)}."


def _timestamp_call(draft: Draft, year: int, month: int, day: int, hour: int, minute: int) -> int:
    draft.call("datetime_info_to_timestamp", year=year, month=month, day=day, hour=hour, minute=minute)
    return to_timestamp(utc(year, month, day, hour, minute))


def save_new_contact(draft: Draft) -> tuple[str, str]:
    name, number = draft.new_name(), draft.new_phone_number()
    relationship = draft.rng.choice(COMMON_RELATIONSHIPS)
    draft.milestone(f"saved {name}", ContactSaved(name, number, relationship), 2)
    draft.call("add_contact", name=name, phone_number=number, relationship=relationship)
    return (
        f"save {name} to my contacts as a {relationship} with the number {as_typed(draft.rng, number)}",
        f"I saved {name} ({number}) as a {relationship}.",
    )


def change_number(draft: Draft) -> tuple[str, str]:
    contact = draft.add_contact(draft.rng.choice(COMMON_RELATIONSHIPS))
    number = draft.new_phone_number()
    draft.milestone(f"{contact.name} has the new number", ContactSaved(contact.name, number), 2)
    draft.call("search_contacts", name=contact.name)
    draft.call("modify_contact", person_id=contact.person_id, phone_number=number)
    return (
        f"change {contact.name}'s number to {as_typed(draft.rng, number)}",
        f"{contact.name}'s number is now {number}.",
    )


def delete_reminder(draft: Draft) -> tuple[str, str]:
    task, word = draft.take_task()
    others = [reminder.reminder_id for reminder in draft.state.reminders]
    reminder = draft.add_reminder(
        task, draft.state.now + draft.rng.randint(1, 20) * DAY + draft.rng.randint(0, 95) * 900
    )
    draft.milestone(f"removed the reminder about {word}", ReminderGone(reminder.reminder_id), 2)
    for reminder_id in others:
        draft.minefield(f"removed reminder {reminder_id}", ReminderGone(reminder_id))
    draft.call("search_reminder", content=word)
    draft.call("remove_reminder", reminder_id=reminder.reminder_id)
    return f"delete my reminder to {task}", f"I deleted the reminder to {task}."


# -- the families: each builds the scenario on the draft and returns the user's request ------------
def _simple_settings(draft: Draft) -> str:
    request, reply = set_setting(draft, draft.rng.choice(SETTINGS), draft.rng.random() < 0.5)
    draft.say(reply)
    return sentence(request)


def _blocked_settings(draft: Draft) -> str:
    """Low battery mode refuses wifi / cellular; the agent must turn it off, retry, and say so."""
    setting = draft.rng.choice(["wifi", "cellular_service"])
    name = draft.rng.choice(SETTING_NAMES[setting])
    draft.state.settings.low_battery_mode = True
    setattr(draft.state.settings, setting, False)
    draft.milestone("low_battery_mode off", SettingIs("low_battery_mode", False))
    draft.milestone(f"{setting} on", SettingIs(setting, True), 2)
    draft.milestone(
        "told the user about low battery mode",
        All(
            (SettingIs("low_battery_mode", False), Reported((TextFact(("low battery", "low power", "battery saver")),)))
        ),
    )
    draft.call(f"set_{setting}_status", on=True)  # refused
    draft.call("set_low_battery_mode_status", on=False)
    draft.call(f"set_{setting}_status", on=True)
    draft.say(f"{capital(name)} is on now. I had to turn off low battery mode first, because it was blocking {name}.")
    return draft.rng.choice([f"Turn on {name}.", f"Please switch {name} on.", f"I need {name}, can you turn it on?"])


def _message_contact(draft: Draft) -> str:
    """Look a contact up and text them; a third of the time cellular is off (half of those also low battery mode)."""
    contact = draft.add_contact(draft.rng.choice(CLOSE_RELATIONSHIPS))
    roll = draft.rng.random()
    draft.state.settings.cellular_service = roll >= 1 / 3
    draft.state.settings.low_battery_mode = roll < 1 / 6
    request, reply = text_contact(draft, contact)
    draft.say(reply)
    return sentence(request)


def _relative_reminder(draft: Draft) -> str:
    request, reply = remind(draft, draft.rng.choice(["tomorrow", "in_hours", "next_weekday", "first_of_next_month"]))
    draft.say(reply)
    return sentence(request)


_COMPOUND_SETTINGS = (
    ("wifi", True),
    ("wifi", False),
    ("location_service", True),
    ("location_service", False),
    ("low_battery_mode", True),
)
_COMPOUND_PARTS: dict[str, Callable[[Draft], tuple[str, str]]] = {
    "setting": lambda draft: set_setting(draft, *draft.rng.choice(_COMPOUND_SETTINGS)),
    "message": lambda draft: text_contact(draft, draft.add_contact(draft.rng.choice(CLOSE_RELATIONSHIPS))),
    "reminder": lambda draft: remind(draft, draft.rng.choice(["tomorrow", "in_hours"])),
    "new_contact": save_new_contact,
    "new_number": change_number,
    "delete_reminder": delete_reminder,
}


def _compound_request(draft: Draft) -> str:
    parts = draft.rng.sample(sorted(_COMPOUND_PARTS), draft.rng.choice([2, 2, 3]))
    requests, replies = zip(*(_COMPOUND_PARTS[part](draft) for part in parts))
    draft.say(" ".join(replies))
    return sentence(*requests)


def _lookup_phone_number(draft: Draft) -> str:
    contact = draft.add_contact(draft.rng.choice(CLOSE_RELATIONSHIPS))
    reference, search = contact_reference(draft, contact)
    draft.milestone(f"looked up {contact.name}", LookedUp("search_contacts", search))
    draft.milestone("reported the phone number", Reported((PhoneFact(contact.phone_number),)), 2)
    draft.call("search_contacts", **search)
    draft.say(f"{contact.name}'s number is {contact.phone_number}.")
    return f"What's {reference}'s phone number?"


def _lookup_latest_message(draft: Draft) -> str:
    """Two or three texts from the contact, then a newer text the owner sent them."""
    contact, owner = draft.add_contact(draft.rng.choice(CLOSE_RELATIONSHIPS)), draft.state.owner
    received = []
    for _ in range(draft.rng.randint(2, 3)):
        text, word = draft.take_chat()
        received.append((draft.add_message(contact, owner, text, draft.past_time(5 * DAY, 7200)), word))
    draft.add_message(owner, contact, draft.take_chat()[0], draft.past_time(3600, 60))
    latest, word = max(received, key=lambda pair: pair[0].creation_timestamp)
    reference, search = contact_reference(draft, contact)
    draft.milestone("searched the messages", LookedUp("search_messages", {"sender_phone_number": contact.phone_number}))
    draft.milestone("reported the latest message", Reported((message_fact(word),)), 2)
    draft.call("search_contacts", **search)
    draft.call("search_messages", sender_phone_number=contact.phone_number)
    draft.say(f'The last message from {contact.name} says: "{latest.content}"')
    return f"What did {reference} last text me?"


def _lookup_last_sender(draft: Draft) -> str:
    """The newest received text, with a newer one the owner sent someone else."""
    contact, owner = draft.add_contact(draft.rng.choice(COMMON_RELATIONSHIPS)), draft.state.owner
    text = draft.take_chat()[0]
    draft.add_message(contact, owner, text, draft.past_time(3000, 600))
    draft.add_message(owner, draft.state.contacts[1], draft.take_chat()[0], draft.past_time(500, 60))
    draft.milestone(
        "searched the messages", LookedUp("search_messages", {"recipient_phone_number": owner.phone_number})
    )
    draft.milestone("reported the sender", Reported((name_fact(contact),)), 2)
    draft.call("search_contacts", relationship="self")
    draft.call("search_messages", recipient_phone_number=owner.phone_number)
    draft.call("search_contacts", phone_number=contact.phone_number)
    draft.say(f'Your most recent text is from {contact.name}: "{text}"')
    return "Who sent me the most recent text message?"


def _lookup_reminder_time(draft: Draft) -> str:
    task, word = draft.take_task()
    day = to_datetime(draft.state.now + draft.rng.randint(1, 40) * DAY)
    moment = utc(day.year, day.month, day.day, draft.rng.randint(7, 20), draft.rng.choice([0, 15, 30, 45]))
    reminder = draft.add_reminder(task, to_timestamp(moment))
    draft.milestone("searched the reminders", LookedUp("search_reminder", {"content": word}))
    draft.milestone("reported the reminder's date and time", Reported((date_fact(moment), time_fact(moment))), 2)
    draft.call("search_reminder", content=word)
    draft.call("timestamp_to_datetime_info", timestamp=reminder.reminder_timestamp)
    draft.say(f'Your reminder "{reminder.content}" is set for {date_text(moment)} at {clock_text(moment)}.')
    return f"When is my reminder to {task}?"


def _lookup_weekday_of_date(draft: Draft) -> str:
    day = to_datetime(draft.state.now + draft.rng.randint(-400, 400) * DAY)
    spoken = f"{MONTHS[day.month - 1]} {day.day}, {day.year}"
    draft.milestone(
        "converted the date",
        LookedUp("timestamp_to_datetime_info", {"timestamp": to_timestamp(utc(day.year, day.month, day.day))}),
    )
    draft.milestone("reported the weekday", Reported((weekday_fact(day),)), 2)
    draft.call("datetime_info_to_timestamp", year=day.year, month=day.month, day=day.day)
    draft.call("timestamp_to_datetime_info", timestamp=to_timestamp(utc(day.year, day.month, day.day)))
    draft.say(f"{spoken} is a {WEEKDAYS[day.weekday()]}.")
    return f"What day of the week is {spoken}?"


def _lookup_weekday_in_days(draft: Draft) -> str:
    days = draft.rng.randint(2, 60)
    target = draft.state.now + days * DAY
    draft.milestone("converted the day", LookedUp("timestamp_to_datetime_info", {"timestamp": target}))
    draft.milestone("reported the weekday", Reported((weekday_fact(to_datetime(target)),)), 2)
    draft.call("get_current_timestamp")
    draft.call("shift_timestamp", timestamp=draft.state.now, days=days)
    draft.call("timestamp_to_datetime_info", timestamp=target)
    draft.say(f"In {days} days it will be {date_text(to_datetime(target))}.")
    return f"What day of the week will it be {days} days from now?"


_LOOKUPS = (
    _lookup_phone_number,
    _lookup_latest_message,
    _lookup_last_sender,
    _lookup_reminder_time,
    _lookup_weekday_of_date,
    _lookup_weekday_in_days,
)


def _lookup_report(draft: Draft) -> str:
    return draft.rng.choice(_LOOKUPS)(draft)


def _ambiguous_contact(draft: Draft) -> str:
    """Two contacts share a first name: search, ask which one, then text the one the user names."""
    first = draft.take_first_name()
    pair = [
        draft.add_contact(relationship, first=first)
        for relationship in draft.rng.sample(COMMON_RELATIONSHIPS + CLOSE_RELATIONSHIPS, 2)
    ]
    target = draft.rng.choice(pair)
    wording, content, words = outgoing_message(draft.rng)
    draft.clarification = draft.rng.choice([f"I mean {target.name}.", f"The one who's my {target.relationship}."])
    draft.milestone(f"looked up {first}", LookedUp("search_contacts", {"name": first}))
    draft.milestone(f"asked which {first}", Asked(candidate_facts(pair, draft.state.contacts)))
    draft.milestone(f"texted {target.name}", MessageSent(target.phone_number, words), 2)
    draft.minefield("texted someone else", SentToOther(target.phone_number))
    draft.call("search_contacts", name=first)
    draft.say(
        f"I found two contacts named {first}: {pair[0].name} ({pair[0].relationship}) and "
        f"{pair[1].name} ({pair[1].relationship}). Which one should I text?"
    )
    draft.call("send_message_with_phone_number", phone_number=target.phone_number, content=content)
    draft.say(f'I texted {target.name}: "{content}"')
    return sentence(f"text {first} {wording}")


_FAMILIES: dict[str, Callable[[Draft], str]] = {
    "simple_settings": _simple_settings,
    "blocked_settings": _blocked_settings,
    "message_contact": _message_contact,
    "relative_reminder": _relative_reminder,
    "compound_request": _compound_request,
    "lookup_report": _lookup_report,
    "ambiguous_contact": _ambiguous_contact,
}

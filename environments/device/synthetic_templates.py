"""Templates of synthetic capability environments on the device target, one per rules-catalogue capability.

A template builds one task on a :class:`Draft` at a difficulty level and
returns the user's request; every task it builds needs the template's
capability, and it marks the oracle turn(s) that exercise it
(``draft.mark_capability_step()``), which the self-checks break to show the
capability is necessary. Higher difficulty means more distractors, more steps
or less direct wording. A new target adds its own templates module.

Every template draws all its randomness from ``draft.rng`` and scores with the
device milestones: state milestones (a setting, a message, a reminder, a
contact) and report milestones (facts told to the user) with weights, so a
partial solution earns partial credit, and minefields (texting someone else,
deleting the wrong reminder, reporting a distractor) that zero the score.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from environments.capabilities import CAPABILITIES
from environments.device.clock import MONTHS, WEEKDAYS, clock_text, date_text, to_datetime, to_timestamp, utc
from environments.device.draft import DAY, Draft, call_message
from environments.device.facts import PhoneFact, TextFact, date_fact, rival_text_fact, time_fact, weekday_fact
from environments.device.milestones import (
    All,
    Asked,
    ContactSaved,
    LookedUp,
    MessageSent,
    Predicate,
    ReminderGone,
    Reported,
    SettingIs,
)
from environments.device.phone_numbers import national_digits, same_phone
from environments.device.scenarios import (
    as_typed,
    candidate_facts,
    capital,
    change_number,
    contact_reference,
    delete_reminder,
    message_fact,
    outgoing_message,
    remind,
    save_new_contact,
    sentence,
    set_setting,
    task_fact,
    text_contact,
)
from environments.device.state import SETTINGS, DeviceState
from environments.device.vocabulary import (
    CLOSE_RELATIONSHIPS,
    COMMON_RELATIONSHIPS,
    SETTING_NAMES,
    TEMPLATE_CHAT_MESSAGES,
)
from environments.protocol import Message
from environments.synthetic.template import CapabilityTemplate
from environments.tool_environment import EpisodeLog

DIFFICULTIES = (1, 2, 3, 4, 5)


# -- predicates the benchmark does not need ------------------------------------------------
@dataclass(frozen=True)
class Not:
    """Holds when ``predicate`` does not (a minefield: a look-alike contact lost its number)."""

    predicate: Predicate

    def __call__(self, state: DeviceState, log: EpisodeLog) -> bool:
        return not self.predicate(state, log)


@dataclass(frozen=True)
class SentToNoneOf:
    """A message was sent to a number outside ``phone_numbers`` (a minefield when several people are texted)."""

    phone_numbers: tuple[str, ...]

    def __call__(self, state: DeviceState, log: EpisodeLog) -> bool:
        return any(
            call.ok
            and call.name == "send_message_with_phone_number"
            and not any(same_phone(call.arguments["phone_number"], number) for number in self.phone_numbers)
            for call in log.tool_calls
        )


def _check(difficulty: int, levels: tuple[int, ...] = DIFFICULTIES) -> int:
    if difficulty not in levels:
        raise ValueError(f"difficulty must be one of {list(levels)}, got {difficulty!r}")
    return difficulty


def _unused_close_relationships(draft: Draft, count: int) -> list[str]:
    """``count`` relationships the user can name as "my <relationship>" that no contact has yet."""
    taken = {contact.relationship for contact in draft.state.contacts}
    return draft.rng.sample([relationship for relationship in CLOSE_RELATIONSHIPS if relationship not in taken], count)


def _spoken_phone(draft: Draft, phone_number: str, unusual: bool) -> str:
    """A number as typed; ``unusual`` adds forms a model copies wrongly more often (dots, country code)."""
    if not unusual:
        return as_typed(draft.rng, phone_number)
    d = national_digits(phone_number)
    return draft.rng.choice(
        [f"{d[:3]}.{d[3:6]}.{d[6:]}", f"+1 {d[:3]} {d[3:6]} {d[6:]}", f"1-{d[:3]}-{d[3:6]}-{d[6:]}", f"+1{d}"]
    )


def _month_day(timestamp: int) -> str:
    moment = to_datetime(timestamp)
    return f"{MONTHS[moment.month - 1]} {moment.day}"


# -- 1. permission_error_recovery ------------------------------------------------------------
_LOW_BATTERY = TextFact(("low battery", "low power", "battery saver"))
_CELLULAR = TextFact(("cellular", "mobile data"))


def _permission_error_recovery(draft: Draft, difficulty: int) -> str:
    """The phone refuses the request at first; the agent fixes the blocker, retries and says what it changed.

    1: wifi or cellular service behind low battery mode. 2: a text with cellular
    service off. 3: a text with cellular off and low battery mode refusing to turn
    it on. 4: wifi and a text, both blocked. 5: wifi and texts to two people,
    both blocked. Marked: the fixing calls (low battery mode off, cellular on).
    """
    _check(difficulty)
    settings = draft.state.settings
    setting = draft.rng.choice(["wifi", "cellular_service"]) if difficulty == 1 else "wifi" if difficulty >= 4 else None
    texts = {1: 0, 2: 1, 3: 1, 4: 1, 5: 2}[difficulty]
    settings.low_battery_mode = difficulty != 2
    recipients = [draft.add_contact(relationship) for relationship in _unused_close_relationships(draft, texts)]
    if texts:
        settings.cellular_service = False
    requests, replies = [], []

    if settings.low_battery_mode:
        draft.milestone("low_battery_mode off", SettingIs("low_battery_mode", False))
        draft.milestone(
            "told the user about low battery mode",
            All((SettingIs("low_battery_mode", False), Reported((_LOW_BATTERY,)))),
        )
    if texts:
        draft.milestone("cellular_service on", SettingIs("cellular_service", True))
        draft.milestone(
            "told the user about cellular service", All((SettingIs("cellular_service", True), Reported((_CELLULAR,))))
        )
        draft.minefield("texted someone else", SentToNoneOf(tuple(contact.phone_number for contact in recipients)))

    if setting is not None:
        name = draft.rng.choice(SETTING_NAMES[setting])
        setattr(settings, setting, False)
        draft.milestone(f"{setting} on", SettingIs(setting, True), 2)
        draft.call(f"set_{setting}_status", on=True)  # refused: low battery mode
        draft.call("set_low_battery_mode_status", on=False)
        draft.mark_capability_step()
        draft.call(f"set_{setting}_status", on=True)
        requests.append(draft.rng.choice([f"turn on {name}", f"switch {name} on", f"get {name} working"]))
        replies.append(
            f"{capital(name)} is on now; I had to turn off low battery mode first because it was blocking {name}."
        )

    for index, contact in enumerate(recipients):
        reference, search = contact_reference(draft, contact)
        wording, content, words = outgoing_message(draft.rng)
        draft.milestone(f"looked up {contact.name}", LookedUp("search_contacts", search))
        draft.milestone(f"texted {contact.name}", MessageSent(contact.phone_number, words), 2)
        draft.call("search_contacts", **search)
        draft.call("send_message_with_phone_number", phone_number=contact.phone_number, content=content)
        if index == 0:  # refused: no cellular service
            if settings.low_battery_mode and setting is None:
                draft.call("set_cellular_service_status", on=True)  # refused: low battery mode
                draft.call("set_low_battery_mode_status", on=False)
                draft.mark_capability_step()
            draft.call("set_cellular_service_status", on=True)
            draft.mark_capability_step()
            draft.call("send_message_with_phone_number", phone_number=contact.phone_number, content=content)
        requests.append(f"text {reference} {wording}")
        replies.append(f'I texted {contact.name}: "{content}"')
    if texts:
        fix = (
            "turned off low battery mode and turned on cellular service"
            if settings.low_battery_mode and setting is None
            else "turned on cellular service"
        )
        replies.append(f"Cellular service was off, so I {fix} to send {'them' if texts > 1 else 'it'}.")
    draft.say(" ".join(replies))
    return sentence(*requests)


# -- 2. datetime_reasoning ---------------------------------------------------------------------
def _a_day_late(message: Message) -> Message:
    """The oracle's ``add_reminder`` with the same content a day late: only the computed time is wrong."""
    call = message["tool_calls"][0]
    arguments = json.loads(call["function"]["arguments"])
    arguments["reminder_timestamp"] += DAY
    return {**message, "tool_calls": [{**call, "function": {**call["function"], "arguments": json.dumps(arguments)}}]}


_EASY_TIMES, _HARD_TIMES = ("in_hours", "tomorrow"), ("next_weekday", "first_of_next_month")


def _datetime_reasoning(draft: Draft, difficulty: int) -> str:
    """Reminders at relative times: the agent computes each timestamp with the clock tools.

    1: in N hours or minutes. 2: tomorrow at a time. 3: next <weekday> at a time.
    4: two reminders (tomorrow or the 1st of next month, and next <weekday>).
    5: three reminders (in N hours or tomorrow, next <weekday>, the 1st of next
    month). Marked: each ``add_reminder`` with its computed timestamp.
    """
    _check(difficulty)
    rng = draft.rng
    kinds = {
        1: ["in_hours"],
        2: ["tomorrow"],
        3: ["next_weekday"],
        4: [rng.choice(["tomorrow", "first_of_next_month"]), "next_weekday"],
        5: [rng.choice(_EASY_TIMES), *_HARD_TIMES],
    }[difficulty]
    rng.shuffle(kinds)
    requests, replies = [], []
    for kind in kinds:
        request, reply = remind(draft, kind)
        draft.mark_capability_step(instead=_a_day_late(draft.oracle[-1]))  # the add_reminder
        requests.append(request)
        replies.append(reply)
    draft.say(" ".join(replies))
    return sentence(*requests)


# -- 3. tool_calling_precision ---------------------------------------------------------------------
def _new_contact(draft: Draft, difficulty: int) -> tuple[str, str]:
    """Save a new contact with a typed number and a relationship; at 5 a contact with the same first name exists."""
    first = draft.take_first_name()
    if difficulty >= 5:
        draft.add_contact(draft.rng.choice(COMMON_RELATIONSHIPS), first=first)
    name, number = draft.new_name(first), draft.new_phone_number()
    relationship = draft.rng.choice(COMMON_RELATIONSHIPS + CLOSE_RELATIONSHIPS)
    draft.milestone(f"saved {name} with the number", ContactSaved(name, number))
    draft.milestone(f"saved {name} as a {relationship}", ContactSaved(name, number, relationship), 2)
    draft.call("add_contact", name=name, phone_number=number, relationship=relationship)
    draft.mark_capability_step()
    typed = _spoken_phone(draft, number, unusual=difficulty >= 5)
    return (
        f"save {name} to my contacts as my {relationship}, number {typed}",
        f"I saved {name} ({number}) as your {relationship}.",
    )


def _new_number(draft: Draft, difficulty: int) -> tuple[str, str]:
    """Change a contact's number; from 4 on a contact with the same first name must keep theirs."""
    first = draft.take_first_name()
    contact = draft.add_contact(draft.rng.choice(COMMON_RELATIONSHIPS), first=first)
    if difficulty >= 4:
        other = draft.add_contact(draft.rng.choice(COMMON_RELATIONSHIPS), first=first)
        draft.minefield(f"changed {other.name}'s number", Not(ContactSaved(other.name, other.phone_number)))
    number = draft.new_phone_number()
    draft.milestone(f"{contact.name} has the new number", ContactSaved(contact.name, number), 2)
    draft.call("search_contacts", name=contact.name)
    draft.call("modify_contact", person_id=contact.person_id, phone_number=number)
    draft.mark_capability_step()
    typed = _spoken_phone(draft, number, unusual=difficulty >= 5)
    return f"change {contact.name}'s number to {typed}", f"{contact.name}'s number is now {number}."


def _settings(draft: Draft, count: int) -> list[tuple[str, bool]]:
    """``count`` distinct settings with target values; low battery mode goes first when turned off, last when on."""
    chosen = [(setting, draft.rng.random() < 0.5) for setting in draft.rng.sample(SETTINGS, count)]
    return sorted(
        chosen, key=lambda pair: 0 if pair == ("low_battery_mode", False) else 2 if pair[0] == "low_battery_mode" else 1
    )


def _tool_calling_precision(draft: Draft, difficulty: int) -> str:
    """Requests whose success depends on exact argument values.

    0: one setting to an exact on/off value (a single call: a level small
    models can reach). 1: save a new contact (name, typed number,
    relationship) or, half the time, text a contact (the number the contact
    search returns is the send's argument: a dependent step, as in the
    target's message and compound requests). 2: the same and one setting. 3: change a number, save a contact, one
    setting. 4: those and two
    settings, with a look-alike contact (same first name) whose number must not
    change. 5: three settings, a look-alike for both contacts, and numbers typed
    with dots or a country code. Marked: every state-changing call.
    """
    _check(difficulty, WITH_LEVEL_0)
    actions = [_new_number(draft, difficulty)] if difficulty >= 3 else []
    if difficulty in (1, 2) and draft.rng.random() < 0.5:
        actions.append(text_contact(draft, draft.add_contact(_unused_close_relationships(draft, 1)[0])))
        draft.mark_capability_step()  # the send: broken, it texts a wrong number
    elif difficulty >= 1:
        actions.append(_new_contact(draft, difficulty))
    for setting, on in _settings(draft, {0: 1, 1: 0, 2: 1, 3: 1, 4: 2, 5: 3}[difficulty]):
        actions.append(set_setting(draft, setting, on))
        draft.mark_capability_step()
        if difficulty == 0:  # partial credit for saying what changed
            told = Reported((rival_text_fact(("on" if on else "off",), "on/off", ("on", "off")),))
            draft.milestone("told the user the new state", All((SettingIs(setting, on), told)))
    requests, replies = zip(*actions)
    draft.say(" ".join(replies))
    return sentence(*requests)


# -- 4. multi_step_task_completion ---------------------------------------------------------------
_MULTI_SETTINGS = (
    ("wifi", True),
    ("wifi", False),
    ("location_service", True),
    ("location_service", False),
    ("low_battery_mode", True),
)
_MULTI_PARTS: dict[str, Callable[[Draft], tuple[str, str]]] = {
    "message": lambda draft: text_contact(draft, draft.add_contact(_unused_close_relationships(draft, 1)[0])),
    "reminder": lambda draft: remind(draft, draft.rng.choice(["tomorrow", "in_hours"])),
    "new_contact": save_new_contact,
    "new_number": change_number,
    "delete_reminder": delete_reminder,
}


def _tell_phone_number(draft: Draft) -> tuple[str, str]:
    reference, reply = _phone_number_lookup(draft)
    return f"tell me {reference}'s phone number", reply


def _multi_step_task_completion(draft: Draft, difficulty: int) -> str:
    """A compound request of independent actions: ``difficulty + 1`` parts (2 to 6), up to two of them settings;
    at 0 two settings (one call each: a level small models can reach); at 1, half the time, a contact's number
    looked up and told, then a setting (the target's lookup and compound requests need both kinds of step).

    Each part has its own milestones, so stopping early earns partial credit.
    Marked: the last action of the last part (from 4: of the last two parts), as
    if the agent stopped before finishing.
    """
    _check(difficulty, WITH_LEVEL_0)
    rng = draft.rng
    if difficulty == 0:
        kinds = ["setting", "setting"]
    elif difficulty == 1 and rng.random() < 0.5:
        kinds = ["tell_number", "setting"]
    else:
        kinds = rng.sample([*sorted(_MULTI_PARTS), "setting", "setting"], difficulty + 1)
    settings = iter(_distinct_settings(draft, kinds.count("setting")))
    plan = [("setting", next(settings)) if kind == "setting" else (kind, None) for kind in kinds]
    if ("setting", ("low_battery_mode", True)) in plan and ("setting", ("wifi", True)) in plan:
        first, second = plan.index(("setting", ("wifi", True))), plan.index(("setting", ("low_battery_mode", True)))
        if second < first:  # low battery mode would refuse wifi
            plan[first], plan[second] = plan[second], plan[first]
    marked = 2 if difficulty >= 4 else 1
    requests, replies = [], []
    for index, (kind, setting) in enumerate(plan):
        if kind == "setting":
            request, reply = set_setting(draft, *setting)
        else:
            request, reply = _tell_phone_number(draft) if kind == "tell_number" else _MULTI_PARTS[kind](draft)
        if index >= len(plan) - marked:  # every part ends with its state change; breaking it = stopping before it
            draft.mark_capability_step(instead=call_message("get_current_timestamp", "call_stopped"))
        requests.append(request)
        replies.append(reply)
    draft.say(" ".join(replies))
    return sentence(*requests)


def _distinct_settings(draft: Draft, count: int) -> list[tuple[str, bool]]:
    choices = list(_MULTI_SETTINGS)
    chosen: list[tuple[str, bool]] = []
    while len(chosen) < count:
        pick = draft.rng.choice(choices)
        chosen.append(pick)
        choices = [choice for choice in choices if choice[0] != pick[0]]
    return chosen


# -- 5. precondition_verification -----------------------------------------------------------------
def _precondition_verification(draft: Draft, difficulty: int) -> str:
    """A state change on one of ``difficulty + 1`` look-alike records: search, ask the user which one, then act.

    Look-alikes are contacts sharing a first name (text one, or change one's
    number) or reminders with the same task on different days (delete one).
    The user answers the question (by full name, relationship or last name; by
    date). Acting on a look-alike is a minefield. Marked: the search and the
    question; without the question the user never says which one.
    """
    _check(difficulty)
    count = difficulty + 1
    kind = draft.rng.choice(["text", "new_number", "delete_reminder"])
    if kind == "delete_reminder":
        return _pick_reminder_to_delete(draft, count)
    first = draft.take_first_name()
    group = [
        draft.add_contact(relationship, first=first)
        for relationship in draft.rng.sample(COMMON_RELATIONSHIPS + CLOSE_RELATIONSHIPS, count)
    ]
    target = draft.rng.choice(group)
    answers = [f"I mean {target.name}.", f"The one who's my {target.relationship}."]
    if difficulty >= 3:
        answers.append(f"The one whose last name is {target.name.split()[-1]}.")
    draft.clarification = draft.rng.choice(answers)
    draft.milestone(f"looked up {first}", LookedUp("search_contacts", {"name": first}))
    candidates = candidate_facts(group, draft.state.contacts)
    listed = sentence(*(f"{contact.name} ({contact.relationship})" for contact in group))[:-1]
    draft.call("search_contacts", name=first)
    draft.mark_capability_step()
    if kind == "text":
        wording, content, words = outgoing_message(draft.rng)
        draft.milestone(f"asked which {first} before texting", Asked(candidates, "send_message_with_phone_number"))
        draft.milestone(f"texted {target.name}", MessageSent(target.phone_number, words), 2)
        draft.minefield("texted someone else", SentToNoneOf((target.phone_number,)))
        draft.say(f"I found {count} contacts named {first}: {listed}. Which one should I text?")
        draft.mark_capability_step()
        draft.call("send_message_with_phone_number", phone_number=target.phone_number, content=content)
        draft.say(f'I texted {target.name}: "{content}"')
        return sentence(f"text {first} {wording}")
    number = draft.new_phone_number()
    draft.milestone(f"asked which {first} before changing a number", Asked(candidates, "modify_contact"))
    draft.milestone(f"{target.name} has the new number", ContactSaved(target.name, number), 2)
    for other in group:
        if other is not target:
            draft.minefield(f"changed {other.name}'s number", Not(ContactSaved(other.name, other.phone_number)))
    draft.say(f"I found {count} contacts named {first}: {listed}. Whose number should I change?")
    draft.mark_capability_step()
    draft.call("modify_contact", person_id=target.person_id, phone_number=number)
    draft.say(f"{target.name}'s number is now {number}.")
    return sentence(f"change {first}'s number to {as_typed(draft.rng, number)}")


def _pick_reminder_to_delete(draft: Draft, count: int) -> str:
    task, word = draft.take_task()
    days = sorted(draft.rng.sample(range(1, 41), count))
    others = [reminder.reminder_id for reminder in draft.state.reminders]
    group = [
        draft.add_reminder(
            task,
            to_timestamp(
                utc(*_ymd(draft.state.now + day * DAY), draft.rng.randint(7, 20), draft.rng.choice([0, 15, 30, 45]))
            ),
        )
        for day in days
    ]
    target = draft.rng.choice(group)
    draft.clarification = draft.rng.choice(
        [
            f"The one on {_month_day(target.reminder_timestamp)}.",
            f"Delete the {_month_day(target.reminder_timestamp)} one.",
        ]
    )
    draft.milestone(f"searched the reminders about {word}", LookedUp("search_reminder", {"content": word}))
    candidates = tuple(date_fact(to_datetime(reminder.reminder_timestamp)) for reminder in group)
    draft.milestone(f"asked which reminder about {word} before deleting", Asked(candidates, "remove_reminder"))
    draft.milestone(
        f"removed the reminder about {word} on {_month_day(target.reminder_timestamp)}",
        ReminderGone(target.reminder_id),
        2,
    )
    for reminder_id in others + [reminder.reminder_id for reminder in group if reminder is not target]:
        draft.minefield(f"removed reminder {reminder_id}", ReminderGone(reminder_id))
    listed = sentence(*(_when(reminder.reminder_timestamp) for reminder in group))[:-1]
    draft.call("search_reminder", content=word)
    draft.mark_capability_step()
    draft.say(f"You have {count} reminders to {task}: {listed}. Which one should I delete?")
    draft.mark_capability_step()
    draft.call("remove_reminder", reminder_id=target.reminder_id)
    draft.say(f"I deleted the reminder to {task} on {_when(target.reminder_timestamp)}.")
    return f"Delete my reminder to {task}."


def _ymd(timestamp: int) -> tuple[int, int, int]:
    moment = to_datetime(timestamp)
    return moment.year, moment.month, moment.day


def _when(timestamp: int) -> str:
    moment = to_datetime(timestamp)
    return f"{date_text(moment)} at {clock_text(moment)}"


# -- 6. structured_data_reasoning ---------------------------------------------------------------------
_DISTRACTORS = {1: 2, 2: 3, 3: 4, 4: 6, 5: 8}


def _structured_data_reasoning(draft: Draft, difficulty: int) -> str:
    """Pick the right record among several in a tool result, and use it.

    The latest text from a contact (report it), the sender of the most recent
    text (text them back), or the soonest / furthest / most recently created
    reminder (delete it). Distractor records: 2, 3, 4, 6, 8 by difficulty; from
    4 on, a contact with the same first name texted more recently. Using a
    distractor is a minefield. Marked: the reply, send or delete that uses the
    chosen record.
    """
    _check(difficulty)
    chats = draft.rng.sample(TEMPLATE_CHAT_MESSAGES, len(TEMPLATE_CHAT_MESSAGES))
    kind = draft.rng.choice(["latest_from", "reply_to_last_sender", "reminder_by_order"])
    if kind == "latest_from":
        return _latest_from(draft, difficulty, chats)
    if kind == "reply_to_last_sender":
        return _reply_to_last_sender(draft, difficulty, chats)
    return _reminder_by_order(draft, difficulty)


def _latest_from(draft: Draft, difficulty: int, chats: list[tuple[str, str]]) -> str:
    owner, count = draft.state.owner, _DISTRACTORS[difficulty]
    first = draft.take_first_name()
    contact = draft.add_contact(_unused_close_relationships(draft, 1)[0], first=first)
    received = [
        (draft.add_message(contact, owner, text, draft.past_time(5 * DAY, 7200)), word) for text, word in chats[:count]
    ]
    latest, word = max(received, key=lambda pair: pair[0].creation_timestamp)
    distractors = [other for message, other in received if message is not latest]
    text, other = chats[count]
    draft.add_message(owner, contact, text, draft.past_time(3600, 60))  # newer, but the owner sent it
    distractors.append(other)
    if difficulty >= 4:
        lookalike = draft.add_contact(draft.rng.choice(COMMON_RELATIONSHIPS), first=first)
        text, other = chats[count + 1]
        draft.add_message(lookalike, owner, text, draft.past_time(7000, 60))
        distractors.append(other)
        reference, search = contact.name, {"name": contact.name}
    else:
        reference, search = contact_reference(draft, contact)
    draft.milestone("searched the messages", LookedUp("search_messages", {"sender_phone_number": contact.phone_number}))
    draft.milestone("reported the latest message", Reported((message_fact(word),)), 2)
    for other in distractors:
        draft.minefield(f"reported the message about {other}", Reported((TextFact((other,)),)))
    draft.call("search_contacts", **search)
    draft.call("search_messages", sender_phone_number=contact.phone_number)
    draft.say(f'The last message from {contact.name} says: "{latest.content}"')
    older = max(
        (message for message, _ in received if message is not latest), key=lambda message: message.creation_timestamp
    )
    draft.mark_capability_step(
        instead={"role": "assistant", "content": f'The last message from {contact.name} says: "{older.content}"'}
    )
    return f"What did {reference} last text me?"


def _reply_to_last_sender(draft: Draft, difficulty: int, chats: list[tuple[str, str]]) -> str:
    owner, count = draft.state.owner, _DISTRACTORS[difficulty]
    senders = [draft.add_contact(draft.rng.choice(COMMON_RELATIONSHIPS)) for _ in range(count - 1)]
    target = draft.add_contact(draft.rng.choice(COMMON_RELATIONSHIPS))
    for sender, (text, _) in zip(senders, chats):
        draft.add_message(sender, owner, text, draft.past_time(5 * DAY, 3100))
    draft.add_message(target, owner, chats[count - 1][0], draft.past_time(3000, 600))  # the newest received text
    for recipient, (text, _) in zip(draft.rng.sample(senders, 1 + difficulty // 3), chats[count:]):
        draft.add_message(owner, recipient, text, draft.past_time(500, 60))  # newer, but sent by the owner
    wording, content, words = outgoing_message(draft.rng)
    draft.milestone(
        "searched the messages", LookedUp("search_messages", {"recipient_phone_number": owner.phone_number})
    )
    draft.milestone(f"texted {target.name}", MessageSent(target.phone_number, words), 2)
    draft.minefield("texted someone else", SentToNoneOf((target.phone_number,)))
    draft.call("search_contacts", relationship="self")
    draft.call("search_messages", recipient_phone_number=owner.phone_number)
    draft.call("search_contacts", phone_number=target.phone_number)
    draft.call("send_message_with_phone_number", phone_number=target.phone_number, content=content)
    wrong = call_message(
        "send_message_with_phone_number", "call_wrong_sender", phone_number=senders[-1].phone_number, content=content
    )
    draft.mark_capability_step(instead=wrong)  # an older sender
    draft.say(f'{target.name} sent you the most recent text, so I texted them: "{content}"')
    return draft.rng.choice(
        [
            f"Text whoever sent me the most recent message {wording}.",
            f"Reply to the last person who texted me {wording}.",
        ]
    )


def _reminder_by_order(draft: Draft, difficulty: int) -> str:
    count, now = _DISTRACTORS[difficulty], draft.state.now
    used = {reminder.reminder_timestamp for reminder in draft.state.reminders}
    for _ in range(count - 1):
        moment = now + draft.rng.randint(1, 40) * DAY + draft.rng.randint(0, 95) * 900
        while moment in used:
            moment += 900
        used.add(moment)
        draft.add_reminder(draft.take_task()[0], moment)
    order = draft.rng.choice(["soonest", "furthest", "newest"])
    task, word = draft.take_task()
    if order == "soonest":  # before every other reminder (they are all a day or more away)
        target = draft.add_reminder(task, now + draft.rng.randint(2, 20) * 3600 + draft.rng.choice([0, 900, 1800]))
        request = draft.rng.choice(["Delete my next reminder.", "Remove the reminder that comes up soonest."])
    elif order == "furthest":
        target = draft.add_reminder(task, max(used) + draft.rng.randint(1, 10) * DAY)
        request = draft.rng.choice(
            ["Delete my last reminder, the one furthest in the future.", "Remove the reminder that is furthest away."]
        )
    else:  # created after every other reminder (they were created a day or more ago)
        target = draft.add_reminder(task, now + draft.rng.randint(1, 40) * DAY + draft.rng.randint(0, 95) * 900)
        target.creation_timestamp = now - draft.rng.randint(600, 7200)
        request = draft.rng.choice(
            ["Delete the reminder I created most recently.", "Remove the newest reminder I made."]
        )
    others = [reminder.reminder_id for reminder in draft.state.reminders if reminder is not target]
    draft.milestone(f"removed the reminder about {word}", ReminderGone(target.reminder_id), 2)
    draft.milestone(
        f"told the user which reminder: {word}", All((ReminderGone(target.reminder_id), Reported((task_fact(word),))))
    )
    for reminder_id in others:
        draft.minefield(f"removed reminder {reminder_id}", ReminderGone(reminder_id))
    draft.call("search_reminder")
    draft.call("remove_reminder", reminder_id=target.reminder_id)
    draft.mark_capability_step(instead=call_message("remove_reminder", "call_wrong_reminder", reminder_id=others[-1]))
    draft.say(f'I deleted your reminder "{target.content}" ({_when(target.reminder_timestamp)}).')
    return request


# -- 7. information_reporting ----------------------------------------------------------------------
def _phone_number_lookup(draft: Draft) -> tuple[str, str]:
    """(how the request names a new contact, the reply telling their number): a lookup whose result the reply must
    tell."""
    contact = draft.add_contact(_unused_close_relationships(draft, 1)[0])
    reference, search = contact_reference(draft, contact)
    draft.milestone(f"looked up {contact.name}", LookedUp("search_contacts", search))
    draft.milestone(f"reported {contact.name}'s phone number", Reported((PhoneFact(contact.phone_number),)), 2)
    draft.call("search_contacts", **search)
    return reference, f"{contact.name}'s number is {contact.phone_number}."


def _report_phone_number(draft: Draft, weekdays: set[int]) -> tuple[str, str]:
    reference, reply = _phone_number_lookup(draft)
    return f"What's {reference}'s phone number?", reply


def _report_reminder_time(draft: Draft, weekdays: set[int]) -> tuple[str, str]:
    task, word = draft.take_task()
    day = to_datetime(draft.state.now + draft.rng.randint(1, 40) * DAY)
    while day.weekday() in weekdays:  # a weekday answer must not be found in this answer
        day = to_datetime(to_timestamp(day) + DAY)
    weekdays.add(day.weekday())
    moment = utc(day.year, day.month, day.day, draft.rng.randint(7, 20), draft.rng.choice([0, 15, 30, 45]))
    reminder = draft.add_reminder(task, to_timestamp(moment))
    draft.milestone(f"searched the reminders about {word}", LookedUp("search_reminder", {"content": word}))
    draft.milestone(
        f"reported the date and time of the reminder about {word}", Reported((date_fact(moment), time_fact(moment))), 2
    )
    draft.call("search_reminder", content=word)
    draft.call("timestamp_to_datetime_info", timestamp=reminder.reminder_timestamp)
    return (
        f"When is my reminder to {task}?",
        f'Your reminder "{reminder.content}" is set for {date_text(moment)} at {clock_text(moment)}.',
    )


def _report_weekday_of_date(draft: Draft, weekdays: set[int]) -> tuple[str, str]:
    day = to_datetime(draft.state.now + draft.rng.randint(-400, 400) * DAY)
    while day.weekday() in weekdays:  # another answer's weekday would report this one too
        day = to_datetime(to_timestamp(day) + DAY)
    weekdays.add(day.weekday())
    spoken = f"{MONTHS[day.month - 1]} {day.day}, {day.year}"
    draft.milestone(
        f"converted {spoken}",
        LookedUp("timestamp_to_datetime_info", {"timestamp": to_timestamp(utc(day.year, day.month, day.day))}),
    )
    draft.milestone(f"reported the weekday of {spoken}", Reported((weekday_fact(day),)), 2)
    draft.call("datetime_info_to_timestamp", year=day.year, month=day.month, day=day.day)
    draft.call("timestamp_to_datetime_info", timestamp=to_timestamp(utc(day.year, day.month, day.day)))
    return f"What day of the week is {spoken}?", f"{spoken} is a {WEEKDAYS[day.weekday()]}."


def _report_weekday_in_days(draft: Draft, weekdays: set[int]) -> tuple[str, str]:
    days = draft.rng.randint(2, 60)
    while to_datetime(draft.state.now + days * DAY).weekday() in weekdays:
        days += 1
    target = to_datetime(draft.state.now + days * DAY)
    weekdays.add(target.weekday())
    draft.milestone(
        f"converted the day in {days} days", LookedUp("timestamp_to_datetime_info", {"timestamp": to_timestamp(target)})
    )
    draft.milestone(f"reported the weekday in {days} days", Reported((weekday_fact(target),)), 2)
    draft.call("get_current_timestamp")
    draft.call("shift_timestamp", timestamp=draft.state.now, days=days)
    draft.call("timestamp_to_datetime_info", timestamp=draft.state.now + days * DAY)
    return f"What day of the week will it be {days} days from now?", f"In {days} days it will be {date_text(target)}."


def _report_latest_message(draft: Draft, weekdays: set[int]) -> tuple[str, str]:
    contact, owner = draft.add_contact(_unused_close_relationships(draft, 1)[0]), draft.state.owner
    received = []
    for _ in range(draft.rng.randint(2, 3)):
        text, word = draft.take_chat()
        received.append((draft.add_message(contact, owner, text, draft.past_time(5 * DAY, 7200)), word))
    latest, word = max(received, key=lambda pair: pair[0].creation_timestamp)
    reference, search = contact_reference(draft, contact)
    draft.milestone(
        f"searched the messages from {contact.name}",
        LookedUp("search_messages", {"sender_phone_number": contact.phone_number}),
    )
    draft.milestone(f"reported the latest message from {contact.name}", Reported((message_fact(word),)), 2)
    draft.call("search_contacts", **search)
    draft.call("search_messages", sender_phone_number=contact.phone_number)
    return f"What did {reference} last text me?", f'The last message from {contact.name} says: "{latest.content}"'


# Each builds one lookup on the draft and returns (question, answer); ``weekdays``: the weekdays other answers
# name, which a weekday answer avoids (else one answer would reach two report milestones).
_EASY_REPORTS = {"phone_number": _report_phone_number, "weekday_of_date": _report_weekday_of_date}
_HARD_REPORTS = {
    "reminder_time": _report_reminder_time,
    "weekday_in_days": _report_weekday_in_days,
    "latest_message": _report_latest_message,
}


def _information_reporting(draft: Draft, difficulty: int) -> str:
    """Lookups whose answers the final reply must tell: 1 easy fact at 1, 1 harder fact at 2, then 2, 3, 4 facts.

    Each fact has a lookup milestone and a report milestone (the reply names the
    phone number, date and time, weekday or message). Marked: the final reply.
    """
    _check(difficulty)
    rng = draft.rng
    if difficulty == 1:
        kinds = [rng.choice(sorted(_EASY_REPORTS))]
    elif difficulty == 2:
        kinds = [rng.choice(sorted(_HARD_REPORTS))]
    else:
        kinds = rng.sample(sorted(_HARD_REPORTS), difficulty - 2 if difficulty < 5 else 3)
        kinds += rng.sample(sorted(_EASY_REPORTS), difficulty - 1 - len(kinds))
        rng.shuffle(kinds)
    builders, weekdays = {**_EASY_REPORTS, **_HARD_REPORTS}, set()
    questions, answers = zip(*(builders[kind](draft, weekdays) for kind in kinds))
    draft.say(" ".join(answers))
    draft.mark_capability_step()
    return " ".join([questions[0], *(f"Also, {question[0].lower()}{question[1:]}" for question in questions[1:])])


WITH_LEVEL_0 = (0, *DIFFICULTIES)  # 0: steps of one call each, a level where SmolLM2-135M earns some reward
LEVEL_0_CAPABILITIES = ("tool_calling_precision", "multi_step_task_completion")

TEMPLATES: dict[str, CapabilityTemplate[Draft, str]] = {
    name: CapabilityTemplate(
        name, CAPABILITIES[name], build, WITH_LEVEL_0 if name in LEVEL_0_CAPABILITIES else DIFFICULTIES
    )
    for name, build in (
        ("permission_error_recovery", _permission_error_recovery),
        ("datetime_reasoning", _datetime_reasoning),
        ("tool_calling_precision", _tool_calling_precision),
        ("multi_step_task_completion", _multi_step_task_completion),
        ("precondition_verification", _precondition_verification),
        ("structured_data_reasoning", _structured_data_reasoning),
        ("information_reporting", _information_reporting),
    )
}

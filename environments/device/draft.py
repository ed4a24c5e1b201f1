"""A scenario under construction: a random phone, plus the milestones, minefields and oracle script added to it."""

from __future__ import annotations

import calendar
import json
import random
from datetime import datetime
from typing import Any

from environments.device.clock import to_datetime, to_timestamp, utc
from environments.device.milestones import Collateral, Milestone, Oracle, Predicate, bind_to_oracle
from environments.device.phone_numbers import canonical_phone
from environments.device.state import Contact, DeviceState, Reminder, Settings, TextMessage
from environments.device.tools import DeviceTools
from environments.device.vocabulary import (
    AREA_CODES,
    CHAT_MESSAGES,
    COMMON_RELATIONSHIPS,
    FIRST_NAMES,
    LAST_NAMES,
    TASKS,
)
from environments.protocol import Message
from environments.tool_environment import ToolError

DAY = 86400


def random_now(rng: random.Random) -> int:
    """Half the time late on a month's last day (or Feb 28 of a leap year), so relative times cross boundaries."""
    if rng.random() < 0.5:
        year, month = rng.randint(2025, 2028), rng.randint(1, 12)
        year, month, day = rng.choice(
            [
                (2026, 12, 31),
                (2027, 12, 31),
                (2028, 2, 28),
                (2028, 2, 29),
                (2027, 2, 28),
                (year, month, calendar.monthrange(year, month)[1]),
            ]
        )
        hour = rng.randint(19, 23)
    else:
        year, month, day, hour = rng.randint(2025, 2028), rng.randint(1, 12), rng.randint(1, 28), rng.randint(7, 22)
    return to_timestamp(utc(year, month, day, hour, rng.randint(0, 59), rng.randint(0, 59)))


def call_message(tool: str, call_id: str, /, **arguments: Any) -> Message:
    """An assistant message with one tool call."""
    call = {"id": call_id, "type": "function", "function": {"name": tool, "arguments": json.dumps(arguments)}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


class Draft:
    """The phone starts with its owner, 3-5 other contacts, some chat history and 1-3 reminders.

    Names, numbers, chat texts and reminder tasks are drawn without repetition, so
    what a family adds later never collides with what is already there.
    """

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.state = DeviceState(
            now=random_now(rng), settings=Settings(wifi=rng.random() < 0.8, location_service=rng.random() < 0.6)
        )
        self.milestones: list[Milestone] = []
        self.minefields: list[Milestone] = []
        self.oracle: list[Message] = []
        self.clarification: str | None = None
        self.capability_turns: list[int] = []  # oracle turns that exercise a synthetic environment's capability
        self.broken_turns: dict[int, Message] = {}  # capability turns with the wrong action that breaks them
        self._first_names = rng.sample(FIRST_NAMES, len(FIRST_NAMES))
        self._chats = rng.sample(CHAT_MESSAGES, len(CHAT_MESSAGES))
        self._tasks = rng.sample(TASKS, len(TASKS))
        self._numbers: set[str] = set()
        self._names: set[str] = set()
        self._times: set[int] = set()
        self.add_contact("self", is_self=True)
        for _ in range(rng.randint(3, 5)):
            self._add_chat_history(self.add_contact(rng.choice(COMMON_RELATIONSHIPS)))
        for _ in range(rng.randint(1, 3)):
            self.add_reminder(self.take_task()[0], self.state.now + rng.randint(1, 30) * DAY + rng.randint(0, 95) * 900)

    @property
    def now(self) -> datetime:
        return to_datetime(self.state.now)

    # -- drawing without repetition ----------------------------------------------------
    def take_first_name(self) -> str:
        return self._first_names.pop()

    def take_chat(self) -> tuple[str, str]:
        return self._chats.pop()

    def take_task(self) -> tuple[str, str]:
        return self._tasks.pop()

    def new_name(self, first: str | None = None) -> str:
        first = first or self.take_first_name()
        name = f"{first} {self.rng.choice(LAST_NAMES)}"
        while name in self._names:
            name = f"{first} {self.rng.choice(LAST_NAMES)}"
        self._names.add(name)
        return name

    def new_phone_number(self) -> str:
        number = canonical_phone(f"{self.rng.choice(AREA_CODES)}555{self.rng.randint(100, 199):04d}")
        while number in self._numbers:
            number = canonical_phone(f"{self.rng.choice(AREA_CODES)}555{self.rng.randint(100, 199):04d}")
        self._numbers.add(number)
        return number

    def past_time(self, max_age: int, min_age: int) -> int:
        """A timestamp between ``max_age`` and ``min_age`` seconds ago, distinct from earlier ones."""
        moment = self.state.now - self.rng.randint(min_age, max_age)
        while moment in self._times:
            moment = self.state.now - self.rng.randint(min_age, max_age)
        self._times.add(moment)
        return moment

    # -- the initial state -------------------------------------------------------------
    def add_contact(self, relationship: str, first: str | None = None, is_self: bool = False) -> Contact:
        contact = Contact(self.state.new_id("p"), self.new_name(first), self.new_phone_number(), relationship, is_self)
        self.state.contacts.append(contact)
        return contact

    def add_message(self, sender: Contact, recipient: Contact, content: str, creation_timestamp: int) -> TextMessage:
        message = TextMessage(
            self.state.new_id("m"), sender.phone_number, recipient.phone_number, content, creation_timestamp
        )
        self.state.messages.append(message)
        return message

    def add_reminder(self, task: str, reminder_timestamp: int) -> Reminder:
        created = self.past_time(30 * DAY, DAY)
        reminder = Reminder(self.state.new_id("r"), task[0].upper() + task[1:], reminder_timestamp, created)
        self.state.reminders.append(reminder)
        return reminder

    def _add_chat_history(self, contact: Contact) -> None:
        owner = self.state.owner
        for _ in range(self.rng.randint(0, 2)):
            sender, recipient = self.rng.choice([(contact, owner), (owner, contact)])
            self.add_message(sender, recipient, self.take_chat()[0], self.past_time(10 * DAY, 3600))

    # -- scoring and the oracle ----------------------------------------------------------
    def milestone(self, name: str, holds: Predicate, weight: float = 1.0) -> None:
        self.milestones.append(Milestone(name, holds, weight))

    def minefield(self, name: str, holds: Predicate) -> None:
        self.minefields.append(Milestone(name, holds))

    def call(self, tool: str, /, **arguments: Any) -> None:
        """Append an oracle turn with one tool call."""
        self.oracle.append(call_message(tool, f"call_{len(self.oracle)}", **arguments))

    def say(self, text: str) -> None:
        """Append an oracle turn that replies to the user."""
        self.oracle.append({"role": "assistant", "content": text})

    def mark_capability_step(self, instead: Message | None = None) -> None:
        """Mark the last oracle turn as the step the task's capability names; ``instead``: the wrong message that breaks
        only that step (else the self-checks corrupt the turn's arguments)."""
        turn = len(self.oracle) - 1
        self.capability_turns.append(turn)
        if instead is not None:
            self.broken_turns[turn] = instead

    def finish(self) -> None:
        """Judge the milestones against the finished oracle, and add the minefield of changes the task does not ask
        for."""
        oracle = Oracle.of(self.oracle)
        self.milestones = [
            Milestone(milestone.name, bind_to_oracle(milestone.holds, oracle), milestone.weight)
            for milestone in self.milestones
        ]
        self.minefield(
            "changed what the task did not ask for", Collateral(self.state.copy(), self.oracle_final_state())
        )

    def oracle_final_state(self) -> DeviceState:
        """The state the oracle's tool calls leave (the calls the phone refuses change nothing)."""
        state = self.state.copy()
        tools = {tool.name: tool.fn for tool in DeviceTools(state).tools()}
        for message in self.oracle:
            for call in message.get("tool_calls") or []:
                try:
                    tools[call["function"]["name"]](**json.loads(call["function"]["arguments"]))
                except ToolError:
                    pass
        return state

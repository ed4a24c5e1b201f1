"""The phone's tools, bound to one :class:`DeviceState`.

Descriptions are short on purpose: they are rendered into a small model's prompt.
Every failure is a :class:`ToolError`, shown to the agent as ``Error: ...``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from environments.device.clock import WEEKDAYS, to_datetime, to_timestamp, utc
from environments.device.phone_numbers import canonical_phone, same_phone
from environments.device.state import SETTINGS, Contact, DeviceState, Reminder, TextMessage
from environments.tool_environment import Tool, ToolError

PERMISSION_ERROR = "PermissionError: operation not permitted in the current device state"
NO_SERVICE_ERROR = "ConnectionError: no cellular service"

_SETTING_LABELS = {
    "wifi": "wifi",
    "cellular_service": "cellular service",
    "low_battery_mode": "low battery mode",
    "location_service": "location service",
}


def _integer(description: str = "") -> dict[str, str]:
    return {"type": "integer", "description": description} if description else {"type": "integer"}


def _string(description: str = "") -> dict[str, str]:
    return {"type": "string", "description": description} if description else {"type": "string"}


def _parameters(required: list[str], **properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


def _phone(text: str) -> str:
    try:
        return canonical_phone(text)
    except ValueError as exc:
        raise ToolError(str(exc)) from None


def _moment(timestamp: int):
    try:
        return to_datetime(int(timestamp))
    except ValueError as exc:
        raise ToolError(str(exc)) from None


def _not_empty(name: str, value: str) -> str:
    if not value.strip():
        raise ToolError(f"{name} must not be empty")
    return value.strip()


class DeviceTools:
    def __init__(self, state: DeviceState):
        self.state = state

    # -- clock ------------------------------------------------------------------------
    def get_current_timestamp(self) -> int:
        return self.state.now

    def timestamp_to_datetime_info(self, timestamp: int) -> dict[str, Any]:
        moment = _moment(timestamp)
        return {
            "year": moment.year,
            "month": moment.month,
            "day": moment.day,
            "hour": moment.hour,
            "minute": moment.minute,
            "second": moment.second,
            "weekday": WEEKDAYS[moment.weekday()],
        }

    def datetime_info_to_timestamp(
        self, year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
    ) -> int:
        try:
            return to_timestamp(utc(int(year), int(month), int(day), int(hour), int(minute), int(second)))
        except (ValueError, OverflowError) as exc:
            raise ToolError(f"invalid date or time: {exc}") from None

    def shift_timestamp(
        self, timestamp: int, weeks: int = 0, days: int = 0, hours: int = 0, minutes: int = 0, seconds: int = 0
    ) -> int:
        shifted = (
            int(timestamp)
            + int(weeks) * 604800
            + int(days) * 86400
            + int(hours) * 3600
            + int(minutes) * 60
            + int(seconds)
        )
        _moment(shifted)
        return shifted

    # -- settings ---------------------------------------------------------------------
    def get_setting(self, setting: str) -> bool:
        return getattr(self.state.settings, setting)

    def set_setting(self, setting: str, on: bool) -> str:
        blocked = on and setting in ("wifi", "cellular_service") and self.state.settings.low_battery_mode
        if blocked:
            raise ToolError(PERMISSION_ERROR)
        setattr(self.state.settings, setting, on)
        return f"{_SETTING_LABELS[setting]} is now {'on' if on else 'off'}"

    # -- contacts ---------------------------------------------------------------------
    def search_contacts(
        self, name: str | None = None, phone_number: str | None = None, relationship: str | None = None
    ) -> list[dict]:
        number = _phone(phone_number) if phone_number is not None else None
        return [
            asdict(contact)
            for contact in self.state.contacts
            if (name is None or name.strip().casefold() in contact.name.casefold())
            and (number is None or contact.phone_number == number)
            and (relationship is None or relationship.strip().casefold() == contact.relationship.casefold())
        ]

    def add_contact(self, name: str, phone_number: str, relationship: str = "") -> dict:
        number = _phone(phone_number)
        self._check_number_free(number)
        contact = Contact(self.state.new_id("p"), _not_empty("name", name), number, relationship.strip())
        self.state.contacts.append(contact)
        return asdict(contact)

    def modify_contact(
        self, person_id: str, name: str | None = None, phone_number: str | None = None, relationship: str | None = None
    ) -> dict:
        contact = next((contact for contact in self.state.contacts if contact.person_id == person_id), None)
        if contact is None:
            raise ToolError(f"no contact with person_id {person_id!r}")
        if name is None and phone_number is None and relationship is None:
            raise ToolError("give at least one of name, phone_number, relationship")
        if phone_number is not None:
            number = _phone(phone_number)
            if number != contact.phone_number:
                self._check_number_free(number)
            contact.phone_number = number
        if name is not None:
            contact.name = _not_empty("name", name)
        if relationship is not None:
            contact.relationship = relationship.strip()
        return asdict(contact)

    def _check_number_free(self, number: str) -> None:
        if any(contact.phone_number == number for contact in self.state.contacts):
            raise ToolError(f"a contact with phone number {number} already exists")

    # -- messages ---------------------------------------------------------------------
    def send_message_with_phone_number(self, phone_number: str, content: str) -> dict:
        number = _phone(phone_number)
        text = _not_empty("content", content)
        if not self.state.settings.cellular_service:
            raise ToolError(NO_SERVICE_ERROR)
        message = TextMessage(self.state.new_id("m"), self.state.owner.phone_number, number, text, self.state.now)
        self.state.messages.append(message)
        return {"message_id": message.message_id}

    def search_messages(
        self,
        sender_phone_number: str | None = None,
        recipient_phone_number: str | None = None,
        content: str | None = None,
    ) -> list[dict]:
        sender = _phone(sender_phone_number) if sender_phone_number is not None else None
        recipient = _phone(recipient_phone_number) if recipient_phone_number is not None else None
        found = [
            message
            for message in self.state.messages
            if (sender is None or same_phone(message.sender_phone_number, sender))
            and (recipient is None or same_phone(message.recipient_phone_number, recipient))
            and (content is None or content.strip().casefold() in message.content.casefold())
        ]
        return [asdict(message) for message in sorted(found, key=lambda message: message.creation_timestamp)]

    # -- reminders --------------------------------------------------------------------
    def add_reminder(self, content: str, reminder_timestamp: int) -> dict:
        text = _not_empty("content", content)
        _moment(reminder_timestamp)
        if reminder_timestamp <= self.state.now:
            raise ToolError("reminder_timestamp is in the past")
        reminder = Reminder(self.state.new_id("r"), text, int(reminder_timestamp), self.state.now)
        self.state.reminders.append(reminder)
        return {"reminder_id": reminder.reminder_id}

    def search_reminder(self, content: str | None = None) -> list[dict]:
        found = [
            reminder
            for reminder in self.state.reminders
            if content is None or content.strip().casefold() in reminder.content.casefold()
        ]
        return [asdict(reminder) for reminder in sorted(found, key=lambda reminder: reminder.reminder_timestamp)]

    def remove_reminder(self, reminder_id: str) -> str:
        remaining = [reminder for reminder in self.state.reminders if reminder.reminder_id != reminder_id]
        if len(remaining) == len(self.state.reminders):
            raise ToolError(f"no reminder with reminder_id {reminder_id!r}")
        self.state.reminders = remaining
        return f"removed reminder {reminder_id}"

    # -- the OpenAI tools -------------------------------------------------------------
    def tools(self) -> list[Tool]:
        timestamp = _integer()
        return [
            Tool(
                "get_current_timestamp",
                "Current time as a UNIX timestamp (UTC).",
                _parameters([]),
                self.get_current_timestamp,
            ),
            Tool(
                "timestamp_to_datetime_info",
                "Convert a timestamp to year, month, day, hour, minute, second, weekday (UTC).",
                _parameters(["timestamp"], timestamp=timestamp),
                self.timestamp_to_datetime_info,
            ),
            Tool(
                "datetime_info_to_timestamp",
                "Convert a UTC date and time to a timestamp; hour, minute, second default to 0.",
                _parameters(
                    ["year", "month", "day"],
                    year=_integer(),
                    month=_integer("1-12"),
                    day=_integer(),
                    hour=_integer("0-23"),
                    minute=_integer(),
                    second=_integer(),
                ),
                self.datetime_info_to_timestamp,
            ),
            Tool(
                "shift_timestamp",
                "Add a duration (negative: subtract) to a timestamp; unset parts are 0.",
                _parameters(
                    ["timestamp"],
                    timestamp=timestamp,
                    weeks=_integer(),
                    days=_integer(),
                    hours=_integer(),
                    minutes=_integer(),
                    seconds=_integer(),
                ),
                self.shift_timestamp,
            ),
            *self._setting_tools(),
            Tool(
                "search_contacts",
                "Find contacts; all given fields must match (name: partial match). No fields: all contacts.",
                _parameters(
                    [], name=_string(), phone_number=_string(), relationship=_string("e.g. sister, boss, self")
                ),
                self.search_contacts,
            ),
            Tool(
                "add_contact",
                "Add a new contact.",
                _parameters(
                    ["name", "phone_number"], name=_string("full name"), phone_number=_string(), relationship=_string()
                ),
                self.add_contact,
            ),
            Tool(
                "modify_contact",
                "Change fields of the contact with person_id.",
                _parameters(
                    ["person_id"], person_id=_string(), name=_string(), phone_number=_string(), relationship=_string()
                ),
                self.modify_contact,
            ),
            Tool(
                "send_message_with_phone_number",
                "Send a text message.",
                _parameters(["phone_number", "content"], phone_number=_string("recipient"), content=_string()),
                self.send_message_with_phone_number,
            ),
            Tool(
                "search_messages",
                "Find text messages, oldest first; all given fields must match (content: partial match).",
                _parameters([], sender_phone_number=_string(), recipient_phone_number=_string(), content=_string()),
                self.search_messages,
            ),
            Tool(
                "add_reminder",
                "Create a reminder at a future timestamp.",
                _parameters(["content", "reminder_timestamp"], content=_string(), reminder_timestamp=timestamp),
                self.add_reminder,
            ),
            Tool(
                "search_reminder",
                "Find reminders by partial content, soonest first. No content: all reminders.",
                _parameters([], content=_string()),
                self.search_reminder,
            ),
            Tool(
                "remove_reminder",
                "Delete the reminder with reminder_id.",
                _parameters(["reminder_id"], reminder_id=_string()),
                self.remove_reminder,
            ),
        ]

    def _setting_tools(self) -> list[Tool]:
        tools = []
        for setting in SETTINGS:
            label = _SETTING_LABELS[setting]
            tools.append(
                Tool(
                    f"get_{setting}_status",
                    f"Is {label} on?",
                    _parameters([]),
                    lambda setting=setting: self.get_setting(setting),
                )
            )
            tools.append(
                Tool(
                    f"set_{setting}_status",
                    f"Turn {label} on or off.",
                    _parameters(["on"], on={"type": "boolean"}),
                    lambda on, setting=setting: self.set_setting(setting, on),
                )
            )
        return tools

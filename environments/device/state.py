"""The phone's state: settings, contacts, messages, reminders and the fixed current time."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

SETTINGS = ("wifi", "cellular_service", "low_battery_mode", "location_service")


@dataclass
class Settings:
    wifi: bool = True
    cellular_service: bool = True
    low_battery_mode: bool = False
    location_service: bool = True


@dataclass
class Contact:
    person_id: str
    name: str
    phone_number: str
    relationship: str = ""
    is_self: bool = False


@dataclass
class TextMessage:
    message_id: str
    sender_phone_number: str
    recipient_phone_number: str
    content: str
    creation_timestamp: int


@dataclass
class Reminder:
    reminder_id: str
    content: str
    reminder_timestamp: int
    creation_timestamp: int


@dataclass
class DeviceState:
    now: int
    settings: Settings = field(default_factory=Settings)
    contacts: list[Contact] = field(default_factory=list)
    messages: list[TextMessage] = field(default_factory=list)
    reminders: list[Reminder] = field(default_factory=list)
    issued_ids: int = 0

    def new_id(self, prefix: str) -> str:
        """A fresh id such as ``p7`` (person), ``m8`` (message), ``r9`` (reminder)."""
        self.issued_ids += 1
        return f"{prefix}{self.issued_ids}"

    @property
    def owner(self) -> Contact:
        """The phone owner's own contact card."""
        return next(contact for contact in self.contacts if contact.is_self)

    def copy(self) -> DeviceState:
        return copy.deepcopy(self)

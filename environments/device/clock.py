"""UTC timestamps (seconds) and their calendar names; the device has no time zones and no DST."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


def to_timestamp(moment: datetime) -> int:
    return int((moment - EPOCH).total_seconds())


MIN_TIMESTAMP = to_timestamp(datetime(1, 1, 1, tzinfo=UTC))
MAX_TIMESTAMP = to_timestamp(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC))


def to_datetime(timestamp: int) -> datetime:
    """The UTC datetime of ``timestamp``; ValueError outside years 1..9999."""
    if not MIN_TIMESTAMP <= timestamp <= MAX_TIMESTAMP:
        raise ValueError(f"timestamp must be between {MIN_TIMESTAMP} and {MAX_TIMESTAMP}")
    return EPOCH + timedelta(seconds=timestamp)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def clock_text(moment: datetime) -> str:
    """``5:00 PM``, ``8:30 AM``, ``12:15 PM``."""
    hour = moment.hour % 12 or 12
    return f"{hour}:{moment.minute:02d} {'AM' if moment.hour < 12 else 'PM'}"


def date_text(moment: datetime) -> str:
    """``Monday, March 4, 2027``."""
    return f"{WEEKDAYS[moment.weekday()]}, {MONTHS[moment.month - 1]} {moment.day}, {moment.year}"

"""Phone numbers: one canonical form (``+1-415-555-0123``) and the variants people type."""

from __future__ import annotations

import re

_PHONE_CHARACTERS = re.compile(r"^[\d\s()+.\-]+$")


def national_digits(text: str) -> str | None:
    """The ten national digits of a North American number, or None when ``text`` is not one."""
    if not _PHONE_CHARACTERS.match(text):
        return None
    digits = re.sub(r"\D", "", text)
    if len(digits) == 11 and digits.startswith("1"):
        digits = digits[1:]
    return digits if len(digits) == 10 else None


def canonical_phone(text: str) -> str:
    """``+1-AAA-BBB-CCCC``; raises ValueError for a malformed number."""
    digits = national_digits(text)
    if digits is None:
        raise ValueError(f"invalid phone number {text!r}; use a format like +1-415-555-0123")
    return f"+1-{digits[:3]}-{digits[3:6]}-{digits[6:]}"


def same_phone(first: str, second: str) -> bool:
    digits = national_digits(first)
    return digits is not None and digits == national_digits(second)

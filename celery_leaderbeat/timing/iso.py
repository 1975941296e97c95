"""ISO 8601 date-times read the same way on every Python the package supports."""

from __future__ import annotations

import re
from datetime import datetime

#: a UTC offset written without a colon (+0100), which Python 3.10's fromisoformat refuses
_BARE_OFFSET = re.compile(r"([+-])(\d\d)(\d\d)$")
#: a fraction of a second of any length (Python 3.10 takes only 3 or 6 digits)
_FRACTION = re.compile(r"(\d\d:\d\d:\d\d)[.,](\d+)")


def from_iso(text: str) -> datetime:
    """An ISO 8601 date-time, read alike on every Python from 3.10.

    Python 3.11 reads ``2027-01-05T09:00Z``, ``+0100`` and any number of digits
    in a fraction of a second; 3.10's ``fromisoformat`` refuses all three. So a
    trailing ``Z`` is written as ``+00:00``, ``+0100`` as ``+01:00`` and a
    fraction as six digits before parsing. Naive when ``text`` has no offset.
    Anything else is left to ``fromisoformat`` and raises its ``ValueError``.
    """
    value = text.strip()
    if value[-1:] in ("Z", "z"):
        value = value[:-1] + "+00:00"
    if "T" in value or " " in value:
        value = _BARE_OFFSET.sub(r"\1\2:\3", value)
        value = _FRACTION.sub(lambda m: f"{m[1]}.{m[2][:6].ljust(6, '0')}", value)
    return datetime.fromisoformat(value)


def has_fraction_of_second(text: str) -> bool:
    """Does ``text`` give a fraction of a second?"""
    return _FRACTION.search(text) is not None

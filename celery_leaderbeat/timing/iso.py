"""ISO 8601 date-times read the same way on every Python the package supports."""

from __future__ import annotations

from datetime import datetime


def from_iso(text: str) -> datetime:
    """``datetime.fromisoformat(text)``, with a trailing ``Z`` read as UTC on every Python.

    Python 3.11 reads ``2027-01-05T09:00Z``; 3.10 refuses the ``Z`` ("Invalid
    isoformat string"). A ``Z`` is the offset ``+00:00``, so it is written as
    such before parsing; anything else is left to ``fromisoformat`` and raises
    its ``ValueError``.
    """
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    return datetime.fromisoformat(text)

"""A claim's columns as PostgreSQL array literals: one string per column, sent as one
text parameter and read by the server's ``array_in`` (``%(names)s::text[]``).

psycopg adapts a Python list element by element in Python, about 0.2 µs an element; a
chunk's claim passes a dozen columns of a hundred. Joining them into one literal costs
about half as much, and a column the claim passes to several statements (the entries'
names) is built once. Every text element is quoted, so any name round-trips (commas,
braces, quotes, backslashes, spaces, ``NULL``, the empty string).
"""

from __future__ import annotations

from collections.abc import Iterable


def _quoted(value: str | None) -> str:
    if value is None:
        return "NULL"
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def text_array(values: Iterable[str | None]) -> str:
    """``{"a","b",NULL}``: a ``text[]`` literal (None is NULL)."""
    items = list(values)
    if not items:
        return "{}"
    if None not in items:
        joined = '","'.join(items)  # type: ignore[arg-type]  # no None in it
        # nothing to escape (no quote but the separators', no backslash): one join
        if joined.count('"') == 2 * (len(items) - 1) and "\\" not in joined:
            return '{"' + joined + '"}'
    return "{" + ",".join(map(_quoted, items)) + "}"


def int_array(values: Iterable[int | None]) -> str:
    """``{1,2,NULL}``: a ``bigint[]`` literal (None is NULL)."""
    items = list(values)
    if None in items:
        return "{" + ",".join("NULL" if v is None else str(int(v)) for v in items) + "}"
    return "{" + ",".join(map(str, map(int, items))) + "}"  # type: ignore[arg-type]


def bool_array(values: Iterable[bool]) -> str:
    """``{t,f}``: a ``boolean[]`` literal."""
    return "{" + ",".join("t" if v else "f" for v in values) + "}"

"""The run-time entries in SQL (entries.lua): every change in one transaction that locks
the app's version row, so changes are numbered one by one and read by version."""

from __future__ import annotations

from typing import Any, NamedTuple

from .lease_sql import NOW_MS
from .schema import qualified

#: removed names remembered for nodes that are behind; older ones force a full read
REMOVED_CAP = 10_000

_COLUMNS = "name, version, anchor_ms, fingerprint, timing, enabled, ran_ms, kept, definition"
_LOCK = """
INSERT INTO {schema}.entry_meta AS m (app) VALUES (%(app)s)
ON CONFLICT (app) DO UPDATE SET version = m.version
RETURNING version, floor, """ + NOW_MS
_BUMP = """
UPDATE {schema}.entry_meta SET version = version + 1 WHERE app = %(app)s RETURNING version
"""
_GET = "SELECT " + _COLUMNS + " FROM {schema}.entries WHERE app = %(app)s AND name = %(name)s"
_ALL = "SELECT " + _COLUMNS + " FROM {schema}.entries WHERE app = %(app)s"
# What changed since a version, in one statement (one snapshot): the app's version and
# whether the read is whole (kind "m"; whole when ``seen`` is below the floor or past the
# version, a node too far behind or ahead), the saved rows (kind "s": every row when
# whole), the removed names (kind "r"), in order of version.
_CHANGES = """
WITH meta AS (
    SELECT version, floor, (%(seen)s < floor OR %(seen)s > version) AS whole
    FROM {schema}.entry_meta WHERE app = %(app)s
)
SELECT 'm' AS kind, NULL::text, version, NULL::bigint, NULL::text, NULL::text, whole,
       NULL::bigint, NULL::boolean, NULL::text
FROM meta
UNION ALL
SELECT 's', """ + ", ".join(f"e.{c}" for c in _COLUMNS.split(", ")) + """
FROM {schema}.entries e, meta WHERE e.app = %(app)s AND (meta.whole OR e.version > %(seen)s)
UNION ALL
SELECT 'r', r.name, r.version, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM {schema}.entries_removed r, meta
WHERE r.app = %(app)s AND NOT meta.whole AND r.version > %(seen)s
ORDER BY 1, 3
"""
_PUT = """
INSERT INTO {schema}.entries AS e (app, name, version, anchor_ms, fingerprint, timing,
                                   enabled, ran_ms, kept, definition)
VALUES (%(app)s, %(name)s, %(version)s, %(anchor_ms)s, %(fingerprint)s, %(timing)s,
        %(enabled)s, %(ran_ms)s, %(kept)s, %(definition)s)
ON CONFLICT (app, name) DO UPDATE
    SET version = excluded.version, anchor_ms = excluded.anchor_ms,
        fingerprint = excluded.fingerprint, timing = excluded.timing,
        enabled = excluded.enabled, ran_ms = excluded.ran_ms, kept = excluded.kept,
        definition = excluded.definition
"""
_UNREMOVE = "DELETE FROM {schema}.entries_removed WHERE app = %(app)s AND name = %(name)s"
# an enabled entry saved with no slot state gets its first one, so a standby can rescue
# its first slot even when the leader died before reading the save
_FIRST_SLOT = """
INSERT INTO {schema}.slots (app, entry, slot_ms, epoch, state)
VALUES (%(app)s, %(name)s, %(slot_ms)s, 0, 'a') ON CONFLICT (app, entry) DO NOTHING
"""
_DELETE = "DELETE FROM {schema}.entries WHERE app = %(app)s AND name = %(name)s"
_REMOVE = """
INSERT INTO {schema}.entries_removed (app, name, version) VALUES (%(app)s, %(name)s, %(version)s)
ON CONFLICT (app, name) DO UPDATE SET version = excluded.version
"""
# Beyond the cap the oldest removals go, and the floor rises to the newest of them.
_CAP = """
WITH gone AS (
    DELETE FROM {schema}.entries_removed WHERE app = %(app)s AND version <= (
        SELECT version FROM {schema}.entries_removed WHERE app = %(app)s
        ORDER BY version DESC OFFSET %(cap)s LIMIT 1)
    RETURNING version
)
UPDATE {schema}.entry_meta SET floor = greatest(floor, (SELECT max(version) FROM gone))
WHERE app = %(app)s AND EXISTS (SELECT 1 FROM gone)
"""


class Row(NamedTuple):
    """One stored entry, as its columns."""

    name: str
    version: int
    anchor_ms: int
    fingerprint: str
    timing: str
    enabled: bool
    ran_ms: int | None
    kept: bool
    definition: str


class Save(NamedTuple):
    """One save's definition and how (entries.lua's ARGV)."""

    name: str
    how: str  #: upsert, create (refused if it exists) or update (refused if it does not)
    fingerprint: str
    timing: str
    enabled: bool
    definition: str
    anchor_ms: int | None = None  #: an anchor to keep instead of now (an import)
    first_ms: int | None = None  #: a one-off's slot less 1 ms: its first slot state


def _run(conn: Any, schema: str, app: str, text: str, **params: Any) -> Any:
    return conn.execute(qualified(text, schema), {"app": app, **params})


def save(conn: Any, schema: str, app: str, asked: Save) -> tuple[int, int, int]:
    """(1 saved or 0 unchanged, version, anchor), or (2,) exists / (3,) unknown."""
    with conn.transaction():
        version, _, now_ms = _run(conn, schema, app, _LOCK).fetchone()
        anchor = -(-int(now_ms) // 1000) * 1000  # rounded up to the whole second
        found = _run(conn, schema, app, _GET, name=asked.name).fetchone()
        current = Row(*found) if found else None
        if current is not None:
            if asked.how == "create":
                return (2, 0, 0)
            if current.fingerprint == asked.fingerprint and current.enabled == asked.enabled:
                return (0, current.version, current.anchor_ms)
            if current.timing == asked.timing and (current.enabled or not asked.enabled):
                anchor = current.anchor_ms
        elif asked.how == "update":
            return (3, 0, 0)
        if asked.anchor_ms is not None:
            anchor = asked.anchor_ms
        version = _run(conn, schema, app, _BUMP).fetchone()[0]
        kept = asked.anchor_ms is not None or bool(current and current.kept)
        _run(conn, schema, app, _PUT, name=asked.name, version=version, anchor_ms=anchor,
             fingerprint=asked.fingerprint, timing=asked.timing, enabled=asked.enabled,
             ran_ms=None, kept=kept, definition=asked.definition)
        _run(conn, schema, app, _UNREMOVE, name=asked.name)
        if asked.enabled:
            first = anchor if asked.first_ms is None else min(anchor, asked.first_ms)
            _run(conn, schema, app, _FIRST_SLOT, name=asked.name, slot_ms=first)
    return (1, int(version), int(anchor))


def delete(conn: Any, schema: str, app: str, name: str) -> int | None:
    """The version of the removal; None when no entry of that name was stored."""
    with conn.transaction():
        _run(conn, schema, app, _LOCK)
        if not _run(conn, schema, app, _DELETE, name=name).rowcount:
            return None
        version = _run(conn, schema, app, _BUMP).fetchone()[0]
        _run(conn, schema, app, _REMOVE, name=name, version=version)
        _run(conn, schema, app, _CAP, cap=REMOVED_CAP)
    return int(version)


def finish(conn: Any, schema: str, app: str, name: str, fingerprint: str,
           slot_ms: int) -> int | None:
    """A one-off ran ``slot_ms``: disable it if it is still this definition, enabled."""
    with conn.transaction():
        _run(conn, schema, app, _LOCK)
        found = _run(conn, schema, app, _GET, name=name).fetchone()
        current = Row(*found) if found else None
        if current is None or current.fingerprint != fingerprint or not current.enabled:
            return None
        version = _run(conn, schema, app, _BUMP).fetchone()[0]
        _run(conn, schema, app, _PUT, **{**current._asdict(), "version": version,
                                         "enabled": False, "ran_ms": slot_ms})
    return int(version)


def get(conn: Any, schema: str, app: str, name: str) -> Row | None:
    found = _run(conn, schema, app, _GET, name=name).fetchone()
    return Row(*found) if found else None


def all_rows(conn: Any, schema: str, app: str) -> list[Row]:
    return [Row(*r) for r in _run(conn, schema, app, _ALL)]


def _version(conn: Any, schema: str, app: str) -> tuple[int, int]:
    """The app's entries' (version, floor); (0, 0) before its first change."""
    meta = _run(conn, schema, app,
                "SELECT version, floor FROM {schema}.entry_meta WHERE app = %(app)s").fetchone()
    return (int(meta[0]), int(meta[1])) if meta else (0, 0)


def changes(conn: Any, schema: str, app: str, seen: int
            ) -> tuple[int, bool, list[Row], list[str]]:
    """(version, full, saved, removed) since ``seen``, read in one snapshot.

    Every beat asks this every ``dynamic_schedule.POLL`` and most of the time nothing
    changed: that answer is one statement on its own (one round trip). What changed is
    read by one more statement (:data:`_CHANGES`): one statement sees one snapshot, so the
    version, the saved rows and the removed names agree with no transaction around them.
    """
    version, _ = _version(conn, schema, app)
    if version == seen:
        return version, False, [], []
    version, whole, saved, removed = 0, False, [], []
    for kind, *columns in _run(conn, schema, app, _CHANGES, seen=seen):
        if kind == "m":
            version, whole = int(columns[1]), bool(columns[5])
        elif kind == "s":
            saved.append(Row(*columns))
        else:
            removed.append(columns[0])
    if version == seen:
        return version, False, [], []
    return version, whole, saved, removed

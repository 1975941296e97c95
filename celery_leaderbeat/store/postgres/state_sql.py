"""What the beats read and write beside the claims: last slots, fingerprints, the history
(pruned to a count and an age), pauses and the node registry. One statement each."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..types import SlotStatus
from . import rules
from .lease_sql import NOW_MS
from .schema import qualified

_LOAD_ALL = """
SELECT entry, slot_ms, epoch, state, node, claimed_ms FROM {schema}.slots WHERE app = %(app)s
"""
_LOAD = _LOAD_ALL + " AND entry = ANY(%(names)s::text[])"
_DEFINITIONS_ALL = "SELECT entry, fingerprint FROM {schema}.definitions WHERE app = %(app)s"
_DEFINITIONS = _DEFINITIONS_ALL + " AND entry = ANY(%(names)s::text[])"
_WRITE_DEFINITIONS = """
INSERT INTO {schema}.definitions (app, entry, fingerprint)
SELECT %(app)s, w.entry, w.fingerprint
FROM unnest(%(names)s::text[], %(fingerprints)s::text[]) AS w(entry, fingerprint)
ON CONFLICT (app, entry) DO UPDATE SET fingerprint = excluded.fingerprint
"""
_HISTORY = """
SELECT id, extract(epoch FROM at)::float8, event, entry, slot_ms, node, epoch, detail, extra
FROM (SELECT * FROM {schema}.history WHERE app = %(app)s ORDER BY id DESC LIMIT %(count)s) AS h
ORDER BY id
"""
_HISTORY_AFTER = """
SELECT id, extract(epoch FROM at)::float8, event, entry, slot_ms, node, epoch, detail, extra
FROM {schema}.history WHERE app = %(app)s AND id > %(after)s ORDER BY id LIMIT %(count)s
"""
# Keeps the newest ``keep`` rows and nothing older than ``max_age_s``; notes how far back
# the history is whole (a backfill refuses a slot whose 'sent' event may be gone).
_PRUNE_HISTORY = """
WITH gone AS (
    DELETE FROM {schema}.history
    WHERE app = %(app)s
      AND (id <= (SELECT id FROM {schema}.history WHERE app = %(app)s
                  ORDER BY id DESC OFFSET %(keep)s LIMIT 1)
           OR at < clock_timestamp() - %(max_age_s)s * interval '1 second')
    RETURNING at
), noted AS (
    UPDATE {schema}.lease
    SET history_whole_ms = greatest(history_whole_ms,
                                    (SELECT (extract(epoch FROM max(at)) * 1000)::bigint
                                     FROM gone))
    WHERE app = %(app)s AND EXISTS (SELECT 1 FROM gone)
)
SELECT count(*) FROM gone
"""
_LOST_AT = "SELECT lost_at_ms FROM {schema}.lease WHERE app = %(app)s"
# Only while the generation is still below what the node saw: a leader that started
# again since lifted it above every mark it found.
_MARK_LOSS = """
UPDATE {schema}.lease SET loss_generation = %(seen)s
WHERE app = %(app)s AND generation < %(seen)s AND coalesce(loss_generation, -1) < %(seen)s
"""
_REPORT = """
INSERT INTO {schema}.lost_reports (app, entry, node, slot_ms, expires_at)
SELECT %(app)s, w.entry, %(node)s, w.slot_ms,
       clock_timestamp() + %(keep_ms)s * interval '1 millisecond'
FROM unnest(%(names)s::text[], %(slots)s::bigint[]) AS w(entry, slot_ms)
ON CONFLICT (app, entry, node) DO UPDATE
    SET slot_ms = excluded.slot_ms, expires_at = excluded.expires_at
"""
_REPORTS = """
SELECT entry, max(slot_ms) FROM {schema}.lost_reports
WHERE app = %(app)s AND expires_at > clock_timestamp() GROUP BY entry
"""
# Grants are kept for ``max_age_s``: longer than the catch-up window, so a slot a
# catch-up could reach again is still refused by its grant (past it, the entry's slot row
# refuses anything not later than its last slot).
_PRUNE_GRANTS = """
DELETE FROM {schema}.grants
WHERE app = %(app)s AND granted_at < clock_timestamp() - %(max_age_s)s * interval '1 second'
"""
# The state of entries nobody schedules any more, once their slot is older than the
# cutoff (another node's newer schedule keeps it during a rolling deploy); never an
# unconfirmed claim (it is reported first).
_PRUNE_ENTRIES = """
WITH gone AS (
    DELETE FROM {schema}.slots
    WHERE app = %(app)s AND NOT (entry = ANY(%(scheduled)s::text[]))
          AND slot_ms < %(cutoff_ms)s AND state NOT IN ('c', 'u')
    RETURNING entry
), undefined AS (
    DELETE FROM {schema}.definitions AS d USING gone
    WHERE d.app = %(app)s AND d.entry = gone.entry
)
SELECT count(*) FROM gone
"""
_PRUNE_NODES = """
DELETE FROM {schema}.nodes
WHERE app = %(app)s AND seen_at < clock_timestamp() - %(keep_s)s * interval '1 second'
"""
_OVERTAKEN = """
SELECT entry, slot_ms, epoch, state, node, claimed_ms FROM {schema}.overtaken
WHERE app = %(app)s
"""
_FORGET_OVERTAKEN = """
DELETE FROM {schema}.overtaken AS o
USING unnest(%(names)s::text[], %(slots)s::bigint[]) AS w(entry, slot_ms)
WHERE o.app = %(app)s AND o.entry = w.entry AND o.slot_ms = w.slot_ms
"""
_PAUSE = """
INSERT INTO {schema}.paused (app, entry, record) VALUES (%(app)s, %(name)s, %(record)s)
ON CONFLICT (app, entry) DO UPDATE SET record = excluded.record
"""
_RESUME = "DELETE FROM {schema}.paused WHERE app = %(app)s AND entry = %(name)s"
_PAUSED = "SELECT entry, record FROM {schema}.paused WHERE app = %(app)s"
_REGISTER = """
WITH before AS (
    SELECT record FROM {schema}.nodes WHERE app = %(app)s AND node = %(node)s
), put AS (
    INSERT INTO {schema}.nodes (app, node, record) VALUES (%(app)s, %(node)s, %(record)s)
    ON CONFLICT (app, node) DO UPDATE SET record = excluded.record, seen_at = clock_timestamp()
)
SELECT record FROM before
"""
_UNREGISTER = "DELETE FROM {schema}.nodes WHERE app = %(app)s AND node = %(node)s"
_NODES = "SELECT node, record FROM {schema}.nodes WHERE app = %(app)s"


def _run(conn: Any, schema: str, app: str, text: str, **params: Any) -> Any:
    return conn.execute(qualified(text, schema), {"app": app, **params})


def load(conn: Any, schema: str, app: str,
         names: Sequence[str] | None = None) -> dict[str, rules.Row]:
    """The last slot of each entry (of ``names``, or of all)."""
    if names is None:
        cur = _run(conn, schema, app, _LOAD_ALL)
    else:
        cur = _run(conn, schema, app, _LOAD, names=list(names))
    return {entry: rules.Row(int(slot), int(epoch), SlotStatus(state), node, at)
            for entry, slot, epoch, state, node, at in cur}


def definitions(conn: Any, schema: str, app: str,
                names: Sequence[str] | None = None) -> dict[str, str]:
    """The fingerprint the leader stored for each entry (of ``names``, or of all)."""
    if names is None:
        cur = _run(conn, schema, app, _DEFINITIONS_ALL)
    else:
        cur = _run(conn, schema, app, _DEFINITIONS, names=list(names))
    return dict(cur.fetchall())


def write_definitions(conn: Any, schema: str, app: str, fingerprints: dict[str, str]) -> None:
    if fingerprints:
        _run(conn, schema, app, _WRITE_DEFINITIONS, names=list(fingerprints),
             fingerprints=list(fingerprints.values()))


def history(conn: Any, schema: str, app: str, count: int = 50,
            after: int | None = None) -> list[dict[str, str]]:
    """The newest ``count`` events (or the first ``count`` after row ``after``), oldest
    first; ``id`` is ``<ms written>-<row id>``."""
    if after is None:
        cur = _run(conn, schema, app, _HISTORY, count=count)
    else:
        cur = _run(conn, schema, app, _HISTORY_AFTER, count=count, after=after)
    return [_event(*row) for row in cur]


def _event(row_id: int, at: float, event: str, entry: str, slot: int | None, node: str,
           epoch: int, detail: str, extra: dict[str, str] | None) -> dict[str, str]:
    row = {"id": f"{int(at * 1000)}-{row_id}", "at": str(int(at * 1000)), "event": event,
           "node": node, "epoch": str(epoch)}
    if entry:
        row.update(entry=entry, slot="" if slot is None else str(slot), detail=detail)
    elif detail:
        row["detail"] = detail
    row.update(extra or {})
    return row


def prune_history(conn: Any, schema: str, app: str, *, keep: int, max_age_s: float,
                  grants_keep_s: float | None = None) -> int:
    """Drop grants older than ``grants_keep_s`` (default ``max_age_s``), then history rows
    beyond the newest ``keep`` and older than ``max_age_s``; how many history rows went.

    Two transactions: the grants' may be long (a large table after an outage) and takes
    no lock on the lease row; the history's notes on that row how far back it is whole,
    and holds it only as long as its one statement runs (a session holding the lease row
    for half a ttl is taken for a stalled one and ended: :func:`.lease_sql.end_stalled`)."""
    _run(conn, schema, app, _PRUNE_GRANTS,
         max_age_s=max_age_s if grants_keep_s is None else grants_keep_s)
    gone = _run(conn, schema, app, _PRUNE_HISTORY, keep=keep, max_age_s=max_age_s).fetchone()[0]
    return int(gone)


def lost_at(conn: Any, schema: str, app: str) -> int | None:
    """The server's time (ms) when a leader last started again after a loss of writes."""
    row = _run(conn, schema, app, _LOST_AT).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def prune(conn: Any, schema: str, app: str, scheduled: Sequence[str], *, keep_ms: int,
          node_keep_s: float) -> list[int]:
    """Forget entries no longer scheduled (their slot older than ``keep_ms`` by the
    server's clock) and nodes not seen for ``node_keep_s``: [entries, 0, nodes] gone
    (the middle one: backfill records, which this store does not keep yet)."""
    with conn.transaction():
        cutoff = conn.execute("SELECT " + NOW_MS).fetchone()[0] - keep_ms
        entries = _run(conn, schema, app, _PRUNE_ENTRIES, scheduled=list(scheduled),
                       cutoff_ms=cutoff).fetchone()[0]
        nodes = _run(conn, schema, app, _PRUNE_NODES, keep_s=node_keep_s).rowcount
    return [int(entries), 0, int(nodes)]


def overtaken(conn: Any, schema: str, app: str) -> dict[tuple[str, int], rules.Row]:
    """Claimed, unconfirmed slots that a newer claim of another claimant replaced."""
    return {(entry, int(slot)): rules.Row(int(slot), int(epoch), SlotStatus(state), node, at)
            for entry, slot, epoch, state, node, at in _run(conn, schema, app, _OVERTAKEN)}


def forget_overtaken(conn: Any, schema: str, app: str,
                     fields: Sequence[tuple[str, int]]) -> None:
    if fields:
        _run(conn, schema, app, _FORGET_OVERTAKEN, names=[n for n, _ in fields],
             slots=[s for _, s in fields])


def mark_loss(conn: Any, schema: str, app: str, seen: int) -> None:
    """Make a loss of writes known: the highest generation this node saw before it."""
    _run(conn, schema, app, _MARK_LOSS, seen=seen)


def report_lost(conn: Any, schema: str, app: str, node: str, keep_ms: int, seen: int,
                settled: dict[str, int]) -> None:
    """Mark the loss, and keep for ``keep_ms`` the newest slot of each entry ``node``
    knew settled before it (lost.lua)."""
    with conn.transaction():
        if settled:
            _run(conn, schema, app, _REPORT, node=node, keep_ms=keep_ms,
                 names=list(settled), slots=list(settled.values()))
        _run(conn, schema, app, _MARK_LOSS, seen=seen)


def lost_reports(conn: Any, schema: str, app: str) -> dict[str, int]:
    """Per entry, the newest slot any node reported settled before a loss (unexpired)."""
    return {entry: int(slot) for entry, slot in _run(conn, schema, app, _REPORTS)}


def pause(conn: Any, schema: str, app: str, name: str, record: dict[str, Any]) -> None:
    _run(conn, schema, app, _PAUSE, name=name, record=json.dumps(record))


def resume(conn: Any, schema: str, app: str, name: str) -> bool:
    return bool(_run(conn, schema, app, _RESUME, name=name).rowcount)


def paused(conn: Any, schema: str, app: str) -> dict[str, dict[str, Any]]:
    return dict(_run(conn, schema, app, _PAUSED).fetchall())


def register_node(conn: Any, schema: str, app: str, node: str,
                  record: dict[str, Any]) -> dict[str, Any] | None:
    """Store ``node``'s record; the record it replaced."""
    row = _run(conn, schema, app, _REGISTER, node=node, record=json.dumps(record)).fetchone()
    return None if row is None else dict(row[0])


def unregister_node(conn: Any, schema: str, app: str, node: str) -> None:
    _run(conn, schema, app, _UNREGISTER, node=node)


def nodes(conn: Any, schema: str, app: str) -> dict[str, dict[str, Any]]:
    return dict(_run(conn, schema, app, _NODES).fetchall())

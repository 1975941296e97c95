"""The CLI's requests for whichever node leads, and what backfills sent, in SQL.

A request is taken by one caller: ``DELETE … RETURNING`` over the oldest rows, locked
``FOR UPDATE SKIP LOCKED`` so two leaders (an old one not yet fenced, a new one) never
take the same request. One not carried out is put back first in line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .schema import qualified

_PUSH = """
WITH queued AS (
    INSERT INTO {schema}.requests (app, position, body)
    VALUES (%(app)s, nextval(%(sequence)s::regclass), %(body)s)
)
SELECT pg_notify(%(channel)s, 'request')
"""
_POP = """
DELETE FROM {schema}.requests
WHERE (app, position) IN (
    SELECT app, position FROM {schema}.requests WHERE app = %(app)s
    ORDER BY position LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING position, body
"""
_REQUEUE = """
INSERT INTO {schema}.requests (app, position, body)
SELECT %(app)s, w.at + (SELECT coalesce(min(position), 1) FROM {schema}.requests
                        WHERE app = %(app)s) - %(n)s - 1, w.body
FROM unnest(%(bodies)s::text[]) WITH ORDINALITY AS w(body, at)
"""
_MARK = """
INSERT INTO {schema}.backfilled (app, entry, slot_ms, request_id)
VALUES (%(app)s, %(entry)s, %(slot_ms)s, %(request_id)s)
ON CONFLICT (app, entry, slot_ms) DO NOTHING
RETURNING 1
"""
_BACKFILLED = """
SELECT slot_ms FROM {schema}.backfilled WHERE app = %(app)s AND entry = %(entry)s
"""


def push(conn: Any, schema: str, app: str, body: str, channel: str) -> None:
    """Queue ``body`` and wake the leader (on commit)."""
    conn.execute(qualified(_PUSH, schema),
                 {"app": app, "body": body, "channel": channel,
                  "sequence": f'"{schema}".request_positions'})


def pop(conn: Any, schema: str, app: str, limit: int) -> list[str]:
    """Take up to ``limit`` pending requests, oldest first."""
    rows = conn.execute(qualified(_POP, schema), {"app": app, "limit": limit}).fetchall()
    return [body for _, body in sorted(rows)]


def requeue(conn: Any, schema: str, app: str, bodies: Sequence[str]) -> None:
    """Put ``bodies`` back first in line, in their order."""
    if bodies:
        with conn.transaction():
            conn.execute(qualified("LOCK TABLE {schema}.requests IN EXCLUSIVE MODE", schema))
            conn.execute(qualified(_REQUEUE, schema),
                         {"app": app, "bodies": list(bodies), "n": len(bodies)})


def mark_backfilled(conn: Any, schema: str, app: str, entry: str, slot_ms: int,
                    request_id: str) -> bool:
    """Note that ``request_id`` sends this slot; False: a backfill already did."""
    row = conn.execute(qualified(_MARK, schema), {"app": app, "entry": entry,
                                                  "slot_ms": slot_ms,
                                                  "request_id": request_id}).fetchone()
    return row is not None


def backfilled(conn: Any, schema: str, app: str, entry: str) -> set[int]:
    return {int(r[0]) for r in conn.execute(qualified(_BACKFILLED, schema),
                                            {"app": app, "entry": entry})}

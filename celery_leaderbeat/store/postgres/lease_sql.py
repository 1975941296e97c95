"""The lease in SQL: one row per app, each rule one statement (acquire.lua, renew.lua,
release.lua).

The holder is a random id per process (the node id and a token of the process): never a
host name, so two processes configured with one node id never renew each other's lease.
Every decision uses the server's ``clock_timestamp()``: a node's own clock decides
nothing, and each answer carries the server's time so the node can measure its skew.
No advisory lock is involved: a takeover and a renewal are row updates, fenced by the
row's own holder and epoch.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import psycopg

from ..errors import StoreError
from .pipelined import transaction
from .schema import qualified

#: the server's time in ms since the Unix epoch, as every statement here reports it
NOW_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

# Takes the row only where nobody holds it, it expired, this process holds it already (a
# lease it gave up locally: the new epoch fences the older self), or its epoch is below
# one the caller has seen (the server went back to older state: nobody leads under it).
# Nobody takes it while the app's generation is below one the caller saw (the database
# lost writes) unless the caller says to take it despite the loss.
# The epoch is lifted above the row's and the caller's, so it never goes backwards.
_ACQUIRE = """
WITH taken AS (
    INSERT INTO {schema}.lease AS l (app, holder, epoch, expires_at)
    SELECT %(app)s, %(holder)s, %(seen)s + 1,
           clock_timestamp() + %(ttl_ms)s * interval '1 millisecond'
    WHERE %(despite)s OR coalesce((SELECT generation FROM {schema}.lease
                                   WHERE app = %(app)s), 0) >= %(seen_generation)s
    ON CONFLICT (app) DO UPDATE
        SET holder = excluded.holder, epoch = greatest(l.epoch, %(seen)s) + 1,
            expires_at = excluded.expires_at, progress_at = NULL
        WHERE l.holder IS NULL OR l.expires_at <= clock_timestamp()
              OR l.holder = excluded.holder OR l.epoch < %(seen)s
    RETURNING l.epoch
), elected AS (
    INSERT INTO {schema}.history (app, event, node, epoch)
    SELECT %(app)s, 'elected', %(node)s, epoch FROM taken
)
SELECT (SELECT epoch FROM taken), l.holder, l.epoch,
       (extract(epoch FROM l.expires_at - clock_timestamp()) * 1000)::bigint,
       """ + NOW_MS + """, coalesce(l.generation, 0)
FROM (SELECT 1) AS one LEFT JOIN {schema}.lease AS l ON l.app = %(app)s
"""

_RENEW = """
UPDATE {schema}.lease SET expires_at = clock_timestamp() + %(ttl_ms)s * interval '1 millisecond'
WHERE app = %(app)s AND holder = %(holder)s AND epoch = %(epoch)s
      AND expires_at > clock_timestamp()
RETURNING """ + NOW_MS

# The epoch stays in the row: the next acquisition is above it.
_RELEASE = """
WITH gone AS (
    UPDATE {schema}.lease SET holder = NULL, expires_at = clock_timestamp(), progress_at = NULL
    WHERE app = %(app)s AND holder = %(holder)s AND epoch = %(epoch)s
    RETURNING epoch
), noted AS (
    INSERT INTO {schema}.history (app, event, node, epoch, detail)
    SELECT %(app)s, 'released', %(node)s, epoch, %(reason)s FROM gone
)
SELECT pg_notify(%(channel)s, 'released') FROM gone
"""

_HOLDER = """
SELECT holder, epoch, (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint
FROM {schema}.lease
WHERE app = %(app)s AND holder IS NOT NULL AND expires_at > clock_timestamp()
"""


class Acquired(NamedTuple):
    """What an acquire attempt answered."""

    epoch: int | None  #: the new epoch; None: another holds the lease
    holder: str | None  #: refused: who holds it
    held_epoch: int  #: refused: the holder's epoch (0: no row)
    remaining_ms: int  #: refused: the holder's ttl left
    server_ms: int  #: the server's time when it answered
    generation: int = 0  #: the app's generation (see claims_sql): what standbys learn


#: a statement's bound on waiting for the lease row (a claim holding it stalled)
_BOUND = "SELECT set_config('lock_timeout', %s, true)"

# The sessions holding the lease row in a transaction that began more than half a lease
# ttl ago: processes stopped mid-call (SIGSTOP, a frozen VM) whose server still waits for
# the rest of a pipeline. Such a session counts as active, not idle, so no
# idle_in_transaction_session_timeout ends it, and while it lives nobody renews or takes
# the lease: a standby stopped mid-rescue would cost the leader its lease. No call of ours
# holds the row that long (each of its waits is bounded by a call's timeout), so what
# holds it so is stalled: the call that met it ends that session. Half a ttl lets a leader
# that met one renew before its lease runs out.
# The transaction's start is compared with this statement's own start, both as
# pg_stat_activity records them: one clock, whatever clock_timestamp() a session resolves.
# Another role's xact_start reads as NULL without pg_read_all_stats.
_HOLDERS = """
SELECT a.pid, a.xact_start IS NULL,
       a.xact_start < me.query_start - %(age_ms)s * interval '1 millisecond'
FROM {schema}.lease AS l
JOIN pg_locks AS k ON k.locktype = 'transactionid' AND k.granted AND k.transactionid = l.xmax
JOIN pg_stat_activity AS a ON a.pid = k.pid
JOIN pg_stat_activity AS me ON me.pid = pg_backend_pid()
WHERE l.app = %(app)s AND a.pid <> me.pid
"""
_GRANTS = ("run every beat as one role, or grant the beats' role pg_read_all_stats and "
           "pg_signal_backend")


def end_stalled(conn: Any, schema: str, app: str, *, age_ms: int) -> list[int]:
    """End the sessions that have held the lease row for more than ``age_ms`` in one
    transaction; their process ids (empty: none such). Raises StoreError when this role
    may not see how long another role's session has held it, or may not end it."""
    rows = conn.execute(qualified(_HOLDERS, schema), {"app": app, "age_ms": age_ms}).fetchall()
    ended = []
    for pid, hidden, stalled in rows:
        if hidden:
            raise StoreError(f"the lease row of app {app!r} is held by session {pid}, of another "
                             "role, and this role may not see since when, so it cannot tell a "
                             "slow call from a process stopped mid-call (which holds it for "
                             f"good): {_GRANTS}")
        if not stalled:
            continue
        try:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        except psycopg.errors.InsufficientPrivilege as refused:
            raise StoreError(f"session {pid} has held the lease row of app {app!r} for over "
                             f"{age_ms} ms (a process stopped mid-call) and this role may not "
                             f"end it ({refused}): {_GRANTS}") from refused
        ended.append(int(pid))
    return ended


def acquire(conn: Any, schema: str, app: str, *, holder: str, node: str, ttl_ms: int,
            seen_epoch: int, seen_generation: int = 0, despite_loss: bool = False,
            wait_ms: int = 0) -> Acquired:
    """Take the lease if it is free (one statement); the new epoch or the holder's.
    ``wait_ms``: how long to wait for the row while another transaction holds it; past
    that, a session stalled on it for over half ``ttl_ms`` is ended and the row tried again."""
    row = _on_the_row(conn, schema, app, _ACQUIRE, wait_ms=wait_ms, ttl_ms=ttl_ms,
                      params={"holder": holder, "node": node, "ttl_ms": ttl_ms,
                              "seen": seen_epoch, "seen_generation": seen_generation,
                              "despite": despite_loss})
    epoch, held_by, held_epoch, remaining, now_ms, generation = row
    if epoch is not None:
        return Acquired(int(epoch), None, 0, ttl_ms, int(now_ms), int(generation))
    return Acquired(None, held_by, int(held_epoch or 0), max(0, int(remaining or 0)),
                    int(now_ms), int(generation))


def _on_the_row(conn: Any, schema: str, app: str, text: str, *, params: dict[str, Any],
                wait_ms: int, ttl_ms: int) -> Any:
    """The one row of statement ``text`` on the lease row, in a transaction that waits at
    most ``wait_ms`` for the row; once more after ending a session stalled on it for over
    half ``ttl_ms`` (:func:`end_stalled`)."""
    statement = qualified(text, schema)

    def bounded() -> Any:
        with transaction(conn):
            if wait_ms:
                conn.execute(_BOUND, (f"{wait_ms}ms",))
            cursor = conn.execute(statement, {"app": app, **params})
        return cursor.fetchone()

    try:
        return bounded()
    except psycopg.errors.LockNotAvailable:
        if not end_stalled(conn, schema, app, age_ms=ttl_ms // 2):
            raise
        return bounded()


def renew(conn: Any, schema: str, app: str, *, holder: str, epoch: int,
          ttl_ms: int, wait_ms: int = 0) -> int | None:
    """Extend the lease held by ``holder`` under ``epoch``; the server's time (ms), or
    None when the lease is no longer held so (expired, taken, released): lost.
    ``wait_ms``: as :func:`acquire`'s (a session stalled on the row is ended)."""
    row = _on_the_row(conn, schema, app, _RENEW, wait_ms=wait_ms, ttl_ms=ttl_ms,
                      params={"holder": holder, "epoch": epoch, "ttl_ms": ttl_ms})
    return None if row is None else int(row[0])


def release(conn: Any, schema: str, app: str, *, holder: str, epoch: int, node: str,
            reason: str, channel: str, ttl_ms: int = 0, wait_ms: int = 0) -> bool:
    """Give the lease up, fenced by holder and epoch; wake the standbys (on commit).
    False: it was not held so (nothing changed). Waits at most ``wait_ms`` for the row,
    as a renewal does: a release stuck behind a stalled call would hold up a shutdown."""
    row = _on_the_row(conn, schema, app, _RELEASE, wait_ms=wait_ms, ttl_ms=ttl_ms,
                      params={"holder": holder, "epoch": epoch, "node": node,
                              "reason": reason, "channel": channel})
    return row is not None


def current_holder(conn: Any, schema: str, app: str) -> tuple[str | None, int, int]:
    """Who holds the lease, under which epoch, and its ttl left in ms ((None, 0, 0): nobody)."""
    row = conn.execute(qualified(_HOLDER, schema), {"app": app}).fetchone()
    if row is None:
        return None, 0, 0
    return row[0], int(row[1]), max(0, int(row[2]))


def server_identity(conn: Any) -> tuple[int, int]:
    """The server's system identifier and its current timeline: a new timeline means a
    replica was promoted (asynchronous: it may lack commits); a new system identifier,
    another cluster altogether (restored from a dump). A primary's timeline is read from
    its current WAL file's name (the last checkpoint's lags behind a promotion)."""
    row = conn.execute(
        "SELECT (SELECT system_identifier FROM pg_control_system()),"
        " CASE WHEN pg_is_in_recovery() THEN (SELECT timeline_id FROM pg_control_checkpoint())"
        " ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"
        " END").fetchone()
    return int(row[0]), int(row[1])


def identity(conn: Any, schema: str, app: str) -> tuple[int, int]:
    """:func:`server_identity`, as a store call (for :meth:`Place.run`)."""
    return server_identity(conn)


def now_ms(conn: Any, schema: str, app: str) -> int:
    """The server's clock (ms), as a store call (for :meth:`Place.run`)."""
    return server_ms(conn)


def server_ms(conn: Any) -> int:
    """The server's clock, ms since the Unix epoch."""
    return int(conn.execute("SELECT " + NOW_MS).fetchone()[0])

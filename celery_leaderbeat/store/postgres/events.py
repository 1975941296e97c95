"""The events on PostgreSQL: ``pg_notify`` to publish, ``LISTEN`` on a connection of its
own to wait.

A hint, never state: a node that misses one finds the same at its next poll. Where
``LISTEN`` is unavailable (a transaction-mode pooler hands each statement any server
session, so a session's ``LISTEN`` hears nothing), ``listen=False`` makes a subscription
wait out each timeout and answer None: the nodes' own polls carry everything then, at
the cost of the wake-ups (a released lease is found at the next standby poll). A
subscription finds that out itself: its first ``LISTEN`` is tried with a notification
sent from another connection, and one that is not heard within :data:`PROBE_WAIT` s
turns listening off, with a warning.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections import deque
from typing import Any

import psycopg
from psycopg import sql

from .pool import ERRORS

logger = logging.getLogger(__name__)

#: seconds a subscription's first LISTEN waits for the notification that tries it
PROBE_WAIT = 2.0


def channel_name(schema: str, app: str) -> str:
    """The channel of one app's events: short and plain whatever the prefix holds (a
    channel is an identifier of at most 63 bytes)."""
    digest = hashlib.sha1(f"{schema}\0{app}".encode()).hexdigest()[:20]
    return f"leaderbeat_{digest}"


class PostgresSubscription:
    """One node's subscription: ``LISTEN`` on a connection of its own, opened lazily and
    again after it broke."""

    def __init__(self, conninfo: str, channel: str, *, listen: bool = True,
                 connect_timeout: float = 5.0) -> None:
        self.conninfo, self.channel, self.listen = conninfo, channel, listen
        self.connect_timeout = connect_timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._pending: deque[str] = deque()
        self._probed = False  # the first LISTEN was tried: not tried again after a break
        if listen:
            self._connect()

    def _connect(self) -> bool:
        try:
            conn = self._open()
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
            deaf = not self._probed and not self._hears(conn)
        except ERRORS as exc:
            logger.debug("leaderbeat: LISTEN %s failed (%s); polling meanwhile",
                         self.channel, exc)
            return False
        self._probed = True
        if deaf:
            logger.warning("leaderbeat: LISTEN hears nothing on this connection (a "
                           "transaction-mode pooler such as PgBouncer in between?): the "
                           "events are polled instead (a released lease is found at the next "
                           "standby poll); connect the beats to PostgreSQL itself or a "
                           "session-mode pool to be woken at once")
            self.listen = False
            conn.close()
            return False
        self._conn = conn
        return True

    def _open(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.conninfo, autocommit=True,
                               connect_timeout=max(1, int(self.connect_timeout)))

    def _hears(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether ``conn``'s LISTEN hears a notification sent from another connection
        (on a channel of this probe's own); what else arrives meanwhile is kept."""
        probe = f"{self.channel}_probe_{secrets.token_hex(4)}"
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(probe)))
        with self._open() as other:
            other.execute("SELECT pg_notify(%s, '')", (probe,))
        heard, deadline = False, time.monotonic() + PROBE_WAIT
        while not heard and time.monotonic() < deadline:
            left = max(0.0, deadline - time.monotonic())
            for notify in conn.notifies(timeout=left, stop_after=1):
                if notify.channel == probe:
                    heard = True
                else:
                    self._pending.append(notify.payload)
        conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(probe)))
        return heard

    def next(self, timeout: float) -> str | None:
        """The next event, waiting up to ``timeout`` s; None: none yet."""
        if not self.listen or (self._conn is None and not self._connect()):
            time.sleep(max(0.0, min(timeout, 1.0)))  # ask again later, not in a tight loop
            return None
        assert self._conn is not None
        if self._pending:
            return self._pending.popleft()
        try:
            # the generator is read to its end: leaving it after the first would drop the
            # others that arrived in the same read
            for notify in self._conn.notifies(timeout=max(0.0, timeout), stop_after=1):
                self._pending.append(notify.payload)
        except ERRORS:
            self.close()  # opened again at the next call; what it missed is found by a poll
        return self._pending.popleft() if self._pending else None

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                conn.close()
            except ERRORS:
                pass


class PostgresEvents:
    """The events of one app: ``pg_notify`` through the pool, ``LISTEN`` per subscriber."""

    def __init__(self, place: Any, *, listen: bool = True) -> None:
        self.place = place
        self.listen = listen
        self.channel = channel_name(place.schema, place.app)

    def subscribe(self) -> PostgresSubscription:
        return PostgresSubscription(self.place.pool.conninfo, self.channel, listen=self.listen,
                                    connect_timeout=self.place.pool.timeout)

    def publish(self, message: str) -> None:
        self.place.run(publish, self.channel, message)


def publish(conn: Any, schema: str, app: str, channel: str, message: str) -> None:
    """Notify ``channel`` (delivered on commit)."""
    conn.execute("SELECT pg_notify(%s, %s)", (channel, message))

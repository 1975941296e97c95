"""Connections to PostgreSQL: one ``psycopg_pool.ConnectionPool`` per store, its errors,
and the store error each leaves the store as.

A call gets an idle connection only after :func:`closed_while_idle` found nothing waiting
on its socket: a server that restarted, or ended the session, sent its last message (or
closed the socket) while nobody asked anything, so that connection is dropped and the call
takes the next one at once (:func:`connection` checks, not the pool: a pool's own check
sleeps a second, then two, between a failed check and the next connection, which after a
restart cost every call about a second), with no round trip spent on a healthy one. A
server that
vanished without a word (a host gone) is found by the call that meets it: it fails (the
store's connection error) and the pool is checked at once, so the next call gets a fresh
connection rather than the next broken one.

A process that forks (a prefork worker's main process) uses :class:`OneConnection`
instead: a pool's workers and scheduler are threads, and a child forked while one of
them holds a lock (the pool's, libpq's, OpenSSL's) inherits it held forever.
"""

from __future__ import annotations

import math
import select
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg_pool

from ..errors import StoreCredentialsRefused, StoreError, StoreRefused, StoreUnreachable

#: what a failed PostgreSQL call raises: no answer (server, network, pool), or an error
ERRORS: tuple[type[Exception], ...] = (psycopg.Error, psycopg_pool.PoolTimeout, OSError)
#: of those, the ones that mean the server could not be reached (an outage)
UNREACHABLE: tuple[type[Exception], ...] = (psycopg.OperationalError,
                                            psycopg_pool.PoolTimeout, OSError)
#: of those, PostgreSQL refusing the credentials (retrying cannot help)
CREDENTIALS: tuple[type[Exception], ...] = (psycopg.errors.InvalidAuthorizationSpecification,
                                            psycopg.errors.InvalidPassword)
#: of those, PostgreSQL refusing a statement for want of a privilege (retrying cannot help)
REFUSED: tuple[type[Exception], ...] = (psycopg.errors.InsufficientPrivilege,)


def store_error(exc: Exception) -> StoreError:
    """The store error a failed PostgreSQL call leaves the store as (``exc`` kept as its
    cause by the caller). A refused login arrives as an OperationalError whose SQLSTATE
    says so, hence the check on ``sqlstate`` before the outage classes."""
    state = getattr(exc, "sqlstate", None) or ""
    if isinstance(exc, CREDENTIALS) or state in ("28000", "28P01"):
        return StoreCredentialsRefused(str(exc))
    if isinstance(exc, REFUSED) or state == "42501":
        return StoreRefused(str(exc))
    if isinstance(exc, UNREACHABLE):
        return StoreUnreachable(str(exc))
    return StoreError(str(exc))


def make_pool(conninfo: str, *, timeout: float = 5.0, max_size: int = 4, threads: bool = True,
              **kwargs: Any) -> Pool:
    """A pool for ``conninfo`` whose connections fail within about ``timeout`` s.

    ``prepare_threshold=None`` (no server-side prepared statements) keeps it working
    behind a transaction-mode pooler, where consecutive statements may reach different
    server sessions. ``threads=False``: one connection and no threads
    (:class:`OneConnection`), for a process that forks.
    """
    options = {"connect_timeout": max(1, int(timeout)), "prepare_threshold": None,
               "autocommit": True, **kwargs}
    if not threads:
        return OneConnection(conninfo, timeout=timeout, kwargs=options)
    return psycopg_pool.ConnectionPool(conninfo, min_size=1, max_size=max_size,
                                       kwargs=options, timeout=timeout, open=True,
                                       name="leaderbeat")


def closed_while_idle(conn: psycopg.Connection[Any]) -> None:
    """Raise if the server ended this idle connection: anything readable on its socket
    while no statement runs is the server's goodbye (a restart's or a terminated
    session's FATAL message, or the socket's end). A pool's connections never LISTEN, so
    no notification is mistaken for it; a parameter the server reports changing at a
    reload is, and costs one new connection."""
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    if readable:
        conn.close()  # so the pool drops it and opens another, not hands it out again
        raise psycopg.OperationalError("the server ended the session while it was idle")


class OneConnection:
    """One connection, opened by the call that needs it, one call at a time: no threads.

    What a pool offers the store (``connection()``, ``check()``, ``close()``,
    ``conninfo``, ``timeout``), for a process that forks: nothing runs in it but the
    callers, so a fork made between two calls leaves no lock held in the child. A call
    waits for the one in flight at most ``timeout`` s (then ``PoolTimeout``, as a pool's),
    or what the call asks (a ping's shorter wait), also as the connect timeout of a new
    connection (libpq's floor: 2 s).
    """

    def __init__(self, conninfo: str, *, timeout: float, kwargs: dict[str, Any]) -> None:
        self.conninfo = conninfo
        self.timeout = timeout
        self._kwargs = kwargs
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None

    @contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
        wait = self.timeout if timeout is None else min(timeout, self.timeout)
        if not self._lock.acquire(timeout=wait):
            raise psycopg_pool.PoolTimeout(
                f"no connection within {wait} s: the call before still runs")
        try:
            if self._conn is not None:
                try:
                    closed_while_idle(self._conn)
                except psycopg.OperationalError:
                    self._drop()
            if self._conn is None:
                kwargs = self._kwargs if timeout is None else {
                    **self._kwargs, "connect_timeout": max(1, math.ceil(wait))}
                self._conn = psycopg.connect(self.conninfo, **kwargs)
            conn = self._conn
            try:
                yield conn
            finally:
                # a call that left a transaction open or the connection broken: a new one
                if conn.broken or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    self._drop()
        finally:
            self._lock.release()

    def check(self) -> None:
        """Drop the connection if it is broken; the next call opens another. A call in
        flight has it: nothing to check then (and nothing to wait for)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._conn is not None and self._conn.broken:
                self._drop()
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


#: what the store's calls take connections from
Pool = psycopg_pool.ConnectionPool | OneConnection


@contextmanager
def connection(pool: Pool, timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
    """A live connection from ``pool`` within ``timeout`` s (None: the pool's own); a
    connection error also checks the pool's idle ones."""
    try:
        with (pool.connection(timeout) if isinstance(pool, OneConnection)
              else _live(pool, timeout)) as conn:
            yield conn
    except UNREACHABLE:
        try:
            pool.check()
        except ERRORS:  # the server is still away: the next call says so itself
            pass
        raise


@contextmanager
def _live(pool: psycopg_pool.ConnectionPool,
          timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
    """An idle connection of ``pool`` the server has not ended; one it ended goes back
    closed (the pool drops it and opens another) and the next is taken at once, all
    within ``timeout`` (None: the pool's)."""
    deadline = time.monotonic() + (pool.timeout if timeout is None else timeout)
    while True:
        conn = pool.getconn(timeout=max(0.0, deadline - time.monotonic()))
        try:
            closed_while_idle(conn)
        except psycopg.OperationalError:
            pool.putconn(conn)
            continue
        break
    try:
        yield conn
    finally:
        pool.putconn(conn)

"""Connections to PostgreSQL: one ``psycopg_pool.ConnectionPool`` per store, its errors,
and the store error each leaves the store as.

A pool hands a call any open connection; after a server restart its idle connections are
all broken. The call that meets one fails (the store's connection error) and the pool is
checked at once, so the next call gets a fresh connection rather than the next broken one.
"""

from __future__ import annotations

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


def make_pool(conninfo: str, *, timeout: float = 5.0, max_size: int = 4,
              **kwargs: Any) -> psycopg_pool.ConnectionPool:
    """A pool for ``conninfo`` whose connections fail within about ``timeout`` s.

    ``prepare_threshold=None`` (no server-side prepared statements) keeps it working
    behind a transaction-mode pooler, where consecutive statements may reach different
    server sessions.
    """
    options = {"connect_timeout": max(1, int(timeout)), "prepare_threshold": None,
               "autocommit": True, **kwargs}
    return psycopg_pool.ConnectionPool(conninfo, min_size=1, max_size=max_size,
                                       kwargs=options, timeout=timeout, open=True,
                                       name="leaderbeat")


@contextmanager
def connection(pool: psycopg_pool.ConnectionPool) -> Iterator[psycopg.Connection[Any]]:
    """A connection from ``pool``; a connection error also checks the pool's idle ones."""
    try:
        with pool.connection() as conn:
            yield conn
    except UNREACHABLE:
        try:
            pool.check()
        except ERRORS:  # the server is still away: the next call says so itself
            pass
        raise

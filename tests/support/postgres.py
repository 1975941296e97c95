"""A PostgreSQL database per test, on the server at 127.0.0.1:5432 (trust auth, user postgres).

Skipped with the reason when the server is unreachable or psycopg is missing,
except under ``CI=true``, where that is an error.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from celery_leaderbeat.config import Config

HOST, PORT, USER = "127.0.0.1", 5432, "postgres"
#: the Redis URL a PostgreSQL store's Config is given: Config wants one, the store never opens it
NO_REDIS = "redis://unused.invalid"


#: the store URL of :func:`pg_config`'s Configs: tests open the store on a database of
#: their own (``open_store(conninfo, config)``); what decides by the URL sees PostgreSQL
PG_STORE_URL = f"postgresql://{USER}@{HOST}:{PORT}/postgres"


def pg_config(**values: Any) -> Config:
    """A PostgreSQL store's Config: ``values`` over the defaults, checked as set."""
    return Config.from_values({"store_url": PG_STORE_URL, **values})


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL is required under CI=true: {reason}")
    pytest.skip(reason)


def _connect(dbname: str = "postgres"):  # type: ignore[no-untyped-def]
    try:
        import psycopg
    except ImportError:
        _unavailable("psycopg is not installed (pip install 'celery-leaderbeat[django]')")
    try:
        return psycopg.connect(host=HOST, port=PORT, user=USER, dbname=dbname,
                               autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        _unavailable(f"PostgreSQL at {HOST}:{PORT} is unreachable ({str(exc).strip()})")


@contextmanager
def postgres_database(tag: str = "lb") -> Iterator[str]:
    """Create a database with a unique name; drop it (forcing out sessions) afterwards."""
    name = f"{tag}_{secrets.token_hex(4)}"
    with _connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with _connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def node_lease(store: Any, config: Config, **view: Any) -> Any:
    """``store``'s lease as a node holds it: the roles' :class:`LeaseView` over the store's
    :class:`~celery_leaderbeat.store.base.LeaseStore`, with the store's place beside it
    (tests close its pool and run SQL there)."""
    from celery_leaderbeat.roles.lease import LeaseView

    lease = LeaseView(store.lease, config, **view)
    lease.place = store.place  # type: ignore[attr-defined]
    lease.holder_id = config.node_id  # type: ignore[attr-defined]  # the row's holder
    return lease


def with_node_lease(store: Any, config: Config) -> Any:
    """``store`` with its lease replaced by :func:`node_lease`'s view: for tests that drive
    the lease as a node does and never hand the store to a role."""
    store.lease = node_lease(store, config)
    return store


def place_lease(place: Any, config: Config) -> Any:
    """A node's view of the lease of ``config``'s app at ``place`` (a pool shared by apps),
    behind the seam's boundary as a store's own lease is."""
    from celery_leaderbeat.roles.lease import LeaseView
    from celery_leaderbeat.store.calls import Boundary
    from celery_leaderbeat.store.postgres.lease import PostgresLease
    from celery_leaderbeat.store.postgres.pool import ERRORS, store_error

    lease = LeaseView(Boundary(PostgresLease(place, config), "lease", errors=ERRORS,
                               translate=store_error), config)
    lease.place = place  # type: ignore[attr-defined]
    lease.holder_id = config.node_id  # type: ignore[attr-defined]  # the row's holder
    return lease

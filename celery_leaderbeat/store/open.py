"""Open the store a Config names, by the scheme of its URL: Redis, PostgreSQL, or the
in-memory store of this process (``memory://<name>``: tests, development).

``leaderbeat_store_url`` chooses (``postgresql://``/``postgres://``, ``"django"`` for
Django's ``DATABASES["default"]``, or a Redis URL); unset, the store is the Redis of
``leaderbeat_redis_url``. The Scheduler, the CLI, the worker guard, the run-time
entries and the web view all open theirs here, so each process of one site reaches
the same store.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import DJANGO_STORE, Config, is_postgres_store
from ..errors import ConfigurationError
from .base import Store

#: what to run when the schema is missing and this role may not create it
INIT_STORE = "celery -A <app> leaderbeat init-store"


def open_store(config: Config, *, threads: bool = True) -> Store:
    """The store ``config`` names, on new connections (one per process: never share it
    across a fork). On PostgreSQL the schema is created or migrated first where it
    lacks this version's migrations (``leaderbeat_store_schema`` names it).
    ``threads=False``: no threads of the store's own (PostgreSQL on one connection
    instead of a pool), for a process that forks while it is open."""
    if is_postgres_store(config):
        return _open_postgres(config, threads=threads)
    if config.redis_url.startswith("memory://"):
        from .memory import connect as memory_store

        return memory_store(config)
    from .redis_store import connect

    return connect(config)


def postgres_conninfo(config: Config) -> str:
    """The libpq connection string of ``config``'s PostgreSQL store."""
    if config.store_url == DJANGO_STORE:
        return django_conninfo()
    return config.store_url


def django_conninfo(alias: str = "default",
                    databases: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """A libpq connection string from Django's ``DATABASES[alias]`` (or ``databases``):
    the same server, database and role as the site, on connections of the store's own
    (never the request's, whose transactions and thread it must not share)."""
    from psycopg.conninfo import make_conninfo

    if databases is None:
        from django.conf import settings

        databases = settings.DATABASES
    db = databases.get(alias) or {}
    engine = str(db.get("ENGINE", ""))
    if "postgresql" not in engine:
        raise ConfigurationError(
            f"leaderbeat_store_url={DJANGO_STORE!r} needs DATABASES[{alias!r}] on "
            f"PostgreSQL (django.db.backends.postgresql), but its ENGINE is {engine!r}; "
            "set leaderbeat_store_url to a postgresql:// URL or a Redis URL instead")
    parts: dict[str, Any] = {"dbname": db.get("NAME"), "user": db.get("USER"),
                             "password": db.get("PASSWORD"), "host": db.get("HOST"),
                             "port": db.get("PORT")}
    options = {k: v for k, v in (db.get("OPTIONS") or {}).items()
               if k not in _NOT_LIBPQ}
    parts.update(options)
    return make_conninfo("", **{k: str(v) for k, v in parts.items() if v not in (None, "")})


#: Django's OPTIONS that are psycopg's or Django's, not libpq connection parameters
_NOT_LIBPQ = frozenset({"isolation_level", "server_side_binding", "pool", "assume_role",
                        "cursor_factory"})


def _open_postgres(config: Config, *, threads: bool) -> Store:
    try:
        from .postgres import store as postgres
    except ImportError as exc:
        raise ConfigurationError(
            f"leaderbeat_store_url={config.store_url!r} names PostgreSQL, which needs "
            f"psycopg 3 and psycopg_pool ({exc}); pip install 'celery-leaderbeat[postgres]'") from exc
    from .postgres.pool import ERRORS, store_error

    conninfo = postgres_conninfo(config)
    try:
        store = postgres.open_store(conninfo, config, create=False, threads=threads)
    except ERRORS as exc:
        raise store_error(exc) from exc
    try:
        ensure_current(store, config.store_schema)
    except ERRORS as exc:
        store.close()
        raise store_error(exc) from exc
    except BaseException:
        store.close()
        raise
    return store


def ensure_current(store: Any, schema: str) -> list[int]:
    """Apply the migrations ``schema`` lacks (none when it is current: no DDL at all,
    so a role without CREATE runs once a migration role ran ``init-store``). Returns
    the versions applied."""
    import psycopg

    from .postgres.pool import connection
    from .postgres.schema import ensure_schema, latest_version, schema_version

    with connection(store.place.pool) as conn:
        current = schema_version(conn, schema)
        if current == latest_version():  # newer: ensure_schema says so
            return []
        try:
            return ensure_schema(conn, schema)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ConfigurationError(
                f"the PostgreSQL schema {schema!r} is at version {current}, this version "
                f"needs {latest_version()}, and this role may not create or migrate it "
                f"({exc.diag.message_primary}); run `{INIT_STORE}` once as a role that may "
                "(CREATE on the database), then start again") from exc

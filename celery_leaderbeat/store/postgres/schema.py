"""The PostgreSQL store's schema: created and migrated by the store itself, versioned.

Every app shares one schema (``leaderbeat`` unless configured), its rows keyed by an
``app`` column holding the app's key prefix. One schema for every app means one grant
and one migration per database, whatever the number of apps, and a key prefix may hold
characters a schema name cannot (``{leaderbeat:proj}``).

The migrations are the ordered files ``migrations/NNNN_*.sql``; ``schema_version`` has
one row per file applied. :func:`ensure_schema` applies the missing ones in one
transaction, so a site that grants DDL only to a migration role runs it once ahead of
time and the beats then find nothing to do.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from psycopg import sql

from ...config import DEFAULTS
from ...errors import ConfigurationError

#: the schema the tables live in unless ``leaderbeat_store_schema`` names another
DEFAULT_SCHEMA: str = DEFAULTS["store_schema"]


@cache
def migrations() -> tuple[tuple[int, str], ...]:
    """Every migration of the package, ``(version, SQL text)``, oldest first."""
    folder = resources.files(__package__).joinpath("migrations")
    found = []
    for item in folder.iterdir():
        name = item.name
        if name.endswith(".sql") and name[:4].isdigit():
            found.append((int(name[:4]), item.read_text()))
    return tuple(sorted(found))


def latest_version() -> int:
    """The schema version this code reads and writes."""
    return migrations()[-1][0]


@cache
def qualified(text: str, schema: str) -> sql.Composed:
    """``text`` with ``{schema}`` replaced by the quoted schema name (composed once)."""
    return sql.SQL(text).format(schema=sql.Identifier(schema))


def ensure_schema(conn: Any, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Create ``schema`` and apply the migrations it lacks, in one transaction.

    Idempotent; safe when several nodes start at once (a transaction-scoped lock, gone
    at commit, serialises them: it guards the DDL only, never a lease or a claim).
    Returns the versions applied (empty: it was up to date). Raises ConfigurationError
    when the schema is newer than this code knows (a newer version migrated it).
    """
    applied = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"leaderbeat:{schema}",))
        conn.execute(qualified("CREATE SCHEMA IF NOT EXISTS {schema}", schema))
        conn.execute(qualified(
            "CREATE TABLE IF NOT EXISTS {schema}.schema_version ("
            " version integer PRIMARY KEY,"
            " applied_at timestamptz NOT NULL DEFAULT clock_timestamp())", schema))
        current = schema_version(conn, schema)
        if current > latest_version():
            raise ConfigurationError(
                f"PostgreSQL schema {schema!r} is at version {current}, newer than this "
                f"celery-leaderbeat knows ({latest_version()}): upgrade celery-leaderbeat "
                "on this node, or name another schema")
        for version, text in migrations():
            if version > current:
                conn.execute(qualified(text, schema))
                conn.execute(qualified("INSERT INTO {schema}.schema_version (version)"
                                       " VALUES (%s)", schema), (version,))
                applied.append(version)
    return applied


def schema_version(conn: Any, schema: str = DEFAULT_SCHEMA) -> int:
    """The newest migration applied to ``schema`` (0: none, or no schema at all)."""
    exists = conn.execute("SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = %s"
                          " AND tablename = 'schema_version'", (schema,)).fetchone()
    if exists is None:
        return 0
    row = conn.execute(qualified("SELECT max(version) FROM {schema}.schema_version",
                                 schema)).fetchone()
    return int(row[0] or 0)

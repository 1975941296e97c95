"""``celery leaderbeat init-store``: create or migrate the store's schema ahead of time.

Beat creates and migrates the PostgreSQL schema itself when its role may; a site that
grants DDL only to a migration role runs this command as that role instead (in a
deploy step), and beat's role then needs only to read and write the tables.
"""

from __future__ import annotations

import click

from ..config import Config, is_postgres_store
from ..store.open import postgres_conninfo
from .cli_group import command, emit


@command(name="init-store")
def init_store(ctx: click.Context, as_json: bool) -> None:
    """Create or migrate the store's schema (PostgreSQL); a Redis store needs none."""
    config = Config.from_app(ctx.obj.app)
    if not is_postgres_store(config):
        emit(as_json, {"store": "redis", "applied": [], "version": None},
             ["nothing to do: a Redis store has no schema"])
        return
    from ..store.postgres.pool import ERRORS, connection, make_pool, store_error
    from ..store.postgres.schema import DEFAULT_SCHEMA, ensure_schema, schema_version

    try:  # a failure leaves as the store's error, so the command's exit says what it was
        pool = make_pool(postgres_conninfo(config), timeout=config.socket_timeout, max_size=1)
        try:
            with connection(pool) as conn:
                applied = ensure_schema(conn, DEFAULT_SCHEMA)
                version = schema_version(conn, DEFAULT_SCHEMA)
        finally:
            pool.close()
    except ERRORS as exc:
        raise store_error(exc) from exc
    said = (f"schema {DEFAULT_SCHEMA!r}: applied migration(s) "
            f"{', '.join(map(str, applied))}; now at version {version}" if applied else
            f"schema {DEFAULT_SCHEMA!r} is current (version {version}): nothing to do")
    emit(as_json, {"store": "postgresql", "schema": DEFAULT_SCHEMA, "applied": applied,
                   "version": version}, [said])


"""``celery leaderbeat init-store``: create or migrate the store's schema ahead of time.

Beat creates and migrates the PostgreSQL schema itself when its role may; a site that
grants DDL only to a migration role runs this command as that role instead (in a
deploy step), and beat's role then needs only to read and write the tables.
"""

from __future__ import annotations

import click

from ..config import SCHEMA_RULE, Config, is_postgres_store, is_schema_name
from ..store.open import postgres_conninfo
from .cli_group import command, emit


def _schema_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not is_schema_name(value):
        raise click.BadParameter(f"--schema={value!r} {SCHEMA_RULE}", ctx=ctx, param=param)
    return value


@command(click.option("--schema", default=None, callback=_schema_name,
                      help="The schema to create or migrate (default: the setting "
                           "leaderbeat_store_schema, 'leaderbeat' unless set)."),
         name="init-store")
def init_store(ctx: click.Context, schema: str | None, as_json: bool) -> None:
    """Create or migrate the store's schema (PostgreSQL); a Redis store needs none."""
    config = Config.from_app(ctx.obj.app)
    if not is_postgres_store(config):
        emit(as_json, {"store": "redis", "applied": [], "version": None},
             ["nothing to do: a Redis store has no schema"])
        return
    from ..store.postgres.pool import ERRORS, connection, make_pool, store_error
    from ..store.postgres.schema import ensure_schema, schema_version

    schema = schema or config.store_schema
    try:  # a failure leaves as the store's error, so the command's exit says what it was
        pool = make_pool(postgres_conninfo(config), timeout=config.store_timeout, max_size=1)
        try:
            with connection(pool) as conn:
                applied = ensure_schema(conn, schema)
                version = schema_version(conn, schema)
        finally:
            pool.close()
    except ERRORS as exc:
        raise store_error(exc) from exc
    said = (f"schema {schema!r}: applied migration(s) "
            f"{', '.join(map(str, applied))}; now at version {version}" if applied else
            f"schema {schema!r} is current (version {version}): nothing to do")
    emit(as_json, {"store": "postgresql", "schema": schema, "applied": applied,
                   "version": version}, [said])

"""The ``celery leaderbeat`` command group and what its commands share: exit codes, output."""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

import click

from ..errors import LeaderbeatError
from ..store.base import STORE_ERRORS
from .cluster import Cluster, UnknownEntry

NO_LEADER, REDIS_DOWN, BAD_SETTINGS, UNKNOWN_ENTRY, REFUSED = 1, 2, 3, 4, 5

def _fail(code: int, message: str) -> None:
    click.echo(f"leaderbeat: {message}", err=True)
    sys.exit(code)


def _command(func: Any) -> Any:
    """One clear line and a distinct exit code for every expected failure."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except UnknownEntry as exc:
            _fail(UNKNOWN_ENTRY, str(exc.args[0]))
        except LeaderbeatError as exc:
            _fail(BAD_SETTINGS, str(exc))
        except STORE_ERRORS as exc:
            _fail(REDIS_DOWN, f"Redis unreachable or refusing: {exc}")
    return wrapper


def _cluster(ctx: click.Context) -> Cluster:
    return Cluster(ctx.obj.app)


def _emit(as_json: bool, data: Any, lines: list[str]) -> None:
    click.echo(json.dumps(data, indent=2, default=str) if as_json else "\n".join(lines))


def _event_line(row: dict[str, Any]) -> str:
    return " ".join(filter(None, [row["time"], f"{row.get('event', '?'):<9}", row.get("entry"),
                                  row.get("slot"),
                                  f"node={row['node']}" if row.get("node") else None,
                                  f"epoch={row['epoch']}" if row.get("epoch") else None,
                                  f"({row['detail']})" if row.get("detail") else None]))


json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


@click.group(name="leaderbeat")
def leaderbeat() -> None:
    """See and steer celery_leaderbeat: leader, entries, nodes, history, health, actions."""


def command(*params: Any, name: str | None = None) -> Any:
    """A ``celery leaderbeat`` command: ``params`` (click arguments and options, in the
    order shown), then ``--json``; it gets the click context, and every expected failure
    becomes one line and an exit code (:func:`_command`)."""
    def register(func: Any) -> Any:
        func = json_option(click.pass_context(_command(func)))
        for param in reversed(params):
            func = param(func)
        return leaderbeat.command(name=name)(func)
    return register

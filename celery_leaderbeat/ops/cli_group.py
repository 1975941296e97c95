"""The ``celery leaderbeat`` command group and what its commands share: exit codes
(:data:`EXIT_CODES`, sysexits(3) as Celery's own commands use), errors, output.

An error is one line on stderr (``leaderbeat: ...``); under ``--json`` it is one JSON
object on stdout instead, ``{"error": {"code", "kind", "message"}}``, with the same
exit code. Never a traceback for an expected failure.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import IO, Any, ClassVar

import click

from .._version import __version__
from ..errors import (
    BackfillRefused,
    ConfigurationError,
    EntryExists,
    EntryNotFound,
    LeaderbeatError,
    StoreAuthError,
    did_you_mean,
)
from ..store.base import STORE_ERRORS, STORE_REFUSED
from ..store.failures import PG_ERRORS
from ..timing.iso import from_iso
from .cluster import Cluster

OK = 0
UNHEALTHY = 1
USAGE = 64  # EX_USAGE
DATA = 65  # EX_DATAERR
UNAVAILABLE = 69  # EX_UNAVAILABLE
SOFTWARE = 70  # EX_SOFTWARE
CONFIG = 78  # EX_CONFIG

#: what each exit code means (shown by ``celery leaderbeat --help``)
EXIT_CODES = """Exit codes (sysexits):

\b
  0   done; healthy
  1   a health check failed: no leader holds the lease (health, step-down),
      or this host's beat is not healthy (health --node)
  64  usage: an unknown command or option, a bad option value, options that
      contradict each other, a confirmation (--yes) missing or declined
  65  data: no entry of that name, an entry that exists, an entry definition
      that breaks a rule, a backfill whose slots cannot be told or are too many
  69  unavailable: the store (Redis, PostgreSQL) cannot be reached or does not
      answer in time
  70  software: the store answered something this version does not understand
  78  configuration: a leaderbeat_* setting is invalid, the store refused the
      credentials, or its schema is missing and this role may not create it

Under --json an error is {"error": {"code", "kind", "message"}} on stdout."""

#: what ``--json`` calls each code
KINDS = {UNHEALTHY: "unhealthy", USAGE: "usage", DATA: "data", UNAVAILABLE: "unavailable",
         SOFTWARE: "software", CONFIG: "configuration"}

#: the group remembers whether ``--json`` was given, for an error before a command parses
_JSON = "celery_leaderbeat.json"

EXIT_CODES_SHORT = ("Exit codes: 0 ok, 1 unhealthy, 64 usage, 65 data (entry), 69 Redis "
                    "unavailable, 70 software, 78 configuration (celery leaderbeat --help).")


class CommandError(click.ClickException):
    """One expected failure: its message, its exit code (as Celery's
    ``CeleryCommandException`` carries one), and how to show it."""

    exit_code: ClassVar[int] = SOFTWARE

    def __init__(self, message: str, *, as_json: bool = False) -> None:
        super().__init__(message)
        self.as_json = as_json
        # shown after the command's context is gone: its --no-color is read now
        self.no_color = _no_color()

    def show(self, file: IO[Any] | None = None) -> None:
        if self.as_json:
            click.echo(json.dumps({"error": {"code": self.exit_code,
                                             "kind": KINDS[self.exit_code],
                                             "message": self.message}}))
        else:
            prefix = "leaderbeat:"
            if not self.no_color:
                prefix = click.style(prefix, fg="red", bold=True)
            click.echo(f"{prefix} {self.message}", err=True,
                       color=False if self.no_color else None)


class Unhealthy(CommandError):
    """A health check failed (1)."""

    exit_code = UNHEALTHY


class UsageFailure(CommandError):
    """The command was used wrongly (64)."""

    exit_code = USAGE


class DataFailure(CommandError):
    """The entry or slots named are not what the command needs (65)."""

    exit_code = DATA


class Unavailable(CommandError):
    """The store cannot be reached (69)."""

    exit_code = UNAVAILABLE


class ConfigFailure(CommandError):
    """A setting is invalid, or the store refused the credentials (78)."""

    exit_code = CONFIG


class ClickUsage(UsageFailure):
    """One of click's own usage errors, shown as click shows it, exiting 64."""

    def __init__(self, error: click.UsageError) -> None:
        super().__init__(error.format_message())
        self.error = error

    def show(self, file: IO[Any] | None = None) -> None:
        if self.as_json:
            super().show(file)
        else:
            self.error.show(file)


_BY_CODE: dict[int, type[CommandError]] = {
    cls.exit_code: cls for cls in (Unhealthy, UsageFailure, DataFailure, Unavailable,
                                   CommandError, ConfigFailure)}


def fail(code: int, message: str) -> CommandError:
    """The error to raise for an expected failure (``raise fail(DATA, "...")``)."""
    return _BY_CODE[code](message)


def _translate(exc: Exception) -> CommandError | None:
    """The :class:`CommandError` of an expected failure; None for anything else."""
    if isinstance(exc, click.UsageError):
        return ClickUsage(exc)
    if isinstance(exc, (EntryNotFound, EntryExists, BackfillRefused)):
        return DataFailure(str(exc))
    if isinstance(exc, (StoreAuthError, *STORE_REFUSED)):
        return ConfigFailure(f"{_server(exc)} refused: {exc}")
    if isinstance(exc, ConfigurationError):
        return ConfigFailure(str(exc))
    if isinstance(exc, STORE_ERRORS):
        return Unavailable(f"{_server(exc)} unreachable: {exc}")
    if isinstance(exc, LeaderbeatError):
        return CommandError(f"{type(exc).__name__}: {exc}")
    return None


def _server(exc: Exception) -> str:
    """Which store's server an error came from, for the message."""
    return "PostgreSQL" if isinstance(exc.__cause__ or exc, PG_ERRORS) else "Redis"


@contextlib.contextmanager
def _translated(as_json: bool) -> Iterator[None]:
    """Every expected failure inside becomes a :class:`CommandError` (click's usage
    errors too: they keep their text, but exit 64, not click's 2)."""
    try:
        yield
    except CommandError as exc:
        exc.as_json = exc.as_json or as_json
        raise
    except Exception as exc:  # translated, or re-raised as it is
        known = _translate(exc)
        if known is None:
            raise
        known.as_json = as_json
        raise known from exc


class LeaderbeatCommand(click.Command):
    """A command whose parsing and running go through :func:`_translated`."""

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        with _translated("--json" in args):
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with _translated(bool(ctx.params.get("as_json"))):
            return super().invoke(ctx)


class LeaderbeatGroup(click.Group):
    """The group: "did you mean" for a mistyped command, exit codes as its commands."""

    command_class = LeaderbeatCommand

    def resolve_command(self, ctx: click.Context, args: list[str]
                        ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            hint = did_you_mean(args[0], self.list_commands(ctx)) if args else ""
            if not hint:
                raise
            raise click.UsageError(f"{exc.format_message()}\nDid you mean {hint}?",
                                   ctx) from exc

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        with _translated("--json" in args):
            ctx = super().make_context(info_name, args, parent, **extra)
        ctx.meta[_JSON] = "--json" in args
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        with _translated(bool(ctx.meta.get(_JSON))):
            return super().invoke(ctx)


def _no_color() -> bool:
    """Celery's ``--no-color`` (``NO_COLOR``), from the context the command runs in."""
    ctx = click.get_current_context(silent=True)
    return bool(getattr(ctx.obj if ctx else None, "no_color", False)
                or os.environ.get("NO_COLOR"))


def _style(text: str, **styles: Any) -> str:
    return text if _no_color() else click.style(text, **styles)


def echo(text: str = "", *, err: bool = False) -> None:
    """Print a line; colours only to a terminal, and never under ``--no-color``."""
    click.echo(text, err=err, color=False if _no_color() else None)


def cluster_of(ctx: click.Context) -> Cluster:
    return Cluster(ctx.obj.app)


def emit(as_json: bool, data: Any, lines: Sequence[str]) -> None:
    echo(json.dumps(data, indent=2, default=str) if as_json else "\n".join(lines))


def moment_text(value: str | datetime | None) -> str:
    """A time for people: ISO 8601 to the second (JSON keeps the stored precision)."""
    if value is None:
        return "-"
    moment = from_iso(value) if isinstance(value, str) else value
    return moment.replace(microsecond=0).isoformat()


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Rows under bold headers, each column as wide as its widest cell (the last one not
    padded); '-' for an empty cell."""
    cells = [[("-" if cell is None or cell == "" else str(cell)) for cell in row]
             for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1]

    header = line(list(headers)).rstrip()
    return [_style(header, bold=True)] + [line(row).rstrip() for row in cells]


def event_line(row: dict[str, Any]) -> str:
    return " ".join(filter(None, [moment_text(row["time"]), f"{row.get('event', '?'):<9}",
                                  row.get("entry"),
                                  moment_text(row["slot"]) if row.get("slot") else None,
                                  f"node={row['node']}" if row.get("node") else None,
                                  f"epoch={row['epoch']}" if row.get("epoch") else None,
                                  f"({row['detail']})" if row.get("detail") else None]))


json_option = click.option("--json", "as_json", is_flag=True,
                           help="Machine-readable output; errors too, as JSON on stdout.")


@click.group(name="leaderbeat", cls=LeaderbeatGroup,
             epilog=EXIT_CODES)
@click.version_option(__version__, "--version", prog_name="celery-leaderbeat",
                      message="%(prog)s %(version)s")
def leaderbeat() -> None:
    """See and steer celery_leaderbeat: leader, entries, nodes, history, health, actions."""


def command(*params: Callable[[Any], Any], name: str | None = None
            ) -> Callable[[Callable[..., Any]], click.Command]:
    """A ``celery leaderbeat`` command: ``params`` (click arguments and options, in the
    order shown), then ``--json``; it gets the click context as its first argument."""
    def register(func: Callable[..., Any]) -> click.Command:
        wrapped: Any = json_option(click.pass_context(func))
        for param in reversed(params):
            wrapped = param(wrapped)
        return leaderbeat.command(name=name, epilog=EXIT_CODES_SHORT)(wrapped)
    return register

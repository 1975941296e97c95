"""``celery -A proj leaderbeat`` commands for entries defined at run time.

    entries [--json]                   the runtime entries (status shows every entry)
    add NAME TASK [SCHEDULE] [options] create one (SCHEDULE: seconds or a cron string;
                                       --at TIME instead makes a one-off entry)
    edit NAME [options]                change the options given, keep the rest
    remove NAME / enable NAME / disable NAME
    import-redbeat [--prefix redbeat:] [--url URL] [--yes]

Same exit codes as the other commands (:mod:`.cli_group`): 65 for a definition that
breaks a rule, a name that is not a runtime entry, or one that exists (add); 64 for
options that contradict each other or change nothing. Without --yes the import only
prints.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import click

from ..config import OVERLAP_ALIASES, OVERLAP_POLICIES, Config, overlap_policy
from ..entries import split_entries
from ..errors import ConfigurationError, EntryExists, EntryNotFound
from ..store.dynamic import Entry, encode_schedule
from ..store.redbeat import read_redbeat
from ..timing.policy import CATCHUP_MODES
from .cli_group import DATA, command, emit, fail, moment_text, table
from .cli_types import Json, Moment, Schedule, Zone
from .cluster import Cluster

#: how the messages name an entry defined at run time
RUNTIME = "runtime entry"


@contextlib.contextmanager
def _definition() -> Iterator[None]:
    """A definition that breaks a rule is bad data (65), not a bad setting (78)."""
    try:
        yield
    except ConfigurationError as exc:
        raise fail(DATA, str(exc)) from exc


def _check(app: Any, entry: Entry) -> Config:
    """The app's settings (a bad one: 78), then start-up's checks of ``entry`` with its
    problems naming it as a runtime entry (65); the store checks it again."""
    config = Config.from_app(app)
    with _definition():
        split_entries({entry.name: entry.raw()}, config, kind=RUNTIME)
    return config


def _describe(entry: Entry) -> str:
    data = encode_schedule(entry.name, entry.schedule, entry.at)
    if "every" in data:
        return f"every {data['every']:g}s" + (" (relative)" if data.get("relative") else "")
    if "at" in data:
        return f"once at {moment_text(entry.at)}"
    if "cron" in data:
        return f"cron '{data['cron']}'" + (f" {data['tz']}" if data.get("tz") else "")
    if "crontab" in data:
        return "crontab '" + " ".join(data["crontab"]) + "'"
    return f"solar {data['solar']}"


def _row(entry: Entry) -> dict[str, Any]:
    return {"entry": entry.name, "task": entry.task, "schedule": _describe(entry),
            "enabled": entry.enabled, "args": list(entry.args), "kwargs": entry.kwargs,
            "options": entry.options, "leaderbeat": entry.leaderbeat, "version": entry.version,
            "anchor": entry.anchor.isoformat() if entry.anchor else None,
            "ran_at": entry.ran_at.isoformat() if entry.ran_at else None}


def _cells(entry: Entry) -> list[str]:
    state = "enabled" if entry.enabled else (f"ran {moment_text(entry.ran_at)}" if entry.ran_at
                                             else "disabled")
    extra = " ".join(f"{k}={v}" for k, v in sorted({**entry.options, **entry.leaderbeat}.items()))
    return [entry.name, entry.task, _describe(entry), state, f"v{entry.version}", extra]


def _line(entry: Entry) -> str:
    return " ".join(cell for cell in _cells(entry) if cell)


HEADERS = ["entry", "task", "schedule", "state", "version", "options"]

#: the overlap policies and their aliases (Kubernetes' Forbid, Replace, Allow)
OVERLAP_CHOICES = (*OVERLAP_POLICIES, *OVERLAP_ALIASES)

#: the options ``add`` and ``edit`` share, by parameter name
EDIT_OPTIONS = ("args", "kwargs", "queue", "tz", "catchup", "overlap", "at")


def _edit_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed([
        click.option("--args", type=Json(list), help="Positional arguments, a JSON list."),
        click.option("--kwargs", type=Json(dict), help="Keyword arguments, a JSON object."),
        click.option("--queue", help="The queue to send to (options.queue)."),
        click.option("--tz", type=Zone(), help="IANA zone the schedule is read in."),
        click.option("--catchup", type=click.Choice(CATCHUP_MODES),
                     help="What to send of slots nobody could send."),
        click.option("--overlap", type=click.Choice(OVERLAP_CHOICES, case_sensitive=False),
                     help="What the worker guard does with a slot due while the previous "
                          "run still runs."),
        click.option("--at", type=Moment(offset=True),
                     help="A one-off run at this ISO 8601 time (Z or an offset)."),
    ]):
        func = option(func)
    return func


def _apply(entry: Entry, *, args: list[Any] | None, kwargs: dict[str, Any] | None,
           queue: str | None, tz: str | None, catchup: str | None, overlap: str | None,
           at: datetime | None) -> None:
    if args is not None:
        entry.args = args
    if kwargs is not None:
        entry.kwargs = kwargs
    if queue is not None:
        entry.options = {**entry.options, "queue": queue}
    for key, value in (("tz", tz), ("catchup", catchup), ("overlap", overlap_policy(overlap))):
        if value is not None:
            entry.leaderbeat[key] = value
    if at is not None:
        entry.at, entry.schedule = at, None


#: where an entry of each other kind is changed
CHANGED_IN = {"beat_schedule entry": "the app's configuration",
              "django-celery-beat entry": "the Django admin (or its PeriodicTask rows)"}


def _not_runtime(app: Any, name: str) -> EntryNotFound:
    """No runtime entry ``name``: said with the nearest runtime names, or what ``name``
    is when another kind of entry has it."""
    kind = Cluster(app).kind_of(name)
    if kind in CHANGED_IN:
        return EntryNotFound(name, f"among the runtime entries: it is a {kind} (change it "
                                   f"in {CHANGED_IN[kind]})")
    return EntryNotFound(name, "among the runtime entries (see: leaderbeat entries)",
                         [e.name for e in Entry.all(app)])


def _get(app: Any, name: str) -> Entry:
    entry = Entry.get(app, name)
    if entry is None:
        raise _not_runtime(app, name)
    return entry


@command()
def entries(ctx: click.Context, as_json: bool) -> None:
    """The entries defined at run time (API or CLI), by name."""
    found = Entry.all(ctx.obj.app)
    emit(as_json, [_row(e) for e in found], table(HEADERS, [_cells(e) for e in found]))


@command(
    click.argument("name"),
    click.argument("task"),
    click.argument("schedule", type=Schedule(), required=False),
    _edit_options,
)
def add(ctx: click.Context, name: str, task: str, schedule: float | str | None,
        as_json: bool, **options: Any) -> None:
    """Create entry NAME: TASK every SCHEDULE seconds, on a cron string, or once --at."""
    if (schedule is None) == (options["at"] is None):
        raise click.UsageError("give a SCHEDULE or --at, one of them")
    entry = Entry(name, task, schedule)
    _apply(entry, **options)
    _check(ctx.obj.app, entry)
    try:
        with _definition():
            entry.store(ctx.obj.app, how="create")
    except EntryExists:
        raise fail(DATA, f"{RUNTIME} {name!r} exists: change it with edit") from None
    emit(as_json, _row(entry), [f"added {_line(entry)}"])


@command(
    click.argument("name"),
    click.option("--schedule", type=Schedule(), help="Seconds or a cron string."),
    click.option("--task", help="The task name."),
    _edit_options,
)
def edit(ctx: click.Context, name: str, schedule: float | str | None, task: str | None,
         as_json: bool, **options: Any) -> None:
    """Change entry NAME: only the options given; a changed timing counts from now."""
    if schedule is None and task is None and all(v is None for v in options.values()):
        raise click.UsageError("nothing to change: give at least one of --schedule, --task, "
                               + ", ".join(f"--{o}" for o in EDIT_OPTIONS))
    if schedule is not None and options["at"] is not None:
        raise click.UsageError("give --schedule or --at, not both")
    app = ctx.obj.app
    entry = _get(app, name)
    if schedule is not None:
        entry.schedule, entry.at = schedule, None
    if task is not None:
        entry.task = task
    _apply(entry, **options)
    _save(app, entry, as_json, "changed")


def _save(app: Any, entry: Entry, as_json: bool, verb: str) -> None:
    _check(app, entry)
    try:
        with _definition():
            changed = entry.store(app, how="update")
    except EntryNotFound:
        raise fail(DATA, f"no {RUNTIME} {entry.name!r} (removed meanwhile)") from None
    emit(as_json, {**_row(entry), "changed": changed},
         [f"{verb} {_line(entry)}" if changed else f"unchanged {_line(entry)}"])


@command(click.argument("name"))
def remove(ctx: click.Context, name: str, as_json: bool) -> None:
    """Delete entry NAME; no beat sends it once the leader has seen the removal."""
    if not Entry(name, "").delete(ctx.obj.app):
        raise _not_runtime(ctx.obj.app, name)
    emit(as_json, {"removed": name}, [f"removed {name}"])
@command(click.argument("name"))
def enable(ctx: click.Context, name: str, as_json: bool) -> None:
    """Enable entry NAME: it runs from its next slot (no catch-up for the time it was off)."""
    _switch(ctx, name, as_json, enabled=True)


@command(click.argument("name"))
def disable(ctx: click.Context, name: str, as_json: bool) -> None:
    """Disable entry NAME: kept, sends nothing until enabled."""
    _switch(ctx, name, as_json, enabled=False)


def _switch(ctx: click.Context, name: str, as_json: bool, *, enabled: bool) -> None:
    entry = _get(ctx.obj.app, name)
    entry.enabled = enabled
    _save(ctx.obj.app, entry, as_json, "enabled" if enabled else "disabled")


@command(
    click.option("--prefix", default=None, help="RedBeat's key prefix [redbeat_key_prefix, "
                                                 "else 'redbeat:']."),
    click.option("--url", default=None, help="RedBeat's Redis [redbeat_redis_url, else the broker]."),
    click.option("--yes", is_flag=True, help="Create the entries (without it: only say what)."),
    name="import-redbeat",
)
def import_redbeat(ctx: click.Context, prefix: str | None, url: str | None, yes: bool,
                   as_json: bool) -> None:
    """Create a dynamic entry for every RedBeat entry, each keeping RedBeat's phase."""
    from . import redbeat_import

    app = ctx.obj.app
    prefix = prefix or app.conf.get("redbeat_key_prefix") or "redbeat:"
    url = url or app.conf.get("redbeat_redis_url") or app.conf.broker_url
    planned = redbeat_import.plan(app, read_redbeat(url, prefix), prefix)
    lines = [redbeat_import.describe(p) for p in planned]
    rows = [{"entry": p.name, "import": p.entry is not None, "skip": p.skip,
             "last_run_at": p.last_run_at.isoformat() if p.last_run_at else None}
            for p in planned]
    if not yes:
        emit(as_json, {"would": rows, "done": False},
             lines + [(f"{sum(p.entry is not None for p in planned)} of {len(planned)} entries "
                       "would be imported; run again with --yes (stop RedBeat first)")])
        return
    done, there, skipped = redbeat_import.apply(app, planned)
    emit(as_json, {"imported": done, "already": there, "skipped": skipped, "entries": rows},
         lines + [(f"imported {done}, {there} already there (left as they are), "
                   f"{skipped} skipped")])

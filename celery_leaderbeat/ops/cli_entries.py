"""``celery -A proj leaderbeat`` commands for entries defined at run time.

    entries [--json]                   the dynamic entries (status shows every entry)
    add NAME TASK [SCHEDULE] [options] create one (SCHEDULE: seconds or a cron string;
                                       --at TIME instead makes a one-off entry)
    edit NAME [options]                change the options given, keep the rest
    remove NAME / enable NAME / disable NAME
    import-redbeat [--prefix redbeat:] [--url URL] [--yes]

Same exit codes as the other commands: 3 a bad definition, 4 unknown entry,
5 refused (add of a name that exists). Without --yes the import only prints.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click

from ..store.dynamic import Entry, encode_schedule
from ..store.entry_store import EntryExists, EntryUnknown
from ..store.redbeat import read_redbeat
from ..timing.iso import from_iso
from .cli_group import (
    REFUSED,
    UNKNOWN_ENTRY,
    _emit,
    _fail,
    command,
)


def _schedule(value: str) -> Any:
    try:
        return float(value)
    except ValueError:
        return value  # a cron string, checked as beat_schedule checks one


def _json(option: str, value: str | None, kind: type) -> Any:
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"{option} {value!r} is not JSON ({exc})") from None
    if not isinstance(parsed, kind):
        raise click.BadParameter(f"{option} {value!r} must be a JSON {kind.__name__}")
    return parsed


def _at(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        moment = from_iso(value)
    except ValueError:
        raise click.BadParameter(f"--at {value!r} is not an ISO date-time") from None
    if moment.tzinfo is None:
        raise click.BadParameter(f"--at {value!r} needs a UTC offset (like 2027-01-05T09:00+01:00)")
    return moment


def _describe(entry: Entry) -> str:
    data = encode_schedule(entry.name, entry.schedule, entry.at)
    if "every" in data:
        return f"every {data['every']:g}s" + (" (relative)" if data.get("relative") else "")
    if "at" in data:
        return f"once at {entry.at.isoformat() if entry.at else '?'}"
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


def _line(entry: Entry) -> str:
    state = "enabled" if entry.enabled else ("ran " + entry.ran_at.isoformat() if entry.ran_at
                                             else "disabled")
    extra = " ".join(f"{k}={v}" for k, v in sorted({**entry.options, **entry.leaderbeat}.items()))
    return (f"{entry.name:<24} {entry.task:<28} {_describe(entry):<30} {state:<10} "
            f"v{entry.version} {extra}").rstrip()


def _edit_options(func: Any) -> Any:
    for option in reversed([
        click.option("--args", "args_json", help="Positional arguments, a JSON list."),
        click.option("--kwargs", "kwargs_json", help="Keyword arguments, a JSON object."),
        click.option("--queue", help="The queue to send to (options.queue)."),
        click.option("--tz", help="IANA zone the schedule is read in."),
        click.option("--catchup", help="Catch-up policy: skip, latest or all."),
        click.option("--at", "at_text", help="A one-off run at this ISO time (with offset)."),
    ]):
        func = option(func)
    return func


def _apply(entry: Entry, *, args_json: str | None, kwargs_json: str | None, queue: str | None,
           tz: str | None, catchup: str | None, at_text: str | None) -> None:
    if args_json is not None:
        entry.args = _json("--args", args_json, list)
    if kwargs_json is not None:
        entry.kwargs = _json("--kwargs", kwargs_json, dict)
    if queue is not None:
        entry.options = {**entry.options, "queue": queue}
    for key, value in (("tz", tz), ("catchup", catchup)):
        if value is not None:
            entry.leaderbeat[key] = value
    if at_text is not None:
        entry.at, entry.schedule = _at(at_text), None


def _get(app: Any, name: str) -> Entry:
    entry = Entry.get(app, name)
    if entry is None:
        _fail(UNKNOWN_ENTRY, f"no dynamic entry {name!r} (see: leaderbeat entries)")
    assert entry is not None
    return entry


@command()
def entries(ctx: click.Context, as_json: bool) -> None:
    """The entries defined at run time (API or CLI), by name."""
    found = Entry.all(ctx.obj.app)
    lines = [f"{'entry':<24} {'task':<28} {'schedule':<30} {'state':<10} version options"]
    _emit(as_json, [_row(e) for e in found], lines + [_line(e) for e in found])


@command(
    click.argument("name"),
    click.argument("task"),
    click.argument("schedule", required=False),
    _edit_options,
)
def add(ctx: click.Context, name: str, task: str, schedule: str | None, as_json: bool,
        **options: Any) -> None:
    """Create entry NAME: TASK every SCHEDULE seconds, on a cron string, or once --at."""
    if (schedule is None) == (options["at_text"] is None):
        raise click.UsageError("give a SCHEDULE or --at, one of them")
    entry = Entry(name, task, None if schedule is None else _schedule(schedule))
    _apply(entry, **options)
    try:
        entry.store(ctx.obj.app, how="create")
    except EntryExists:
        _fail(REFUSED, f"entry {name!r} exists: change it with edit")
    _emit(as_json, _row(entry), [f"added {_line(entry)}"])


@command(
    click.argument("name"),
    click.option("--schedule", help="Seconds or a cron string."),
    click.option("--task", help="The task name."),
    _edit_options,
)
def edit(ctx: click.Context, name: str, schedule: str | None, task: str | None, as_json: bool,
         **options: Any) -> None:
    """Change entry NAME: only the options given; a changed timing counts from now."""
    app = ctx.obj.app
    entry = _get(app, name)
    if schedule is not None:
        entry.schedule, entry.at = _schedule(schedule), None
    if task is not None:
        entry.task = task
    _apply(entry, **options)
    _save(app, entry, as_json, "changed")


def _save(app: Any, entry: Entry, as_json: bool, verb: str) -> None:
    try:
        changed = entry.store(app, how="update")
    except EntryUnknown:
        _fail(UNKNOWN_ENTRY, f"no dynamic entry {entry.name!r} (removed meanwhile)")
    _emit(as_json, {**_row(entry), "changed": changed},
          [f"{verb} {_line(entry)}" if changed else f"unchanged {_line(entry)}"])


@command(click.argument("name"))
def remove(ctx: click.Context, name: str, as_json: bool) -> None:
    """Delete entry NAME; no beat sends it once the leader has seen the removal."""
    if not Entry(name, "").delete(ctx.obj.app):
        _fail(UNKNOWN_ENTRY, f"no dynamic entry {name!r} (see: leaderbeat entries)")
    _emit(as_json, {"removed": name}, [f"removed {name}"])


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
        _emit(as_json, {"would": rows, "done": False},
              lines + [(f"{sum(p.entry is not None for p in planned)} of {len(planned)} entries "
                       "would be imported; run again with --yes (stop RedBeat first)")])
        return
    done, there, skipped = redbeat_import.apply(app, planned)
    _emit(as_json, {"imported": done, "already": there, "skipped": skipped, "entries": rows},
          lines + [(f"imported {done}, {there} already there (left as they are), "
                   f"{skipped} skipped")])

"""``celery -A proj leaderbeat ...``: what the cluster of beats is doing, read from Redis.

    celery -A proj leaderbeat status    # the leader, its epoch and lease; every entry's last slot
    celery -A proj leaderbeat nodes     # every beat process: role, last seen, clock skew
    celery -A proj leaderbeat history   # elected / released / sent / missed / unsent events
    celery -A proj leaderbeat health    # exit 0 when a leader holds a live lease, else 1

Plain text for people, ``--json`` for scripts. Read-only: nothing here changes
the schedule or the lease.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from typing import Any

import click
import redis

from . import guard as _guard  # noqa: F401 - connects the worker guard to worker_init
from .config import Config
from .connection import describe, make_client
from .entries import EntryOptions, split_entries
from .errors import LeaderbeatError
from .keys import Keys
from .ledger import STATE_NAMES, Ledger
from .scripts import Scripts, text
from .slots import clock_for, from_ms, slot_id


class _View:
    """Read access to one app's leaderbeat state."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.config = Config.from_app(app)
        self.keys = Keys(self.config.key_prefix)
        self.client = make_client(self.config.redis_url, self.config.redis_options,
                                  self.config.socket_timeout)
        self.ledger = Ledger(self.client, Scripts(self.client), self.keys, self.config)

    def leader(self) -> dict[str, Any] | None:
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.leader)
        pipe.pttl(self.keys.leader)
        token, pttl = pipe.execute()
        if not token:
            return None
        node, epoch = text(token).rsplit("|", 1)
        return {"node": node, "epoch": int(epoch), "lease_ms_left": int(pttl)}

    def entries(self) -> list[dict[str, Any]]:
        """Every entry of ``beat_schedule`` (and any left in Redis) with its last and next slot."""
        schedule, options = split_entries(self.app.conf.beat_schedule or {}, self.config)
        stored = self.ledger.load()
        rows = []
        for name in sorted(set(schedule) | set(stored)):
            state = stored.get(name)
            row: dict[str, Any] = {"entry": name, "configured": name in schedule,
                                   "last_slot": None, "state": None, "epoch": None,
                                   "task_id": None, "next_due": None}
            if state is not None:
                last = from_ms(state.slot_ms)
                row.update(last_slot=last.isoformat(), state=STATE_NAMES.get(state.state),
                           epoch=state.epoch,
                           task_id=slot_id(self.config.key_prefix, name, last)
                           if state.state not in ("a", "k") else None)
            if name in schedule:
                opts = options.get(name) or EntryOptions.defaults(self.config)
                clock = clock_for(schedule[name]["schedule"], name=name,
                                  tz=opts.tz or self.app.timezone, jitter=opts.jitter)
                after = from_ms(state.slot_ms) if state else datetime.now(timezone.utc)
                row["next_due"] = clock.fire_time(clock.next_after(after)).isoformat()
            rows.append(row)
        return rows

    def nodes(self) -> list[dict[str, Any]]:
        now = time.time()
        rows = []
        for node_id, info in sorted(self.ledger.nodes().items()):
            seen = info.get("last_seen")
            rows.append(dict(info, node=node_id,
                             seen_ago=None if seen is None else round(now - seen, 1)))
        return rows

    def history(self, count: int) -> list[dict[str, Any]]:
        rows = []
        for row in self.ledger.history(count):
            when = datetime.fromtimestamp(int(row["id"].split("-")[0]) / 1000, timezone.utc)
            row = dict(row, time=when.isoformat(timespec="milliseconds"))
            if row.get("slot"):
                row["slot"] = from_ms(int(row["slot"])).isoformat()
            rows.append(row)
        return rows


def _view(ctx: click.Context) -> _View:
    try:
        return _View(ctx.obj.app)
    except LeaderbeatError as exc:
        raise click.ClickException(str(exc)) from exc


def _emit(as_json: bool, data: Any, lines: list[str]) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        click.echo("\n".join(lines))


def _redis_errors(func: Any) -> Any:
    """Turn Redis trouble into one clear line and exit status 2 (1 means 'no leader')."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (redis.RedisError, OSError) as exc:
            click.echo(f"leaderbeat: Redis unreachable or refusing: {exc}", err=True)
            sys.exit(2)
    wrapper.__name__ = func.__name__
    wrapper.__doc__ = func.__doc__
    return wrapper


@click.group(name="leaderbeat")
def leaderbeat() -> None:
    """Inspect celery_leaderbeat: leader, entries, nodes, history, health."""


@leaderbeat.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@_redis_errors
def status(ctx: click.Context, as_json: bool) -> None:
    """The leader and every entry's last and next slot."""
    view = _view(ctx)
    leader, entries = view.leader(), view.entries()
    lines = [f"redis   {describe(view.config.redis_url)}  prefix {view.config.key_prefix}",
             "leader  " + (f"{leader['node']} (epoch {leader['epoch']}, lease "
                           f"{leader['lease_ms_left'] / 1000:.1f} s left)" if leader
                           else "none")]
    lines.append(f"{'entry':<28} {'last slot':<33} {'state':<18} next due")
    for row in entries:
        name = row["entry"] + ("" if row["configured"] else " (not configured)")
        lines.append(f"{name:<28} {row['last_slot'] or '-':<33} {row['state'] or '-':<18} "
                     f"{row['next_due'] or '-'}")
    _emit(as_json, {"leader": leader, "entries": entries}, lines)


@leaderbeat.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@_redis_errors
def nodes(ctx: click.Context, as_json: bool) -> None:
    """Every beat process that registered: role, host, pid, last seen, clock skew."""
    rows = _view(ctx).nodes()
    lines = [f"{'node':<36} {'role':<8} {'seen':>8} {'skew':>9} version"]
    for row in rows:
        skew = row.get("clock_skew")
        lines.append(f"{row['node']:<36} {row.get('role', '?'):<8} "
                     f"{row['seen_ago'] if row['seen_ago'] is not None else '-':>7}s "
                     f"{'-' if skew is None else f'{skew:+.3f}s':>9} {row.get('version', '?')}")
    _emit(as_json, rows, lines)


@leaderbeat.command()
@click.option("-n", "--count", default=50, show_default=True, help="How many events.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@_redis_errors
def history(ctx: click.Context, count: int, as_json: bool) -> None:
    """The newest history events, oldest first."""
    rows = _view(ctx).history(count)
    lines = [" ".join(filter(None, [row["time"], f"{row.get('event', '?'):<9}",
                                   row.get("entry"), row.get("slot"),
                                   f"node={row['node']}" if row.get("node") else None,
                                   f"epoch={row['epoch']}" if row.get("epoch") else None,
                                   f"({row['detail']})" if row.get("detail") else None]))
             for row in rows]
    _emit(as_json, rows, lines)


@leaderbeat.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
@_redis_errors
def health(ctx: click.Context, as_json: bool) -> None:
    """Exit 0 when a leader holds a live lease; 1 when none does; 2 when Redis is unreachable.

    The lease expires unless its holder renews it, so a leader key that
    exists is a leader that answered within the last lease ttl.
    """
    leader = _view(ctx).leader()
    _emit(as_json, {"healthy": leader is not None, "leader": leader},
          [f"OK: {leader['node']} leads (epoch {leader['epoch']})" if leader
           else "NO LEADER: no beat holds the lease"])
    sys.exit(0 if leader else 1)

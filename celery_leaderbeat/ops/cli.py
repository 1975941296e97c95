"""``celery -A proj leaderbeat ...``: see what the beats do, and act on them.

    status                  the leader, its epoch and lease; every entry's last slot and run
    nodes                   every beat process: role (gone ones marked), last seen, clock skew
    history [--entry N] [--follow]   elected / released / sent / missed / skipped / unsent ...
    health [--node]         exit 0 when a leader holds a live lease (--node: this host's beat
                            leads or is a healthy standby)
    step-down [--this-node] the leader releases its lease; a standby leads at once
    pause NAME [--note T]   slots of NAME are skipped (recorded 'paused') until resume NAME
    trigger NAME            the leader sends NAME once now, under a task id of its own
    backfill NAME --from ISO --to ISO   send the slots in that range that were never sent
    reset --yes             delete this app's leaderbeat state in Redis (not its entries)
    entries, add, edit, remove, enable, disable, import-redbeat
                            entries defined at run time (see cli_entries)

Every command takes ``--json``. Errors are one line on stderr and an exit code:
1 unhealthy / no leader, 2 Redis unreachable, 3 bad settings or URL, 4 unknown
entry, 5 refused (a confirmation is missing), never a traceback.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone

import click

from ..integrations.guard import offer_step
from ..store.connection import describe
from ..timing.iso import from_iso
from .cli_group import (
    NO_LEADER,
    REFUSED,
    _cluster,
    _emit,
    _event_line,
    _fail,
    command,
    leaderbeat,
)

__all__ = ["leaderbeat"]  # the `celery.commands` entry point

# Loaded by every `celery` command as its plugin: the apps it finalizes get the worker
# guard's bootstep, which switches itself on only in a worker with leaderbeat_guard = True.
offer_step()

#: backfill sends at most this many slots unless --max says otherwise
BACKFILL_MAX = 100


@command()
def status(ctx: click.Context, as_json: bool) -> None:
    """The leader and every entry's last slot, its run, and its next slot."""
    cluster = _cluster(ctx)
    leader, entries = cluster.leader(), cluster.entries()
    lines = [f"redis   {describe(cluster.config.redis_url)}  prefix {cluster.config.key_prefix}",
             "leader  " + (f"{leader['node']} (epoch {leader['epoch']}, lease "
                           f"{leader['lease_ms_left'] / 1000:.1f} s left)" if leader else "none")]
    lines.append(f"{'entry':<24} {'source':<9} {'last slot':<33} {'state':<18} "
                 f"{'next due':<33} run / paused")
    for row in entries:
        name = row["entry"] + ("" if row["configured"] else " (not configured)")
        extra = row["run"] or ""
        if row["paused"]:
            extra = f"PAUSED ({row['paused'].get('note') or 'no note'}) {extra}".strip()
        lines.append(f"{name:<24} {row['source']:<9} {row['last_slot'] or '-':<33} "
                     f"{row['state'] or '-':<18} "
                     f"{row['next_due'] or '-':<33} {extra}")
    if leader:
        leader = {k: v for k, v in leader.items() if k != "token"}
    _emit(as_json, {"leader": leader, "entries": entries}, lines)


@command()
def nodes(ctx: click.Context, as_json: bool) -> None:
    """Every beat that registered; gone ones marked, long-gone ones removed."""
    rows = _cluster(ctx).nodes()
    lines = [f"{'node':<36} {'role':<20} {'seen':>8} {'skew':>9} version"]
    for row in rows:
        skew = row.get("clock_skew")
        lines.append(f"{row['node']:<36} {row.get('role') or '?':<20} "
                     f"{row['seen_ago'] if row['seen_ago'] is not None else '-':>7}s "
                     f"{'-' if skew is None else f'{skew:+.3f}s':>9} {row.get('version', '?')}")
    _emit(as_json, rows, lines)


@command(
    click.option("-n", "--count", default=50, show_default=True, help="How many events."),
    click.option("--entry", default=None, help="Only the events of this entry."),
    click.option("--follow", is_flag=True, help="Keep printing new events (Ctrl-C stops)."),
)
def history(ctx: click.Context, count: int, entry: str | None, follow: bool,
            as_json: bool) -> None:
    """The newest history events, oldest first."""
    cluster = _cluster(ctx)
    rows = cluster.history(count, entry)
    if as_json and not follow:
        _emit(True, rows, [])
        return
    for row in rows:
        click.echo(json.dumps(row) if as_json else _event_line(row))
    last_id = rows[-1]["id"] if rows else "$"
    try:
        while follow:
            last_id, new = cluster.follow(last_id)
            for row in new:
                if entry is None or row.get("entry") == entry:
                    click.echo(json.dumps(row) if as_json else _event_line(row))
    except KeyboardInterrupt:
        pass


@command(
    click.option("--node", "this_node", is_flag=True,
                 help="Judge this host's beat: leading, or a healthy standby (for probes)."),
)
def health(ctx: click.Context, this_node: bool, as_json: bool) -> None:
    """Exit 0 when healthy, 1 when not, 2 when Redis is unreachable; one line of reason.

    Plain: a leader holds a live lease (the lease expires unless its holder renews
    it). --node: this host's beat registered within 3 renew intervals, sees Redis
    and keeps its clock within leaderbeat_max_clock_skew, leading or standing by.
    """
    cluster = _cluster(ctx)
    if this_node:
        ok, why = cluster.node_health()
        _emit(as_json, {"healthy": ok, "reason": why}, [f"{'OK' if ok else 'UNHEALTHY'}: {why}"])
    else:
        leader = cluster.leader()
        ok = leader is not None
        why = (f"{leader['node']} leads (epoch {leader['epoch']})" if leader
               else "no beat holds the lease")
        _emit(as_json, {"healthy": ok, "leader": leader and
                        {k: v for k, v in leader.items() if k != "token"}, "reason": why},
              [f"OK: {why}" if ok else f"NO LEADER: {why}"])
    if not ok:
        sys.exit(NO_LEADER)


@command(
    click.option("--wait", "wait_s", default=5.0, show_default=True,
                 help="Seconds to wait for the next leader."),
    click.option("--this-node", is_flag=True,
                 help="Only if the leader runs on this host (a pod's preStop hook); else do nothing."),
    name="step-down",
)
def step_down(ctx: click.Context, wait_s: float, this_node: bool, as_json: bool) -> None:
    """The leader releases its lease (fenced: it can send nothing more); a standby leads."""
    cluster = _cluster(ctx)
    if this_node and not cluster.leads_here():
        _emit(as_json, {"released": None}, ["this host's beat does not lead: nothing to do"])
        return
    old = cluster.step_down()
    if old is None:
        _fail(NO_LEADER, "no beat holds the lease: nothing to step down")
        return
    new, took = cluster.wait_for_leader(old["token"], wait_s)
    data = {"released": old["node"], "epoch": old["epoch"],
            "new_leader": new and new["node"], "new_epoch": new and new["epoch"],
            "handover_ms": round(took * 1000, 1) if new else None}
    _emit(as_json, data, [f"{old['node']} (epoch {old['epoch']}) released the lease; " + (
        f"{new['node']} leads (epoch {new['epoch']}) after {took * 1000:.0f} ms" if new
        else f"no standby took over within {wait_s:.0f} s")])
    if new is None:
        sys.exit(NO_LEADER)


@command(
    click.argument("name"),
    click.option("--note", default="", help="Why: shown in status and the history."),
)
def pause(ctx: click.Context, name: str, note: str, as_json: bool) -> None:
    """Skip NAME's slots (recorded 'skipped'/'paused') until resume; cluster-wide."""
    _cluster(ctx).pause(name, note)
    _emit(as_json, {"paused": name, "note": note},
          [f"{name} paused{f' ({note})' if note else ''}: its slots are skipped until resume"])


@command(click.argument("name"))
def resume(ctx: click.Context, name: str, as_json: bool) -> None:
    """Send NAME's slots again from its next one; paused slots are not replayed."""
    was = _cluster(ctx).resume(name)
    _emit(as_json, {"resumed": name, "was_paused": was},
          [f"{name} resumed" if was else f"{name} was not paused"])


@command(
    click.argument("name"),
    click.option("--note", default="", help="Why: recorded in the history."),
)
def trigger(ctx: click.Context, name: str, note: str, as_json: bool) -> None:
    """The leader sends NAME once now, under a task id of its own; the schedule is unchanged."""
    request = _cluster(ctx).trigger(name, note)
    _emit(as_json, {"triggered": name, "request": request.id},
          [f"{name}: trigger {request.id} queued; the leader sends it within a second "
           "(see: history --entry " + name + ")"])


def _when(value: str) -> datetime:
    try:
        moment = from_iso(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO date-time (like 2026-12-01T04:00)")
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


@command(
    click.argument("name"),
    click.option("--from", "start", required=True, help="ISO date-time, UTC unless it says."),
    click.option("--to", "end", required=True, help="ISO date-time, UTC unless it says."),
    click.option("--max", "limit", default=BACKFILL_MAX, show_default=True,
                 help="Refuse to send more slots than this."),
    click.option("--yes", is_flag=True, help="Send without asking."),
    click.option("--note", default="", help="Recorded in the history."),
)
def backfill(ctx: click.Context, name: str, start: str, end: str, limit: int, yes: bool,
             note: str, as_json: bool) -> None:
    """Send NAME's slots in [--from, --to] that were never sent, oldest first, each once."""
    cluster = _cluster(ctx)
    first, last = _when(start), _when(end)
    never, sent, horizon = cluster.backfill_slots(name, first, last)
    if horizon is None or horizon > first:
        _fail(REFUSED, f"the history only reaches back to {horizon.isoformat() if horizon else 'nothing'}:"
                       f" what was sent before cannot be told; choose --from after it")
    if len(never) > limit:
        _fail(REFUSED, f"{len(never)} slots were never sent, more than --max {limit}")
    lines = [f"{name}: {len(never)} slot(s) in range never sent, {len(sent)} already sent"]
    lines += [f"  {s.isoformat()}" for s in never[:20]] + (["  ..."] if len(never) > 20 else [])
    if not never:
        _emit(as_json, {"entry": name, "to_send": [], "already_sent": len(sent)}, lines)
        return
    if not yes:
        if as_json or not sys.stdin.isatty():
            _fail(REFUSED, f"backfill of {len(never)} slot(s) needs --yes")
        click.echo("\n".join(lines))
        if not click.confirm("send them?"):
            _fail(REFUSED, "not confirmed")
    request = cluster.backfill(name, never, note)
    _emit(as_json, {"entry": name, "request": request.id,
                    "to_send": [s.isoformat() for s in never], "already_sent": len(sent)},
          lines + [f"backfill {request.id} queued for the leader"])


@command(click.option("--yes", is_flag=True, help="Really delete."))
def reset(ctx: click.Context, yes: bool, as_json: bool) -> None:
    """Delete this app's leaderbeat state: lease, claims, history, nodes, pauses.

    Entries defined at run time are definitions, not state: they stay (remove them
    with ``remove``)."""
    cluster = _cluster(ctx)
    if not yes:
        _fail(REFUSED, f"reset deletes every key under {cluster.store.admin.where}: add --yes")
    deleted = cluster.reset()
    _emit(as_json, {"deleted_keys": deleted},
          [f"deleted {deleted} key(s) under {cluster.store.admin.where}; "
           + "running beats start afresh"])


from . import cli_entries  # noqa: F401 - registers the entry commands on the group

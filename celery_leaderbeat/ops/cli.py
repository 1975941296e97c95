"""``celery -A proj leaderbeat ...``: see what the beats do, and act on them.

    status                  the leader, its epoch and lease; every entry's last slot and run
    nodes                   every beat process: role (gone ones marked), last seen, clock skew
    history [--entry N] [--follow]   elected / released / sent / missed / skipped / unsent ...
    health [--node]         exit 0 when a leader holds a live lease (--node: this host's beat
                            leads or is a healthy standby), 1 when not
    step-down [--this-node] the leader releases its lease; a standby leads at once
    pause NAME [--note T]   slots of NAME are skipped (recorded 'paused') until resume NAME
    trigger NAME            the leader sends NAME once now, under a task id of its own
    backfill NAME --from ISO --to ISO   send the slots in that range that were never sent
    reset --yes             delete this app's leaderbeat state in Redis (not its entries)
    entries, add, edit, remove, enable, disable, import-redbeat
                            entries defined at run time (see cli_entries)

Every command takes ``--json``; the exit codes are in :mod:`.cli_group`.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Any

import click

from ..config import is_postgres_store
from ..integrations.guard import offer_step
from ..store.connection import describe
from .cli_group import (
    DATA,
    UNHEALTHY,
    USAGE,
    cluster_of,
    command,
    echo,
    emit,
    event_line,
    fail,
    leaderbeat,
    moment_text,
    table,
)
from .cli_types import Moment
from .cluster import Cluster, Leader

__all__ = ["leaderbeat"]  # the `celery.commands` entry point

# Loaded by every `celery` command as its plugin: the apps it finalizes get the worker
# guard's bootstep, which switches itself on only in a worker with leaderbeat_guard = True.
offer_step()

#: backfill sends at most this many slots unless --max says otherwise
BACKFILL_MAX = 100


def _public(leader: Leader | None) -> dict[str, Any] | None:
    """The leader as ``--json`` shows it: without its fencing token."""
    return None if leader is None else {k: v for k, v in leader.items() if k != "token"}


@command()
def status(ctx: click.Context, as_json: bool) -> None:
    """The leader and every entry's last slot, its run, and its next slot."""
    cluster = cluster_of(ctx)
    leader, entries = cluster.leader(), cluster.entries()
    send_path = _leader_send_path(cluster, leader)
    where = cluster.config.store_url or cluster.config.redis_url
    kind = "store" if is_postgres_store(cluster.config) else "redis"
    lines = [f"{kind}   {describe(where)}  prefix {cluster.config.key_prefix}",
             "leader  " + (f"{leader['node']} (epoch {leader['epoch']}, lease "
                           f"{leader['lease_ms_left'] / 1000:.1f} s left)" if leader else "none")]
    if send_path:
        lines.append(f"sends   {send_path}")
    rows = []
    for row in entries:
        extra = row["run"] or ""
        if row["paused"]:
            extra = f"PAUSED ({row['paused'].get('note') or 'no note'}) {extra}".strip()
        rows.append([row["entry"] + ("" if row["configured"] else " (not configured)"),
                     row["source"], moment_text(row["last_slot"]), row["state"],
                     moment_text(row["next_due"]), extra])
    lines += table(["entry", "source", "last slot", "state", "next due", "run / paused"], rows)
    emit(as_json, {"leader": _public(leader), "send_path": send_path, "entries": entries}, lines)


def _leader_send_path(cluster: Cluster, leader: Leader | None) -> str | None:
    """How the leader sends its chunks, from its registry record (None: not said yet)."""
    if leader is None:
        return None
    mine = [row for row in cluster.nodes() if row.get("node") == leader["node"]]
    return mine[0].get("send_path") if mine else None


@command()
def nodes(ctx: click.Context, as_json: bool) -> None:
    """Every beat that registered; gone ones marked (the leader forgets them after an hour)."""
    found = cluster_of(ctx).nodes()
    rows = [[row.get("node"), row.get("role") or "?",
             "-" if row.get("seen_ago") is None else f"{row.get('seen_ago')}s",
             "-" if row.get("clock_skew") is None else f"{row.get('clock_skew'):+.3f}s",
             row.get("version", "?"), row.get("send_path") or "-"] for row in found]
    emit(as_json, found, table(["node", "role", "seen", "skew", "version", "send path"], rows))


@command(
    click.option("-n", "--count", type=click.IntRange(min=1), default=50, show_default=True,
                 help="How many events."),
    click.option("--entry", default=None, help="Only the events of this entry."),
    click.option("--follow", is_flag=True, help="Keep printing new events (Ctrl-C stops)."),
)
def history(ctx: click.Context, count: int, entry: str | None, follow: bool,
            as_json: bool) -> None:
    """The newest history events, oldest first."""
    cluster = cluster_of(ctx)
    rows = cluster.history(count, entry)
    if as_json and not follow:
        emit(True, rows, [])
        return
    for row in rows:
        echo(json.dumps(row) if as_json else event_line(dict(row)))
    cursor = rows[-1]["id"] if rows else None
    try:
        while follow:
            cursor, new = cluster.follow(cursor)
            for row in new:
                if entry is None or row.get("entry") == entry:
                    echo(json.dumps(row) if as_json else event_line(dict(row)))
    except KeyboardInterrupt:
        pass


@command(
    click.option("--node", "this_node", is_flag=True,
                 help="Judge this host's beat: leading, or a healthy standby (for probes)."),
)
def health(ctx: click.Context, this_node: bool, as_json: bool) -> None:
    """Exit 0 when healthy, 1 when not, 69 when Redis is unreachable; one line of reason.

    Plain: a leader holds a live lease (the lease expires unless its holder renews
    it). --node: this host's beat registered within 3 renew intervals, sees Redis
    and keeps its clock within leaderbeat_max_clock_skew, leading or standing by.
    """
    cluster = cluster_of(ctx)
    if this_node:
        ok, why = cluster.node_health()
        emit(as_json, {"healthy": ok, "reason": why}, [f"{'OK' if ok else 'UNHEALTHY'}: {why}"])
    else:
        leader = cluster.leader()
        ok = leader is not None
        why = (f"{leader['node']} leads (epoch {leader['epoch']})" if leader
               else "no beat holds the lease")
        emit(as_json, {"healthy": ok, "leader": _public(leader), "reason": why},
             [f"OK: {why}" if ok else f"NO LEADER: {why}"])
    if not ok:
        ctx.exit(UNHEALTHY)


@command(
    click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=5.0,
                 show_default=True, help="Seconds to wait for the next leader."),
    click.option("--this-node", is_flag=True,
                 help="Only if the leader runs on this host (a pod's preStop hook); else do nothing."),
    name="step-down",
)
def step_down(ctx: click.Context, wait_s: float, this_node: bool, as_json: bool) -> None:
    """The leader releases its lease (fenced: it can send nothing more); a standby leads."""
    cluster = cluster_of(ctx)
    if this_node and not cluster.leads_here():
        emit(as_json, {"released": None}, ["this host's beat does not lead: nothing to do"])
        return
    old = cluster.step_down()
    if old is None:
        raise fail(UNHEALTHY, "no beat holds the lease: nothing to step down")
    new, took = cluster.wait_for_leader(old["token"], wait_s)
    data = {"released": old["node"], "epoch": old["epoch"],
            "new_leader": new and new["node"], "new_epoch": new and new["epoch"],
            "handover_ms": round(took * 1000, 1) if new else None}
    emit(as_json, data, [f"{old['node']} (epoch {old['epoch']}) released the lease; " + (
        f"{new['node']} leads (epoch {new['epoch']}) after {took * 1000:.0f} ms" if new
        else f"no standby took over within {wait_s:.0f} s")])
    if new is None:
        ctx.exit(UNHEALTHY)


@command(
    click.argument("name"),
    click.option("--note", default="", help="Why: shown in status and the history."),
)
def pause(ctx: click.Context, name: str, note: str, as_json: bool) -> None:
    """Skip NAME's slots (recorded 'skipped'/'paused') until resume; cluster-wide."""
    cluster_of(ctx).pause(name, note)
    emit(as_json, {"paused": name, "note": note},
         [f"{name} paused{f' ({note})' if note else ''}: its slots are skipped until resume"])


@command(click.argument("name"))
def resume(ctx: click.Context, name: str, as_json: bool) -> None:
    """Send NAME's slots again from its next one; paused slots are not replayed."""
    was = cluster_of(ctx).resume(name)
    emit(as_json, {"resumed": name, "was_paused": was},
         [f"{name} resumed" if was else f"{name} was not paused"])


def _who_sends(cluster: Cluster) -> tuple[str | None, str]:
    """Who carries a queued request out: the leader's node, and a sentence saying when."""
    leader = cluster.leader()
    if leader is None:
        return None, ("no beat holds the lease now: the request waits in the queue until a "
                      "leader takes it (see: leaderbeat health)")
    return leader["node"], f"{leader['node']} leads: it carries it out within about a second"


@command(
    click.argument("name"),
    click.option("--note", default="", help="Why: recorded in the history."),
)
def trigger(ctx: click.Context, name: str, note: str, as_json: bool) -> None:
    """The leader sends NAME once now, under a task id of its own; the schedule is unchanged.

    With no leader, the request waits until a beat leads (and this says so)."""
    cluster = cluster_of(ctx)
    request = cluster.trigger(name, note)
    node, when = _who_sends(cluster)
    emit(as_json, {"triggered": name, "request": request.id, "leader": node},
         [f"{name}: trigger {request.id} queued; {when} (see: history --entry {name})"])


@command(
    click.argument("name"),
    click.option("--from", "start", type=Moment(), required=True,
                 help="ISO 8601 date-time (Z or an offset; UTC when it has none)."),
    click.option("--to", "end", type=Moment(through=True), required=True,
                 help="ISO 8601 date-time, not before --from; to the second: through "
                      "the end of that second."),
    click.option("--max", "limit", type=click.IntRange(min=1), default=BACKFILL_MAX,
                 show_default=True, help="Refuse to send more slots than this."),
    click.option("--yes", is_flag=True, help="Send without asking."),
    click.option("--note", default="", help="Recorded in the history."),
)
def backfill(ctx: click.Context, name: str, start: datetime, end: datetime, limit: int,
             yes: bool, note: str, as_json: bool) -> None:
    """Send NAME's slots in [--from, --to] that were never sent, oldest first, each once.

    With no leader, the request waits until a beat leads (and this says so)."""
    if start > end:
        raise click.BadParameter(f"--from {moment_text(start)} is after --to "
                                 f"{moment_text(end)}: --from must not be later",
                                 param_hint="'--from' / '--to'")
    cluster = cluster_of(ctx)
    never, sent, horizon = cluster.backfill_slots(name, start, end)
    if horizon is None or horizon > start:
        raise fail(DATA, f"the history only reaches back to "
                         f"{moment_text(horizon) if horizon else 'nothing'}: what was sent "
                         "before cannot be told; choose --from after it")
    if len(never) > limit:
        raise fail(DATA, f"{len(never)} slots of {name!r} were never sent, more than "
                         f"--max {limit}: narrow the range or raise --max")
    lines = [f"{name}: {len(never)} slot(s) in range never sent, {len(sent)} already sent"]
    lines += [f"  {moment_text(s)}" for s in never[:20]] + (["  ..."] if len(never) > 20 else [])
    if not never:
        emit(as_json, {"entry": name, "to_send": [], "already_sent": len(sent)}, lines)
        return
    _confirm(yes, as_json, lines, f"backfill of {len(never)} slot(s) needs --yes")
    request = cluster.backfill(name, never, note)
    node, when = _who_sends(cluster)
    emit(as_json, {"entry": name, "request": request.id, "leader": node,
                   "to_send": [s.isoformat() for s in never], "already_sent": len(sent)},
         lines + [f"backfill {request.id} queued; {when}"])


def _confirm(yes: bool, as_json: bool, lines: list[str], needs: str) -> None:
    """Go on with --yes, or when a person at a terminal says yes; else refuse (64)."""
    if yes:
        return
    if as_json or not sys.stdin.isatty():
        raise fail(USAGE, needs)
    echo("\n".join(lines))
    if not click.confirm("send them?"):
        raise fail(USAGE, "not confirmed: nothing sent")


@command(click.option("--yes", is_flag=True, help="Really delete."))
def reset(ctx: click.Context, yes: bool, as_json: bool) -> None:
    """Delete this app's leaderbeat state: lease, claims, history, nodes, pauses.

    Entries defined at run time are definitions, not state: they stay (remove them
    with ``remove``)."""
    cluster = cluster_of(ctx)
    if not yes:
        raise fail(USAGE, f"reset deletes every key under {cluster.store.admin.where}: add --yes")
    deleted = cluster.reset()
    emit(as_json, {"deleted_keys": deleted},
         [f"deleted {deleted} key(s) under {cluster.store.admin.where}; "
          + "running beats start afresh"])


from ..web import cli as _web_cli  # noqa: F401 - registers `web` on the group
from . import (
    cli_entries,  # noqa: F401 - registers the entry commands on the group
    cli_store,  # noqa: F401 - registers `init-store` on the group
)

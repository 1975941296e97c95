"""A storm of run-time entry changes under three beats, the leader SIGKILLed mid-storm.

    nice python bench/dynamic_storm.py [--entries 10000] [--every 25] [--storm 120]
                                       [--changes 2000] [--once 500]
    nice python bench/dynamic_storm.py --every 20 --phases 8   # like for like (below)
    nice python bench/dynamic_storm.py --every 20 --phases 8 --side-by-side

Two runs on this machine, each with three real beats (Celery's default 300 s loop,
leaderbeat's default 10 s lease and 2 s rescue_after):

- ``static``: the same number of entries in ``beat_schedule``, at the same interval:
  the leader's CPU per 1,000 sends and the standbys' CPU share, for comparison; then
  the leader SIGKILLed a second before a burst, and how late that burst was sent.
- ``runtime``: the entries saved through the ``Entry`` API before the beats start;
  a quiet stretch (the steady cost per send), then the storm: interval edits (each
  new interval anchored at its save), argument edits, disables, enables of disabled
  entries, removals and one-offs due 2-12 s after their save, at an even pace; the
  leader SIGKILLed half-way through. The first half gives the leader's CPU per 1,000
  sends and each standby's share of a core while it follows the storm.

With ``--phases K`` (``every`` a divisor of 60), the static entries and the run-time
ones saved before the beats start are the same six-field crons, entry i due at second
``i % K`` of every ``every``: both fall due on the same K instants, so the quiet
windows compare the cost of an entry's kind alone (without it, the static entries
share one instant and the run-time ones the seconds their saves took). Argument edits
and enables keep the cron; interval edits become intervals, as without.

With ``--side-by-side`` the static cluster is not run first but beside the run-time
one, through the quiet window and the storm: each window's figures (``beside_static``)
are read on both clusters over the same seconds, so a ratio is not at the mercy of
what the machine did minutes apart (the static phase alone varied by half from run
to run on a machine where a Redis round trip costs 160 us of CPU). The two clusters
share the cores; the static leader is not killed.

Every operation's new definition carries its own argument, so each message says
which definition it was sent under. Checked from the broker: every one-off sent
exactly once and within ``rescue_after`` + 1 s of its time; every edit in force
within 1 s of its save (no slot of the old definition after save + 1 s; an edited
interval's first slot at the save's anchor + the new interval); nothing of a
disabled or removed entry after save + 1 s. Edits saved while nobody leads (the
kill to the next election) are counted apart: a standby rescues only slots of the
definition the leader wrote, so they are in force from the next election. CPU
from /proc. A row goes to bench/results/dynamic.jsonl. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import NOOP, Rig, code, cpu_seconds, entries, load, rss_mib
from celery import Celery

from celery_leaderbeat import Entry

RESULTS = Path(__file__).resolve().parent / "results" / "dynamic.jsonl"
RESCUE_AFTER = 2.0  # leaderbeat's default
SEEN_WITHIN = 1.0  # the documented promise for a change
#: Celery's own default loop (the harness shortens it for the scheduler comparison)
SETTINGS = {"beat_max_loop_interval": 300}


@dataclass
class Sent:
    entry: str
    slot: float
    tag: Any  # the second argument: which definition (operation) it was sent under
    epoch: int
    received: float


@dataclass
class Op:
    kind: str  # interval, args, disable, enable, remove, once
    name: str
    tag: int
    saved: float  # wall time the save returned
    anchor: float = 0.0  # Redis TIME of the save (Entry.anchor)
    every: float = 0.0
    at: float = 0.0
    led: bool = True  # a leader led at the save and a second later


@dataclass
class Run:
    rig: Rig
    app: Celery
    sent: list[Sent] = field(default_factory=list)


def api_app(url: str) -> Celery:
    app = Celery("bench")
    app.conf.update(leaderbeat_redis_url=url, leaderbeat_key_prefix="bench", timezone="UTC")
    return app


def parse_all(rig: Rig) -> list[Sent]:
    out = []
    for received, raw in list(rig.watch.raw):
        data = json.loads(raw)
        headers: dict[str, Any] = data.get("headers") or {}
        args = json.loads(base64.b64decode(data["body"]))[0]
        slot = headers.get("leaderbeat_slot")
        if slot is None:
            continue
        # every message with a slot header names its entry too
        out.append(Sent(headers["leaderbeat_entry"], datetime.fromisoformat(slot).timestamp(),
                        args[1] if len(args) > 1 else None,
                        int(headers.get("leaderbeat_epoch") or 0), received))
    return out


def leader_pid(rig: Rig) -> int | None:
    raw = rig.state.client().get("{bench}:leader")
    return int(raw.decode().split("|")[0].split(":")[-2]) if raw else None


def wait_leader(rig: Rig, other_than: int | None = None, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = leader_pid(rig)
        if pid is not None and pid != other_than:
            return pid
        time.sleep(0.05)
    raise AssertionError("no leader")


def cpu_of(rig: Rig) -> dict[int, float]:
    return {b.pid: cpu_seconds(b.pid) for b in rig.beats if b.alive}


@dataclass
class Mark:
    """What a rig had spent at one moment: each beat's CPU, the messages sent, the time."""

    leader: int | None
    cpu: dict[int, float]
    sent: int
    at: float


def mark(rig: Rig) -> Mark:
    return Mark(leader_pid(rig), cpu_of(rig), rig.watch.count, time.monotonic())


def between(a: Mark, b: Mark) -> dict[str, Any]:
    """Leader CPU per 1,000 sends and the standbys' CPU share from ``a`` to ``b`` (the
    leader of ``a``; its CPU at ``b`` read before it was killed, if it was)."""
    wall, sends, leader = b.at - a.at, b.sent - a.sent, a.leader
    standby = [(b.cpu[p] - a.cpu[p]) / wall for p in b.cpu if p != leader and p in a.cpu]
    spent = b.cpu[leader] - a.cpu[leader] if leader in b.cpu and leader in a.cpu else float("nan")
    return {"seconds": round(wall, 1), "sends": sends,
            "leader_cpu_per_1000": round(1000 * spent / max(sends, 1), 4),
            "standby_cpu_share": [round(s, 4) for s in standby]}


def window(rig: Rig, seconds: float, beside: Rig | None = None) -> dict[str, Any]:
    """Leader CPU per 1,000 sends and the standbys' CPU share over ``seconds`` (and the
    same of the static rig ``beside``, over the same seconds)."""
    start, start_beside = mark(rig), mark(beside) if beside is not None else None
    time.sleep(seconds)
    row = between(start, mark(rig))
    row["leader_rss_mib"] = round(rss_mib(start.leader), 1) if start.leader else None
    if beside is not None and start_beside is not None:
        row["beside_static"] = between(start_beside, mark(beside))
    return row


# -- static ------------------------------------------------------------------------------------

def phased(i: int, every: float, phases: int) -> str:
    """Entry i's six-field cron under ``--phases``: due at second ``i % phases`` of
    every ``every``."""
    return f"{i % phases}/{int(every)} * * * * *"


def static_rig(n: int, every: float, phases: int = 0) -> Rig:
    """Three beats of the same entries in beat_schedule, one full round sent."""
    schedule = entries(n, every, prefix="d")
    if phases:
        for i, name in enumerate(schedule):
            del schedule[name]["every"]
            schedule[name]["cron"] = phased(i, every, phases)
    rig = Rig("leaderbeat", schedule, settings=SETTINGS)
    try:
        for _ in range(3):
            rig.start_beat()
        wait_leader(rig)
        rig.watch.wait_count(n, timeout=every * 3 + 60)
    except BaseException:
        rig.close()
        raise
    return rig


def static(n: int, every: float, seconds: float, phases: int = 0) -> dict[str, Any]:
    """The same entries in beat_schedule: the steady costs, then the leader SIGKILLed."""
    with static_rig(n, every, phases) as rig:
        time.sleep(every / 2)
        row = window(rig, seconds)
        leader = leader_pid(rig)
        # killed a second before the next burst: its slots fall due while nobody leads
        last = max(s.slot for s in parse_all(rig))
        time.sleep(max(0.0, last + every - 1.0 - time.time()))
        next(b for b in rig.beats if b.pid == leader).kill()
        killed_at = time.time()
        wait_leader(rig, other_than=leader)
        elected_at = time.time()
        time.sleep(5)
        sent = parse_all(rig)
    row.update(gap_lateness(sent, killed_at, elected_at))
    return row


def gap_lateness(sent: list[Sent], killed_at: float, elected_at: float) -> dict[str, Any]:
    """How late the slots due while nobody led were sent: rescued, or by the next leader."""
    late = sorted(s.received - s.slot for s in sent if killed_at <= s.slot <= elected_at)
    return {"elected_after_kill_s": round(elected_at - killed_at, 2), "gap_slots": len(late),
            "gap_slots_late_p50_s": round(late[len(late) // 2], 3) if late else None,
            "gap_slots_late_worst_s": round(late[-1], 3) if late else None,
            "gap_slots_over_rescue_plus_1": sum(x > RESCUE_AFTER + 1 for x in late)}


# -- runtime -----------------------------------------------------------------------------------

def plan_ops(n: int, changes: int, once: int, rng: random.Random) -> list[str]:
    kinds = (["interval"] * (changes // 2) + ["args"] * (changes // 5)
             + ["disable"] * (changes // 10) + ["remove"] * (changes // 10))
    kinds += ["enable"] * (changes - len(kinds)) + ["once"] * once
    rng.shuffle(kinds)
    return kinds


def storm(run: Run, n: int, every: float, seconds: float, changes: int, once: int,
          rng: random.Random, phases: int = 0,
          beside: Rig | None = None) -> tuple[list[Op], float, float, dict[str, Any]]:
    """The storm; returns the operations, the kill and election times (0.0: no election
    within the storm), and the CPU of the first half (the first leader; and of the static
    rig ``beside`` over the same time) with the killed leader's pid."""
    names = [f"d{i}" for i in range(n)]
    rng.shuffle(names)
    fresh = iter(names)  # each operation on an entry of its own
    disabled: list[tuple[str, float]] = []
    ops: list[Op] = []
    kinds = plan_ops(n, changes, once, rng)
    pace = seconds / len(kinds)
    start, started_at = time.monotonic(), time.time()
    killed_at = elected_at = 0.0
    killed: int | None = None
    first: dict[str, Any] = {}
    # the leader's CPU over the storm only: its total since start would add the start-up,
    # the first load of every entry and the quiet window to the storm's sends; each
    # standby's share of a core is what following the storm costs it
    began = mark(run.rig)
    began_beside = mark(beside) if beside is not None else None
    leader = began.leader
    assert leader is not None, "no leader when the storm began"
    for k, kind in enumerate(kinds):
        while time.monotonic() < start + k * pace:
            time.sleep(0.002)
        if not killed_at and k >= len(kinds) // 2:
            half = mark(run.rig)
            first = between(began, half)
            # not a cost per send (the start-up and the first load of every entry are in
            # it): the leader's CPU since it started, over the storm's sends
            first["leader_cpu_since_start_per_1000"] = round(
                1000 * half.cpu[leader] / max(first["sends"], 1), 4)
            first["leader_rss_mib"] = round(rss_mib(leader), 1)
            if beside is not None and began_beside is not None:
                first["beside_static"] = between(began_beside, mark(beside))
            next(b for b in run.rig.beats if b.pid == leader).kill()
            killed_at, killed = time.time(), leader
        if killed_at and not elected_at and (pid := leader_pid(run.rig)) not in (None, leader):
            elected_at, leader = time.time(), pid
        if kind == "enable" and disabled and disabled[0][1] < time.time() - 5:
            ops.append(save(run.app, Op("enable", disabled.pop(0)[0], k, 0.0), every,
                            phases=phases))
            continue
        name = next(fresh)
        op = save(run.app, Op("args" if kind == "enable" else kind,
                              f"once{k}" if kind == "once" else name, k, 0.0), every, rng,
                  phases)
        ops.append(op)
        if kind == "disable":
            disabled.append((name, time.time()))
    return ops, killed_at, elected_at, {"first": first, "started_at": started_at,
                                        "killed": killed}


def save(app: Celery, op: Op, every: float, rng: random.Random | None = None,
         phases: int = 0) -> Op:
    args = [op.name, op.tag]
    # what an argument edit or an enable keeps: the entry's own schedule (its cron under
    # --phases, whose first slot after an enable is the cron's, not the anchor + every)
    kept: Any = (phased(int(op.name[1:]), every, phases)
                 if phases and op.kind != "once" else every)
    if op.kind == "interval":
        op.every = rng.choice([every - 5, every + 5]) if rng else every
        entry = Entry(op.name, NOOP, op.every, args=args)
    elif op.kind in ("args", "enable"):
        op.every = 0.0 if phases else every
        entry = Entry(op.name, NOOP, kept, args=args)
    elif op.kind == "disable":
        entry = Entry(op.name, NOOP, kept, args=[op.name], enabled=False)
    elif op.kind == "once":
        op.at = time.time() + (rng.uniform(2, 12) if rng else 5)
        entry = Entry(op.name, NOOP, at=datetime.fromtimestamp(op.at, timezone.utc), args=args)
    else:
        stored = Entry.get(app, op.name)
        assert stored is not None, f"{op.name} is not stored"  # each op has an entry of its own
        stored.delete(app)
        op.saved = time.time()
        return op
    entry.save(app)
    op.saved = time.time()
    op.anchor = entry.anchor.timestamp() if entry.anchor else op.saved
    return op


def verdict(ops: list[Op], sent: list[Sent], killed_at: float, elected_at: float,
            end: float, since: float = 0.0) -> dict[str, Any]:
    by_entry: dict[str, list[Sent]] = defaultdict(list)
    for s in sent:
        by_entry[s.entry].append(s)
    gap = (killed_at - SEEN_WITHIN, elected_at + SEEN_WITHIN)
    out: dict[str, Any] = defaultdict(int)
    once_late: list[float] = []
    edit_late: dict[str, list[float]] = {"led": [], "rescued": []}
    enabled_again = {op.name: op.saved for op in ops if op.kind == "enable"}
    for op in ops:
        mine = by_entry.get(op.name, [])
        in_gap = gap[0] <= op.saved <= gap[1]
        if op.kind == "once":
            got = [s for s in mine if s.tag == op.tag]
            out["once"] += 1
            out["once_not_exactly_once"] += len(got) != 1
            if got:
                once_late.append(max(s.received - op.at for s in got))
            continue
        until = enabled_again.get(op.name, end) if op.kind == "disable" else end
        old = [s for s in mine if s.tag != op.tag and op.saved + SEEN_WITHIN < s.slot < until]
        if op.kind in ("disable", "remove"):
            out[f"{op.kind}_checked"] += 1
            out[f"{op.kind}_sent_after"] += bool(old)
            continue
        new = sorted(s.slot for s in mine if s.tag == op.tag)
        if not new or new[0] + 1 > end:
            continue
        key = "gap_" if in_gap else ""
        out[f"{key}{op.kind}_checked"] += 1
        out[f"{key}{op.kind}_old_after_1s"] += bool(old)
        if op.kind in ("interval", "enable") and op.every:
            expected = op.anchor + op.every
            off = new[0] - expected
            out[f"{key}{op.kind}_not_at_save_plus_interval"] += abs(off) > 0.002
            first = min(s.received for s in mine if s.tag == op.tag)
            if not in_gap:  # its first slot came due while a leader led, or in the gap
                # (due just before the kill and not sent by then: rescued too)
                rescued = expected <= elected_at and first >= killed_at
                edit_late["rescued" if rescued else "led"].append(first - expected)
    out.update(gap_lateness(sent, killed_at, elected_at))
    # a standby rescues only the definition the leader wrote: an entry saved in the gap
    # is in force from the next election, so its slots there are the next leader's
    edited = {op.name for op in ops if gap[0] <= op.saved <= gap[1]}
    unedited = gap_lateness([s for s in sent if s.entry not in edited], killed_at, elected_at)
    out.update({f"unedited_{k}": v for k, v in unedited.items() if k.startswith("gap_")})
    # from the storm's start: slots due while the beats started are sent by catch-up
    led = sorted(s.received - s.slot for s in sent if since <= s.slot < killed_at - 1)
    out["led_slots_late_p99_s"] = round(led[len(led) * 99 // 100], 3) if led else None
    out["once_worst_late_s"] = round(max(once_late), 3) if once_late else None
    out["once_late_over_rescue_plus_1"] = sum(x > RESCUE_AFTER + 1 for x in once_late)
    for key, late in edit_late.items():  # first slot due while a leader led / nobody led
        out[f"edit_first_slot_{key}_n"] = len(late)
        out[f"edit_first_slot_{key}_worst_late_s"] = round(max(late), 3) if late else None
    return dict(out)


def runtime(n: int, every: float, seconds: float, changes: int, once: int,
            quiet: float, phases: int = 0, beside: Rig | None = None) -> dict[str, Any]:
    rng = random.Random(7)
    row: dict[str, Any] = {}
    with Rig("leaderbeat", {}, settings=SETTINGS) as rig:
        run = Run(rig, api_app(rig.state.url))
        t0 = time.perf_counter()
        for i in range(n):
            seeded: Any = phased(i, every, phases) if phases else every
            Entry(f"d{i}", NOOP, seeded, args=[f"d{i}", -1]).save(run.app)
        row["seed_s"] = round(time.perf_counter() - t0, 1)
        for _ in range(3):
            rig.start_beat()
        wait_leader(rig)
        rig.watch.wait_count(n, timeout=every * 3 + 60)
        time.sleep(every / 2)
        row["quiet"] = window(rig, quiet, beside)
        ops, killed_at, elected_at, cpu = storm(run, n, every, seconds, changes, once, rng,
                                            phases, beside)
        # a storm shorter than the lease ttl ends before the election: the killed leader's
        # lease still names it until then
        leader = wait_leader(rig, other_than=cpu["killed"], timeout=30)
        elected_at = elected_at or time.time()
        cpu_l0, sent0, t_l0 = cpu_seconds(leader), rig.watch.count, time.monotonic()
        time.sleep(15)  # the last one-offs come due; the next leader's own sends
        row["storm_first_leader"] = cpu["first"]
        row["storm_next_leader_after"] = {
            "sends": rig.watch.count - sent0, "seconds": round(time.monotonic() - t_l0, 1),
            "leader_cpu_per_1000": round(1000 * (cpu_seconds(leader) - cpu_l0)
                                         / max(rig.watch.count - sent0, 1), 4),
            "leader_rss_mib": round(rss_mib(leader), 1)}
        row["elected_after_kill_s"] = round(elected_at - killed_at, 2)
        end = time.time()
        sent = parse_all(rig)
    row["ops"] = dict(Counter(op.kind for op in ops))
    row["check"] = verdict(ops, sent, killed_at, elected_at, end, since=cpu["started_at"])
    row["duplicates"] = len(sent) - len({(s.entry, s.slot) for s in sent})
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--every", type=float, default=25.0)
    parser.add_argument("--storm", type=float, default=120.0)
    parser.add_argument("--changes", type=int, default=2000)
    parser.add_argument("--once", type=int, default=500)
    parser.add_argument("--quiet", type=float, default=30.0)
    parser.add_argument("--static-seconds", type=float, default=45.0)
    parser.add_argument("--phases", type=int, default=0,
                        help="static and seeded run-time entries on the same K instants of "
                             "every --every s (six-field crons; --every must divide 60)")
    parser.add_argument("--side-by-side", action="store_true",
                        help="the static entries run beside the run-time ones, each window "
                             "measured on both over the same seconds (no static kill)")
    parser.add_argument("--skip-static", action="store_true")
    parser.add_argument("--skip-runtime", action="store_true")
    args = parser.parse_args()
    if args.phases and (60 % args.every or not 0 < args.phases <= args.every):
        parser.error(f"--phases {args.phases} needs --every to divide 60 and to be at least "
                     f"the phases (got --every {args.every:g})")
    row: dict[str, Any] = {"scenario": "storm", "entries": args.entries, "every": args.every,
                           "code": code(), "load0": load()}
    if args.phases:
        row["phases"] = args.phases
    if args.side_by_side:
        row["side_by_side"] = True
        with static_rig(args.entries, args.every, args.phases) as beside:
            row["runtime"] = runtime(args.entries, args.every, args.storm, args.changes,
                                     args.once, args.quiet, args.phases, beside)
    if not args.skip_static and not args.side_by_side:
        row["static"] = static(args.entries, args.every, args.static_seconds, args.phases)
        print(json.dumps(row["static"]), flush=True)
    if not args.skip_runtime and not args.side_by_side:
        row["runtime"] = runtime(args.entries, args.every, args.storm, args.changes, args.once,
                                 args.quiet, args.phases)
    row["load1"] = load()
    row["at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(json.dumps(row) + "\n")
    print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()

"""Overlap policies under load: real prefork workers, a task that runs 2.5 times its interval.

    python bench/overlap.py [--policy skip|buffer_one|buffer_all|cancel_other|all]
                            [--slots 200] [--interval 0.4] [--lease-ttl 3]

Per policy: its own redis-servers (leaderbeat's state, the broker, what the task
records), two guarded ``celery worker -c1`` processes (prefork, ``task_acks_late``,
prefetch 1, so a slot due while one worker runs the entry reaches the other), and
``--slots`` slots of one entry published as beat publishes them (deterministic task
id, leaderbeat headers, ``leaderbeat_overlap``) every ``--interval`` seconds, for
a task that runs 2.5 times the interval and records a tick every 50 ms. Halfway, the
worker running the entry is SIGKILLed mid-run and a new one started. Lease ttl 3 s
by default (the dead run's lock lapses 3 s after its last renewal; 10 s without it).

Read back: each run's span (first to last tick; a run terminated or killed has no
``end``), the history (each slot's decision), and the guard's decision counters.
Figures per policy, printed and appended to bench/results/overlap.jsonl:

- overlaps: pairs of runs of which the second started before the first's last tick;
- unaccounted: slots published with neither a run nor a record of a decision;
- skip: slots skipped and recorded;
- buffer_one: the most slots waiting at once (the history in Redis's order); the
  start of each slot that waited, after the end (last tick) of the run before it:
  p50, p99, max; the one that waited for the killed run, after the kill;
- buffer_all: slots run, in slot order or not;
- cancel_other: runs terminated (the SIGKILLed one aside), each recorded ``cancelled``
  and ended ``cancelled``.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from celery_leaderbeat.store.keys import Keys
from celery_leaderbeat.timing.slots import slot_id
from tests.support.beatapp import make_app
from tests.support.overlap_tasks import overlaps, spans
from tests.support.redis_server import RedisServer
from tests.support.worker import WorkerProcess, wait_until
from tests.test_guard import guarded_env, history

RESULTS = Path(__file__).resolve().parent / "results" / "overlap.jsonl"
TICKING = "tests.support.overlap_tasks.ticking"
POLICIES = ("skip", "buffer_one", "buffer_all", "cancel_other")
START = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
ENTRY = "bench"


def ms(slot: str) -> int:
    return int(datetime.fromisoformat(slot).timestamp() * 1000)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


class Rig:
    """Servers and two workers for one policy; ``kill_running()`` replaces one."""

    def __init__(self, directory: Path, lease_ttl: float) -> None:
        self.dir = directory
        self.servers = [RedisServer(workdir=directory / f"redis{i}") for i in range(3)]
        state, broker, record = self.servers
        self.prefix = "bench-overlap"
        settings = {"task_acks_late": True, "worker_prefetch_multiplier": 1,
                    "leaderbeat_lease_ttl": lease_ttl,
                    "leaderbeat_renew_interval": max(1.0, lease_ttl / 3)}
        self.env = guarded_env(directory, broker_url=broker.url, state_url=state.url,
                               record_url=record.url, prefix=self.prefix, settings=settings)
        self.state, self.record = state.client(), record.client()
        self.workers: list[WorkerProcess] = []
        self.started = 0
        self.interval = 0.0
        self.killed_pid: int | None = None
        for _ in range(2):
            self.add_worker()

    def add_worker(self) -> WorkerProcess:
        self.started += 1
        worker = WorkerProcess(self.env, self.dir / f"w{self.started}.log",
                               name=f"w{self.started}", concurrency=1,
                               extra_args=["-I", "tests.support.overlap_tasks"])
        worker.wait_ready(60)
        self.workers.append(worker)
        return worker

    def kill_running(self) -> float | None:
        """SIGKILL the worker whose pool child runs the entry now; the time, or None."""
        runs = [r for r in spans(self.record) if not r["ended"]]
        if not runs:
            return None
        child = runs[-1]["pid"]
        try:
            parent = int(Path(f"/proc/{child}/stat").read_text().split(")")[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        for worker in self.workers:
            if worker.proc.pid == parent:
                self.killed_pid = child
                worker.kill()
                killed = time.time()
                self.workers.remove(worker)
                self.add_worker()
                return killed
        return None

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
        for server in self.servers:
            server.close()


def feed(rig: Rig, policy: str, n: int, interval: float) -> tuple[list[str], float | None]:
    """Publish ``n`` slots, one every ``interval`` s; kill the running worker halfway."""
    app = make_app(rig.env)
    rig.interval = interval
    ids, killed = [], None
    next_at = time.monotonic()
    try:
        for i in range(n):
            slot = START + timedelta(seconds=interval * i)
            task_id = slot_id(rig.prefix, ENTRY, slot)
            app.send_task(TICKING, kwargs={"seconds": 2.5 * interval}, task_id=task_id,
                          headers={"leaderbeat_slot": slot.isoformat(),
                                   "leaderbeat_entry": ENTRY, "leaderbeat_epoch": 1,
                                   "leaderbeat_overlap": policy})
            ids.append(task_id)
            if i >= n // 2 and killed is None:
                killed = rig.kill_running()
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        app.close()
    return ids, killed


def events(rig: Rig) -> list[dict[str, str]]:
    return [e for e in history(rig.state, rig.prefix) if e.get("entry") == ENTRY]


def settle(rig: Rig, n: int, timeout: float) -> None:
    """Until every slot started or was skipped, and no run goes on (or ticks)."""
    def done() -> bool:
        evs = events(rig)
        decided = {e["slot"] for e in evs if e["event"] in ("started", "skipped")}
        started = {int(e["slot"]) for e in evs if e["event"] == "started"}
        runs = spans(rig.record)
        return (len(decided) >= n and started <= {ms(r["slot"]) for r in runs}
                and all(r["ended"] or time.time() - r["last"] > 1.0 for r in runs))
    try:
        wait_until(done, timeout, "the runs to end")
    except AssertionError:
        print(f"  (not settled within {timeout:.0f} s; figures as they stand)")
    time.sleep(1.0)


def figures(rig: Rig, policy: str, ids: list[str], killed: float | None) -> dict[str, Any]:
    runs, evs = spans(rig.record), events(rig)
    by_id = {r["id"]: r for r in runs}
    decided = {int(e["slot"]) for e in evs if e["event"] in ("started", "skipped", "buffered")}
    published_ms = {ms((START + timedelta(seconds=rig.interval * i)).isoformat())
                    for i in range(len(ids))}
    # state.client() has no decode_responses: it answers bytes
    decisions = cast("dict[bytes, bytes]", rig.state.hgetall(Keys(rig.prefix).overlap_decisions))
    out: dict[str, Any] = {
        "policy": policy, "slots": len(ids), "runs": len(runs),
        "overlaps": len(overlaps(runs)),
        "ran_to_end": sum(r["ended"] for r in runs),
        "unaccounted": len(ids) - len(decided & published_ms),
        "worker_killed": killed is not None,
        "decisions": {k.decode(): int(v) for k, v in decisions.items()},
    }
    skipped = [e for e in evs if e["event"] == "skipped"]
    out["skipped_recorded"] = len(skipped)
    if policy == "buffer_one":
        out.update(buffer_one(runs, evs, killed))
    if policy == "buffer_all":
        order = [r["id"] for r in runs]
        out["every_slot_ran"] = set(ids) <= set(by_id)
        out["in_slot_order"] = order == [i for i in ids if i in by_id]
    if policy == "cancel_other":
        terminated = [r for r in runs if not r["ended"] and r["pid"] != rig.killed_pid]
        cancelled = {int(e["slot"]) for e in evs if e["event"] == "cancelled"}
        ended = {int(e["slot"]) for e in evs if e["event"] == "finished"
                 and e.get("detail", "").startswith("cancelled")}
        out["killed_run_recorded_cancelled"] = any(
            ms(r["slot"]) in cancelled for r in runs
            if r["pid"] == rig.killed_pid and not r["ended"])
        out["terminated"] = len(terminated)
        out["terminated_recorded_cancelled"] = sum(ms(r["slot"]) in cancelled
                                                   for r in terminated)
        out["terminated_recorded_ended"] = sum(ms(r["slot"]) in ended for r in terminated)
        out["cancel_records"] = len(cancelled)
    return out


def buffer_one(runs: list[dict[str, Any]], evs: list[dict[str, str]],
               killed: float | None) -> dict[str, Any]:
    waiting = most = 0
    for e in evs:
        waiting += e["event"] == "buffered"
        waiting -= e["event"] == "started" and e.get("detail") == "after wait"
        most = max(most, waiting)
    after_wait = {int(e["slot"]) for e in evs
                  if e["event"] == "started" and e.get("detail") == "after wait"}
    delays, after_kill = [], None
    for before, run in pairwise(runs):
        if ms(run["slot"]) not in after_wait:
            continue
        if not before["ended"]:  # the killed run: its end is when the guard judged it dead
            after_kill = round(run["start"] - killed, 3) if killed else None
            continue
        delays.append(run["start"] - before["last"])
    return {"most_waiting": most, "started_after_wait": len(after_wait),
            "start_after_previous_end_s": {"p50": pct(delays, 0.5), "p99": pct(delays, 0.99),
                                           "max": pct(delays, 1.0), "n": len(delays)},
            "start_after_kill_s": after_kill}


def run_policy(policy: str, n: int, interval: float, lease_ttl: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"overlap-{policy}-") as tmp:
        rig = Rig(Path(tmp), lease_ttl)
        try:
            began = time.monotonic()
            ids, killed = feed(rig, policy, n, interval)
            drain = n * 2.5 * interval + 60 if policy == "buffer_all" else 60
            settle(rig, n, drain)
            out = figures(rig, policy, ids, killed)
            out["seconds"] = round(time.monotonic() - began, 1)
        finally:
            rig.close()
    out.update(interval=interval, task_seconds=2.5 * interval, lease_ttl=lease_ttl,
               at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
               load=round(os.getloadavg()[0], 2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", choices=(*POLICIES, "all"), default="all")
    parser.add_argument("--slots", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.4)
    parser.add_argument("--lease-ttl", type=float, default=3.0)
    args = parser.parse_args()
    for policy in POLICIES if args.policy == "all" else (args.policy,):
        out = run_policy(policy, args.slots, args.interval, args.lease_ttl)
        print(json.dumps(out))
        RESULTS.parent.mkdir(exist_ok=True)
        with RESULTS.open("a") as f:
            f.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    main()

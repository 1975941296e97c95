"""Entries defined at run time: how fast a change reaches every beat, what it costs, the import.

    python bench/dynamic.py visible [--sizes 100,10000]   # 3 beats: save -> seen by each
    python bench/dynamic.py cpu     [--sizes 100,10000]   # the leader's CPU for one save
    python bench/dynamic.py import  [--n 1000] [--redbeat-seconds 75]  # RedBeat -> leaderbeat

Each run starts its own redis-servers and real beats (``visible``, ``import``)
or an in-process leader (``cpu``: CPU read with ``time.process_time`` around
the tick that takes the change in). Rows are appended to
bench/results/dynamic.jsonl. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import NOOP, Rig, load, log_events
from celery import Celery

from celery_leaderbeat import Entry
from celery_leaderbeat.store.keys import Keys

RESULTS = Path(__file__).resolve().parent / "results" / "dynamic.jsonl"
FAR = 86400  # a daily interval: nothing comes due while the bench runs


def api_app(state_url: str, prefix: str = "bench") -> Celery:
    app = Celery("bench")
    app.conf.update(leaderbeat_redis_url=state_url, leaderbeat_key_prefix=prefix,
                    timezone="UTC", broker_url=state_url)
    return app


def seed(app: Celery, n: int) -> float:
    """``n`` daily entries through the API; the seconds it took."""
    t0 = time.perf_counter()
    for i in range(n):
        Entry(f"d{i}", NOOP, FAR, args=[f"d{i}"]).save(app)
    return time.perf_counter() - t0


def version(state: redis.Redis) -> int:
    """The version of the run-time entries in the state Redis."""
    return int(state.hget(Keys("bench").entries_meta, "version") or 0)


# -- visible: 3 beats --------------------------------------------------------------------------

def visible(n: int, saves: int = 5) -> dict[str, Any]:
    row: dict[str, Any] = {"scenario": "visible", "entries": n, "load0": load()}
    with Rig("leaderbeat", {}) as rig:
        app, state = api_app(rig.state.url), rig.state.client()
        row["seed_s"] = seed(app, n)
        # DEBUG: a change of a few entries is logged ("dynamic entries at version N") at DEBUG
        beats = [rig.start_beat("DEBUG") for _ in range(3)]
        v0 = version(state)
        deadline = time.monotonic() + 120
        while not all(log_events(b, rf"dynamic entries at version {v0}:") for b in beats):
            assert time.monotonic() < deadline, "beats never loaded the entries"
            time.sleep(0.2)
        time.sleep(2)
        delays = []
        for k in range(saves):
            saved_at = time.time()
            Entry("d7", NOOP, FAR, args=["d7"], kwargs={"k": k}).save(app)
            v = version(state)
            deadline = time.monotonic() + 10
            while not all(log_events(b, rf"dynamic entries at version {v}:") for b in beats):
                assert time.monotonic() < deadline, f"a beat never saw version {v}"
                time.sleep(0.05)
            delays.append(max(log_events(b, rf"dynamic entries at version {v}:")[0]
                              for b in beats) - saved_at)
            time.sleep(1.3)
        row.update(saves=saves, visible_all_max_s=max(delays),
                   visible_all_median_s=statistics.median(delays), load1=load())
    return row


# -- cpu: the leader, in-process ---------------------------------------------------------------

def cpu(n: int, saves: int = 15) -> dict[str, Any]:
    from celery_leaderbeat.scheduler import LEADER, Scheduler

    row: dict[str, Any] = {"scenario": "cpu", "entries": n, "load0": load()}
    with Rig("leaderbeat", {}) as rig:
        app, state = api_app(rig.state.url), rig.state.client()
        app.conf.update(broker_url=rig.broker.url, beat_schedule={})
        seed(app, n)
        scheduler = Scheduler(app=app)
        try:
            deadline = time.monotonic() + 60
            # the scheduler follows the run-time entries from its first tick on
            while (scheduler.role != LEADER or scheduler._dynamic is None
                   or scheduler._dynamic.seen < version(state)):
                assert time.monotonic() < deadline
                time.sleep(min(scheduler.tick(), 0.05))
            dynamic = scheduler._dynamic
            for _ in range(5):
                scheduler.tick()
            idle = []
            for _ in range(saves):
                t0 = time.process_time()
                scheduler.tick()
                idle.append(time.process_time() - t0)
            total = []
            for k in range(saves):
                seen = dynamic.seen
                Entry("d7", NOOP, FAR, args=["d7"], kwargs={"k": k}).save(app)
                dynamic.next_look = 0.0  # this tick looks at the store
                t0 = time.process_time()
                scheduler.tick()  # takes the change in: the store, then the leader's agenda
                total.append(time.process_time() - t0)
                assert dynamic.seen > seen
        finally:
            scheduler.close()
    row.update(saves=saves, idle_tick_ms=1000 * statistics.median(idle),
               save_total_ms=1000 * statistics.median(total), load1=load())
    return row


# -- import: 1,000 RedBeat entries -----------------------------------------------------------

def import_redbeat(n: int, redbeat_seconds: float) -> dict[str, Any]:
    from celery.schedules import crontab, schedule
    from redbeat import RedBeatSchedulerEntry

    from celery_leaderbeat.ops import redbeat_import

    row: dict[str, Any] = {"scenario": "import", "entries": n, "load0": load()}
    with Rig("redbeat", {}) as rig:
        rb = Celery("bench", broker=rig.broker.url_for(0))
        rb.conf.update(redbeat_redis_url=rig.state.url, timezone="UTC")
        crons = n // 10
        for i in range(n):
            sched = (crontab() if i < crons else schedule(timedelta(seconds=20 + i % 40)))
            RedBeatSchedulerEntry(f"r{i}", NOOP, sched, args=[f"r{i}"], app=rb).save()
        beat = rig.start_beat()
        time.sleep(redbeat_seconds)
        os.kill(beat.pid, signal.SIGTERM)
        beat.proc.wait(30)
        redbeat_sent = rig.watch.count
        last = {f"r{i}": RedBeatSchedulerEntry.from_key(f"redbeat:r{i}", app=rb).last_run_at
                for i in range(n)}
        app = api_app(rig.state.url)
        app.conf.update(broker_url=rig.broker.url_for(0))
        t0 = time.perf_counter()
        planned = redbeat_import.plan(app, rig.state.client(), "redbeat:")
        done, _there, skipped = redbeat_import.apply(app, planned)
        row.update(import_s=time.perf_counter() - t0, imported=done, skipped=skipped)
        switched = time.time()
        rig.kind = "leaderbeat"
        rig.env.update(LB_REDIS_URL=rig.state.url, LB_PREFIX="bench")
        ours = rig.start_beat()
        time.sleep(65)
        ours_msgs = [m for m in rig.watch.messages()[redbeat_sent:]]
        ours.close()
    first: dict[str, float] = {}
    for m in ours_msgs:
        if m.entry and m.slot is not None:
            first[m.entry] = min(first.get(m.entry, m.slot), m.slot)
    dev, twice, never = [], [], []
    for i in range(crons, n):
        name = f"r{i}"
        expected = last[name].timestamp() + 20 + i % 40  # RedBeat's next run
        if name not in first:
            never.append(name)
            continue
        if first[name] <= last[name].timestamp():
            twice.append(name)
        if expected >= switched:  # due after the switch: the phase must be RedBeat's
            dev.append(first[name] - expected)
    row.update(redbeat_seconds=redbeat_seconds, redbeat_sent=redbeat_sent,
               interval_first_runs=len(dev), phase_dev_worst_ms=1000 * max(map(abs, dev)),
               sent_twice=len(twice), intervals_not_sent=len(never),
               crontab_first_runs=sum(f"r{i}" in first for i in range(crons)), load1=load())
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=("visible", "cpu", "import"))
    parser.add_argument("--sizes", default="100,10000")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--redbeat-seconds", type=float, default=75.0)
    args = parser.parse_args()
    if args.scenario == "import":
        rows = [import_redbeat(args.n, args.redbeat_seconds)]
    else:
        run = visible if args.scenario == "visible" else cpu
        rows = [run(int(size)) for size in args.sizes.split(",")]
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as out:
        for row in rows:
            row["at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            out.write(json.dumps(row) + "\n")
            print(json.dumps(row))


if __name__ == "__main__":
    main()

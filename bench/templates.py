"""What a leader keeps to build messages: N runtime entries with options of their own, churned.

    python bench/templates.py [--entries 15000] [--cycles 3] [--churn 5000] [--tracemalloc]

An in-process leader against a redis-server of its own (its state and the broker)
follows N runtime entries (``Entry(...).save``), each with options of its own (a
shape each), daily (nothing comes due) so it prepares every message in idle
time. Then ``--cycles`` times: ``--churn`` entries are removed and as many new
ones added (with options of their own), and the leader prepares them. After
each step it prints the process's VmRSS, the memory Python traced
(``--tracemalloc``: slower, exact) and what the message store keeps: entries
(parts), shapes and task look-ups. Rows are appended to
bench/results/templates.jsonl. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from celery import Celery

from celery_leaderbeat import Entry
from celery_leaderbeat.scheduler import LEADER, Scheduler
from tests.support.beat import NOOP
from tests.support.redis_server import RedisServer

RESULTS = Path(__file__).resolve().parent / "results" / "templates.jsonl"
DAY = 86400.0


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def save(app: Celery, names: range, cycle: int) -> None:
    for i in names:
        name = f"e{i}"
        Entry(name, NOOP, DAY, args=[name],
              options={"headers": {"tenant": f"{name}/{cycle}"}, "priority": i % 10}).save(app)


def prepared(scheduler: Scheduler, count: int, timeout: float = 600.0) -> None:
    """Tick until the leader follows ``count`` runtime entries and has prepared them all."""
    deadline = time.monotonic() + timeout
    while True:
        delay = scheduler.tick()
        dynamic = sum(1 for e in scheduler.schedule.values()
                      if getattr(e, "leaderbeat_source", None) == "dynamic")
        epoch = scheduler._shared.lease.epoch if scheduler._shared else None
        if (scheduler.role == LEADER and dynamic == count
                and scheduler._warmed == (scheduler._schedule_version, epoch)):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"not prepared after {timeout} s: {dynamic} of {count}")
        time.sleep(min(delay, 0.01))


def measure(step: str, scheduler: Scheduler, traced: bool) -> dict[str, Any]:
    gc.collect()
    messages = scheduler._enqueuer.messages if scheduler._enqueuer else None
    row = {"step": step, "entries": len(scheduler.schedule), "rss_mib": round(rss_mib(), 1),
           "kept_entries": len(messages._parts) if messages else 0,
           "kept_shapes": len(messages._shapes) if messages else 0,
           "kept_tasks": len(messages._tasks) if messages else 0}
    if traced:
        row["traced_mib"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 1)
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=15_000)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--churn", type=int, default=5_000)
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--label", default="", help="what the run measures (kept in the row)")
    args = parser.parse_args()
    if args.tracemalloc:
        tracemalloc.start()
    work = Path(tempfile.mkdtemp(prefix="lb-templates-"))
    logging.basicConfig(filename=str(work / "beat.log"), level=logging.INFO)
    server = RedisServer(workdir=work / "redis")
    app = Celery("bench")
    app.conf.update(broker_url=server.url_for(0), leaderbeat_key_prefix="t", timezone="UTC")
    scheduler = Scheduler(app=app)
    rows = []
    try:
        prepared(scheduler, 0)
        rows.append(measure("empty", scheduler, args.tracemalloc))
        save(app, range(args.entries), 0)
        prepared(scheduler, args.entries)
        rows.append(measure(f"{args.entries} entries", scheduler, args.tracemalloc))
        low = 0
        for cycle in range(1, args.cycles + 1):
            for i in range(low, low + args.churn):
                Entry(f"e{i}", NOOP, DAY).delete(app)
            save(app, range(low + args.entries, low + args.entries + args.churn), cycle)
            low += args.churn
            prepared(scheduler, args.entries)
            rows.append(measure(f"churn {cycle}: -{args.churn} +{args.churn}", scheduler,
                                args.tracemalloc))
    finally:
        scheduler.close()
        server.close()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False,
                            capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip() or "?"
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(json.dumps({"commit": commit, "args": vars(args), "rows": rows}) + "\n")


if __name__ == "__main__":
    main()

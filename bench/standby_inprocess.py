"""What a standby costs, in one process: its CPU while a leader beside it sends.

    python bench/standby_inprocess.py                     # 10,000 entries, 8 phases of 20 s
    python bench/standby_inprocess.py --runtime           # the same, run-time entries
    python bench/standby_inprocess.py --runtime --edit-every 0.05   # following 20 edits a second
    python bench/standby_inprocess.py ... --profile [--top 30] [--sort tottime]  # where its time goes
    python bench/standby_inprocess.py --reads 1250        # one look's read of 1,250 states, alone

A leader and a standby (two ``Scheduler`` objects, each with its own Celery app,
as two beats would have) run against a redis-server of the run's own: the
leader ticks in a thread, the standby in the main thread, as its beat's loop
would. Edits (``--edit-every``) are saved from a third thread, as
``bench/send_inprocess.py`` saves them: one run-time entry's interval made 15
or 25 s, its save the new anchor, as ``bench/dynamic_storm.py``'s storm does. Prints the standby's CPU seconds
(``time.thread_time`` of its thread) over the window, its share of a core, the
slots that fell due (the leader's sends) and the standby's CPU per 1,000 of
them. Quicker and steadier than the storm bench, which measures whole
processes; the figures in docs/benchmarks.md say which one they come from.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import logging
import pstats
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from celery import Celery

from bench.send_inprocess import Edits
from celery_leaderbeat.config import Config
from celery_leaderbeat.scheduler import LEADER, Scheduler
from celery_leaderbeat.store.dynamic import Entry
from celery_leaderbeat.store.open import open_store
from tests.support.beat import NOOP
from tests.support.redis_server import RedisServer


def schedule_arguments(parser: argparse.ArgumentParser) -> None:
    """The schedule's options (``schedule_of``), shared with ``bench/rescue_inprocess.py``."""
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=20, help="each entry's period (s)")
    parser.add_argument("--phases", type=int, default=8,
                        help="the entries fall due on this many seconds of each period")


def workspace(name: str) -> tuple[Path, RedisServer, str]:
    """A run's directory (the log at INFO in it, as a beat's), its own redis-server and a
    queue of its own; shared with ``bench/rescue_inprocess.py``."""
    work = Path(tempfile.mkdtemp(prefix=f"lb-{name}-"))
    logging.basicConfig(filename=str(work / "beat.log"), level=logging.INFO)
    return work, RedisServer(workdir=work / "redis"), f"lb-{name}-{uuid.uuid4().hex[:8]}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    schedule_arguments(parser)
    parser.add_argument("--runtime", action="store_true",
                        help="the entries saved through the Entry API, not in beat_schedule")
    parser.add_argument("--edit-every", type=float, default=0.0,
                        help="--runtime: one entry's interval edited every so many seconds")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--sort", default="cumulative",
                        help="--profile: the order (pstats: cumulative, tottime, ...)")
    parser.add_argument("--reads", type=int, default=0,
                        help="only time the read of this many entries' slot states (what a "
                             "standby's look reads), 500 times, and print the CPU of one")
    return parser.parse_args()


def schedule_of(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Entry i on the six-field cron due at second ``i % phases`` of every period."""
    return {f"e{i}": {"task": NOOP, "schedule": f"{i % args.phases}/{args.every} * * * * *",
                      "args": [f"e{i}"]} for i in range(args.entries)}


def make_app(server: RedisServer, queue: str, beat_schedule: dict[str, Any]) -> Celery:
    """A beat's app on the run's server and queue (shared with ``bench/rescue_inprocess.py``)."""
    app = Celery("bench")
    app.conf.update(broker_url=server.url_for(0), leaderbeat_key_prefix="b",
                    beat_schedule=beat_schedule, timezone="UTC",
                    beat_max_loop_interval=300, task_default_queue=queue)
    return app


class Loop(threading.Thread):
    """Runs ``step`` until stopped; ``step`` returns how long to sleep."""

    def __init__(self, step: Any) -> None:
        super().__init__(daemon=True)
        self.step, self.stop = step, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.stop.wait(min(self.step(), 1.0))


def main() -> None:
    args = parse_args()
    work, server, queue = workspace("standby-inprocess")
    static = {} if args.runtime else schedule_of(args)
    apps = [make_app(server, queue, static) for _ in range(3)]
    if args.runtime:
        for name, entry in schedule_of(args).items():
            Entry(name, entry["task"], entry["schedule"], args=entry["args"]).save(apps[2])
    client = server.client()
    leader, standby, reader = Scheduler(app=apps[0]), None, None
    loops = [Loop(leader.tick)]
    try:
        if args.reads:
            reader = open_store(Config.from_app(apps[1]))
            time_reads(leader, reader.ledger, args.reads)
            return
        deadline = time.monotonic() + 30
        while leader.role != LEADER:
            assert time.monotonic() < deadline, "no leader within 30 s"
            time.sleep(min(leader.tick(), 0.05))
        loops[0].start()
        standby = Scheduler(app=apps[1])
        warm_until = time.monotonic() + args.every + 5  # every entry followed, looked at once
        while time.monotonic() < warm_until:
            time.sleep(min(standby.tick(), 1.0))
        if args.edit_every:
            loops.append(Loop(Edits(apps[2], args.edit_every, list(schedule_of(args))).due))
            loops[-1].start()
        measure(args, standby, lambda: int(client.llen(queue)))
        assert leader.role == LEADER, "the leader lost its lease: the figures are not a standby's"
    finally:
        for loop in loops:
            if loop.is_alive():
                loop.stop.set()
                loop.join(5)
        for scheduler in (standby, leader):
            if scheduler is not None:
                scheduler.close()
        if reader is not None:
            reader.close()
        server.close()
        shutil.rmtree(work, ignore_errors=True)


def time_reads(scheduler: Scheduler, ledger: Any, n: int) -> None:
    """Elect ``scheduler`` (it anchors every entry: each has a state), then time the read of
    ``n`` entries' states as a standby's look makes it (``ledger``: another node's), 500
    times."""
    deadline = time.monotonic() + 30
    while len(names := sorted(ledger.load())[:n]) < n:
        assert time.monotonic() < deadline, f"only {len(names)} entries have a state"
        time.sleep(min(scheduler.tick(), 0.05))
    for _ in range(50):  # warm
        ledger.load(names)
    started = time.thread_time()
    for _ in range(500):
        ledger.load(names)
    cpu = (time.thread_time() - started) / 500
    print(f"the read of {n} entries' states: {1000 * cpu:.3f} CPU ms each")


class Collections:
    """CPU seconds the standby's thread spends in Python's cyclic collector (``gc.callbacks``).

    A collection of the older generations scans every object the process holds: one in
    the window costs more than a hundred milliseconds, which the run either catches or
    does not. The window starts after a full collection and the figure says how much of
    it was the collector's."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.seconds, self.count, self._started = 0.0, 0, 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if threading.get_ident() != self.thread:
            return
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._started
            self.count += 1


def measure(args: argparse.Namespace, standby: Scheduler, enqueued: Any) -> None:
    # timed by the thread's CPU clock: the waits on the socket and in sleep count nothing
    profile = cProfile.Profile(time.thread_time) if args.profile else None
    gc.collect()
    collections = Collections()
    gc.callbacks.append(collections)
    n0, cpu0, t0 = enqueued(), time.thread_time(), time.monotonic()
    ticks = 0
    if profile:
        profile.enable()
    while time.monotonic() < t0 + args.seconds:
        delay = standby.tick()
        ticks += 1
        time.sleep(min(delay, 1.0))
    if profile:
        profile.disable()
    gc.callbacks.remove(collections)
    cpu, wall, due = time.thread_time() - cpu0, time.monotonic() - t0, enqueued() - n0
    print(f"standby of {args.entries} {'run-time' if args.runtime else 'static'} entries"
          f"{f', an edit every {args.edit_every:g} s' if args.edit_every else ''}: "
          f"{cpu:.3f} CPU s in {wall:.1f} s ({100 * cpu / wall:.2f} % of a core"
          f"{', profiled' if profile else ''}), {due} slots due, "
          f"{1000 * cpu / max(due, 1):.4f} CPU s per 1,000, {ticks} ticks; of it the "
          f"collector {collections.seconds:.3f} s ({collections.count} collections)")
    if profile:
        pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()

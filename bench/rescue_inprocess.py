"""What a rescue costs, in one process: standbys sending the bursts a stopped leader left.

    python bench/rescue_inprocess.py                  # 10,000 entries, 8 phases of 20 s
    python bench/rescue_inprocess.py --standbys 2     # two standbys race for the bursts
                                                      # (one interpreter lock: not two beats)
    python bench/rescue_inprocess.py --seconds 30

A leader and one or more standbys (``Scheduler`` objects with Celery apps of their own,
as beats would have) run against a redis-server of the run's own, the broker on the
same server, so the leader claims and enqueues in one step and a rescue claims, then
publishes. Once every entry has been sent and looked at, the leader stops ticking
while its heartbeat thread goes on renewing the lease: the slots due afterwards are
rescued, ``rescue_after`` (2 s) after their time, until the heartbeat gives the lease
up (a loop silent past its planned wake-up and a ttl) and a standby is elected. The
first standby ticks in the main thread, the others in threads of their own. Prints,
for each of the first standby's rescue batches, its slots, wall seconds and the
thread's CPU seconds, then how late the rescued slots (epoch 0) reached the broker
(read from their ``leaderbeat_slot`` header and the moment a thread of this process
drained them, every 20 ms; the tests' ``Recorder``), and how many a leader sent.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.standby_inprocess import Loop, make_app, schedule_arguments, schedule_of, workspace
from celery_leaderbeat.integrations.lifecycle import LEADER
from celery_leaderbeat.roles import standby as standby_module
from celery_leaderbeat.scheduler import Scheduler
from tests.support.recorder import Recorder


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    schedule_arguments(parser)
    parser.add_argument("--standbys", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=25.0,
                        help="how long the standbys rescue after the leader stops")
    return parser.parse_args()


class Batches:
    """Wall and thread-CPU seconds of each rescue batch of the main thread's standby."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, float, float, int]] = []
        self.thread = threading.get_ident()
        original = standby_module.Standby._claim_and_send

        def timed(standby: Any, unclaimed: list[Any]) -> Any:
            if threading.get_ident() != self.thread:
                return original(standby, unclaimed)
            wall, cpu = time.monotonic(), time.thread_time()
            outcome = original(standby, unclaimed)
            self.rows.append((len(unclaimed), time.monotonic() - wall,
                              time.thread_time() - cpu, outcome.sent if outcome else 0))
            return outcome

        standby_module.Standby._claim_and_send = timed  # type: ignore[method-assign,assignment]


class Drain(threading.Thread):
    """Drains the queue every 20 ms (the tests' :class:`Recorder`: each message with when
    it was seen, so its lateness)."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__(daemon=True)
        self.recorder, self.stop = recorder, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.02):
            self.recorder.drain()


def main() -> None:
    args = parse_args()
    work, server, queue = workspace("rescue-inprocess")
    client = server.client()
    batches = Batches()
    schedule = schedule_of(args)
    leader = Scheduler(app=make_app(server, queue, schedule))
    standbys = [Scheduler(app=make_app(server, queue, schedule)) for _ in range(args.standbys)]
    loops = [Loop(leader.tick)] + [Loop(s.tick) for s in standbys[1:]]
    try:
        deadline = time.monotonic() + 30
        while leader.role != LEADER:
            assert time.monotonic() < deadline, "no leader within 30 s"
            time.sleep(min(leader.tick(), 0.05))
        for loop in loops:
            loop.start()
        warm_until = time.monotonic() + args.every + 5  # every entry sent and looked at once
        while time.monotonic() < warm_until:
            time.sleep(min(standbys[0].tick(), 1.0))
        loops[0].stop.set()  # the leader stops sending; its heartbeat renews on
        loops[0].join()
        client.delete(queue)
        batches.rows.clear()
        drain = Drain(Recorder(server.client(), queue))
        drain.start()
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:  # a standby's tick waits inside itself
            time.sleep(min(standbys[0].tick(), 1.0))
        time.sleep(1.0)
        drain.stop.set()
        drain.join()
        drain.recorder.drain()
        report(args, batches, drain.recorder.messages, standbys[0].role)
    finally:
        for loop in loops:
            loop.stop.set()
        for scheduler in [*standbys, leader]:
            scheduler.close()
        server.close()
        shutil.rmtree(work, ignore_errors=True)


def report(args: argparse.Namespace, batches: Batches, messages: list[Any], role: str) -> None:
    print(f"{args.entries} entries in {args.phases} phases of {args.every} s, "
          f"{args.standbys} standby(s), the leader stopped:")
    for slots, wall, cpu, sent in batches.rows:
        print(f"  a rescue batch of {slots} slots (the first standby sent {sent}): "
              f"{1000 * wall:.0f} ms wall, {1000 * cpu:.0f} CPU ms")
    late = sorted(m.lateness for m in messages if m.epoch == 0)
    if late:
        print(f"  {len(late)} rescued slots reached the broker; lateness p50 "
              f"{late[len(late) // 2]:.2f} s, p99 {late[int(len(late) * 0.99)]:.2f} s, "
              f"worst {late[-1]:.2f} s")
    led = len(messages) - len(late)
    if led:
        print(f"  {led} slots were sent by a leader (the first standby is now {role}): the "
              "stopped leader's lease lapsed and a standby was elected")


if __name__ == "__main__":
    main()

"""The send path: claim and enqueue in one step against batched publishing, RedBeat and stock.

    python bench/send.py steady  [--entries 2000 --every 5 --seconds 60] [--kinds ...]
    python bench/send.py burst   [--entries 10000] [--standbys 2] [--bursts 1] [--kinds ...]
    python bench/send.py rabbit  [--entries 2000 --every 5 --seconds 60]
    python bench/send.py kill    [--entries 2000] [--at 550] [--kinds fast,batched]
    python bench/send.py all

Kinds: ``fast`` is leaderbeat with its state on the broker's own Redis server
and database (the default when the broker is Redis: claim and enqueue in one
step); ``batched`` is leaderbeat with its state on another Redis server
(claim, then publish the chunk in one kombu batch); ``redbeat`` and ``stock``
are RedBeat and Celery's PersistentScheduler on the same app and schedule.

Every scenario starts its own redis-server processes on free ports and real
``celery beat`` processes; RabbitMQ is the one on 127.0.0.1:5672, with a queue
of the run's own. Results are appended as JSON lines to
bench/results/send.jsonl. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import LEASE_TTL, LOOP, SCHEDULERS, Watch, cpu_seconds, load, versions

from tests.support.beat import NOOP, BeatProcess, beat_env
from tests.support.redis_server import RedisServer

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is 3.11+

RESULTS = Path(__file__).resolve().parent / "results"
BURST_EVERY = 30  # seconds between bursts of the burst and kill scenarios (cron, seconds first)


def save(row: dict[str, Any]) -> None:
    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / "send.jsonl", "a") as out:
        out.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def interval_entries(n: int, every: float) -> dict[str, dict[str, Any]]:
    return {f"e{i}": {"task": NOOP, "every": every, "args": [f"e{i}"]} for i in range(n)}


def cron_entries(n: int) -> dict[str, dict[str, Any]]:
    """``n`` entries on one cron expression, every ``BURST_EVERY`` seconds at :00 and :30."""
    return {f"e{i}": {"task": NOOP, "cron": f"*/{BURST_EVERY} * * * * *", "args": [f"e{i}"]}
            for i in range(n)}


class SendRig:
    """One run: a broker Redis (holding leaderbeat's state for ``fast``), a watch, beats."""

    def __init__(self, kind: str, schedule: dict[str, dict[str, Any]],
                 settings: dict[str, Any] | None = None, broker_url: str | None = None) -> None:
        self.kind = kind
        self.work = Path(tempfile.mkdtemp(prefix=f"lb-send-{kind}-"))
        self.broker = RedisServer(workdir=self.work / "broker")
        self.state = self.broker if kind == "fast" else RedisServer(workdir=self.work / "state")
        conf: dict[str, Any] = {"beat_max_loop_interval": LOOP}
        if kind == "redbeat":
            conf.update(redbeat_redis_url=self.state.url, redbeat_lock_timeout=LEASE_TTL)
        conf.update(settings or {})
        self.env = beat_env(self.work, broker_url=broker_url or self.broker.url_for(0),
                            redis_url=self.state.url if kind == "batched" else None,
                            prefix="bench" if kind in ("fast", "batched") else None,
                            schedule=schedule, settings=conf)
        self.beats: list[BeatProcess] = []
        self.watch = Watch(self.broker.client()) if broker_url is None else None

    def start_beat(self) -> BeatProcess:
        beat = BeatProcess("bench.benchapp", self.env, self.work / f"beat-{len(self.beats)}.log",
                           scheduler=SCHEDULERS["stock" if self.kind == "stock" else
                                                "redbeat" if self.kind == "redbeat" else
                                                "leaderbeat"])
        self.beats.append(beat)
        if self.watch is not None:
            self.watch.sample(beat.pid)
        return beat

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()
        for beat in self.beats:
            beat.close()
        if self.state is not self.broker:
            self.state.close()
        self.broker.close()
        shutil.rmtree(self.work, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def steady(kind: str, n: int, every: float, seconds: float) -> dict[str, Any]:
    """One beat, ``n`` entries every ``every`` s: CPU seconds per 1,000 sends over a window."""
    with SendRig(kind, interval_entries(n, every)) as rig:
        assert rig.watch is not None
        beat = rig.start_beat()
        rig.watch.wait_count(1, 120)
        time.sleep(every + 1)
        cpu0, sent0, t0 = cpu_seconds(beat.pid), rig.watch.count, time.time()
        time.sleep(seconds)
        cpu, sent = cpu_seconds(beat.pid) - cpu0, rig.watch.count - sent0
        elapsed = time.time() - t0
        late = sorted(m.lateness for m in rig.watch.messages()[sent0:] if m.lateness is not None)
        return {"scenario": "steady", "kind": kind, "entries": n, "every": every,
                "window_s": round(elapsed, 1), "sent": sent,
                "expected": round(n * elapsed / every), "cpu_s": round(cpu, 2),
                "cpu_per_1000": round(1000 * cpu / max(sent, 1), 3),
                "late_p99_s": round(late[int(0.99 * (len(late) - 1))], 3) if late else None,
                "load": load()}


def _next_burst(after: float) -> float:
    return (int(after) // BURST_EVERY + 1) * BURST_EVERY


def _wait_leader(rig: SendRig, timeout: float = 120) -> BeatProcess:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for beat in rig.beats:
            if "elected leader" in beat.log_text():
                return beat
        time.sleep(0.2)
    raise RuntimeError("no leader elected")


def burst(kind: str, n: int, standbys: int, bursts: int = 1) -> list[dict[str, Any]]:
    """``n`` entries on one cron, due the same second; one leader and ``standbys`` more.

    One row per burst, ``bursts`` in a row (``BURST_EVERY`` s apart). The first may
    come before the leader prepared every entry's message in idle time (how much it
    prepared depends on when the slot falls after the election); later ones do not.
    """
    rows = []
    with SendRig(kind, cron_entries(n)) as rig:
        assert rig.watch is not None
        leader = rig.start_beat()
        _wait_leader(rig)
        for _ in range(standbys):
            rig.start_beat()
        time.sleep(3)  # every standby loaded its schedule
        slot = _next_burst(time.time() + 5)
        for index in range(bursts):
            while time.time() < slot - 1:
                time.sleep(0.1)
            base = rig.watch.count
            cpu0 = {b.pid: cpu_seconds(b.pid) for b in rig.beats}
            deadline = slot + 30
            while rig.watch.count - base < n and time.time() < deadline:
                time.sleep(0.02)
            time.sleep(0.5)
            cpu = {b.pid: cpu_seconds(b.pid) - cpu0[b.pid] for b in rig.beats}
            msgs = [m for m in rig.watch.messages()[base:] if m.slot == slot]
            by_pid = Counter(m.pid for m in msgs)
            received = sorted(m.received for m in msgs)
            rows.append({
                "scenario": "burst", "kind": kind, "entries": n, "standbys": standbys,
                "burst": index + 1, "sent": len(msgs), "distinct": len({m.entry for m in msgs}),
                "first_s": round(received[0] - slot, 3) if received else None,
                "last_s": round(received[-1] - slot, 3) if received else None,
                "by_leader": by_pid.get(leader.pid, 0),
                "rescued": len(msgs) - by_pid.get(leader.pid, 0),
                "cpu_leader_s": round(cpu[leader.pid], 2),
                "cpu_standbys_s": [round(cpu[b.pid], 2) for b in rig.beats[1:]],
                "watch_period_s": rig.watch.period, "load": load()})
            slot += BURST_EVERY
    return rows


def rabbit(n: int, every: float, seconds: float) -> dict[str, Any]:
    """Leaderbeat on a RabbitMQ broker: CPU per 1,000 sends, counted from its own history."""
    import kombu

    queue = f"lb-send-bench-{uuid.uuid4().hex[:8]}"
    amqp = "amqp://guest:guest@127.0.0.1:5672//"
    settings = {"task_default_queue": queue}
    conn = kombu.Connection(amqp)
    with SendRig("batched", interval_entries(n, every), settings, broker_url=amqp) as rig:
        beat = rig.start_beat()

        def sent() -> int:  # nobody consumes: the queue's depth is what was enqueued
            try:
                return int(kombu.Queue(queue, channel=conn.default_channel)
                           .queue_declare(passive=True).message_count)
            except conn.channel_errors:  # not declared yet
                conn.close()
                return 0

        deadline = time.monotonic() + 120
        while sent() == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(every + 1)
        cpu0, sent0, t0 = cpu_seconds(beat.pid), sent(), time.time()
        time.sleep(seconds)
        cpu, count = cpu_seconds(beat.pid) - cpu0, sent() - sent0
        elapsed = time.time() - t0
        log = beat.log_text()
    kombu.Queue(queue, channel=conn.channel()).delete()
    conn.close()
    return {"scenario": "rabbit", "kind": "batched", "entries": n, "every": every,
            "window_s": round(elapsed, 1), "sent": count, "expected": round(n * elapsed / every),
            "cpu_s": round(cpu, 2), "cpu_per_1000": round(1000 * cpu / max(count, 1), 3),
            "batching": "send path single_write" in log and "Producer" not in log, "load": load()}


def kill(kind: str, n: int, at: int) -> dict[str, Any]:
    """SIGKILL of the leader ``at`` messages into an ``n``-entry burst; no guard, no recovery.

    Every slot of the burst must be enqueued exactly once (a worker without the
    guard runs what is enqueued, once each).
    """
    with SendRig(kind, cron_entries(n)) as rig:
        assert rig.watch is not None
        leader = rig.start_beat()
        _wait_leader(rig)
        standby = rig.start_beat()
        time.sleep(3)
        slot = _next_burst(time.time() + 5)
        base = rig.watch.count
        while rig.watch.count - base < at and time.time() < slot + 30:
            time.sleep(0.001)
        leader.kill()
        killed_at = rig.watch.count - base
        deadline = time.time() + 3 * LEASE_TTL
        while time.time() < deadline and len({m.entry for m in rig.watch.messages()[base:]
                                               if m.slot == slot}) < n:
            time.sleep(0.2)
        time.sleep(1)
        msgs = [m for m in rig.watch.messages()[base:] if m.slot == slot]
        per_entry = Counter(m.entry for m in msgs)
        log = standby.log_text()
    return {"scenario": "kill", "kind": kind, "entries": n, "killed_after": killed_at,
            "enqueued": len(msgs), "distinct": len(per_entry),
            "missing": n - len(per_entry), "twice": sum(1 for c in per_entry.values() if c > 1),
            "reported_unsent": sum(int(x) for x in re.findall(
                r"(\d+) slot\(s\) were claimed but not confirmed sent", log)),
            "load": load()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["steady", "burst", "rabbit", "kill", "all"])
    parser.add_argument("--kinds", default=None)
    parser.add_argument("--entries", type=int, default=None)
    parser.add_argument("--every", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--standbys", type=int, default=2)
    parser.add_argument("--at", type=int, default=550)
    parser.add_argument("--bursts", type=int, default=1, help="burst: bursts in a row")
    args = parser.parse_args()
    save({"scenario": "env", **versions()})
    todo = ["steady", "burst", "rabbit", "kill"] if args.what == "all" else [args.what]
    for what in todo:
        if what == "steady":
            for kind in (args.kinds or "fast,batched,redbeat,stock").split(","):
                save(steady(kind, args.entries or 2000, args.every, args.seconds))
        elif what == "burst":
            for kind in (args.kinds or "fast,batched").split(","):
                for row in burst(kind, args.entries or 10_000, args.standbys, args.bursts):
                    save(row)
        elif what == "rabbit":
            save(rabbit(args.entries or 2000, args.every, args.seconds))
        elif what == "kill":
            for kind in (args.kinds or "fast,batched").split(","):
                save(kill(kind, args.entries or 2000, args.at))


if __name__ == "__main__":
    main()

"""The PostgreSQL store beside the Redis store, same RabbitMQ broker, real ``celery beat``.

    python bench/pg_send.py steady [--entries 2000 --every 5 --seconds 60] [--stores postgresql,redis]
    python bench/pg_send.py burst  [--entries 10000 --standbys 2 --bursts 2] [--stores ...]
    python bench/pg_send.py claim  [--chunk 100 --rounds 500] [--prepare] [--attribute]

``steady``: one beat, ``--entries`` every ``--every`` s; over a window of ``--seconds``,
the beat's CPU seconds per 1,000 sends and the store server's beside it (every process
of the PostgreSQL cluster, or the redis-server), from /proc.
``burst``: ``--entries`` on one cron, due the same second, one leader and ``--standbys``
more: when the last message reached the queue after the slot, and how many slots a
standby rescued from the healthy leader (expected 0).
``claim``: bench/pg_claim.py's 100-slot claim, on the cluster of the bench's own; the
bench's CPU seconds and the server's beside the latencies.

Each run starts the store's server of its own (bench/pg_rig.py: a PostgreSQL cluster with
fsync on, or a redis-server on a free port) and consumes a RabbitMQ queue of its own on
127.0.0.1:5672. Rows are appended as JSON lines, each with the load average, to
bench/results/pg_send.jsonl. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import LOOP, SCHEDULERS
from pg_rig import (
    Consumer,
    Seen,
    StoreServer,
    cpu_seconds,
    durable_cluster,
    load,
    store_server,
    tree_cpu,
    versions,
)
from send import BURST_EVERY, _next_burst, cron_entries, interval_entries

from tests.support.beat import BeatProcess, beat_env

RESULTS = Path(__file__).resolve().parent / "results"


def save(row: dict[str, Any]) -> None:
    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / "pg_send.jsonl", "a") as out:
        out.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


class Run:
    """One store's run: its server, a consumer of a queue of its own, and beats."""

    def __init__(self, store: StoreServer, consumer: Consumer, work: Path,
                 schedule: dict[str, dict[str, Any]]) -> None:
        self.store, self.consumer, self.work = store, consumer, work
        settings = {"beat_max_loop_interval": LOOP, "task_default_queue": consumer.queue,
                    **store.settings}
        self.env = beat_env(work, broker_url="amqp://guest:guest@127.0.0.1:5672//",
                            redis_url=store.redis_url, prefix="bench", schedule=schedule,
                            settings=settings)
        self.beats: list[BeatProcess] = []

    def start_beat(self) -> BeatProcess:
        beat = BeatProcess("bench.benchapp", self.env, self.work / f"beat-{len(self.beats)}.log",
                           scheduler=SCHEDULERS["leaderbeat"])
        self.beats.append(beat)
        return beat

    def wait_leader(self, timeout: float = 180) -> BeatProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for beat in self.beats:
                if "elected leader" in beat.log_text():
                    return beat
            time.sleep(0.2)
        raise RuntimeError("no leader elected:\n" + self.beats[0].log_text()[-3000:])

    def close(self) -> None:
        for beat in self.beats:
            beat.close()


def run_store(kind: str, schedule: dict[str, dict[str, Any]], body: Any) -> Any:
    """``body(run)`` with the store's server, a consumer and the run's beats; all closed."""
    work = Path(tempfile.mkdtemp(prefix=f"lb-pgsend-{kind}-"))
    try:
        with store_server(kind, work) as store:
            consumer = Consumer()
            run = Run(store, consumer, work, schedule)
            try:
                return body(run)
            finally:
                run.close()
                consumer.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _p99(values: list[float]) -> float | None:
    values = sorted(values)
    return round(values[int(0.99 * (len(values) - 1))], 3) if values else None


def _slot_time(seen: Seen) -> float:
    return datetime.fromisoformat(seen.slot).timestamp()


def steady(kind: str, n: int, every: float, seconds: float) -> dict[str, Any]:
    """One beat, ``n`` entries every ``every`` s: beat and server CPU per 1,000 sends."""
    def body(run: Run) -> dict[str, Any]:
        beat = run.start_beat()
        if not run.consumer.wait_count(1, 180):
            raise RuntimeError("nothing sent in 180 s:\n" + beat.log_text()[-3000:])
        time.sleep(every + 1)  # past the first batch and the start-up
        load0, sent0, t0 = load(), run.consumer.count, time.time()
        cpu0, server0 = cpu_seconds(beat.pid), run.store.cpu()
        time.sleep(seconds)
        cpu, server = cpu_seconds(beat.pid) - cpu0, run.store.cpu() - server0
        msgs = run.consumer.seen[sent0:]
        elapsed = time.time() - t0
        per = Counter((m.entry, m.slot) for m in msgs)
        batches = [b for b in _logged_batches(beat) if b[0] > 0][1:]  # past the first
        return {"scenario": "steady", "store": kind, "entries": n, "every": every,
                "window_s": round(elapsed, 1), "sent": len(msgs),
                "expected": round(n * elapsed / every),
                "twice": sum(1 for c in per.values() if c > 1),
                "beat_cpu_s": round(cpu, 2), "server_cpu_s": round(server, 2),
                "beat_cpu_per_1000": round(1000 * cpu / max(len(msgs), 1), 3),
                "server_cpu_per_1000": round(1000 * server / max(len(msgs), 1), 3),
                "late_p99_s": _p99([m.received - _slot_time(m) for m in msgs]),
                "batch_ms_max": max((b[1] for b in batches), default=None),
                "batch_start_late_ms_max": max((b[2] for b in batches), default=None),
                "load_before": load0, "load_after": load()}
    return run_store(kind, interval_entries(n, every), body)  # type: ignore[no-any-return]


def _logged_batches(beat: BeatProcess) -> list[tuple[int, int, int]]:
    """(sent, duration ms, start ms after the earliest was due) of each logged batch."""
    found = re.findall(r"sent (\d+) slot\(s\) of \d+ due entries in (\d+) ms, "
                       r"(\d+) ms after the earliest was due", beat.log_text())
    return [(int(a), int(b), int(c)) for a, b, c in found]


def _enqueued(depths: list[tuple[float, int]], slot: int, n: int
              ) -> tuple[float | None, float | None]:
    """(first, last) message in the queue, s after the slot, from a held consumer's reads
    of the queue's depth (each within :data:`DEPTH_EVERY` s of the broker having it)."""
    first = next((t for t, depth in depths if depth > 0), None)
    last = next((t for t, depth in depths if depth >= n), None)
    return (None if first is None else round(first - slot, 3),
            None if last is None else round(last - slot, 3))


def _burst_row(run: Run, leader: BeatProcess, slot: int, base: int, n: int,
               logged: int, cpu: dict[int, float], measure: str) -> dict[str, Any]:
    """``cpu``: the CPU seconds each beat (by pid) and the server (0) spent on the burst."""
    msgs = [m for m in run.consumer.seen[base:] if _slot_time(m) == slot]
    by_pid = Counter(m.pid for m in msgs)
    received = sorted(m.received for m in msgs)
    batches = [b for b in _logged_batches(leader)[logged:] if b[0] > 0]
    if measure == "depth":
        first_s, last_s = _enqueued(run.consumer.depths, slot, n)
    else:
        first_s = round(received[0] - slot, 3) if received else None
        last_s = round(received[-1] - slot, 3) if received else None
    return {
        "scenario": "burst", "store": run.store.kind, "entries": n,
        "standbys": len(run.beats) - 1, "sent": len(msgs),
        "distinct": len({m.entry for m in msgs}), "measure": measure,
        "first_s": first_s, "last_s": last_s,
        "leader_logged": [{"sent": b[0], "duration_ms": b[1], "start_late_ms": b[2]}
                          for b in batches],
        "by_leader": by_pid.get(leader.pid, 0),
        "rescued": len(msgs) - by_pid.get(leader.pid, 0),
        "rescue_lines": sum(b.log_text().count(" rescued ") for b in run.beats),
        "cpu_leader_s": round(cpu[leader.pid], 2),
        "cpu_standbys_s": [round(cpu[b.pid], 2) for b in run.beats if b is not leader],
        "server_cpu_s": round(cpu[0], 2), "load": load()}


def _cpu(run: Run) -> dict[int, float]:
    return {b.pid: cpu_seconds(b.pid) for b in run.beats} | {0: run.store.cpu()}


def _wait_burst(run: Run, slot: int, base: int, n: int, measure: str) -> None:
    """Until the burst's ``n`` messages were enqueued (or 30 s past the slot), and 3 s
    more: a late rescue would show by then."""
    def enqueued() -> int:
        if measure == "depth":
            return run.consumer.depths[-1][1] if run.consumer.depths else 0
        return run.consumer.count - base
    while enqueued() < n and time.time() < slot + 30:
        time.sleep(0.05)
    time.sleep(3)


def _take_in(run: Run, base: int) -> None:
    """A held consumer takes in what it held (the checks of each slot once need it)."""
    held = run.consumer.depths[-1][1] if run.consumer.depths else 0
    run.consumer.release()
    deadline = time.time() + 30
    while run.consumer.count - base < held and time.time() < deadline:
        time.sleep(0.05)


def burst(kind: str, n: int, standbys: int, bursts: int,
          measure: str = "depth") -> list[dict[str, Any]]:
    """``n`` entries due the same second, one leader and ``standbys`` more; ``bursts`` in
    a row, ``BURST_EVERY`` s apart (the first may come before the leader prepared every
    entry's message in idle time; later ones do not).

    ``measure``: ``depth`` (the consumer held from a second before the slot, the queue's
    depth read every 20 ms: when each message was enqueued, no consumer beside the
    beats) or ``consume`` (a consumer taking each message as it comes: when each was
    received, the consumer's CPU and lag included)."""
    def body(run: Run) -> list[dict[str, Any]]:
        leader = run.start_beat()
        run.wait_leader()
        for _ in range(standbys):
            run.start_beat()
        time.sleep(8)  # every standby imported and loaded its schedule
        rows = []
        slot = _next_burst(time.time() + 5)
        for index in range(bursts):
            while time.time() < slot - 1:
                time.sleep(0.1)
            if measure == "depth":
                run.consumer.hold()
            base, logged, load0 = run.consumer.count, len(_logged_batches(leader)), load()
            cpu0 = _cpu(run)
            _wait_burst(run, slot, base, n, measure)
            cpu = {pid: seconds - cpu0[pid] for pid, seconds in _cpu(run).items()}
            if measure == "depth":
                _take_in(run, base)
            row = _burst_row(run, leader, slot, base, n, logged, cpu, measure)
            rows.append({**row, "burst": index + 1, "load_before": load0})
            slot += BURST_EVERY
        return rows
    return run_store(kind, cron_entries(n), body)  # type: ignore[no-any-return]


def claim(chunk: int, rounds: int, prepare: bool, attribute: bool = False) -> dict[str, Any]:
    """bench/pg_claim.py's measurement, on a cluster of the bench's own (fsync on)."""
    from pg_claim import run

    with durable_cluster() as cluster:
        server = int((cluster.data / "postmaster.pid").read_text().split()[0])
        load0, client0, server0 = load(), time.process_time(), tree_cpu(server)
        text = run(cluster.conninfo, chunk, rounds, 50, 5 if prepare else None,
                   attribute=attribute)
        client = time.process_time() - client0
        time.sleep(1)  # the closed pool's backends exited and their parent reaped them
        server_cpu = tree_cpu(server) - server0
    # CPU seconds over every round (warm-up and set-up included): steadier than the
    # latencies on a shared machine
    return {"scenario": "claim", "store": "postgresql", "result": text,
            "client_cpu_s": round(client, 2), "server_cpu_s": round(server_cpu, 2),
            "load_before": load0, "load_after": load()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["steady", "burst", "claim"])
    parser.add_argument("--stores", default="postgresql,redis")
    parser.add_argument("--entries", type=int, default=None)
    parser.add_argument("--every", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--standbys", type=int, default=2)
    parser.add_argument("--bursts", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--prepare", action="store_true")
    parser.add_argument("--measure", choices=["depth", "consume"], default="depth",
                        help="burst: when each message was enqueued (the queue's depth, "
                        "no consumer meanwhile) or received (a consumer beside the beats)")
    parser.add_argument("--attribute", action="store_true",
                        help="claim: which rounds pruned the history or opened a WAL segment")
    args = parser.parse_args()
    save({"scenario": "env", **versions()})
    if args.what == "claim":
        save(claim(args.chunk, args.rounds, args.prepare, args.attribute))
        return
    for kind in args.stores.split(","):
        if args.what == "steady":
            save(steady(kind, args.entries or 2000, args.every, args.seconds))
        else:
            for row in burst(kind, args.entries or 10_000, args.standbys, args.bursts,
                             args.measure):
                save(row)


if __name__ == "__main__":
    main()

"""celery_leaderbeat against Celery's PersistentScheduler and RedBeat, in one run.

    python bench/compare.py tick     [--sizes 100,1000,10000,100000] [--kinds ...] [--quick]
    python bench/compare.py target   # one leader, 2,000 entries every 5 s, 60 s
    python bench/compare.py redis    # Redis commands per batch / per 1,000 sends, +2 standbys
    python bench/compare.py failover [--repeats 10]   # SIGKILL and SIGTERM of the leader
    python bench/compare.py pause    [--repeats 3]    # SIGSTOP mid-batch past the ttl
    python bench/compare.py memory   # RSS at 100,000 entries, takeover (reload) time
    python bench/compare.py restart  # state Redis restarted empty: time to the next send
    python bench/compare.py all [--quick]
    python bench/compare.py plot     # docs/img/*.png from bench/results/*.jsonl

Every scenario starts its own redis-server processes on free ports (state and
broker apart) and real ``celery beat`` processes; it never touches another
Redis. Each measurement is appended, as one JSON line with the load average,
to bench/results/<scenario>.jsonl, so chunks run at different times can be
compared and their spread reported. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _scenarios as sc
from _harness import versions

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("leaderbeat", "stock", "redbeat")
QUICK = False


def save(name: str, rows: list[dict] | dict) -> None:
    global RESULTS
    if QUICK:
        RESULTS = RESULTS.with_name("results-quick")  # never mixed into the published runs
    RESULTS.mkdir(exist_ok=True)
    rows = rows if isinstance(rows, list) else [rows]
    with open(RESULTS / f"{name}.jsonl", "a") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


def save_each(name: str, runs: Iterable[list[dict] | dict]) -> None:
    """Save each run's rows as it ends (``runs``: a generator, so a failed run keeps the
    rows of the runs before it)."""
    for rows in runs:
        save(name, rows)


def run_tick(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    window = 8 if args.quick else args.window
    for n in sizes:
        for kind in args.kinds:
            if "busy" in args.parts:
                save("tick", sc.tick_busy(kind, n, window, start_cap=args.start_cap))
            if "idle" in args.parts:
                save("tick", sc.tick_idle(kind, n, window, start_cap=args.start_cap))
            if "all" in args.parts:
                save("tick", sc.tick_all(kind, n, every=args.every, cap=args.cap,
                                         start_cap=args.start_cap))


def run_target(args: argparse.Namespace) -> None:
    for kind in args.kinds:
        row = sc.tick_all(kind, 2000, every=5.0, cap=10)  # first batch
        save("target", {**row, "scenario": "target-first-batch"})
        save("target", _steady(kind, 2000, 5.0, 20 if args.quick else 60))


def _steady(kind: str, n: int, every: float, seconds: float) -> dict:
    import time

    from _harness import Rig, cpu_seconds, entries, load

    with Rig(kind, entries(n, every)) as rig:
        beat = rig.start_beat()
        rig.watch.wait_count(1, 60)
        time.sleep(every + 1)
        cpu0, sent0, t0 = cpu_seconds(beat.pid), rig.watch.count, time.time()
        time.sleep(seconds)
        cpu, sent = cpu_seconds(beat.pid) - cpu0, rig.watch.count - sent0
        elapsed = time.time() - t0
        msgs = rig.watch.messages()[sent0:]
        late = sorted(m.lateness for m in msgs if m.lateness is not None)
        return {"scenario": "target", "kind": kind, "entries": n, "every": every,
                "window_s": elapsed, "sent": sent, "expected": round(n * elapsed / every),
                "cpu_s": cpu, "cpu_per_1000": 1000 * cpu / max(sent, 1),
                "late_max_s": late[-1] if late else None,
                "late_p99_s": late[int(0.99 * (len(late) - 1))] if late else None,
                "load": load()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["tick", "target", "redis", "failover", "pause",
                                         "memory", "restart", "all", "env", "plot"])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--sizes", default="100,1000,10000,100000")
    parser.add_argument("--parts", default="busy,idle,all", help="tick: busy,idle,all")
    parser.add_argument("--window", type=float, default=20.0, help="tick: seconds measured")
    parser.add_argument("--every", type=float, default=30.0, help="tick all: the interval")
    parser.add_argument("--cap", type=float, default=60.0, help="tick all: batch time cap")
    parser.add_argument("--start-cap", type=float, default=240.0)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    args.kinds = args.kinds.split(",")
    if args.quick:
        global QUICK
        QUICK = True
        args.sizes = "100,1000" if args.sizes == parser.get_default("sizes") else args.sizes
        args.repeats = min(args.repeats, 2)
        args.cap = min(args.cap, 20)
        args.every = min(args.every, 10)
    if args.what != "plot":
        save("env", versions())
    ha = [k for k in args.kinds if k != "stock"]  # stock beat has no HA
    steps = {
        "tick": lambda: run_tick(args),
        "target": lambda: run_target(args),
        "redis": lambda: save_each("redis", (
            sc.redis_commands(k, 2000, 5.0, 10 if args.quick else 30) for k in ha)),
        "failover": lambda: save_each("failover", (sc.failover(k, mode, args.repeats)
                                                   for mode in ("kill", "term") for k in ha)),
        "pause": lambda: save_each("pause", (sc.paused_leader(k, min(args.repeats, 3))
                                             for k in ha)),
        "memory": lambda: save("memory", sc.memory(1000 if args.quick else 100_000,
                                                   min(args.repeats, 3))),
        "restart": lambda: save_each("restart", (sc.redis_restart(k, min(args.repeats, 3))
                                                 for k in ha)),
        "env": lambda: None,
    }
    if args.what == "plot":
        import _plots

        _plots.main(RESULTS)
    elif args.what == "all":
        for name in ("tick", "target", "redis", "failover", "pause", "memory", "restart"):
            steps[name]()
    else:
        steps[args.what]()


if __name__ == "__main__":
    main()

"""Chaos soak outside pytest: N beats (and workers) under seeded random faults, then the verdict.

    python bench/soak.py --seconds 300 --nodes 5 [--seed 1234] [--workdir DIR]
    python bench/soak.py --seconds 3600 --nodes 5 --workers 3 --broker amqp --guard \\
        --json results.json
    python bench/soak.py --seconds 1800 --store postgres --workers 2 --broker amqp --guard

Without ``--workers``: the short run's setup, longer (Redis broker drained by a
recorder, 4 entries, a 3 s lease, the six original fault kinds). With
``--workers N`` (needs ``--broker amqp``, RabbitMQ on 127.0.0.1:5672): the full
soak: about 219 entries (1, 2, 5 s intervals and cron strings), N prefork workers
with ``acks_late`` recording every execution, leaderbeat's default settings (lease
ttl 10 s), every fault kind (standby stopped, worker killed, Redis stopped, Redis
restarted with its data too), and the figures: slots published more than once,
executed twice, missed without a reason, lateness. ``LEADERBEAT_SOAK=300 python -m
pytest tests/chaos -k soak`` runs the full soak as a test.

``--store postgres`` (needs ``--broker amqp``): no Redis process at all. The store is
a PostgreSQL cluster of the run's own, the executions go to a database of the run's own
on the PostgreSQL at 127.0.0.1:5432, and the store's faults are PostgreSQL's: stopped
and started ("fast"), crashed (immediate stop, WAL recovery), every session ended by
``pg_terminate_backend``, every server process SIGSTOPped 1.5-5 s; beside them the
beats' (SIGKILL, SIGSTOP of the leader and of a standby, SIGTERM), the links' (cut,
stalled) and the workers' (SIGKILL) faults (``tests/chaos/pgrun.py``).

``--reanalyse DIR`` recomputes the figures of a finished run from the files it
left in its work directory (publishes, executions, history, faults).

Prints the seed first, every fault as it happens, the summary at the end; exits 1
when the verdict fails. Logs, the fault list (chaos-report.json), the copied
history, the publishes and executions stay in the work directory (kept, printed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.chaos.figures import soak_figures
from tests.chaos.harness import FAULT_KINDS, PG_SOAK_KINDS, SOAK_KINDS, ChaosRun, seed_from_env
from tests.chaos.pgrun import PgChaosRun
from tests.chaos.soakschedule import soak_schedule


def reanalyse(workdir: Path) -> dict:
    """The figures of a finished run, from chaos-{report,published,executed,history}.json."""
    report = json.loads((workdir / "chaos-report.json").read_text())
    executed = json.loads((workdir / "chaos-executed.json").read_text())
    published = [tuple(p) for p in json.loads((workdir / "chaos-published.json").read_text())]
    history = json.loads((workdir / "chaos-history.json").read_text())
    tags = {str(r.get("hostname", "")).split("@")[0].split("-", 1)[-1] for r in executed}
    killed = {}
    for fault in report["faults"]:
        if fault["kind"] == "kill_worker":  # target "worker-<i>-<generation> pid <pid>"
            _, index, generation = fault["target"].split()[0].split("-")
            for tag in tags:
                killed[f"w{index}g{generation}-{tag}"] = fault["start_wall"]
    end_wall = report.get("end_wall") or max(f["end_wall"] for f in report["faults"]) + 25.0
    return soak_figures(published=published, executed=executed, history=history,
                        end_ms=round((end_wall - 5.0) * 1000), killed_workers=killed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float,
                        default=float(os.environ.get("LEADERBEAT_SOAK") or 300))
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--broker", choices=("redis", "amqp"), default="redis")
    parser.add_argument("--guard", action="store_true", help="leaderbeat_guard = True")
    parser.add_argument("--store", choices=("redis", "postgres"), default="redis",
                        help="the beats' store (postgres: no Redis process anywhere)")
    parser.add_argument("--gap", type=float, nargs=2, default=None, metavar=("MIN", "MAX"),
                        help="seconds between faults (default 5 7 with workers, else 2 5)")
    parser.add_argument("--seed", type=int, default=None,
                        help="default: LEADERBEAT_CHAOS_SEED, else random")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", default=None, help="also write the report here")
    parser.add_argument("--reanalyse", default=None, metavar="DIR",
                        help="recompute a finished run's figures from its work directory")
    args = parser.parse_args()
    if args.reanalyse:
        print(json.dumps(reanalyse(Path(args.reanalyse)), indent=1))
        return 0
    if args.workers and args.broker != "amqp":
        parser.error("--workers needs --broker amqp")
    if args.store == "postgres" and args.broker != "amqp":
        parser.error("--store postgres needs --broker amqp (it runs no Redis)")
    seed = args.seed if args.seed is not None else seed_from_env(os.environ)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix=f"lb-soak-{seed}-"))
    print(f"chaos seed={seed} (replay: --seed {seed} or LEADERBEAT_CHAOS_SEED={seed})",
          flush=True)
    full = bool(args.workers)
    kinds = PG_SOAK_KINDS if args.store == "postgres" else \
        (SOAK_KINDS if full else FAULT_KINDS)
    runner = PgChaosRun if args.store == "postgres" else ChaosRun
    run = runner(workdir, seed=seed, nodes=args.nodes, duration=args.seconds,
                 log=lambda line: print(line, flush=True), workers=args.workers,
                 broker=args.broker, guard=args.guard,
                 gap=tuple(args.gap) if args.gap else ((5.0, 7.0) if full else (2.0, 5.0)),
                 steady=25.0 if full else 8.0,
                 schedule=soak_schedule() if full else None,
                 settings={} if full else None,
                 kinds=kinds)
    report = run.run()
    if not report.ok:
        print(report.failure_text(), flush=True)
    if args.json:
        Path(args.json).write_text(report.to_json())
    print(f"work directory: {workdir}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

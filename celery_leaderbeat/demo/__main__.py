"""A one-command failover demo: ``python -m celery_leaderbeat.demo [--quick] [--json]
[--store postgres]``.

It starts a throw-away Redis (or PostgreSQL cluster), a real Celery worker and three ``celery beat -S
celery_leaderbeat.Scheduler`` processes with default settings, runs a schedule
of three entries, SIGKILLs the leader about a third of the way in and SIGTERMs
the next leader about two thirds in, then stops everything and says what
happened: slots expected and run, duplicates (must be none), missed slots,
worst lateness, and how long each failover took. No process is left behind,
on success, on an error, on Ctrl-C or on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

from .procs import DemoError, Interrupted, Interrupts
from .scenario import FULL, QUICK, Demo
from .view import Screen, make_view, print_summary


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m celery_leaderbeat.demo",
        description="Three celery beats, one worker, a SIGKILL and a SIGTERM of the leader: "
                    "watch every slot run once.")
    parser.add_argument("--quick", action="store_true", help="a 30 s run instead of 60 s (CI)")
    parser.add_argument("--json", action="store_true",
                        help="print the summary as one JSON object on stdout (the live view "
                             "goes to stderr)")
    parser.add_argument("--store", choices=("redis", "postgres"), default="redis",
                        help="where leaderbeat keeps its state: a Redis of the demo's own "
                             "(the default), or a PostgreSQL cluster of its own, with RabbitMQ "
                             "as the broker when one answers, else kombu's filesystem transport")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (logs) and say where it is")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; 0 when the scenario ran and no slot ran twice."""
    args = parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    screen = Screen("celery-leaderbeat failover demo" + (" (--quick)" if args.quick else "")
                    + (" on PostgreSQL" if args.store == "postgres" else ""))
    interrupts = Interrupts()
    interrupts.install()
    started = time.monotonic()
    result: dict[str, Any] = {}
    demo: list[Demo] = []  # the one Demo, once made: its directory is cleaned up after
    try:
        code = _run(args, screen, interrupts, out, result, demo)
    finally:
        if demo:
            result["temp_dir"] = str(demo[0].dir)
            if args.keep:
                result["kept"] = str(demo[0].dir)
            else:
                shutil.rmtree(demo[0].dir, ignore_errors=True)
        interrupts.restore()
    result["wall_time_s"] = round(time.monotonic() - started, 1)
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        print_summary(result, out)
    if "error" in result:
        print(f"demo: {result['error']}", file=sys.stderr)
    return code


def _run(args: argparse.Namespace, screen: Screen, interrupts: Interrupts, out: Any,
         result: dict[str, Any], made: list[Demo]) -> int:
    """Run the scenario into ``result``; the exit code. Every process is stopped before
    this returns, whatever happened."""
    view = make_view(screen, stream=out, live=True)
    try:
        with view:
            demo = Demo(QUICK if args.quick else FULL, interrupts, view, screen, args.store)
            made.append(demo)
            try:
                result.update(demo.run())
                ran = all(f["first_send_by_another_beat_after_s"] is not None
                          for f in result["failovers"]) and len(result["failovers"]) == 2
                result["scenario_ran"] = ran
                return 0 if ran and result["duplicates"] == 0 else 1
            finally:
                screen.phase = "stopping every process"
                result["left_running"] = demo.close()
                result["pids"] = [p.pid for p in demo.procs]
    except Interrupted as exc:
        result["interrupted"] = exc.args[0]
        return 128 + exc.signum
    except DemoError as exc:
        result["error"] = str(exc)
        return 2
    except Exception as exc:  # noqa: BLE001 - shown with its traceback once all is stopped
        traceback.print_exc()
        result["error"] = f"{type(exc).__name__}: {exc}"
        return 1


if __name__ == "__main__":
    sys.exit(main())

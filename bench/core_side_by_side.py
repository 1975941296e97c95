"""Two checkouts of the package measured side by side, by the same bench code, in one run.

    python bench/core_side_by_side.py --before ../before [--after .] [--rounds 3] \\
        [--steps inprocess,steady,burst,kill] [--seconds 60] [--kills 4]
    python bench/core_side_by_side.py --summary    # the table, from the rows so far

Each round runs every step once on each checkout, alternating which goes first
from round to round, so the other load on the machine falls on both alike.
A step runs in a process of its own, started in the checkout it measures with
``PYTHONPATH`` set to it: the package, ``tests.support`` (servers, beat
processes, the broker watch) and the beats' app are that checkout's; the bench
code driving them (``send.py``, ``send_inprocess.py``, ``_scenarios.py``,
``_harness.py``) is this directory's, for both. Steps:

- ``inprocess``: ``send_inprocess.py steady`` with ``--path fast`` (the default
  path: claim and enqueue in one step) and ``--path plain`` (no one step, every
  message built by ``apply_async``, kombu's batch): CPU of the process per
  1,000 sends, 2,000 entries every 5 s;
- ``inburst``: ``send_inprocess.py burst --path fast``: CPU seconds of a warm
  burst of 10,000 entries on one cron, in one process;
- ``steady``: ``send.py steady`` with a real ``celery beat``, kinds ``fast`` and
  ``batched``: the beat's CPU seconds per 1,000 sends;
- ``burst``: ``send.py burst``, 10,000 entries due the same second, one leader
  and two standbys, two bursts in a row: last message after the slot, rescued;
- ``kill``: ``_scenarios.failover`` with SIGKILL, ``--kills`` times: the worst
  slot's lateness after each kill.

Every row (with the checkout's commit and the 1-minute load average before and
after the step) is appended to bench/results/core_side_by_side.jsonl.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "core_side_by_side.jsonl"
STEPS = ("inprocess", "inburst", "steady", "burst", "kill")


def load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def commit_of(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()


# -- in the measured checkout ---------------------------------------------------------


def import_tree(tree: Path) -> None:
    """Import the package and ``tests.support`` from ``tree`` before any bench module puts
    this repository first on ``sys.path``: their submodules then come from ``tree``."""
    sys.path.insert(0, str(tree))
    import celery_leaderbeat
    import tests.support.beat

    for module in (celery_leaderbeat, tests.support.beat):
        if not str(module.__file__).startswith(str(tree) + os.sep):
            raise SystemExit(f"{module.__name__} imported from {module.__file__}, not {tree}")


def check_tree(tree: Path) -> None:
    """Every module of the package and of ``tests.support`` loaded came from ``tree``."""
    for name, module in list(sys.modules.items()):
        origin = str(getattr(module, "__file__", None) or "")
        if name.startswith(("celery_leaderbeat", "tests.support")) and origin \
                and not origin.startswith(str(tree) + os.sep):
            raise SystemExit(f"{name} was imported from {origin}, not {tree}")


def run_step(step: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    if step in ("inprocess", "inburst"):  # one path a process: nothing of another run is left
        what = "steady" if step == "inprocess" else "burst"
        return inprocess_one(what, args.path or "fast", args.seconds_inprocess)
    import send

    if step == "steady":
        return [send.steady(kind, 2000, 5.0, args.seconds) for kind in ("fast", "batched")]
    if step == "burst":
        return send.burst("fast", 10_000, 2, 2)
    import _scenarios

    return _scenarios.failover("leaderbeat", "kill", args.kills)


def child(args: argparse.Namespace) -> None:
    tree = Path(args.tree).resolve()
    import_tree(tree)
    before = load1()
    rows = run_step(args.step, args)
    check_tree(tree)
    stamp = {"tree": args.label, "commit": commit_of(tree), "load_before": before,
             "load_after": load1(), "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    OUT.parent.mkdir(exist_ok=True)
    with open(OUT, "a") as out:
        for row in rows:
            row = {**stamp, "step": args.step, **row}
            out.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


def inprocess_one(what: str, path: str, seconds: float) -> list[dict[str, Any]]:
    """``send_inprocess.py what --path path``, its printed line as a row."""
    import send_inprocess

    sys.argv = ["send_inprocess.py", what, "--path", path, "--seconds", str(seconds)]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        send_inprocess.main()
    line = printed.getvalue().strip()
    found = re.search(r"(\d+) sent, ([\d.]+) CPU s, ([\d.]+) CPU s per 1,000", line)
    if found is None:
        raise SystemExit(f"send_inprocess.py printed {line!r}")
    wall = re.search(r"([\d.]+) s wall in the ticks that sent", line)
    return [{"scenario": f"inprocess {what}", "path": path, "sent": int(found[1]),
             "cpu_s": float(found[2]), "cpu_per_1000": float(found[3]), "seconds": seconds,
             **({"sending_wall_s": float(wall[1])} if wall else {})}]


# -- the summary ------------------------------------------------------------------------


def _fmt(values: list[float]) -> str:
    if not values:
        return "–"
    return ", ".join(f"{v:.3g}" for v in values) + (
        f" (median {statistics.median(values):.3g})" if len(values) > 2 else "")


def _figures(rows: list[dict[str, Any]]) -> dict[str, Callable[[dict[str, Any]], Any]]:
    """Each table row's name and how a measured row gives its figure (None: not this row)."""
    def pick(step: str, key: str, **match: Any) -> Callable[[dict[str, Any]], Any]:
        return lambda r: r.get(key) if r["step"] == step and all(
            r.get(k) == v for k, v in match.items()) else None

    return {
        "in one process, 2,000 every 5 s, default path: CPU s per 1,000 sends":
            pick("inprocess", "cpu_per_1000", path="fast"),
        "the same, plain path": pick("inprocess", "cpu_per_1000", path="plain"),
        "in one process, a warm burst of 10,000 on one cron, default path: CPU s":
            pick("inburst", "cpu_s"),
        "the same: wall s in the ticks that sent": pick("inburst", "sending_wall_s"),
        "celery beat, 2,000 every 5 s, fast (one step): CPU s per 1,000 sends":
            pick("steady", "cpu_per_1000", kind="fast"),
        "celery beat, the same, batched (state on another Redis)":
            pick("steady", "cpu_per_1000", kind="batched"),
        "10,000 burst: last message after the slot, s": pick("burst", "last_s"),
        "10,000 burst: first message after the slot, s": pick("burst", "first_s"),
        "10,000 burst: rescued by standbys": pick("burst", "rescued"),
        "10,000 burst: leader CPU s": pick("burst", "cpu_leader_s"),
        "SIGKILL of the leader: worst slot lateness, s": pick("kill", "late_max_s"),
        "SIGKILL: first send by another beat, s": pick("kill", "first_send_s"),
        "SIGKILL: new leader elected, s": pick("kill", "elected_s"),
    }


def _load(value: Any) -> float | None:
    """A 1-minute load average: a number, or the first of send.py's ``load a b c``."""
    if isinstance(value, str):
        found = re.search(r"[\d.]+", value)
        return float(found[0]) if found else None
    return float(value) if isinstance(value, int | float) else None


def summary(path: Path) -> None:
    """The rows of ``path`` as a markdown table: before and after, each run's figure."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    print("| measure | before | after |\n|---|---|---|")
    for name, figure in _figures(rows).items():
        cells = []
        for tree in ("before", "after"):
            got = [figure(r) for r in rows if r["tree"] == tree]
            cells.append(_fmt([float(v) for v in got if v is not None]))
        print(f"| {name} | {cells[0]} | {cells[1]} |")
    loads = [v for r in rows for k in ("load_before", "load_after", "load")
             if (v := _load(r.get(k))) is not None]
    print(f"\n1-minute load average {min(loads):.2f}–{max(loads):.2f}; "
          f"{rows[0]['utc']} – {rows[-1]['utc']} UTC")


# -- the driver -------------------------------------------------------------------------


def launch(tree: Path, label: str, step: str, args: argparse.Namespace,
           extra: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--tree", str(tree),
               "--label", label, "--step", step, "--seconds", str(args.seconds),
               "--seconds-inprocess", str(args.seconds_inprocess), "--kills", str(args.kills),
               *extra]
    print(f"{time.strftime('%H:%M:%S', time.gmtime())} load {load1():.2f} {label} {step} "
          f"{' '.join(extra)}", flush=True)
    subprocess.run(command, cwd=tree, env=env, check=False)


def launcher(step: str, args: argparse.Namespace, extra: list[str]
             ) -> Callable[[Path, str], None]:
    """:func:`launch` of ``step`` with ``extra``, for a tree and its label."""
    return lambda tree, label: launch(tree, label, step, args, extra)


def driver(args: argparse.Namespace) -> None:
    trees = [(Path(args.before).resolve(), "before"), (Path(args.after).resolve(), "after")]
    for index in range(args.rounds):
        order = trees if index % 2 == 0 else trees[::-1]
        for step in args.steps.split(","):
            runs: list[Callable[[Path, str], None]]
            if step == "inprocess":  # each path in a process of its own
                runs = [launcher("inprocess", args, ["--path", p]) for p in ("fast", "plain")]
            elif step == "inburst":
                runs = [launcher("inburst", args, ["--path", "fast"])]
            else:
                runs = [launcher(step, args, [])]
            for run in runs:
                for tree, label in order:
                    run(tree, label)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default=None)
    parser.add_argument("--after", default=str(HERE.parent))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", default=",".join(STEPS))
    parser.add_argument("--seconds", type=float, default=60.0, help="steady: the window")
    parser.add_argument("--seconds-inprocess", type=float, default=20.0)
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument("--summary", action="store_true",
                        help="print the table of bench/results/core_side_by_side.jsonl")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    parser.add_argument("--label", help=argparse.SUPPRESS)
    parser.add_argument("--step", choices=STEPS, help=argparse.SUPPRESS)
    parser.add_argument("--path", choices=["fast", "plain"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.summary:
        summary(OUT)
    elif args.child:
        child(args)
    elif args.before is None:
        parser.error("--before: the checkout of the code before the change")
    else:
        driver(args)


if __name__ == "__main__":
    main()

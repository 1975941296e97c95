"""One beat, many entries: is every send on time, and what does a send cost?

    python bench/throughput.py --entries 2000 --every 5 --seconds 60 [--stock] [--standbys 2]

Starts its own redis-server (state and broker on separate servers), runs one
``celery beat`` (ours, or Celery's PersistentScheduler with ``--stock``) for
``--seconds``, then reports: slots sent, duplicates, CPU seconds of the beat
process per 1,000 sends (from /proc), and how late each batch started
(parsed from our per-tick log line; stock beat has no such line), and the
commands the leaderbeat Redis served per 1,000 sends (``INFO commandstats``
deltas over the window: the leader's claims, heartbeat and registry, and
with ``--standbys`` the standbys' polls and rescue reads).
Speed is measured here, never asserted in the unit tests.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.beat import NOOP, BeatProcess, Recorder, beat_env, duplicates
from tests.support.redis_server import RedisServer


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def command_counts(client) -> Counter:
    """Calls per command served so far (``INFO commandstats``)."""
    return Counter({name.removeprefix("cmdstat_"): int(stats["calls"])
                    for name, stats in client.info("commandstats").items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--every", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--stock", action="store_true", help="Celery's PersistentScheduler")
    parser.add_argument("--standbys", type=int, default=0, help="extra beats standing by")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="leaderbeat-bench-"))
    with RedisServer(workdir=work / "state") as state, RedisServer(workdir=work / "broker") as broker:
        schedule = {f"e{i}": {"task": NOOP, "every": args.every} for i in range(args.entries)}
        env = beat_env(work, broker_url=broker.url_for(0), redis_url=state.url,
                       prefix="bench", schedule=schedule)
        scheduler = "celery.beat:PersistentScheduler" if args.stock else "celery_leaderbeat.Scheduler"
        recorder = Recorder(broker.client())
        beat = BeatProcess(env=env, log_path=work / "beat.log", scheduler=scheduler,
                           loglevel="INFO")
        standbys = []
        try:
            # start measuring once the beat is up (import and start-up cost excluded)
            deadline = time.monotonic() + 60
            while not recorder.drain():
                if time.monotonic() > deadline:
                    raise SystemExit("beat sent nothing in 60 s:\n" + beat.log_text()[-3000:])
                time.sleep(0.05)
            standbys = [BeatProcess(env=env, log_path=work / f"standby-{i}.log",
                                    scheduler=scheduler) for i in range(args.standbys)]
            time.sleep(3 if standbys else 0)  # standbys up and reading the slot states
            recorder.drain()
            commands0 = command_counts(state.client())
            cpu0, t0, sent0 = cpu_seconds(beat.pid), time.monotonic(), len(recorder.messages)
            while time.monotonic() - t0 < args.seconds:
                time.sleep(0.5)
                recorder.drain()
            cpu = cpu_seconds(beat.pid) - cpu0
            sent = len(recorder.messages) - sent0
            commands = command_counts(state.client()) - commands0
        finally:
            beat.kill()
            for standby in standbys:
                standby.kill()
        expected = args.entries * args.seconds / args.every
        log = beat.log_text()
        lateness = [float(m) for m in re.findall(r"(\d+) ms after the earliest was due", log)]
        durations = [float(m) for m in re.findall(r"due entries in (\d+) ms", log)]
        by_slot = Counter(m.slot for m in recorder.messages if m.slot)
        print(f"scheduler            {scheduler}")
        print(f"entries x period     {args.entries} x {args.every} s for {args.seconds:.0f} s")
        print(f"slots sent           {sent} (expected about {expected:.0f}, "
              f"{100 * sent / expected:.1f}%)")
        print(f"duplicate slots      {len(duplicates(recorder.messages)) if not args.stock else 'n/a'}")
        print(f"beat CPU             {cpu:.2f} s = {1000 * cpu / max(sent, 1):.3f} s per 1,000 sends")
        if by_slot:
            full = sum(1 for n in by_slot.values() if n == args.entries)
            print(f"slot batches         {len(by_slot)}, of which {full} carry all "
                  f"{args.entries} entries (first/last may be cut by the window)")
        if not args.stock:
            total = sum(commands.values()) - commands["info"]
            per = ", ".join(f"{k} {1000 * v / max(sent, 1):.1f}"
                            for k, v in commands.most_common() if k != "info")
            print(f"redis commands       {1000 * total / max(sent, 1):.1f} per 1,000 sends "
                  f"with {args.standbys} standby(s): {per}")
        if durations:
            print(f"batch send time      median {statistics.median(durations):.0f} ms, "
                  f"max {max(durations):.0f} ms (claim + publish + mark sent)")
        if lateness:
            print(f"batch start lateness median {statistics.median(lateness):.0f} ms, "
                  f"max {max(lateness):.0f} ms over {len(lateness)} batches")


if __name__ == "__main__":
    main()

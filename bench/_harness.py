"""What every scenario of bench/compare.py needs: servers, beats, a broker watch, /proc.

The three schedulers run from the same app (bench.benchapp) with the same
schedule; only ``-S`` and the scheduler's own settings differ. Every entry
carries its own name as its first argument, so a message from any scheduler
says which entry it is; leaderbeat's also carry the slot (``leaderbeat_slot``).
The sender of a message is the pid in Celery's ``origin`` header (gen<pid>@host).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.beat import NOOP, BeatProcess, beat_env
from tests.support.redis_server import RedisServer

if TYPE_CHECKING:
    from typing_extensions import Self

SCHEDULERS = {
    "leaderbeat": "celery_leaderbeat.Scheduler",
    "stock": "celery.beat:PersistentScheduler",
    "redbeat": "redbeat.RedBeatScheduler",
}
LEASE_TTL = 10  # leaderbeat's default lease ttl; RedBeat's lock timeout is set equal
LOOP = 1.0  # beat_max_loop_interval for every scheduler (RedBeat's lock poll and extend pace)
CLK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (threads included), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def rss_mib(pid: int) -> float:
    """VmRSS of ``pid`` in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def code() -> str:
    """The commit the bench runs (``+`` when the tree differs from it, results aside), for
    its result row."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                ".", ":!bench/results"], check=True, cwd=root, text=True,
                               capture_output=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


def load() -> str:
    """The load averages, as ``uptime`` prints them."""
    return "load " + " ".join(Path("/proc/loadavg").read_text().split()[:3])


def entries(n: int, every: float, start: int = 0, prefix: str = "e") -> dict[str, dict[str, Any]]:
    """``n`` interval entries named <prefix><i>, each with its name as its only argument."""
    return {f"{prefix}{i}": {"task": NOOP, "every": every, "args": [f"{prefix}{i}"]}
            for i in range(start, start + n)}


@dataclass(frozen=True)
class Msg:
    entry: str | None
    slot: float | None  # leaderbeat_slot as a timestamp (None from stock beat and RedBeat)
    pid: int | None  # the sending beat
    received: float  # wall time the watch took it off the broker (at most 20 ms late)

    @property
    def lateness(self) -> float | None:
        return None if self.slot is None else self.received - self.slot


def parse(raw: bytes, received: float) -> Msg:
    data = json.loads(raw)
    headers = data.get("headers") or {}
    body = json.loads(base64.b64decode(data["body"]))
    entry = body[0][0] if body and body[0] else headers.get("leaderbeat_entry")
    slot = headers.get("leaderbeat_slot")
    origin = re.match(r"gen(\d+)@", str(headers.get("origin") or ""))
    return Msg(entry, datetime.fromisoformat(slot).timestamp() if slot else None,
               int(origin.group(1)) if origin else None, received)


class Watch:
    """Polls the broker queue every ``period`` s (LRANGE + DEL), and samples beat CPU.

    Raw messages are kept and parsed on demand, so the bench itself costs the
    beats' two cores as little as possible while they run.
    """

    def __init__(self, broker: Any, period: float = 0.02) -> None:
        self.client = broker
        self.period = period
        self.raw: list[tuple[float, bytes]] = []
        self.samples: dict[int, list[tuple[float, float]]] = {}
        self._parsed: list[Msg] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self, pid: int) -> None:
        """Also record (time, CPU seconds) of ``pid`` at every poll."""
        self.samples.setdefault(pid, [])

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            with self.client.pipeline(transaction=True) as pipe:
                pipe.lrange("celery", 0, -1)
                pipe.delete("celery")
                items, _ = pipe.execute()
            now = time.time()
            for pid, rows in list(self.samples.items()):
                try:
                    rows.append((now, cpu_seconds(pid)))
                except (FileNotFoundError, ProcessLookupError):
                    pass
            if items:
                with self._lock:
                    self.raw.extend((now, raw) for raw in reversed(items))

    @property
    def count(self) -> int:
        return len(self.raw)

    def messages(self) -> list[Msg]:
        with self._lock:
            todo = self.raw[len(self._parsed):]
        self._parsed.extend(parse(raw, t) for t, raw in todo)
        return list(self._parsed)

    def cpu_at(self, pid: int, t: float) -> float:
        """The last CPU sample of ``pid`` taken at or before ``t``."""
        rows = self.samples.get(pid) or [(0.0, 0.0)]
        best = rows[0][1]
        for when, cpu in rows:
            if when > t:
                break
            best = cpu
        return best

    def wait_count(self, n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.count < n:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def read_ticks(path: Path) -> int:
    try:
        return struct.unpack("q", path.read_bytes()[:8])[0]
    except (FileNotFoundError, struct.error):
        return 0


class Rig:
    """One run: a state Redis, a broker Redis, a watch, and the beats started in it."""

    def __init__(self, kind: str, schedule: dict[str, dict[str, Any]],
                 settings: dict[str, Any] | None = None, period: float = 0.02) -> None:
        self.kind = kind
        self.work = Path(tempfile.mkdtemp(prefix=f"lb-compare-{kind}-"))
        self.state = RedisServer(workdir=self.work / "state")
        self.broker = RedisServer(workdir=self.work / "broker")
        self.schedule = schedule
        conf: dict[str, Any] = {"beat_max_loop_interval": LOOP}
        if kind == "redbeat":
            conf.update(redbeat_redis_url=self.state.url, redbeat_lock_timeout=LEASE_TTL)
        conf.update(settings or {})
        self.env = beat_env(self.work, broker_url=self.broker.url_for(0),
                            redis_url=self.state.url if kind == "leaderbeat" else None,
                            prefix="bench" if kind == "leaderbeat" else None,
                            schedule=schedule, settings=conf)
        self.beats: list[BeatProcess] = []
        self.watch = Watch(self.broker.client(), period)

    def start_beat(self, loglevel: str = "INFO") -> BeatProcess:
        name = f"beat-{len(self.beats)}"
        env = dict(self.env, LB_TICK_FILE=str(self.work / f"{name}.ticks"))
        beat = BeatProcess("bench.benchapp", env, self.work / f"{name}.log",
                           scheduler=SCHEDULERS[self.kind], loglevel=loglevel)
        beat.ticks_path = self.work / f"{name}.ticks"  # type: ignore[attr-defined]
        self.beats.append(beat)
        self.watch.sample(beat.pid)
        return beat

    def ticks(self, beat: BeatProcess) -> int:
        return read_ticks(beat.ticks_path)  # type: ignore[attr-defined]

    def command_counts(self) -> Counter:
        return Counter({name.removeprefix("cmdstat_"): int(stats["calls"])
                        for name, stats in self.state.client().info("commandstats").items()})

    def close(self) -> None:
        self.watch.close()
        for beat in self.beats:
            beat.close()
        self.state.close()
        self.broker.close()
        shutil.rmtree(self.work, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


LOG_TIME = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): \w+/\w+\] (.*)")


def log_events(beat: BeatProcess, pattern: str) -> list[float]:
    """Wall times of the log lines of ``beat`` matching ``pattern``."""
    times = []
    for line in beat.log_text().splitlines():
        m = LOG_TIME.match(line)
        if m and re.search(pattern, m.group(2)):
            stamp = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
            times.append(time.mktime(stamp.timetuple()) + stamp.microsecond / 1e6)
    return times


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    def version(name: str) -> str:
        try:
            return installed(name)
        except PackageNotFoundError:  # a bench that does not run RedBeat may lack it
            return "not installed"

    import celery
    import redis

    server = subprocess.run([RedisServer(start=False).binary, "--version"],
                            capture_output=True, text=True, check=True).stdout.split()
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               "?")
    mem = int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024
    return {"python": sys.version.split()[0], "celery": celery.__version__,
            "redis-py": redis.__version__, "redis-server": server[2].removeprefix("v="),
            "celery-redbeat": version("celery-redbeat"), "nproc": str(os.cpu_count()),
            "cpu": cpu, "ram": f"{mem:.0f} GiB",
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}

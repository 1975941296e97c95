"""What bench/pg_send.py and bench/pg_history.py share: a store server of the bench's own
(a PostgreSQL cluster, or a redis-server), its CPU from /proc, and a RabbitMQ queue of the
run's own read by a consumer thread.

Not a benchmark by itself: ``python bench/pg_send.py`` and ``python bench/pg_history.py``
use it.

The PostgreSQL cluster is tests/support/pg_cluster.py's (initdb on a free port), with
what that helper turns off for speed turned back on (``fsync``, ``synchronous_commit``)
and PostgreSQL's default ``shared_buffers`` (128MB): the store's documented settings, so
a commit costs what it costs in production on this disk.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import kombu

from tests.support.pg_cluster import Cluster, pg_cluster
from tests.support.redis_server import RedisServer

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
CLK = os.sysconf("SC_CLK_TCK")
#: how often a held consumer reads its queue's depth (s)
DEPTH_EVERY = 0.02
#: appended to the cluster's postgresql.conf (the last setting of a name wins)
DURABLE = "\nfsync = on\nsynchronous_commit = on\nshared_buffers = 128MB\n"


def versions() -> dict[str, str]:
    """What the figures were measured with."""
    import celery
    import psycopg
    import redis

    def first_line(*command: str) -> str:
        return subprocess.run(command, capture_output=True, text=True,
                              check=False).stdout.strip()

    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               "?")
    repo = str(Path(__file__).resolve().parents[1])
    commit = first_line("git", "-C", repo, "rev-parse", "--short", "HEAD")
    if first_line("git", "-C", repo, "status", "--porcelain", "--", "celery_leaderbeat"):
        commit += " (package modified)"
    return {"commit": commit, "python": sys.version.split()[0], "celery": celery.__version__,
            "redis-py": redis.__version__, "psycopg": psycopg.__version__,
            "redis-server": first_line("redis-server", "--version"),
            "postgresql": first_line("pg_config", "--version"),
            "rabbitmq": "127.0.0.1:5672", "nproc": str(os.cpu_count()), "cpu": cpu,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def load() -> str:
    """The load averages, as ``uptime`` prints them."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads)."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / CLK


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid``, of its children alive now, and of those it already reaped
    (a backend that exits between two samples is counted by its parent's cutime)."""
    fields = _stat(pid)
    total = sum(int(f) for f in fields[11:15]) / CLK
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            child = _stat(int(entry.name))
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(child[1]) == pid:
            total += (int(child[11]) + int(child[12])) / CLK
    return total


@dataclass
class StoreServer:
    """The store's server: the settings that point beats at it, its pid, its conninfo."""

    kind: str  # "postgresql" or "redis"
    settings: dict[str, Any]
    redis_url: str | None
    pid: int
    conninfo: str | None = None
    redis: RedisServer | None = None

    def cpu(self) -> float:
        """CPU seconds of the server (every PostgreSQL process of the cluster)."""
        return tree_cpu(self.pid) if self.kind == "postgresql" else cpu_seconds(self.pid)


@contextmanager
def durable_cluster() -> Iterator[Cluster]:
    """A PostgreSQL cluster of the bench's own, fsync and synchronous_commit on."""
    with pg_cluster() as cluster:
        with open(cluster.data / "postgresql.conf", "a") as conf:
            conf.write(DURABLE)
        cluster.restart()
        yield cluster


@contextmanager
def store_server(kind: str, work: Path) -> Iterator[StoreServer]:
    """A PostgreSQL cluster or a redis-server of the run's own, as the beats' store."""
    if kind == "postgresql":
        with durable_cluster() as cluster:
            url = f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres?connect_timeout=3"
            pid = int((cluster.data / "postmaster.pid").read_text().split()[0])
            yield StoreServer(kind, {"leaderbeat_store_url": url}, None, pid,
                              conninfo=cluster.conninfo)
    elif kind == "redis":
        with RedisServer(workdir=work / "state") as server:
            assert server.pid is not None
            yield StoreServer(kind, {}, server.url, server.pid, redis=server)
    else:
        raise SystemExit(f"store {kind!r}: expected 'postgresql' or 'redis'")


@dataclass(frozen=True)
class Seen:
    """One message as the consumer took it off the queue."""

    entry: str
    slot: str
    origin: str  # Celery's origin header: gen<pid>@host of the sending beat
    received: float  # wall time the consumer got it (after the broker had it)

    @property
    def pid(self) -> int | None:
        head = self.origin.split("@", 1)[0]
        return int(head[3:]) if head.startswith("gen") and head[3:].isdigit() else None


class Consumer:
    """Consumes a RabbitMQ queue of the run's own in a thread (no ack, no decoding of the
    body): every message with its receipt time. Declared before any beat starts.

    ``hold()`` stops consuming and counts instead: the thread reads the queue's depth
    (a passive declare, one round trip) every :data:`DEPTH_EVERY` s, so the time each
    message was enqueued is known without a consumer taking CPU beside the beats
    and without its lag counted as theirs; ``release()`` consumes what was held."""

    def __init__(self, url: str = AMQP_URL) -> None:
        self.queue = f"lb-pgbench-{secrets.token_hex(4)}"
        self.conn = kombu.Connection(url, connect_timeout=5)
        self.conn.ensure_connection(max_retries=3)
        # celery declares its default queue durable; the same arguments, or a 406
        self._queue = kombu.Queue(self.queue, durable=True)
        self._queue(self.conn.default_channel).declare()
        self.seen: list[Seen] = []
        #: while held: (wall time, messages in the queue), one per read of its depth
        self.depths: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._held = threading.Event()
        self._holding = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _on_message(self, message: Any) -> None:
        headers = message.headers or {}
        self.seen.append(Seen(str(headers.get("leaderbeat_entry")),
                              str(headers.get("leaderbeat_slot")),
                              str(headers.get("origin")), time.time()))

    def _run(self) -> None:
        consumer = kombu.Consumer(self.conn.default_channel, [self._queue], no_ack=True,
                                  on_message=self._on_message)
        consumer.consume()
        consuming = True
        while not self._stop.is_set():
            if self._held.is_set():
                if consuming:
                    consumer.cancel()
                    consuming = False
                    self._drain_for(0.3)  # what was on its way before the cancel
                    self._holding.set()
                _, depth, _ = self._queue(self.conn.default_channel).queue_declare(passive=True)
                self.depths.append((time.time(), depth))
                time.sleep(DEPTH_EVERY)
                continue
            if not consuming:
                consumer.consume()
                consuming = True
            self._drain_for(0.2)
        if consuming:
            consumer.cancel()

    def _drain_for(self, seconds: float) -> None:
        try:
            self.conn.drain_events(timeout=seconds)
        except TimeoutError:
            pass

    def hold(self) -> None:
        """Stop consuming and start reading the queue's depth (returns once holding)."""
        self.depths = []
        self._held.set()
        self._holding.wait(10)

    def release(self) -> None:
        """Consume again, what was held first."""
        self._holding.clear()
        self._held.clear()

    @property
    def count(self) -> int:
        return len(self.seen)

    def wait_count(self, n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.count < n:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        try:
            self._queue(self.conn.channel()).delete()
        finally:
            self.conn.release()

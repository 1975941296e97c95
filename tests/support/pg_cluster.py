"""A PostgreSQL cluster of the test's own: initdb in a temp dir, a free port, stopped and
removed afterwards. For tests that restart or kill the server.

The binaries come from ``pg_config --bindir``. initdb refuses to run as root, so under
root every command runs as the ``postgres`` OS user (``runuser -u postgres --``) in a
directory that user owns. Skipped with the reason when no binaries are found (an error
under ``CI=true``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest


def _bindir() -> Path:
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                             check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"pg_config is required under CI=true: {exc}")
        pytest.skip(f"no PostgreSQL binaries (pg_config: {exc})")
    return Path(out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """One running cluster: ``conninfo``, and ``restart()``, ``stop()``, ``kill()``,
    ``start()``, ``promote()`` (a standby), ``pause()``/``resume()`` (every server process).

    ``settings``: ``postgresql.conf`` parameters written after this module's own (so they
    win over them), e.g. ``{"max_connections": "100"}``.
    """

    def __init__(self, bindir: Path, root: Path, port: int,
                 settings: Mapping[str, str] | None = None) -> None:
        self.bindir, self.root, self.port = bindir, root, port
        self.settings = dict(settings or {})
        self.data = root / "data"
        self.log = root / "server.log"

    @property
    def conninfo(self) -> str:
        return (f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres "
                "connect_timeout=3")

    def _run(self, *args: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *args], check=True, capture_output=True, timeout=60)

    def _pg_ctl(self, *args: str) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                  "-w", "-t", "30", *args)

    def init(self) -> None:
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
                  "--auth=trust", "--no-sync")
        self._configure()

    def init_standby_of(self, primary: Cluster) -> None:
        """A streaming replica of ``primary`` (asynchronous: a commit does not wait for it)."""
        self._run(str(self.bindir / "pg_basebackup"), "-h", "127.0.0.1", "-p",
                  str(primary.port), "-U", "postgres", "-D", str(self.data), "-R",
                  "-X", "stream", "--no-sync")
        self._configure()

    def _configure(self) -> None:
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                       f"unix_socket_directories = '{self.root}'\nfsync = off\n"
                       "max_connections = 30\nshared_buffers = 16MB\n")
            conf.writelines(f"{name} = {value}\n" for name, value in self.settings.items())

    def start(self) -> None:
        self._pg_ctl("-o", f"-p {self.port}", "start")

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "stop")

    def restart(self) -> None:
        self._pg_ctl("-m", "fast", "-o", f"-p {self.port}", "restart")

    def promote(self) -> None:
        """A standby becomes a primary (on a new timeline)."""
        self._pg_ctl("promote")

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def pids(self) -> list[int]:
        """The postmaster and its children (the backends and the background processes)."""
        main = self.postmaster_pid()
        children = []
        for status in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = status.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            if int(fields[1]) == main:
                children.append(int(status.parent.name))
        return [main, *children]

    def pause(self) -> list[int]:
        """SIGSTOP every server process (a frozen host); the pids, for :meth:`resume`."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        return pids

    def resume(self, pids: list[int] | None = None) -> None:
        for pid in pids if pids is not None else self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the postmaster (its children end when they find it gone)."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


@contextmanager
def pg_cluster(standby_of: Cluster | None = None,
               settings: Mapping[str, str] | None = None) -> Iterator[Cluster]:
    """A fresh cluster on a free port (a streaming replica of ``standby_of`` if given, with
    ``settings`` in its ``postgresql.conf``); stopped (immediate) and its files removed after."""
    bindir = _bindir()
    root = Path(tempfile.mkdtemp(prefix="lb-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    cluster = Cluster(bindir, root, _free_port(), settings)
    try:
        if standby_of is None:
            cluster.init()
        else:
            cluster.init_standby_of(standby_of)
        cluster.start()
        yield cluster
    finally:
        try:
            cluster.stop("immediate")
        except (OSError, subprocess.SubprocessError):
            pass  # already stopped, or killed by the test
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def pgbouncer(port: int, host: str = "127.0.0.1", mode: str = "transaction") -> Iterator[int]:
    """Debian's ``pgbouncer`` in front of the server at ``host:port`` (every database, trust
    auth), pooling in ``mode``; yields the port it listens on. Skipped when not installed."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(binary).exists():
        if os.environ.get("CI") == "true":
            pytest.fail("pgbouncer is required under CI=true")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    root = Path(tempfile.mkdtemp(prefix="lb-pgb-"))
    listen = _free_port()
    (root / "users.txt").write_text('"postgres" ""\n')
    (root / "pgbouncer.ini").write_text(
        f"[databases]\n* = host={host} port={port}\n[pgbouncer]\nlisten_addr = 127.0.0.1\n"
        f"listen_port = {listen}\nunix_socket_dir =\nauth_type = trust\n"
        f"auth_file = {root}/users.txt\npool_mode = {mode}\ndefault_pool_size = 4\n"
        f"max_client_conn = 100\nlogfile = {root}/pgbouncer.log\n"
        "ignore_startup_parameters = extra_float_digits,options\n")
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        for child in root.iterdir():
            shutil.chown(child, "postgres", "postgres")
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    proc = subprocess.Popen([*prefix, binary, str(root / "pgbouncer.ini")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", listen), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = root / "pgbouncer.log"
                    pytest.fail("pgbouncer did not start: "
                                + (log.read_text()[-2000:] if log.exists() else "no log"))
                time.sleep(0.05)
        yield listen
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(root, ignore_errors=True)

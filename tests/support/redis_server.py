"""Real ``redis-server`` processes for tests, each on its own free port.

Tests never use a shared Redis: every server here is started by the test
suite, in its own temporary directory, and killed when the test ends.

    with RedisServer() as server:
        server.client().ping()
        server.kill()
        server.restart()          # same port, same arguments
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .closing import Closing
from .redis_binary import find_redis_server, free_port

__all__ = ["RedisServer", "RedisServerError", "find_redis_server", "free_port"]

READY_LINE = "Ready to accept connections"
ADDRESS_IN_USE = "Address already in use"
START_TIMEOUT = 10.0
START_ATTEMPTS = 5


class RedisServerError(RuntimeError):
    """A test Redis server failed to start; the message ends with its log tail."""


class RedisServer(Closing):
    """One ``redis-server`` process on a free local port, in its own directory.

    ``extra_args`` are appended to the command line (``--requirepass``,
    ``--maxmemory-policy``, ``--cluster-enabled yes`` ...). ``config_text`` is
    written to ``redis.conf`` and passed first (Sentinel needs a writable
    config file; set ``sentinel=True``). ``port_flag`` names the option that
    receives the port: use ``"--tls-port"`` together with
    ``extra_args=["--port", "0", ...tls files]`` for a TLS-only server.
    """

    def __init__(
        self,
        extra_args: Sequence[str] = (),
        *,
        config_text: str | None = None,
        sentinel: bool = False,
        binary: str | None = None,
        workdir: str | os.PathLike[str] | None = None,
        port_flag: str = "--port",
        start: bool = True,
    ) -> None:
        self.binary = binary or find_redis_server()
        self.extra_args = list(extra_args)
        self.config_text = config_text
        self.sentinel = sentinel
        self.port_flag = port_flag
        self._own_dir = workdir is None
        self.dir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="lb-redis-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "redis.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._finalizer = weakref.finalize(self, _kill_quietly, [None])
        if start:
            self.start()

    # -- public API -------------------------------------------------------

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` (add the password yourself if any)."""
        return self.url_for(0)

    def url_for(self, db: int = 0) -> str:
        """The URL of database ``db`` on this server, with the password if one is set."""
        password = self.password
        auth = f":{password}@" if password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    @property
    def password(self) -> str | None:
        """The ``--requirepass`` value given in ``extra_args``, if any."""
        if "--requirepass" in self.extra_args:
            return self.extra_args[self.extra_args.index("--requirepass") + 1]
        return None

    @property
    def pid(self) -> int | None:
        """Process id of the running server, or None."""
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        """True while the server process has not exited."""
        return self.proc is not None and self.proc.poll() is None

    def client(self, db: int = 0, timeout: float = 2.0, **kwargs: object) -> redis.Redis:
        """A raw-bytes client with short timeouts and no retries (fails fast)."""
        options: dict[str, object] = {
            "host": "127.0.0.1",
            "port": self.port,
            "db": db,
            "password": self.password,
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry": Retry(NoBackoff(), 0),
            "decode_responses": False,
        }
        options.update(kwargs)
        return redis.Redis(**options)  # type: ignore[arg-type]

    def start(self) -> None:
        """Start on a fresh free port, retrying another port if one is taken."""
        last: Exception | None = None
        for _ in range(START_ATTEMPTS):
            try:
                self._spawn(free_port())
                return
            except _PortTaken as exc:
                last = exc
        raise RedisServerError(f"no free port after {START_ATTEMPTS} attempts: {last}")

    def restart(self, timeout: float = START_TIMEOUT) -> None:
        """Start again on the same port with the same arguments (kills first if alive)."""
        if self.alive:
            self.kill()
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._spawn(self.port)
                return
            except _PortTaken:
                if time.monotonic() > deadline:
                    raise RedisServerError(f"port {self.port} still in use after {timeout}s")
                time.sleep(0.1)  # the kernel frees the port on its own schedule

    def kill(self) -> None:
        """SIGKILL the server and reap it (a crash: nothing is saved)."""
        self._signal_and_wait(signal.SIGKILL)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the server and wait for it; SIGKILL if it does not exit in time."""
        self._signal_and_wait(signal.SIGTERM, timeout)

    def pause(self) -> None:
        """SIGSTOP the server: connections stay open but nothing answers."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)

    def log_text(self) -> str:
        """Everything the server wrote to its log (all runs, appended)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def close(self) -> None:
        """Kill the server and remove its directory if this object created it."""
        self.kill()
        self._finalizer.detach()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __repr__(self) -> str:
        return f"<RedisServer port={self.port} pid={self.pid} alive={self.alive}>"

    # -- internals --------------------------------------------------------

    def _command(self, port: int) -> list[str]:
        cmd = [self.binary]
        if self.config_text is not None:
            conf = self.dir / "redis.conf"
            if not conf.exists():  # Sentinel rewrites its config: keep it on restart
                conf.write_text(self.config_text)
            cmd.append(str(conf))
        cmd += [
            self.port_flag,
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
        ]
        if not self.sentinel:
            cmd += ["--save", "", "--appendonly", "no"]
        cmd += self.extra_args
        if self.sentinel:
            cmd.append("--sentinel")
        return cmd

    def _spawn(self, port: int) -> None:
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            log.write(f"=== start on port {port} ===\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self._command(port),
                cwd=self.dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C in the terminal must not reach it first
            )
        self.port = port
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _kill_quietly, [self.proc])
        self._wait_ready(offset)

    def _wait_ready(self, offset: int, timeout: float = START_TIMEOUT) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            log = self.log_text()[offset:]
            if self.proc.poll() is not None:
                if ADDRESS_IN_USE in log:
                    raise _PortTaken(f"port {self.port}: {ADDRESS_IN_USE}")
                raise RedisServerError(
                    f"redis-server exited with {self.proc.returncode} on start-up; "
                    f"command {self._command(self.port)}\nlog tail:\n{_tail(log)}"
                )
            if READY_LINE in log or self._answers_ping():
                return
            time.sleep(0.02)
        self.kill()
        raise RedisServerError(
            f"redis-server on port {self.port} not ready after {timeout}s\n"
            f"log tail:\n{_tail(self.log_text()[offset:])}"
        )

    def _answers_ping(self) -> bool:
        """True when the port answers a raw PING (Sentinel never logs READY_LINE)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                reply = sock.recv(64)
        except OSError:
            return False
        return reply[:1] in (b"+", b"-")  # "-NOAUTH" also proves it is serving

    def _signal_and_wait(self, sig: signal.Signals, timeout: float = 10.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            proc.send_signal(signal.SIGCONT)  # a paused server cannot handle SIGTERM
            proc.send_signal(sig)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        except ProcessLookupError:
            pass


class _PortTaken(Exception):
    """The chosen port was taken between picking it and binding it."""


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _kill_quietly(holder: list[subprocess.Popen[bytes] | None]) -> None:
    """Finalizer: never leave a server running when its owner is collected or at exit."""
    for proc in holder:
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                pass

"""Real ``celery worker`` processes for guard tests (prefork by default)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .beat import APP_MODULE, REPO_ROOT
from .closing import Closing


def node_name(name: str) -> str:
    """A worker's node name of its own (``<name>-<8 hex>@<host>``): on a shared RabbitMQ, a
    worker's remote-control queue (``<node>.celery.pidbox``) is exclusive to one connection,
    so two tests running at once whose workers shared a name failed to start one of them."""
    return f"{name}-{uuid.uuid4().hex[:8]}@%h"


class WorkerProcess(Closing):
    """One ``celery worker`` in its own session; ``kill()`` takes its pool children too."""

    def __init__(self, env: Mapping[str, str], log_path: Path, *, name: str = "w",
                 concurrency: int = 2, extra_args: Sequence[str] = ()) -> None:
        self.log_path = log_path
        full_env = {**os.environ, **env, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", APP_MODULE, "worker", f"-c{concurrency}",
             "-n", node_name(name), "--loglevel=INFO", "--without-gossip", "--without-mingle",
             *extra_args],
            cwd=REPO_ROOT, env=full_env, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while "ready." not in self.log_text():
            assert self.proc.poll() is None, f"worker exited\n{self.log_text()[-3000:]}"
            assert time.monotonic() < deadline, f"worker not ready\n{self.log_text()[-3000:]}"
            time.sleep(0.1)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self._log.close()


def executed(client: Any) -> list[dict[str, Any]]:
    """Rows the ``record`` and ``sleepy`` tasks appended to the list ``executed``."""
    return [json.loads(raw) for raw in client.lrange("executed", 0, -1)]


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout}s"
        time.sleep(0.1)

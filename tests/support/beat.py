"""Real ``celery beat`` processes for multi-process tests.

    env = beat_env(tmp_path, broker_url=server.url_for(1), redis_url=server.url,
                   prefix=key_prefix, schedule={"tick": {"task": NOOP, "every": 1}})
    with BeatCluster(3, env, tmp_path) as cluster:
        cluster[0].wait_for_log(r"Scheduler: Sending due task")
        cluster[0].kill()
    recorder = Recorder(server.client(db=1))
    assert duplicates(recorder.drain()) == []

Each process runs ``python -m celery -A tests.support.beatapp beat -S <scheduler>``
from the repository root, in its own session (so signals reach only it), with
stdout and stderr written to its own log file.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .closing import Closing
from .recorder import Message, Recorder, duplicates, slots_by_entry

__all__ = [
    "APP_MODULE",
    "NOOP",
    "REPO_ROOT",
    "BeatCluster",
    "BeatProcess",
    "Message",
    "Recorder",
    "beat_env",
    "duplicates",
    "slots_by_entry",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
APP_MODULE = "tests.support.beatapp"
NOOP = "tests.support.beatapp.noop"
DEFAULT_SCHEDULER = "celery_leaderbeat.Scheduler"
STOCK_SCHEDULER = "celery.beat:PersistentScheduler"


def beat_env(
    directory: str | os.PathLike[str],
    *,
    broker_url: str,
    schedule: Mapping[str, Mapping[str, Any]],
    redis_url: str | None = None,
    prefix: str | None = None,
    settings: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """The ``LB_*`` variables for :mod:`tests.support.beatapp`; writes the schedule file."""
    schedule_file = Path(directory) / "schedule.json"
    schedule_file.write_text(json.dumps(schedule, indent=1))
    env = {"LB_BROKER_URL": broker_url, "LB_SCHEDULE_FILE": str(schedule_file)}
    if redis_url:
        env["LB_REDIS_URL"] = redis_url
    if prefix:
        env["LB_PREFIX"] = prefix
    if settings:
        env["LB_SETTINGS"] = json.dumps(dict(settings))
    return env


class BeatProcess(Closing):
    """One ``celery beat`` subprocess; started at construction."""

    def __init__(
        self,
        app_module: str = APP_MODULE,
        env: Mapping[str, str] | None = None,
        log_path: str | os.PathLike[str] = "beat.log",
        *,
        scheduler: str = DEFAULT_SCHEDULER,
        extra_args: Sequence[str] = (),
        loglevel: str = "INFO",
    ) -> None:
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.scheduler = scheduler
        # Stock schedulers keep a shelve file; give each process its own.
        schedule_db = self.log_path.with_suffix(".schedule")
        self.command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            app_module,
            "beat",
            "-S",
            scheduler,
            f"--loglevel={loglevel}",
            "-s",
            str(schedule_db),
            *extra_args,
        ]
        full_env = dict(os.environ)
        full_env.update(env or {})
        pythonpath = [str(REPO_ROOT)] + [p for p in [full_env.get("PYTHONPATH")] if p]
        full_env["PYTHONPATH"] = os.pathsep.join(pythonpath)
        full_env["PYTHONUNBUFFERED"] = "1"
        full_env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT prints every thread's stack (term())
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            self.command,
            cwd=REPO_ROOT,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        """Process id of the beat."""
        return self.proc.pid

    @property
    def alive(self) -> bool:
        """True until the process exits (a stopped process is still alive)."""
        return self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """Exit status, or None while running (negative: killed by that signal)."""
        return self.proc.poll()

    def log_text(self) -> str:
        """Everything the process has written so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for_log(self, pattern: str, timeout: float = 15.0, since: int = 0) -> re.Match[str]:
        """Poll the log until ``pattern`` matches at or after character ``since``.

        Fails at once, with the log tail, if the process exits first.
        """
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            exited = not self.alive
            match = regex.search(self.log_text(), since)
            if match:
                return match
            if exited:
                raise AssertionError(
                    f"beat {self.pid} exited ({self.returncode}) before logging "
                    f"{pattern!r}\n{self._tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"beat {self.pid} did not log {pattern!r} within {timeout}s\n{self._tail()}"
                )
            time.sleep(0.05)

    def wait_exit(self, timeout: float = 15.0) -> int:
        """Wait for the process to exit and return its status."""
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL (a crash) and reap."""
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGKILL)
        self._reap(10)

    def term(self, timeout: float = 15.0) -> int:
        """SIGTERM (a graceful stop) and wait; SIGKILL if it outlives ``timeout``."""
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGABRT)  # the stacks where it hung, into its log
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            self.kill()
            raise AssertionError(f"beat {self.pid} ignored SIGTERM for {timeout}s (its "
                                 f"threads' stacks at the end)\n{self._tail(120)}") from None

    def stop(self) -> None:
        """SIGSTOP: the process freezes mid-whatever (GC pause, VM freeze)."""
        self._signal(signal.SIGSTOP)

    def cont(self) -> None:
        """SIGCONT a stopped process."""
        self._signal(signal.SIGCONT)

    def close(self) -> None:
        """Kill if still running and close the log file; safe to call twice."""
        if self.alive:
            self.kill()
        self._log.close()

    def __repr__(self) -> str:
        return f"<BeatProcess pid={self.pid} alive={self.alive} log={self.log_path}>"

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)  # its own session: reaches only this beat
        except ProcessLookupError:
            pass

    def _reap(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def _tail(self, lines: int = 40) -> str:
        text = "\n".join(self.log_text().splitlines()[-lines:])
        return f"--- {self.log_path} (tail) ---\n{text}"


class BeatCluster(Closing):
    """``n`` beat processes sharing one environment, killed at teardown.

    ``node_env(i)`` may add per-node variables (e.g. a distinct
    ``LB_SETTINGS`` with ``leaderbeat_node_id``). Logs are ``beat-<i>.log``
    in ``directory``.
    """

    def __init__(
        self,
        n: int,
        env: Mapping[str, str],
        directory: str | os.PathLike[str],
        *,
        scheduler: str = DEFAULT_SCHEDULER,
        app_module: str = APP_MODULE,
        node_env: Callable[[int], Mapping[str, str]] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.directory = Path(directory)
        self.beats: list[BeatProcess] = []
        try:
            for i in range(n):
                this_env = dict(env)
                this_env.update(node_env(i) if node_env else {})
                self.beats.append(
                    BeatProcess(
                        app_module,
                        this_env,
                        self.directory / f"beat-{i}.log",
                        scheduler=scheduler,
                        extra_args=extra_args,
                    )
                )
        except BaseException:
            self.close()
            raise

    def __getitem__(self, index: int) -> BeatProcess:
        return self.beats[index]

    def __len__(self) -> int:
        return len(self.beats)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.beats)

    @property
    def alive(self) -> list[BeatProcess]:
        """The processes that have not exited."""
        return [b for b in self.beats if b.alive]

    def logs(self) -> str:
        """All logs, each under a header: attach to a failure message."""
        return "\n".join(
            f"=== beat {i} pid {b.pid} ===\n{b.log_text()}" for i, b in enumerate(self.beats)
        )

    def close(self) -> None:
        """Kill every process; never leaves one running."""
        for beat in self.beats:
            beat.close()

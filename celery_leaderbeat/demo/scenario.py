"""The demo's scenario: start everything, elect, SIGKILL, SIGTERM, run on, measure.

:class:`Demo` drives the processes of :mod:`.procs`, watches Redis through
:class:`.watch.Watcher` (PostgreSQL through :class:`.postgres.PostgresWatcher`), shows what happens on a :mod:`.view` view and
hands what it read to :func:`.summary.summarize`.
"""

from __future__ import annotations

import contextlib
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from ..config import DEFAULTS
from ..store.keys import Keys
from .app import SCHEDULE
from .procs import (
    DemoError,
    Interrupts,
    Proc,
    celery_argv,
    check_broker_transport,
    check_postgres_driver,
    find_redis_server,
    start_redis,
    stop_all,
)
from .summary import Rhythm, Signalled, slot_ms, summarize
from .view import BeatRow, PlainView, Screen
from .watch import Watcher

PREFIX = "leaderbeat-demo"
BEATS = 3
POLL = 0.2  # seconds between two looks at Redis
#: the default the demo runs with: how long a SIGKILLed leader's lease outlives it
LEASE_TTL = float(DEFAULTS["lease_ttl"])


@dataclass(frozen=True)
class Plan:
    """When things happen, in seconds after the first election."""

    duration: float
    kill_at: float
    term_at: float


FULL, QUICK = Plan(54.0, 18.0, 36.0), Plan(24.0, 7.0, 16.0)


class Demo:
    """One run of the scenario in its own temporary directory; :meth:`close` stops every process.

    The directory (logs, Redis' working dir) is the caller's to remove or keep.
    """

    def __init__(self, plan: Plan, interrupts: Interrupts, view: PlainView,
                 screen: Screen, store: str = "redis") -> None:
        self.plan = plan
        self.interrupts = interrupts
        self.view = view
        self.screen = screen
        self.store = store
        self.dir = Path(tempfile.mkdtemp(prefix="leaderbeat-demo-"))
        self.procs: list[Proc] = []
        self.beats: list[Proc] = []
        self.origin = time.time()
        self.signals: list[Signalled] = []
        self._leader: tuple[str, int] | None = None
        self._cleanup: Callable[[], None] | None = None
        self.broker_said = "broker: the demo's Redis (db 1)"

    # -- processes ----------------------------------------------------------------

    def start(self) -> None:
        """The store's server, then the worker, then the beats, each registered before
        anything else."""
        env = self._start_postgres() if self.store == "postgres" else self._start_redis()
        with self.interrupts.held():
            self.worker = Proc("worker", celery_argv(
                "worker", "-P", "solo", "-n", "demo-worker@%h", "--loglevel=INFO",
                "--without-gossip", "--without-mingle"), self.dir, env)
            self.procs.append(self.worker)
        self._say(f"celery worker -P solo (pid {self.worker.pid})")
        for i in range(BEATS):
            with self.interrupts.held():
                beat = Proc(f"beat-{i}", celery_argv(
                    "beat", "-S", "celery_leaderbeat.Scheduler", "--loglevel=INFO",
                    "-s", str(self.dir / f"beat-{i}.schedule")), self.dir, env)
                self.procs.append(beat)
                self.beats.append(beat)
            self.screen.beats.append(BeatRow(i, beat.pid))
            self._say(f"celery beat -S celery_leaderbeat.Scheduler: beat {i} (pid {beat.pid})")

    def _start_redis(self) -> dict[str, str]:
        """A Redis of the demo's own: the broker (db 1), the store (db 0), the runs (db 2)."""
        check_broker_transport()
        binary = find_redis_server()
        with self.interrupts.held():
            self.server, port = start_redis(self.dir, binary)
            self.procs.append(self.server)
        self._say(f"redis-server {binary} on port {port} (pid {self.server.pid}), in {self.dir}")
        url = f"redis://127.0.0.1:{port}"
        self.watch = Watcher(redis.Redis.from_url(f"{url}/0", socket_timeout=2),
                             redis.Redis.from_url(f"{url}/2", socket_timeout=2),
                             Keys(PREFIX), self.beats,
                             broker=redis.Redis.from_url(f"{url}/1", socket_timeout=2))
        return {"LBDEMO_BROKER_URL": f"{url}/1", "LBDEMO_REDIS_URL": f"{url}/0",
                "LBDEMO_RECORD_URL": f"{url}/2", "LBDEMO_PREFIX": PREFIX}

    def _start_postgres(self) -> dict[str, str]:
        """A PostgreSQL cluster of the demo's own (the store and the runs), and a broker."""
        from . import postgres

        check_postgres_driver()
        bindir = postgres.find_bindir()
        with self.interrupts.held():
            self.server, url = postgres.start_postgres(self.dir, bindir)
            self.procs.append(self.server)
        self._say(f"postgres {bindir} on {url.split('@')[-1]} (pid {self.server.pid}), "
                  f"in {self.dir}")
        broker, self.broker_said, self._cleanup = postgres.choose_broker(self.dir)
        self._say(self.broker_said)
        self.watch = postgres.PostgresWatcher(url, PREFIX, self.beats)
        return {**broker, "LBDEMO_STORE_URL": url, "LBDEMO_RECORD_URL": url,
                "LBDEMO_PREFIX": PREFIX}

    def close(self) -> list[int]:
        """Stop every process group and reap it; returns the pids that outlived SIGKILL."""
        with self.interrupts.held(then_raise=False):
            watch = getattr(self, "watch", None)  # none before the server answered
            if watch is not None:
                with contextlib.suppress(Exception):  # the server may be gone already
                    watch.close()
            left = stop_all(self.procs, grace=5.0)
            if self._cleanup is not None:
                self._cleanup()
            return left

    # -- the scenario -------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Start, elect, kill, terminate, run on, stop; the summary of what was measured."""
        self.start()
        self.screen.phase = "waiting for the first election"
        self._until(lambda: self._leader is not None, 45.0, "no beat was elected leader")
        t0 = time.monotonic()
        anchors = self._anchors()
        self.screen.phase = "running the schedule"
        self._watch_until(t0 + self.plan.kill_at)
        killed = self._signal_leader(signal.SIGKILL)
        self.screen.phase = (f"beat {killed.beat} SIGKILLed: its lease must expire "
                             f"(ttl {LEASE_TTL:g} s)")
        self._until(lambda: self._led_by_other(killed), 3 * LEASE_TTL,
                    "no beat took over after SIGKILL")
        self.screen.phase = "running the schedule"
        elected = time.monotonic()
        self._watch_until(max(t0 + self.plan.term_at, elected + 3))  # 3 s of the new leader
        termed = self._signal_leader(signal.SIGTERM)
        self.screen.phase = f"beat {termed.beat} SIGTERMed: it releases the lease"
        self._until(lambda: self._led_by_other(termed), 3 * LEASE_TTL,
                    "no beat took over after SIGTERM")
        self.screen.phase = "running the schedule"
        elected = time.monotonic()
        self._watch_until(max(t0 + self.plan.duration, elected + 5))
        until = time.time()
        self.screen.phase = "stopping the beats, letting the worker finish"
        for beat, row in zip(self.beats, self.screen.beats):
            if beat.signalled is None:
                beat.signalled, row.state = "SIGTERM", "stopped"
        with self.interrupts.held():
            stop_all(self.beats, grace=10.0)
        self._until(lambda: self.watch.pending() == 0, 15.0,
                    "the worker did not finish the queued tasks")
        time.sleep(0.5)  # Celery acks before it runs a task: let the last run record itself
        self._poll()
        rhythms = {name: Rhythm(period, isinstance(spec, str))
                   for name, (spec, period) in SCHEDULE.items()}
        summary = summarize(runs=self.watch.runs, history=self.watch.history, anchors=anchors,
                            rhythms=rhythms, until=until, signals=self.signals,
                            beat_of=self.watch.beat_of, origin=self.origin)
        return {**summary, "store": self.store,
                "broker": self.broker_said.removeprefix("broker: ")}

    def _anchors(self) -> dict[str, int]:
        """Each entry's first-seen time (state ``a``): its slots are the ones after it.

        The leader stores it when it first sees an entry, a few seconds before its
        first slot; should a first slot be sent before this look, the anchor is
        rebuilt from that slot.
        """
        anchors: dict[str, int] = {}

        def seen_all() -> bool:
            for name, (ms, state) in self.watch.slot_states().items():
                if name in SCHEDULE and name not in anchors:
                    spec, period = SCHEDULE[name]
                    anchors[name] = ms if state == "a" else (
                        ms - 1 if isinstance(spec, str) else ms - round(period * 1000))
            return len(anchors) == len(SCHEDULE)

        self._until(seen_all, 15.0, "the leader did not store the entries' first slots")
        return anchors

    def _signal_leader(self, sig: signal.Signals) -> Signalled:
        """Send ``sig`` to the beat holding the lease now."""
        self._poll()
        if self._leader is None:
            raise DemoError(f"nobody leads when {sig.name} is due")
        node, epoch = self._leader
        index = self.watch.identify(node)
        if index is None:
            raise DemoError(f"the leader {node} is none of the demo's beats")
        beat = self.beats[index]
        at = time.time()
        beat.signal(sig)
        beat.signalled = sig.name
        self.screen.beats[index].state = "killed" if sig == signal.SIGKILL else "stopped"
        self._event(f"{sig.name} -> beat {index} (pid {beat.pid}), the leader (epoch {epoch})")
        signalled = Signalled(sig.name, at, index, beat.pid, node)
        self.signals.append(signalled)
        return signalled

    def _led_by_other(self, sig: Signalled) -> bool:
        return self._leader is not None and self._leader[0] != sig.node

    # -- watching ---------------------------------------------------------------------

    def _until(self, done: Callable[[], bool], timeout: float, failure: str) -> None:
        """Poll Redis and refresh the view until ``done()``; DemoError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            self._poll()
            if done():
                return
            if time.monotonic() > deadline:
                raise DemoError(f"{failure} within {timeout:.0f} s (logs: {self.dir})")
            time.sleep(POLL)

    def _watch_until(self, moment: float) -> None:
        """Poll Redis and refresh the view until monotonic time ``moment``."""
        while time.monotonic() < moment:
            self._poll()
            time.sleep(min(POLL, max(0.0, moment - time.monotonic())))

    def _poll(self) -> None:
        """One look: the processes still up, the lease, the runs; then the view refreshed."""
        for proc in (self.server, self.worker):  # nothing works without them
            if not proc.alive:
                raise DemoError(f"{proc.name} (pid {proc.pid}) exited on its own "
                                f"({proc.popen.returncode}); its log ends:\n{_tail(proc)}")
        self._follow_lease()
        self._follow_runs()
        self.screen.elapsed = time.time() - self.origin
        self.view.refresh()

    def _follow_lease(self) -> None:
        """Say each election and release, and a lease that expired; show who leads now."""
        watch = self.watch
        for row in watch.new_history():
            event = row.get("event")
            if event == "elected":
                self._event(f"{watch.name(row.get('node'))} elected leader "
                            f"(epoch {row.get('epoch')})")
            elif event == "released":
                self._event(f"{watch.name(row.get('node'))} released the lease")
        leader = watch.leader()
        if leader is None and self._leader is not None and not self._released_last():
            self._event(f"no leader: the lease of {watch.name(self._leader[0])} expired")
        self._leader = leader
        self._show_beats(leader)

    def _show_beats(self, leader: tuple[str, int] | None) -> None:
        """Each beat's row: whether it leads, under which epoch; DemoError for a beat that
        exited on its own."""
        for i, shown in enumerate(self.screen.beats):
            shown.leader = leader is not None and self.watch.beat_of.get(leader[0]) == i
            shown.epoch = leader[1] if shown.leader and leader else None
            beat = self.beats[i]
            if shown.state == "running" and not beat.alive and beat.signalled is None:
                shown.state = f"exited ({beat.popen.returncode})"
                raise DemoError(f"beat {i} (pid {beat.pid}) exited on its own "
                                f"({beat.popen.returncode}); its log ends:\n{_tail(beat)}")

    def _follow_runs(self) -> None:
        """Show each new run with its lateness and sender; count the runs and duplicates."""
        watch = self.watch
        for run in watch.new_runs():
            lateness = float(run["started"]) - (slot_ms(run.get("slot")) or 0) / 1000
            self.view.run(time.time() - self.origin, run, lateness, watch.sender(run.get("epoch")))
        slots = [(r.get("entry"), r.get("slot")) for r in watch.runs]
        self.screen.runs = len(slots)
        self.screen.duplicates = len(slots) - len(set(slots))

    def _released_last(self) -> bool:
        events = [h.get("event") for h in self.watch.history
                  if h.get("event") in ("elected", "released")]
        return bool(events) and events[-1] == "released"

    def _event(self, text: str) -> None:
        self.view.event(time.time() - self.origin, text)

    def _say(self, text: str) -> None:
        self._event(text)
        self.view.refresh()


def _tail(proc: Proc, lines: int = 15) -> str:
    return "\n".join(proc.log_text().splitlines()[-lines:])

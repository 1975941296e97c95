"""The chaos harness: N real beats, a seeded fault injector, and the verdict.

    run = ChaosRun(workdir, seed=1234, nodes=3, duration=40.0)
    report = run.run()          # starts everything, injects faults, tears down
    print(report.summary())
    assert report.ok, report.failure_text()

What runs:

- two ``redis-server`` processes: the leaderbeat state (killed and restarted
  empty by the injector) and the broker (never touched, so the evidence
  survives every fault);
- N ``celery beat -S celery_leaderbeat.Scheduler`` processes, each talking to
  the state Redis through its own :class:`TcpProxy` (so one beat's link can be
  cut or stalled) and to the broker directly;
- a monitor thread that polls the leader key every 20 ms (failover times) and
  copies the history stream out of Redis every 0.2 s (a Redis restart empties
  it, so it must be copied while it exists);
- the injector, driven only by ``random.Random(seed)``: every fault's kind,
  target choice and duration are drawn from the seed in a fixed order, so a
  seed replays the same fault plan (the interleaving with the beats' own
  timing of course differs from run to run).

Fault kinds (:data:`FAULT_KINDS`): SIGKILL the leader (a fresh beat replaces
it), SIGSTOP the leader past the lease TTL then SIGCONT (it must step down and
stay alive as a standby), SIGTERM a node (the leader, more often than not;
replaced), restart the state Redis (kill + start on the same port: it comes
back empty), drop or blackhole one beat's link (the leader's, more often than
not) for a few seconds.

The soak (``workers=3, broker="amqp", guard=True, settings={}``, :data:`SOAK_KINDS`)
adds prefork workers with ``acks_late`` and the guard, RabbitMQ with a recording
queue, and four kinds: SIGSTOP a standby (3-10 s), SIGKILL a worker (replaced, its
unacknowledged messages redelivered), SIGSTOP the state Redis (1.5-5 s), and SIGKILL
it and restart it with its data (append-only file, fsync always: nothing answered is
lost). A restart-empty then also removes the files.

Verdict (:func:`verdict`): zero duplicate (entry, slot); every expected slot
that was not sent is explained, either by the history (``missed`` or
``unsent``) or by falling in a fault window widened by the failover bound
(start - 1 s .. end + ttl + poll + 2 s); no off-grid slot; no slot both
recorded ``missed`` and sent; no beat exited except the ones the injector
killed or terminated; a resumed leader stepped down; every leader-removing
fault was followed by a new leader within a generous bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

import kombu.exceptions
import redis

from tests.support.beat import NOOP, BeatProcess, Recorder, beat_env
from tests.support.proxy import TcpProxy
from tests.support.redis_server import RedisServer
from tests.support.worker import WorkerProcess, executed

from .amqp import AmqpRecorder, Topology
from .figures import soak_figures
from .soakschedule import grid_of

TTL, RENEW, POLL = 3.0, 1.0, 0.5
SETTINGS: dict[str, Any] = {
    "leaderbeat_lease_ttl": TTL,
    "leaderbeat_renew_interval": RENEW,
    "leaderbeat_standby_poll": POLL,
}

#: entry name -> spec for :func:`beat_env`
SCHEDULE: dict[str, dict[str, Any]] = {
    "every1a": {"task": NOOP, "every": 1},
    "every1b": {"task": NOOP, "every": 1},
    "every2": {"task": NOOP, "every": 2},
    "cron2s": {"task": NOOP, "cron": "*/2 * * * * *"},
}

FAULT_KINDS = (
    "kill_leader",
    "stop_leader",
    "term_node",
    "restart_redis",
    "cut_link",
    "stall_link",
)

#: the soak's kinds: the above plus a standby stopped, a worker killed (and replaced),
#: the state Redis stopped (SIGSTOP) a few seconds, and killed and restarted with its data
SOAK_KINDS = FAULT_KINDS + ("stop_standby", "kill_worker", "stop_redis", "restart_redis_kept")

#: the PostgreSQL soak's kinds (``tests/chaos/pgrun.py``): the beats', the links' and the
#: workers' faults above, and the server's: stopped and started again ("fast": sessions
#: closed cleanly), crashed (immediate stop: recovery from the WAL on start), every
#: client session ended by ``pg_terminate_backend``, and every server process SIGSTOPped
PG_KINDS = ("restart_pg", "crash_pg", "terminate_pg", "pause_pg")
PG_SOAK_KINDS = ("kill_leader", "stop_leader", "term_node", "cut_link", "stall_link",
                 "stop_standby", "kill_worker", *PG_KINDS)
ALL_KINDS = SOAK_KINDS + PG_KINDS

#: Redis faults after which a missing slot may lack a history record (the stream is lost)
HISTORY_LOSING = frozenset({"restart_redis"})

#: how far a fault window is widened: before its start, and after its end
WINDOW_BEFORE = 1.0
WINDOW_AFTER = TTL + POLL + 2.0

def failover_bounds(ttl: float, poll: float) -> dict[str, float]:
    """Generous bounds on the time until a new leader token appears (seconds)."""
    return {
        "kill_leader": ttl + poll + 2.5,  # from the SIGKILL
        "stop_leader": ttl + poll + 2.5,  # from the SIGSTOP
        "term_node": 2.5,  # from the SIGTERM (designed: ~100 ms)
        "restart_redis": 2.0 + poll + 3.5,  # from Redis being back (reconnect backoff caps at 2 s)
        "cut_link": ttl + poll + 2.5,  # from the cut, when another node took over
        "stall_link": ttl + poll + 2.5,
    }


FAILOVER_BOUND = failover_bounds(TTL, POLL)

#: slots newer than the end of the run minus this are not expected yet
END_MARGIN = 3.0


# -- small helpers ------------------------------------------------------------------------


def pid_of(token: str | None) -> int | None:
    """The pid inside a leader token ``host:pid:random|epoch``."""
    if not token:
        return None
    try:
        return int(token.rsplit("|", 1)[0].split(":")[-2])
    except (IndexError, ValueError):
        return None


def node_of(token: str | None) -> str | None:
    return token.rsplit("|", 1)[0] if token else None


def slot_ms(value: Any) -> int:
    """A ``leaderbeat_slot`` header (ISO time) as integer epoch milliseconds."""
    return round(datetime.fromisoformat(str(value)).timestamp() * 1000)


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%H:%M:%S.%f")[:-3]


def wait_until(predicate: Callable[[], Any], timeout: float, step: float = 0.02) -> Any:
    """Poll ``predicate`` until truthy; its value, or None after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(step)


@dataclass
class Fault:
    """One injected fault, with monotonic and wall-clock start and end."""

    kind: str
    target: str
    start_mono: float
    start_wall: float
    end_mono: float = 0.0
    end_wall: float = 0.0
    leader_before: str | None = None
    hit_leader: bool = False  # the target was the leader when the fault began
    failover: float | None = None  # seconds until a new leader token appeared
    failover_from: str = ""  # "start" or "end" (Redis restart: from Redis being back)
    note: str = ""
    window_after: float = WINDOW_AFTER  # ttl + poll + 2 s of the run
    load: float = 0.0  # 1-minute load average when the fault began

    def window_ms(self) -> tuple[int, int]:
        return (round((self.start_wall - WINDOW_BEFORE) * 1000),
                round((self.end_wall + self.window_after) * 1000))


@dataclass
class Observation:
    mono: float
    wall: float
    token: str | None
    ok: bool  # False: Redis did not answer


class Watching(threading.Thread):
    """Polls the store's leader (changes only are kept) every ``interval`` s and copies its
    history every ``copy_every`` polls, and once more at the end; a store's watcher says
    how (``_poll_leader``, ``_copy_history``, ``_close``)."""

    copy_every = 10

    def __init__(self, name: str, interval: float) -> None:
        super().__init__(name=name, daemon=True)
        self.interval = interval
        self.lock = threading.Lock()
        self.observations: list[Observation] = []
        self.history: dict[tuple[str, ...], dict[str, str]] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        n = 0
        while not self._halt.is_set():
            self._poll_leader()
            if n % self.copy_every == 0:
                self._copy_history()
            n += 1
            self._halt.wait(self.interval)
        self._copy_history()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)
        self._close()

    def _poll_leader(self) -> None:
        raise NotImplementedError

    def _copy_history(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError


class Monitor(Watching):
    """Polls the leader key and copies the history stream."""

    def __init__(self, server: RedisServer, prefix: str, interval: float = 0.02) -> None:
        super().__init__("chaos-monitor", interval)
        self.client = server.client(timeout=0.5)
        self.leader_key = "{" + prefix + "}:leader"
        self.history_key = "{" + prefix + "}:history"
        self._last_id = "-"

    def _close(self) -> None:
        self.client.close()

    def _poll_leader(self) -> None:
        try:
            raw = cast("bytes | None", self.client.get(self.leader_key))  # no decode_responses
            obs = Observation(time.monotonic(), time.time(), raw.decode() if raw else None, True)
        except (redis.RedisError, OSError):
            obs = Observation(time.monotonic(), time.time(), None, False)
        with self.lock:
            last = self.observations[-1] if self.observations else None
            if last is None or (last.token, last.ok) != (obs.token, obs.ok):
                self.observations.append(obs)

    def _copy_history(self) -> None:
        try:
            start = "-" if self._last_id == "-" else "(" + self._last_id
            # no decode_responses: bytes; XRANGE answers a list, every entry with its fields
            rows = cast("list[tuple[bytes, dict[bytes, bytes]]]",
                        self.client.xrange(self.history_key, min=start, max="+", count=10000))
        except (redis.RedisError, OSError):
            self._last_id = "-"  # Redis may come back empty: read the new stream from its start
            return
        with self.lock:
            for event_id, fields in rows:
                row = {k.decode(): v.decode() for k, v in fields.items()}
                row["id"] = event_id.decode()
                key = (row["id"], row.get("event", ""), row.get("entry", ""),
                       row.get("slot", ""), row.get("node", ""))
                self.history[key] = row
        if rows:
            self._last_id = rows[-1][0].decode()

    def snapshot(self) -> tuple[list[Observation], list[dict[str, str]]]:
        with self.lock:
            return list(self.observations), list(self.history.values())


@dataclass
class Node:
    """One of the N beat seats: its proxy and its current process (replaced on kill/term)."""

    index: int
    proxy: TcpProxy
    proc: BeatProcess
    generation: int = 0


@dataclass
class Spawned:
    proc: BeatProcess
    label: str
    expected_exit: str = ""  # why the injector ended it ("" = it must be alive)
    expected_why: str = ""  # e.g. "the leader" or "a standby"


# -- the report ---------------------------------------------------------------------------


@dataclass
class Report:
    seed: int
    nodes: int
    wall_seconds: float = 0.0
    chaos_seconds: float = 0.0
    faults: list[Fault] = field(default_factory=list)
    #: the slots of the entries' grids up to the run's end; ``messages`` may hold more (a
    #: slot sent past that end), so expected - unique is not ``missing``: counted apart
    expected: int = 0
    messages: int = 0
    unique: int = 0
    duplicates: list[tuple[str, str]] = field(default_factory=list)
    missing: int = 0
    explained_history: int = 0
    explained_unsent: int = 0
    explained_window: int = 0
    unexplained: list[tuple[str, str]] = field(default_factory=list)
    #: missing slots explained only by a fault window: (entry, slot, the faults' kinds)
    window_only: list[tuple[str, str, str]] = field(default_factory=list)
    unrecorded: int = 0  # of those, not near a Redis restart (G3 says: recorded)
    issues: list[str] = field(default_factory=list)
    info: list[str] = field(default_factory=list)
    workdir: str = ""
    #: the run's shape: broker, workers, guard, entries, ttl, kinds
    mode: dict[str, Any] = field(default_factory=dict)
    #: with workers: :func:`soak_figures` (executions, guard events, lateness)
    figures: dict[str, Any] = field(default_factory=dict)
    load: dict[str, float] = field(default_factory=dict)
    end_wall: float = 0.0

    @property
    def ok(self) -> bool:
        return (not self.duplicates and not self.unexplained and not self.issues
                and not self.figures.get("executed_twice")
                and not self.figures.get("published_never_executed"))

    @property
    def longest_failover(self) -> Fault | None:
        measured = [f for f in self.faults if f.failover is not None]
        return max(measured, key=lambda f: f.failover or 0.0) if measured else None

    def summary(self) -> str:
        kinds = Counter(f.kind for f in self.faults)
        kinds_text = " ".join(f"{k}={kinds[k]}" for k in ALL_KINDS if kinds[k])
        longest = self.longest_failover
        longest_text = (f"{longest.failover:.2f}s ({longest.kind}, {longest.failover_from})"
                        if longest else "n/a")
        per_kind = []
        for kind in ALL_KINDS:
            values = [f.failover for f in self.faults if f.kind == kind and f.failover is not None]
            if values:
                per_kind.append(f"{kind}<={max(values):.2f}s")
        s = f"chaos seed={self.seed}"
        lines = [
            f"{s} nodes={self.nodes} {self.mode}",
            (f"{s} nodes={self.nodes} duration={self.wall_seconds:.1f}s "
            f"(chaos {self.chaos_seconds:.1f}s) faults={len(self.faults)} [{kinds_text}]"),
            (f"{s} slots expected={self.expected} sent={self.messages} unique={self.unique} "
            f"duplicate={len(self.duplicates)} missing={self.missing} missed-explained="
            f"{self.explained_history + self.explained_unsent + self.explained_window} "
            f"(history-missed={self.explained_history} history-unsent={self.explained_unsent} "
            f"fault-window={self.explained_window}, of which unrecorded={self.unrecorded}) "
            f"missed-unexplained={len(self.unexplained)}"),
            f"{s} longest failover={longest_text} [{' '.join(per_kind)}]",
        ]
        if self.figures:
            f = self.figures
            lp, le = f["lateness_publish_s"], f["lateness_execution_s"]
            lines += [
                (f"{s} published={f['publishes']} (slots {f['slots_published']}) "
                f"published-more-than-once={f['published_more_than_once']} "
                f"executed={f['executions']} (slots {f['slots_executed']}) "
                f"executed-twice={f['executed_twice']} (and reruns of runs killed with "
                f"their worker: {f['executed_twice_rerun_after_worker_kill']}) "
                f"published-never-executed={f['published_never_executed']} "
                f"missed-without-reason={self.missed_without_reason}"),
                (f"{s} lateness publish p50={lp['p50']}s p99={lp['p99']}s worst={lp['worst']}s; "
                f"execution p50={le['p50']}s p99={le['p99']}s worst={le['worst']}s; "
                f"load avg mean={self.load.get('mean')} max={self.load.get('max')}"),
                f"{s} guard {f['guard_events']}",
            ]
        lines += [
            (f"{s} verdict={'PASS' if self.ok else 'FAIL'} issues={len(self.issues)} "
            f"(replay: LEADERBEAT_CHAOS_SEED={self.seed}) logs={self.workdir}"),
        ]
        return "\n".join(lines)

    @property
    def missed_without_reason(self) -> int:
        """Expected slots not published and not recorded, outside any fault window, plus
        those in a fault window that no history-losing Redis restart explains."""
        return len(self.unexplained) + self.unrecorded

    def fault_table(self, t0_mono: float | None = None) -> str:
        t0 = t0_mono if t0_mono is not None else (self.faults[0].start_mono if self.faults else 0)
        rows = []
        for f in self.faults:
            fo = f"{f.failover:.2f}s from {f.failover_from}" if f.failover is not None else "-"
            rows.append(f"  +{f.start_mono - t0:6.1f}s {f.kind:<13} {f.target:<28} "
                        f"{f.end_mono - f.start_mono:5.1f}s  wall {iso(round(f.start_wall*1000))}"
                        f"..{iso(round(f.end_wall*1000))}  failover {fo} {f.note}")
        return "\n".join(rows)

    def failure_text(self) -> str:
        parts = [self.summary(), "faults:", self.fault_table()]
        if self.duplicates:
            parts.append(f"DUPLICATE (entry, slot): {self.duplicates[:20]}")
        if self.unexplained:
            parts.append(f"UNEXPLAINED missing slots: {self.unexplained[:30]}")
        parts += [f"ISSUE: {i}" for i in self.issues]
        for key in ("published_more_than_once_examples", "executed_twice_examples",
                    "published_never_executed_examples"):
            if self.figures.get(key):
                parts.append(f"{key}: {self.figures[key]}")
        if self.window_only:
            parts.append(f"explained by a fault window only (not in the history): "
                         f"{self.window_only[:40]}")
        parts += [f"info: {i}" for i in self.info]
        return "\n".join(parts)

    def to_json(self) -> str:
        data = asdict(self)
        data["ok"] = self.ok
        return json.dumps(data, indent=1, default=str)


# -- the verdict (pure: no processes, no Redis) -----------------------------------------


def expected_slots(kind: str, step_ms: int, observed: Sequence[int], restarts_ms: Sequence[int],
                   end_ms: int) -> tuple[list[int], list[int]]:
    """(expected slots, off-grid observed slots) of one entry, up to ``end_ms``.

    ``kind`` "cron": a fixed grid of multiples of ``step_ms`` (``*/2`` seconds) from the
    first observed slot. ``kind`` "interval": the phase is the entry's anchor, which a
    Redis restart (state lost) re-anchors at "now"; so the observed slots are split into
    segments at each restart (slots older than the kill belong to the segment before),
    each segment is a grid ``first + k*step``, and a segment's grid runs until the next
    non-empty segment's anchor (its first slot minus one step) or ``end_ms``.
    """
    observed = sorted(set(observed))
    if not observed:
        return [], []
    if kind == "cron":
        start = observed[0] - observed[0] % step_ms
        return list(range(start, end_ms + 1, step_ms)), [s for s in observed if s % step_ms]
    bounds = sorted(restarts_ms)
    segments: list[list[int]] = [[] for _ in range(len(bounds) + 1)]
    for s in observed:
        segments[sum(1 for b in bounds if s >= b)].append(s)
    segments = [seg for seg in segments if seg]
    grid: list[int] = []
    off: list[int] = []
    for i, seg in enumerate(segments):
        first = seg[0]
        limit = segments[i + 1][0] - step_ms if i + 1 < len(segments) else end_ms
        grid += list(range(first, max(limit, seg[-1]) + 1, step_ms))
        off += [s for s in seg if (s - first) % step_ms]
    return sorted(set(grid)), off


def verdict(report: Report, *, schedule: Mapping[str, Mapping[str, Any]],
            messages: Iterable[tuple[str | None, Any]], history: Iterable[Mapping[str, str]],
            restarts_wall: Sequence[float], end_wall: float,
            end_margin: float = END_MARGIN) -> Report:
    """Fill ``report``'s slot counts from what the broker received and the history said.

    ``restarts_wall``: the Redis restarts that lost the state (interval entries re-anchor).
    """
    counts = _count_messages(report, messages, schedule)
    observed: dict[str, list[int]] = defaultdict(list)
    for entry, slot in counts:
        if entry is not None and entry in schedule and slot is not None:
            observed[entry].append(slot_ms(slot))
    missed, unsent = _recorded_misses(history)
    windows = [f.window_ms() for f in report.faults]
    unrecorded: list[str] = []
    restarts_ms = [round(w * 1000) for w in restarts_wall]
    end_ms = round((end_wall - end_margin) * 1000)
    for entry, spec in schedule.items():
        seen = observed.get(entry, [])
        if not seen:
            report.issues.append(f"entry {entry}: no message at all")
            continue
        grid = _grid(report, entry, spec, seen, restarts_ms, end_ms)
        seen_set = set(seen)
        report.expected += len(grid)
        _check_sent_not_missed(report, entry, seen_set, missed)
        for s in grid:
            if s not in seen_set and _count_missing(report, entry, s, (missed, unsent), windows):
                unrecorded.append(f"{entry}@{iso(s)}")
    report.unrecorded = len(unrecorded)
    if unrecorded:
        # G3: "every missed slot is recorded in the history". Only a Redis restart may
        # lose the record (the stream is emptied with the rest of the state).
        report.issues.append(f"G3-UNRECORDED-MISS: {len(unrecorded)} missing slot(s) in a fault "
                             f"window but recorded neither 'missed' nor 'unsent' in the history, "
                             f"and no Redis restart near them: {unrecorded[:20]}")
    return report


def _count_messages(report: Report, messages: Iterable[tuple[str | None, Any]],
                    schedule: Mapping[str, Any]) -> Counter[tuple[str | None, Any]]:
    """Count the messages, their duplicates and the distinct (entry, slot) pairs into
    ``report``, with an issue for messages of no entry of ``schedule``; the pairs' counts."""
    msgs = [(entry, slot) for entry, slot in messages]
    report.messages = len(msgs)
    counts = Counter(msgs)
    report.duplicates = sorted((str(e), str(s)) for (e, s), n in counts.items() if n > 1)
    report.unique = len(counts)
    unknown = sorted({str(e) for e, _ in msgs if e not in schedule})
    if unknown:
        report.issues.append(f"messages for unknown entries (or without headers): {unknown}")
    return counts


def _recorded_misses(history: Iterable[Mapping[str, str]]
                     ) -> tuple[set[tuple[str, int]], set[tuple[str, int]]]:
    """The (entry, slot ms) the history recorded 'missed', and those it recorded 'unsent'."""
    missed: set[tuple[str, int]] = set()
    unsent: set[tuple[str, int]] = set()
    for row in history:
        if row.get("event") not in ("missed", "unsent") or not row.get("slot"):
            continue
        if "not listed" in row.get("detail", ""):
            continue  # an aggregate count, not this slot
        key = (row.get("entry", ""), int(row["slot"]))
        (missed if row["event"] == "missed" else unsent).add(key)
    return missed, unsent


def _grid(report: Report, entry: str, spec: Mapping[str, Any], seen: Sequence[int],
          restarts_ms: Sequence[int], end_ms: int) -> list[int]:
    """The slots ``entry`` should have sent (see :func:`expected_slots`); an issue for the
    ones seen off that grid."""
    kind, step = grid_of(spec)
    grid, off = expected_slots(kind, step, seen, restarts_ms, end_ms)
    if off:
        report.issues.append(f"entry {entry}: {len(off)} slot(s) off its grid: "
                             f"{[iso(s) for s in off[:10]]}")
    return grid


def _check_sent_not_missed(report: Report, entry: str, seen: set[int],
                           missed: set[tuple[str, int]]) -> None:
    """An issue for slots of ``entry`` the history recorded 'missed' that were sent."""
    sent_missed = sorted(s for (e, s) in missed if e == entry and s in seen)
    if sent_missed:
        report.issues.append(f"entry {entry}: {len(sent_missed)} slot(s) recorded 'missed' "
                             f"in the history but sent: {[iso(s) for s in sent_missed[:10]]}")


def _count_missing(report: Report, entry: str, s: int,
                   recorded: tuple[set[tuple[str, int]], set[tuple[str, int]]],
                   windows: Sequence[tuple[int, int]]) -> bool:
    """Count slot ``s`` of ``entry``, never sent, by what explains it: the history
    ('missed', 'unsent'), a fault's window, or nothing. True for a slot in a window that
    the history left unrecorded though no fault near it could have lost the record."""
    missed, unsent = recorded
    report.missing += 1
    if (entry, s) in missed:
        report.explained_history += 1
    elif (entry, s) in unsent:
        report.explained_unsent += 1
    elif any(lo <= s <= hi for lo, hi in windows):
        report.explained_window += 1
        near = {f.kind for f, (lo, hi) in zip(report.faults, windows) if lo <= s <= hi}
        report.window_only.append((entry, iso(s), "+".join(sorted(near))))
        return not near & HISTORY_LOSING
    else:
        report.unexplained.append((entry, iso(s)))
    return False


def measure_failovers(faults: Sequence[Fault], observations: Sequence[Observation],
                      report: Report, ttl: float = TTL, poll: float = POLL) -> None:
    """Per fault: seconds until a new leader token appeared; issues where over the bound.

    A link fault on the leader need not remove it (a cut shorter than the lease is
    survived): a new token counts for it only before the next fault began and within
    ttl + poll + 3 s of its end; otherwise the leader kept its lease.
    """
    faults = list(faults)
    bounds = failover_bounds(ttl, poll)
    for i, f in enumerate(faults):
        if f.kind not in bounds:
            continue  # a standby, a worker, or Redis paused / restarted with its data
        next_start = faults[i + 1].start_mono if i + 1 < len(faults) else float("inf")
        if f.kind == "restart_redis":
            ref, f.failover_from = f.end_mono, "Redis back"
            new = next((o for o in observations
                        if o.mono >= ref and o.ok and o.token), None)
        elif f.hit_leader:
            ref, f.failover_from = f.start_mono, "fault start"
            new = next((o for o in observations
                        if o.mono >= ref and o.ok and o.token and o.token != f.leader_before),
                       None)
        else:
            continue
        if f.kind in ("cut_link", "stall_link"):
            limit = min(next_start, f.end_mono + ttl + poll + 3.0)
            if new is None or new.mono > limit:
                f.note += " leader kept its lease"
                continue
            if node_of(new.token) == node_of(f.leader_before):
                f.note += " same node re-elected"
        if new is None:
            report.issues.append(f"{f.kind} at wall {iso(round(f.start_wall * 1000))}: no new "
                                 f"leader token ever appeared (before: {f.leader_before})")
            continue
        took = new.mono - ref
        f.failover = took
        if took > bounds[f.kind]:
            report.issues.append(f"FAILOVER-BOUND: {f.kind} at wall "
                                 f"{iso(round(f.start_wall * 1000))}: new leader after "
                                 f"{took:.2f}s > bound {bounds[f.kind]:.1f}s")


# -- the run ------------------------------------------------------------------------------


@dataclass
class WorkerSeat:
    """One of the soak's workers: its current process (replaced when killed)."""

    index: int
    proc: WorkerProcess
    generation: int = 0


class ChaosRun:
    """One chaos run in ``workdir``; :meth:`run` returns the :class:`Report`.

    By default (the short CI run): the Redis broker drained by a recorder, no
    workers, :data:`SCHEDULE`, a shortened lease (:data:`SETTINGS`) and
    :data:`FAULT_KINDS`. The soak passes ``workers`` (prefork, ``acks_late``),
    ``broker="amqp"`` (RabbitMQ, a topology of the run's own, every publish copied
    to a recording queue), ``guard=True``, its own ``schedule``, ``settings={}``
    (Celery's and leaderbeat's defaults: ttl 10 s) and :data:`SOAK_KINDS`.
    """

    def __init__(self, workdir: str | Path, *, seed: int, nodes: int = 3,
                 duration: float = 40.0, max_faults: int | None = None,
                 gap: tuple[float, float] = (2.0, 5.0), steady: float = 8.0,
                 log: Callable[[str], None] = print, workers: int = 0,
                 broker: str = "redis", guard: bool = False,
                 schedule: Mapping[str, Mapping[str, Any]] | None = None,
                 settings: Mapping[str, Any] | None = None,
                 kinds: Sequence[str] = FAULT_KINDS) -> None:
        if broker not in ("redis", "amqp"):
            raise ValueError(f"broker={broker!r}: 'redis' or 'amqp'")
        if workers and broker != "amqp":
            raise ValueError("workers need broker='amqp' (the Redis broker's queue is drained "
                             "by the recorder, so workers would see nothing)")
        unknown = sorted(set(kinds) - set(ALL_KINDS))
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; known: {ALL_KINDS}")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.seed = seed
        self.rng = random.Random(seed)
        self.n = nodes
        self.duration = duration
        self.max_faults = max_faults
        self._terms = 0
        self.gap = gap
        self.steady = steady
        self._print = log
        self.n_workers = workers
        self.broker_kind = broker
        self.guard = guard
        self.schedule = dict(schedule if schedule is not None else SCHEDULE)
        self.settings = dict(SETTINGS if settings is None else settings)
        self.kinds = tuple(kinds)
        self.ttl = float(self.settings.get("leaderbeat_lease_ttl", 10.0))
        self.poll = float(self.settings.get("leaderbeat_standby_poll", 1.0))
        self.tag = f"{seed}-{random.SystemRandom().randrange(16**6):06x}"
        self.prefix = f"chaos-{seed}"
        self.report = Report(seed=seed, nodes=nodes, workdir=str(self.workdir))
        self.report.mode = {"broker": broker, "workers": workers, "guard": guard,
                            "entries": len(self.schedule), "ttl": self.ttl,
                            "kinds": list(self.kinds)}
        self.faults: list[Fault] = []
        self.restarts_wall: list[float] = []  # restarts that lost the state
        self.spawned: list[Spawned] = []
        self.nodes: list[Node] = []
        self.seats: list[WorkerSeat] = []
        self.dead_workers: list[WorkerProcess] = []
        self.killed_workers: dict[str, float] = {}  # node name -> wall time of the SIGKILL
        self.loads: list[float] = []
        self._bag: list[str] = []
        self._events = open(self.workdir / "chaos-events.log", "a")  # noqa: SIM115
        self.t0 = time.monotonic()

    # -- logging

    def log(self, text: str) -> None:
        line = f"[chaos seed={self.seed} +{time.monotonic() - self.t0:6.1f}s] {text}"
        self._events.write(line + "\n")
        self._events.flush()
        self._print(line)

    # -- lifecycle

    def _start_servers(self) -> None:
        keep = "restart_redis_kept" in self.kinds
        # Restarted with its data: every write is in the append-only file before it is
        # answered (fsync always), so a kill loses nothing the nodes were told.
        state_args = ["--appendonly", "yes", "--appendfsync", "always"] if keep else []
        self.state = RedisServer(state_args, workdir=self.workdir / "redis-state")
        self.ctl = self.state.client(timeout=0.5)
        self.results: RedisServer | None = None
        broker_url = self._start_broker()
        if self.n_workers:
            self.results = RedisServer(workdir=self.workdir / "redis-results")
        self.env = beat_env(self.workdir, broker_url=broker_url, redis_url=self.state.url,
                            prefix=self.prefix, schedule=self.schedule,
                            settings=self._celery_settings())
        if self.results is not None:
            self.env["LB_RECORD_URL"] = self.results.url

    def _start_broker(self) -> str:
        """RabbitMQ's topology and recorder, or the Redis broker and its recorder: the URL."""
        self.topology: Topology | None = None
        if self.broker_kind == "amqp":
            self.topology = Topology(self.tag)
            self.topology.declare()
            self.amqp = AmqpRecorder(self.topology)
            self.amqp.start()
            return self.topology.url
        self.broker = RedisServer(workdir=self.workdir / "redis-broker")
        self.recorder = Recorder(self.broker.client())
        return self.broker.url_for(0)

    def _celery_settings(self) -> dict[str, Any]:
        settings = dict(self.settings)
        if self.guard:
            settings["leaderbeat_guard"] = True
        if self.topology is not None:
            settings.update(self.topology.settings())
        if self.n_workers:
            settings["task_acks_late"] = True
        return settings

    def run(self) -> Report:
        self.log(f"start: seed={self.seed} nodes={self.n} chaos={self.duration:.0f}s "
                 f"mode={self.report.mode} workdir={self.workdir} "
                 f"(replay: LEADERBEAT_CHAOS_SEED={self.seed})")
        self._start_servers()
        self.monitor = self._make_monitor()
        try:
            for i in range(self.n_workers):
                self.seats.append(WorkerSeat(i, self._spawn_worker(i, 0)))
            for i in range(self.n):
                proxy = TcpProxy("127.0.0.1", self._state_port())
                self.nodes.append(Node(i, proxy, self._spawn(i, proxy, 0)))
            self.monitor.start()
            self._warm_up()
            chaos_start = time.monotonic()
            chaos_end = chaos_start + self.duration
            while True:
                gap = self.rng.uniform(*self.gap)
                kind = self._next_kind()
                params = (self.rng.random(), self.rng.random(), self.rng.uniform(1.5, 5.0))
                if time.monotonic() + gap >= chaos_end:
                    break
                if self.max_faults is not None and len(self.faults) >= self.max_faults:
                    break
                time.sleep(gap)
                self.loads.append(os.getloadavg()[0])
                self._inject(kind, *params)
                self.faults[-1].load = self.loads[-1]
                self.faults[-1].window_after = self.ttl + self.poll + 2.0
                self._settle()
            self.report.chaos_seconds = time.monotonic() - chaos_start
            self.log(f"chaos over after {len(self.faults)} faults; steady for {self.steady:.0f}s")
            time.sleep(self.steady)
            end_wall = time.time()
            self._drain_published()
            self._wait_workers_idle()
            self._check_processes()
        finally:
            if self.monitor.is_alive():
                self.monitor.stop()
            rows = self._executed_rows()
            self._teardown()
        observations, history = self.monitor.snapshot()
        report = self.report
        report.faults = self.faults
        report.wall_seconds = time.monotonic() - self.t0
        report.end_wall = end_wall
        if self.loads:
            report.load = {"mean": round(sum(self.loads) / len(self.loads), 2),
                           "max": round(max(self.loads), 2)}
        measure_failovers(self.faults, observations, report, self.ttl, self.poll)
        published = self._published()
        margin = END_MARGIN if self.broker_kind == "redis" and not self.n_workers else 5.0
        verdict(report, schedule=self.schedule,
                messages=((entry, slot) for entry, slot, _, _ in published),
                history=history, restarts_wall=self.restarts_wall, end_wall=end_wall,
                end_margin=margin)
        if self.n_workers:
            report.figures = soak_figures(published=published, executed=rows, history=history,
                                          end_ms=round((end_wall - margin) * 1000),
                                          killed_workers=self.killed_workers)
            (self.workdir / "chaos-executed.json").write_text(json.dumps(rows, indent=0))
            (self.workdir / "chaos-published.json").write_text(
                json.dumps(published, indent=0, default=str))
        self._info(history)
        (self.workdir / "chaos-report.json").write_text(report.to_json())
        (self.workdir / "chaos-history.json").write_text(json.dumps(history, indent=0))
        (self.workdir / "chaos-leader.json").write_text(
            json.dumps([asdict(o) for o in observations], indent=0))
        self.log("faults:\n" + report.fault_table(self.t0))
        for line in report.summary().splitlines():
            self.log(line)
        self._events.close()
        return report

    def _published(self) -> list[tuple[str | None, Any, str, float]]:
        """Every publish seen: (entry, slot header, task id, wall time seen)."""
        if self.broker_kind == "amqp":
            return [(m.entry, m.slot, m.id, m.received) for m in self.amqp.snapshot()]
        return [(m.entry, m.slot, m.id, m.received) for m in self.recorder.messages]

    def _drain_published(self) -> None:
        if self.broker_kind == "redis":
            self.recorder.drain()
        else:
            time.sleep(1.0)  # the consumer's prefetch: let it catch up

    def _wait_workers_idle(self, timeout: float = 60.0) -> None:
        """With workers: until the workers' queue is empty twice in a row (or timeout).

        The beats go on publishing meanwhile, so the executions never stop growing;
        what was published before the end is done once nothing waits in the queue
        (a message being run is not counted there: hence twice, 2 s apart).
        """
        if not self.n_workers or self.topology is None:
            return
        deadline = time.monotonic() + timeout
        empty = 0
        while time.monotonic() < deadline:
            try:
                empty = empty + 1 if self.topology.backlog() == 0 else 0
            except (OSError, kombu.exceptions.KombuError) as exc:
                self.report.info.append(f"queue depth unknown: {exc!r}")
                empty = 0
            if empty >= 2:
                return
            time.sleep(2.0)
        self.report.info.append(f"workers still busy {timeout:.0f}s after the end")

    def _warm_up(self) -> None:
        """Wait for a leader and a first message of every entry (conditions, not sleeps)."""
        if not wait_until(self._live_leader, 40 + self.ttl):
            raise AssertionError(f"seed {self.seed}: no leader within 40s\n{self._logs_tail()}")
        entries = set(self.schedule)
        longest = max(grid_of(spec)[1] for spec in self.schedule.values()) / 1000

        def all_seen() -> bool:
            if self.broker_kind == "redis":
                self.recorder.drain()
            return entries <= {p[0] for p in self._published()}

        if not wait_until(all_seen, 20 + longest, step=0.1):
            missing = sorted(entries - {p[0] for p in self._published()})
            raise AssertionError(f"seed {self.seed}: not every entry was sent within "
                                 f"{20 + longest:.0f}s (missing {missing[:10]})\n"
                                 f"{self._logs_tail()}")
        self.log(f"warm: leader {self._read_leader()}, {len(self._published())} messages")

    def _teardown(self) -> None:
        for sp in self.spawned:
            with contextlib.suppress(Exception):  # tear down the rest whatever one did
                sp.proc.close()
        for seat in self.seats:
            seat.proc.close()
        for proc in self.dead_workers:
            proc.close()
        for node in self.nodes:
            node.proxy.close()
        self._stop_state()
        if self.broker_kind == "amqp":
            self.amqp.stop()
            assert self.topology is not None
            errors = self.topology.delete()
            if errors:
                self.report.info.append(f"amqp clean-up errors: {errors}")
            if self.amqp.errors:
                self.report.info.append(f"amqp recorder errors: {self.amqp.errors[:5]}")
        else:
            with contextlib.suppress(redis.RedisError, OSError):
                self.recorder.client.close()
            self.broker.kill()
        self._stop_results()

    # -- the store's server (the PostgreSQL run overrides these)

    def _make_monitor(self) -> Any:
        return Monitor(self.state, self.prefix)

    def _state_port(self) -> int:
        return self.state.port

    def _executed_rows(self) -> list[dict[str, Any]]:
        return executed(self.results.client()) if self.results is not None else []

    def _stop_state(self) -> None:
        with contextlib.suppress(redis.RedisError, OSError):
            self.ctl.close()
        self.state.resume()  # a stop_redis interrupted mid-way must not leave it frozen
        self.state.kill()

    def _stop_results(self) -> None:
        if self.results is not None:
            self.results.kill()

    # -- processes

    def _spawn(self, index: int, proxy: TcpProxy, generation: int) -> BeatProcess:
        env = dict(self.env, LB_REDIS_URL=proxy.url_for(0))
        proc = BeatProcess(env=env, log_path=self.workdir / f"beat-{index}-{generation}.log")
        self.spawned.append(Spawned(proc, f"beat-{index}-{generation}"))
        return proc

    def _spawn_worker(self, index: int, generation: int) -> WorkerProcess:
        """A prefork worker (2 processes) with a unique node name; talks to Redis directly."""
        return WorkerProcess(self.env, self.workdir / f"worker-{index}-{generation}.log",
                             name=self._worker_name(index, generation),
                             extra_args=["--include", "tests.chaos.soaktask"])

    def _worker_name(self, index: int, generation: int) -> str:
        return f"w{index}g{generation}-{self.tag}"

    def _replace(self, node: Node) -> None:
        node.generation += 1
        node.proc = self._spawn(node.index, node.proxy, node.generation)

    def _expect_exit(self, proc: BeatProcess, how: str, role: str = "") -> None:
        for sp in self.spawned:
            if sp.proc is proc:
                sp.expected_exit, sp.expected_why = how, role

    def _check_processes(self) -> None:
        for sp in self.spawned:
            if sp.expected_exit:
                if sp.expected_exit == "SIGTERM" and sp.proc.returncode not in (0, None):
                    critical = [line for line in sp.proc.log_text().splitlines()
                                if "CRITICAL" in line]
                    self.report.issues.append(
                        f"SIGTERM-EXIT-STATUS: {sp.label} (pid {sp.proc.pid}, {sp.expected_why}) "
                        f"exited {sp.proc.returncode} after SIGTERM, expected 0: "
                        f"{critical[:2]} (log {sp.proc.log_path})")
                continue
            if not sp.proc.alive:
                self.report.issues.append(
                    f"UNEXPECTED-EXIT: {sp.label} (pid {sp.proc.pid}) exited "
                    f"({sp.proc.returncode}) though nothing killed it\n{_tail(sp.proc.log_text())}")
        for seat in self.seats:
            if seat.proc.proc.poll() is not None:
                self.report.issues.append(
                    f"UNEXPECTED-EXIT: worker {seat.index}-{seat.generation} exited "
                    f"({seat.proc.proc.returncode})\n{_tail(seat.proc.log_text())}")

    def _logs_tail(self) -> str:
        return "\n".join(f"--- {sp.label} pid {sp.proc.pid} ---\n{_tail(sp.proc.log_text(), 15)}"
                         for sp in self.spawned)

    # -- leadership

    def _read_leader(self) -> str | None:
        try:
            raw = cast("bytes | None", self.ctl.get("{" + self.prefix + "}:leader"))
        except (redis.RedisError, OSError):
            return None
        return raw.decode() if raw else None

    def _node_by_pid(self, pid: int | None) -> Node | None:
        return next((n for n in self.nodes if pid is not None and n.proc.pid == pid), None)

    def _live_leader(self) -> tuple[str, Node] | None:
        """(token, node) when the leader key names one of our running, not stopped, beats."""
        token = self._read_leader()
        node = self._node_by_pid(pid_of(token))
        if token and node and node.proc.alive:
            return token, node
        return None

    def _settle(self, timeout: float | None = None) -> None:
        """After a fault: wait for N live beats and a live leader among them."""
        timeout = timeout if timeout is not None else max(25.0, 2 * self.ttl + 15)
        ok = wait_until(lambda: all(n.proc.alive for n in self.nodes) and self._live_leader(),
                        timeout)
        if not ok:
            self.report.issues.append(
                f"no live leader {timeout:.0f}s after the fault of "
                f"{self.faults[-1].kind if self.faults else '-'} (leader key: "
                f"{self._read_leader()})")
            self.log(f"ISSUE: no live leader within {timeout:.0f}s")

    # -- faults

    def _next_kind(self) -> str:
        """Kinds come from a shuffled bag: every kind once per bag (the short run's kinds:
        term_node twice, a standby and the leader)."""
        if not self._bag:
            self._bag = list(self.kinds)
            if self.kinds == FAULT_KINDS:
                self._bag.append("term_node")
            self.rng.shuffle(self._bag)
        return self._bag.pop()

    def _pick(self, u_leader: float, u_index: float, leader_bias: float) -> tuple[Node, str | None]:
        """The leader with probability ``leader_bias``, else one of the others."""
        live = self._live_leader()
        token, leader = (live if live else (self._read_leader(), None))
        if leader is not None and u_leader < leader_bias:
            return leader, token
        others = [n for n in self.nodes if n is not leader]
        return others[int(u_index * len(others)) % len(others)], token

    def _begin(self, kind: str, target: str, token: str | None, hit_leader: bool) -> Fault:
        fault = Fault(kind, target, time.monotonic(), time.time(), leader_before=token,
                      hit_leader=hit_leader)
        self.faults.append(fault)
        self.log(f"fault {kind} -> {target} (leader {token})")
        return fault

    def _end(self, fault: Fault, note: str = "") -> None:
        fault.end_mono, fault.end_wall = time.monotonic(), time.time()
        fault.note += note
        self.log(f"fault {fault.kind} over after {fault.end_mono - fault.start_mono:.1f}s {note}")

    def _inject(self, kind: str, u_leader: float, u_index: float, duration: float) -> None:
        getattr(self, f"_fault_{kind}")(u_leader, u_index, duration)

    def _fault_kill_leader(self, u_leader: float, u_index: float, duration: float) -> None:
        node, token = self._pick(u_leader, u_index, 1.0)
        hit = token is not None and pid_of(token) == node.proc.pid
        proc = node.proc
        fault = self._begin("kill_leader", f"beat-{node.index} pid {proc.pid}", token, hit)
        self._expect_exit(proc, "SIGKILL")
        proc.kill()
        self._end(fault)
        self._replace(node)

    def _fault_stop_leader(self, u_leader: float, u_index: float, duration: float) -> None:
        node, token = self._pick(u_leader, u_index, 1.0)
        proc = node.proc
        fault = self._begin("stop_leader", f"beat-{node.index} pid {proc.pid}", token, False)
        proc.stop()
        # Was it still the leader once frozen? (Only then must it step down on SIGCONT.)
        fault.hit_leader = token is not None and self._read_leader() == token \
            and pid_of(token) == proc.pid
        wait_until(lambda: (t := self._read_leader()) is not None and t != token,
                   self.ttl + self.poll + 8)
        past = fault.start_mono + self.ttl + 0.5 + duration / 5  # 0.8 .. 1.5 s past the TTL
        time.sleep(max(0.0, past - time.monotonic()))
        since = len(proc.log_text())
        proc.cont()
        self._end(fault)
        if fault.hit_leader:
            try:
                proc.wait_for_log(r"steps down", timeout=10, since=since)
            except AssertionError as exc:
                self.report.issues.append(f"stop_leader: the resumed leader did not step down "
                                          f"(or exited): {exc}")

    def _fault_stop_standby(self, u_leader: float, u_index: float, duration: float) -> None:
        """SIGSTOP a standby for 3 .. 10 s (sometimes past the ttl), then SIGCONT."""
        node, token = self._pick(u_leader, u_index, 0.0)
        proc = node.proc
        fault = self._begin("stop_standby", f"beat-{node.index} pid {proc.pid}", token, False)
        proc.stop()
        time.sleep(duration * 2)
        proc.cont()
        self._end(fault)

    def _fault_term_node(self, u_leader: float, u_index: float, duration: float) -> None:
        # Alternately a standby and the leader: one bag of faults always has both.
        self._terms += 1
        node, token = self._pick(u_leader, u_index, 1.0 if self._terms % 2 == 0 else 0.0)
        proc = node.proc
        hit = token is not None and pid_of(token) == proc.pid
        fault = self._begin("term_node", f"beat-{node.index} pid {proc.pid}"
                            f"{' (leader)' if hit else ''}", token, hit)
        self._expect_exit(proc, "SIGTERM", "the leader" if hit else "a standby")
        try:
            code = proc.term(timeout=15)
            note = f"exit {code}"
        except AssertionError as exc:
            self.report.issues.append(f"term_node: {exc}")
            note = "ignored SIGTERM"
        self._end(fault, note)
        self._replace(node)

    def _fault_kill_worker(self, u_leader: float, u_index: float, duration: float) -> None:
        """SIGKILL a worker and its pool (unacknowledged messages go back); a new one starts."""
        if not self.seats:
            return self._fault_stop_standby(u_leader, u_index, duration)
        seat = self.seats[int(u_index * len(self.seats)) % len(self.seats)]
        fault = self._begin("kill_worker", f"worker-{seat.index}-{seat.generation} "
                            f"pid {seat.proc.proc.pid}", self._read_leader(), False)
        seat.proc.kill()
        self.killed_workers[self._worker_name(seat.index, seat.generation)] = time.time()
        self.dead_workers.append(seat.proc)
        seat.generation += 1
        seat.proc = self._spawn_worker(seat.index, seat.generation)
        self._end(fault)
        return None

    def _fault_restart_redis(self, u_leader: float, u_index: float, duration: float) -> None:
        token = self._read_leader()
        fault = self._begin("restart_redis", f"redis :{self.state.port}", token, True)
        self.state.kill()
        self.restarts_wall.append(fault.start_wall)
        for name in ("appendonlydir", "appendonly.aof", "dump.rdb"):  # back empty
            path = self.state.dir / name
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif path.exists():
                path.unlink()
        time.sleep(duration / 2)  # down for 0.75 .. 2.5 s
        self.state.restart()
        self._end(fault, "(back empty)")

    def _fault_restart_redis_kept(self, u_leader: float, u_index: float,
                                  duration: float) -> None:
        """SIGKILL the state Redis, down 0.75 .. 2.5 s, back with its data (append-only file)."""
        token = self._read_leader()
        fault = self._begin("restart_redis_kept", f"redis :{self.state.port}", token, False)
        self.state.kill()
        time.sleep(duration / 2)
        self.state.restart(timeout=30)
        self._end(fault, "(back with its data)")

    def _fault_stop_redis(self, u_leader: float, u_index: float, duration: float) -> None:
        """SIGSTOP the state Redis 1.5 .. 5 s (below and near the ttl's half), then SIGCONT."""
        token = self._read_leader()
        fault = self._begin("stop_redis", f"redis :{self.state.port}", token, False)
        self.state.pause()
        time.sleep(duration)
        self.state.resume()
        self._end(fault)

    def _fault_link(self, kind: str, mode: str, u_leader: float, u_index: float,
                    duration: float) -> None:
        node, token = self._pick(u_leader, u_index, 0.75)
        hit = token is not None and pid_of(token) == node.proc.pid
        fault = self._begin(kind, f"beat-{node.index} link{' (leader)' if hit else ''}",
                            token, hit)
        node.proxy.set_mode(mode)  # type: ignore[arg-type]
        time.sleep(duration)
        node.proxy.set_mode("forward")
        self._end(fault)

    def _fault_cut_link(self, u_leader: float, u_index: float, duration: float) -> None:
        self._fault_link("cut_link", "drop", u_leader, u_index, duration)

    def _fault_stall_link(self, u_leader: float, u_index: float, duration: float) -> None:
        self._fault_link("stall_link", "blackhole", u_leader, u_index, duration)

    # -- extra information

    def _info(self, history: list[dict[str, str]]) -> None:
        events = Counter(row.get("event") for row in history)
        self.report.info.append(f"history events copied: {dict(events)}")
        epochs = Counter(str(m.epoch) for m in (self.amqp.snapshot() if self.broker_kind == "amqp"
                                                else self.recorder.messages))
        self.report.info.append(f"messages per epoch: {dict(sorted(epochs.items()))}")
        tracebacks = {sp.label: sp.proc.log_text().count("Traceback") for sp in self.spawned}
        tracebacks = {k: v for k, v in tracebacks.items() if v}
        if tracebacks:
            self.report.info.append(f"tracebacks in beat logs: {tracebacks}")
        if self.seats:
            logs = [s.proc for s in self.seats] + self.dead_workers
            worker_tb = sum(p.log_text().count("Traceback") for p in logs)
            self.report.info.append(f"tracebacks in worker logs: {worker_tb}")


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.splitlines()[-lines:])


def seed_from_env(environ: Mapping[str, str]) -> int:
    """``LEADERBEAT_CHAOS_SEED`` when set, else a fresh random seed."""
    raw = environ.get("LEADERBEAT_CHAOS_SEED", "").strip()
    return int(raw) if raw else random.SystemRandom().randrange(1, 10**6)

"""The in-memory store's shared state: what one Redis server holds for one app.

Every part of :mod:`~celery_leaderbeat.store.memory` works on one :class:`MemoryState`
under its one lock, so each store call is atomic as a Lua script is on Redis. Its
clock is injectable (``clock``: seconds, the store's time, as Redis ``TIME``), and
every ttl is measured by it.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

#: a history event: (its id as (ms, seq), its fields)
Row = tuple[tuple[int, int], dict[str, str]]


class Expiring:
    """Values with an optional deadline on the store's clock (ms), as Redis keys with PX."""

    def __init__(self, now_ms: Callable[[], int]) -> None:
        self._now_ms = now_ms
        self._values: dict[Any, tuple[Any, int | None]] = {}

    def get(self, key: Any) -> Any:
        held = self._values.get(key)
        if held is None:
            return None
        value, until = held
        if until is not None and until <= self._now_ms():
            del self._values[key]
            return None
        return value

    def set(self, key: Any, value: Any, px: int | None = None, *, keep_ttl: bool = False) -> None:
        if keep_ttl and self.get(key) is not None:
            self._values[key] = (value, self._values[key][1])
            return
        self._values[key] = (value, None if px is None else self._now_ms() + int(px))

    def expire(self, key: Any, px: int) -> bool:
        value = self.get(key)
        if value is None:
            return False
        self._values[key] = (value, self._now_ms() + int(px))
        return True

    def pttl(self, key: Any) -> int:
        """Remaining ms, -1 with no deadline, -2 when there is no such value (as PTTL)."""
        if self.get(key) is None:
            return -2
        until = self._values[key][1]
        return -1 if until is None else until - self._now_ms()

    def delete(self, key: Any) -> bool:
        return self._values.pop(key, None) is not None

    def clear(self) -> int:
        live = sum(1 for key in list(self._values) if self.get(key) is not None)
        self._values.clear()
        return live


class MemoryState:
    """Everything of one app in one process; not shared between processes."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # the history grew
        self.keyed = Expiring(self.now_ms)  # the lease, the leader's progress, guard records
        self.epoch_counter: int | None = None
        self.generation: int | None = None
        self.slots: dict[str, str] = {}  # entry -> "<slot>|<epoch>|<state>[|<node>|<at>]"
        self.overtaken: dict[str, str] = {}  # "<entry>|<slot>" -> the value replaced
        self.paused: dict[str, str] = {}  # entry -> JSON record
        self.definitions: dict[str, str] = {}  # entry -> fingerprint
        self.defined_by: int | None = None  # the epoch of the leader that wrote its whole plan
        self.backfilled: dict[str, str] = {}  # "<entry>|<slot>" -> request id
        self.floor: int | None = None  # no backfill reaches a slot before it (after a loss)
        self.lost_at: int | None = None  # the store's time of the latest reset after a loss
        self.loss: int | None = None  # a loss a node reported: the generation it had seen
        self.lost: dict[str, int] = {}  # "<entry>|<node>" -> slot reported settled
        self.lost_until: int | None = None
        self.nodes: dict[str, str] = {}  # node id -> JSON record
        self.requests: list[str] = []
        self.history: list[Row] = []
        self.trimmed_ms = 0  # the ms of the newest event trimmed from the history
        self.subscribers: weakref.WeakSet[Any] = weakref.WeakSet()
        # the worker guard
        self.fence = 0
        self.waiting: dict[str, dict[str, int]] = {}  # entry -> task id -> slot ms
        self.messages: dict[str, dict[str, str]] = {}  # entry -> task id -> message
        self.waiting_entries: set[str] = set()
        self.decisions: dict[str, int] = {}
        # the run-time entries
        self.entries: dict[str, Any] = {}  # name -> Stored
        self.entries_version = 0
        self.entries_floor = 0
        self.entries_changed: dict[str, int] = {}
        self.entries_removed: dict[str, int] = {}

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def now_us(self) -> int:
        return int(self.clock() * 1_000_000)

    def leader(self) -> str | None:
        token = self.keyed.get("leader")
        return None if token is None else str(token)

    def add_history(self, fields: dict[str, Any], keep: int) -> str:
        """Append one event (its id as Redis Streams would give it) and trim to ``keep``."""
        now = self.now_ms()
        last = self.history[-1][0] if self.history else (0, -1)
        at = (now, 0) if now > last[0] else (last[0], last[1] + 1)
        self.history.append((at, {k: str(v) for k, v in fields.items()}))
        extra = len(self.history) - max(1, int(keep))
        if extra > 0:
            self.trimmed_ms = max(self.trimmed_ms, self.history[extra - 1][0][0])
            del self.history[:extra]
        self.changed.notify_all()
        return row_id(at)

    def publish(self, message: str) -> None:
        for subscriber in list(self.subscribers):
            subscriber.put(message)

    def lost_reports(self) -> dict[str, int]:
        if self.lost_until is not None and self.lost_until <= self.now_ms():
            self.lost.clear()
            self.lost_until = None
        return self.lost


class Subscriber:
    """One subscription's messages, kept until read."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[str] = queue.SimpleQueue()

    def put(self, message: str) -> None:
        self._queue.put(message)

    def next(self, timeout: float) -> str | None:
        try:
            return self._queue.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None


def row_id(at: tuple[int, int]) -> str:
    return f"{at[0]}-{at[1]}"


def row(at: tuple[int, int], fields: dict[str, str]) -> dict[str, str]:
    """A history event as the seam answers it: its fields, ``id`` and ``at``."""
    return {**fields, "id": row_id(at), "at": str(at[0])}


def parse_id(text: str) -> tuple[int, int]:
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def parts(stored: str) -> tuple[int, str, str, str, int | None]:
    """A stored slot value's parts: slot, epoch, state, node ('' for a leader), claimed at."""
    slot, epoch, rest = stored.split("|", 2)
    state, _, tail = rest.partition("|")
    node, at = tail, None
    head, sep, last = tail.rpartition("|")
    if sep and last.isdigit():
        node, at = head, int(last)
    return int(slot), epoch, state, node, at

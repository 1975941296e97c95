"""The in-memory store: the reference implementation of :mod:`~celery_leaderbeat.store.base`.

Selected by ``leaderbeat_redis_url = "memory://"`` (or ``memory://<name>``: every
store of one name in one process shares one state). It holds everything in this
process, so it is **not shared between processes**: it serves tests and a
single-process development setup, never a cluster of beats on several hosts.

It keeps every rule the Redis store keeps, with the same atomicity (one lock per
state: each call is one step, as one Lua script is on Redis), fencing, epochs,
rescue rules, answers and bounds; the Lua scripts are the specification and each
part names the script it follows. The store's clock is injectable
(:class:`~celery_leaderbeat.store.memory_state.MemoryState`'s ``clock``), and every
ttl runs on it. It offers neither optional capability: no claim-and-enqueue in one
step (``client`` is None), and it cannot lose writes, so the loss checks never fire.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

from ..config import Config
from .base import (
    ClusterAdmin,
    EntryDefinitions,
    Events,
    GuardStore,
    LeaseStore,
    LossDetection,
    RequestQueue,
    SlotStore,
)
from .calls import PARTS, Hook, store_call, through_boundary
from .events import RELEASED, REQUEST
from .memory_entries import MemoryEntries
from .memory_guard import MemoryGuard
from .memory_ledger import MemoryLedger
from .memory_state import MemoryState, Subscriber, parse_id, row, row_id
from .records import LOSS, Acquired, Renewed

#: the states of the ``memory://<name>`` stores of this process, by name
_STATES: dict[str, MemoryState] = {}
_STATES_LOCK = threading.Lock()


class MemoryLease:
    """The lease of one in-memory store: ``acquire.lua``, ``renew.lua``, ``release.lua``."""

    def __init__(self, state: MemoryState, config: Config) -> None:
        self.state = state
        self.config = config
        self.ttl_ms = int(config.lease_ttl * 1000)

    def acquire(self, seen_epoch: int, seen_generation: int = 0, *,
                despite_loss: bool = False) -> Acquired:
        s, node = self.state, self.config.node_id
        with s.lock:
            now, generation = s.clock(), s.generation or 0
            current = s.leader()
            if current:
                holder, _, held = current.rpartition("|")
                if holder != node and not (held.isdigit() and int(held) < seen_epoch):
                    return Acquired(False, None, current, s.keyed.pttl("leader"), generation, now)
            if generation < seen_generation and not despite_loss:
                return Acquired(False, None, None, LOSS, generation, now)
            epoch = max((s.epoch_counter or 0) + 1, seen_epoch + 1)
            s.epoch_counter = epoch
            s.keyed.set("leader", f"{node}|{epoch}", self.ttl_ms)
            s.add_history({"event": "elected", "node": node, "epoch": epoch},
                          self.config.history_length)
            return Acquired(True, epoch, None, 0, generation, now)

    def renew(self, token: str) -> Renewed:
        s = self.state
        with s.lock:
            current = s.leader()
            if current != token:
                return Renewed(False, current, None)
            s.keyed.expire("leader", self.ttl_ms)
            return Renewed(True, None, s.clock())

    def release(self, token: str, reason: str) -> bool:
        return release(self.state, token, reason, self.config.history_length)

    def holder(self) -> tuple[str | None, int]:
        with self.state.lock:
            return self.state.leader(), self.state.keyed.pttl("leader")

    def now(self) -> float:
        return self.state.clock()


def release(state: MemoryState, token: str, reason: str, keep: int) -> bool:
    """``release.lua``: give the lease up if ``token`` holds it, and wake the standbys."""
    with state.lock:
        if state.leader() != token:
            return False
        state.keyed.delete("leader")
        node, _, epoch = token.rpartition("|")
        state.add_history({"event": "released", "node": node, "epoch": epoch,
                           "reason": reason}, keep)
        state.publish(RELEASED)
        return True


class MemoryEvents:
    """The events of one in-memory store: each subscriber keeps what it has not read."""

    def __init__(self, state: MemoryState) -> None:
        self.state = state

    def subscribe(self) -> Subscriber:
        subscriber = Subscriber()
        with self.state.lock:
            self.state.subscribers.add(subscriber)
        return subscriber

    def publish(self, message: str) -> None:
        with self.state.lock:
            self.state.publish(message)


class MemoryRequests:
    """The CLI's requests of one in-memory store."""

    def __init__(self, state: MemoryState) -> None:
        self.state = state

    def push(self, request: str) -> None:
        with self.state.lock:
            self.state.requests.append(request)
            self.state.publish(REQUEST)

    def now_ms(self) -> int:
        return self.state.now_ms()

    def pop(self, limit: int = 1000) -> list[str]:
        with self.state.lock:
            taken = self.state.requests[:limit]
            del self.state.requests[:limit]
            return taken

    def requeue(self, requests: Sequence[str]) -> None:
        with self.state.lock:
            self.state.requests[:0] = list(requests)

    def mark_backfilled(self, entry: str, slot_ms: int, request_id: str) -> bool:
        with self.state.lock:
            field = f"{entry}|{slot_ms}"
            if field in self.state.backfilled:
                return False
            self.state.backfilled[field] = request_id
            return True

    def backfilled(self, entry: str) -> set[int]:
        with self.state.lock:
            return {int(slot) for name, _, slot in
                    (field.rpartition("|") for field in self.state.backfilled) if name == entry}


class MemoryAdmin:
    """What the CLI reads and does in one in-memory store."""

    def __init__(self, state: MemoryState, config: Config, name: str) -> None:
        self.state = state
        self.config = config
        self._where = f"memory://{name}"

    @property
    def where(self) -> str:
        return self._where

    def step_down(self, token: str, reason: str) -> bool:
        return release(self.state, token, reason, self.config.history_length)

    def paused(self) -> dict[str, dict[str, Any]]:
        with self.state.lock:
            return {name: json.loads(record) for name, record in self.state.paused.items()}

    def pause(self, name: str, record: dict[str, Any]) -> None:
        with self.state.lock:
            self.state.paused[name] = json.dumps(record)

    def resume(self, name: str) -> bool:
        with self.state.lock:
            return self.state.paused.pop(name, None) is not None

    def note(self, fields: dict[str, str]) -> None:
        with self.state.lock:
            self.state.add_history(fields, self.config.history_length)

    def all_history(self) -> list[dict[str, str]]:
        with self.state.lock:
            return [row(at, fields) for at, fields in self.state.history]

    def follow(self, cursor: str | None = None, block_ms: int = 1000
               ) -> tuple[str, list[dict[str, str]]]:
        s = self.state
        deadline = time.monotonic() + block_ms / 1000
        with s.lock:
            if cursor is None:
                cursor = row_id(s.history[-1][0]) if s.history else "0-0"
            after = parse_id(cursor)
            while True:
                rows = [row(at, f) for at, f in s.history if at > after][:500]
                left = deadline - time.monotonic()
                if rows or left <= 0:
                    return (rows[-1]["id"] if rows else cursor), rows
                s.changed.wait(left)

    def forget_nodes(self, node_ids: list[str]) -> None:
        with self.state.lock:
            for node in node_ids:
                self.state.nodes.pop(node, None)

    def reset(self) -> int:
        s = self.state
        with s.lock:
            kept = (s.entries, s.entries_version, s.entries_floor, s.entries_changed,
                    s.entries_removed, s.subscribers)
            deleted = s.keyed.clear() + sum(1 for part in (
                s.slots, s.overtaken, s.paused, s.definitions, s.backfilled, s.lost, s.nodes,
                s.requests, s.history, s.waiting, s.messages, s.waiting_entries, s.decisions)
                if part)
            deleted += sum(1 for value in (s.epoch_counter, s.generation, s.loss, s.floor)
                           if value is not None)
            fresh = MemoryState(s.clock)
            for field, value in vars(fresh).items():
                if field not in ("lock", "changed"):
                    setattr(s, field, value)
            (s.entries, s.entries_version, s.entries_floor, s.entries_changed,
             s.entries_removed, s.subscribers) = kept
            return deleted


class MemoryStore:
    """Every part of :class:`~celery_leaderbeat.store.base.Store` on one in-memory state."""

    def __init__(self, state: MemoryState, config: Config, name: str = "", *,
                 hook: Hook | None = None) -> None:
        self.state = state
        self.lease: LeaseStore = MemoryLease(state, config)
        ledger = MemoryLedger(state, config)
        self.ledger: SlotStore = ledger
        self.loss: LossDetection = ledger  # it detects losses of writes
        self.events: Events = MemoryEvents(state)
        self.requests: RequestQueue = MemoryRequests(state)
        self.entries: EntryDefinitions = MemoryEntries(state)
        self.guard: GuardStore = MemoryGuard(state, config)
        self.admin: ClusterAdmin = MemoryAdmin(state, config, name)
        self._hook = hook
        through_boundary(self, PARTS, hook=hook)
        self.loss = cast(LossDetection, self.ledger)  # behind the boundary: ``ledger.*``

    def ping(self) -> None:
        """Always answers (the state is in this process), unless a test's hook fails it."""
        if self._hook is not None:
            with store_call("store.ping"):
                self._hook("store.ping", lambda: None)

    def warnings(self) -> list[str]:
        return []

    def close(self) -> None:
        """Nothing to let go: the state stays for the other stores of its name."""


def shared_state(name: str, clock: Callable[[], float] | None = None) -> MemoryState:
    """The state of ``memory://<name>`` in this process (made on first use)."""
    with _STATES_LOCK:
        state = _STATES.get(name)
        if state is None:
            state = _STATES[name] = MemoryState(clock or time.time)
        return state


def forget(name: str) -> None:
    """Drop the state of ``memory://<name>`` (a test done with it)."""
    with _STATES_LOCK:
        _STATES.pop(name, None)


def connect(config: Config) -> MemoryStore:
    """The in-memory store ``leaderbeat_redis_url = "memory://<name>"`` names."""
    name = config.redis_url.split("://", 1)[1].strip("/")
    return MemoryStore(shared_state(name), config, name)

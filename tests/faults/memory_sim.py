"""The harness of :mod:`tests.faults.sim` on the in-memory store: no Redis at all.

The store's clock is the virtual clock itself, so every ttl runs in virtual time
with nothing to keep in step. The fault seam sits at the store's boundary
(:mod:`celery_leaderbeat.store.calls`): every call of a store member passes
:meth:`Seam.intercept` labelled ``CALL <store call><role call>``, and a fault
raises the store's own error (``before``: nothing ran; ``after``: it ran, the
answer is lost). ``drop`` means nothing here (there is no connection to lose):
the call runs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from celery_leaderbeat.config import Config
from celery_leaderbeat.store.calls import ROLE_SITE
from celery_leaderbeat.store.errors import StoreUnreachable
from celery_leaderbeat.store.memory import MemoryStore, forget, shared_state
from celery_leaderbeat.store.memory_state import MemoryState, row_id

from .model_world import SCHEDULE, World
from .seam import InjectedFault, Seam, _caller_outside_the_store
from .sim import Sim


def memory_hook(seam: Seam, node_id: str) -> Callable[[str, Callable[[], Any]], Any]:
    """The boundary hook of one node's store: each call through ``seam``."""

    def hook(site: str, run: Callable[[], Any]) -> Any:
        label = f"CALL {site}<{ROLE_SITE.get() or _caller_outside_the_store()}"
        try:
            return seam.intercept(node_id, label, run)
        except InjectedFault as exc:
            raise StoreUnreachable(str(exc)) from exc

    return hook


@dataclass
class MemorySim(Sim):
    """:class:`Sim` with every node on one in-memory store whose clock is the virtual one."""

    def __post_init__(self) -> None:
        # a state of its own, named in the URL: a Cluster the test makes (the CLI) opens it too
        self.name = f"sim-{id(self):x}"
        self.redis_url = f"memory://{self.name}"
        self.state = shared_state(self.name, self.clock.time)
        super().__post_init__()

    def close(self) -> None:
        try:
            super().close()
        finally:
            forget(self.name)

    def _admin(self) -> Any:
        return None

    def _connect(self, config: Config) -> Any:
        assert self._building is not None, "a store made outside Sim.start"
        return MemoryStore(self.state, config, self.prefix,
                           hook=memory_hook(self.seam, self._building))

    def _connect_guard(self, config: Config) -> Any:
        return MemoryStore(self.state, config, self.prefix, hook=memory_hook(self.seam, "guard"))

    @classmethod
    def on(cls, prefix: str, schedule: Mapping[str, Mapping[str, Any]], **kw: Any) -> MemorySim:
        return cls("memory://", prefix, schedule, **kw)

    def history(self) -> list[dict[str, str]]:
        with self.state.lock:
            return [dict(fields) for _, fields in self.state.history]


#: the parts of a MemoryState that are its data (the rest: its lock, clock, subscribers)
_NOT_DATA = ("clock", "lock", "changed", "subscribers", "keyed")


def data_of(state: MemoryState) -> dict[str, Any]:
    """A copy of everything ``state`` holds, as a snapshot would (deadlines absolute: a
    value whose deadline passed meanwhile is gone when it is read, as Redis drops a key
    whose expiry passed when it loads a snapshot)."""
    with state.lock:
        data = {k: copy.deepcopy(v) for k, v in vars(state).items() if k not in _NOT_DATA}
        data["keyed"] = dict(state.keyed._values)
        return data


def put_back(state: MemoryState, data: dict[str, Any] | None) -> None:
    """The store restarted: on ``data`` (a snapshot), or empty (None); the subscribers
    stay, as a client subscribes again after a reconnect."""
    with state.lock:
        if data is None:
            data = data_of(MemoryState(state.clock))
        for field, value in data.items():
            if field != "keyed":
                setattr(state, field, copy.deepcopy(value))
        state.keyed._values = dict(data["keyed"])


class MemoryWorld(World):
    """The model's world on the in-memory store: a restart replaces its data in place."""

    def __init__(self) -> None:
        super().__init__(None)

    def _sim(self) -> Sim:
        return MemorySim.on("model", SCHEDULE)

    @property
    def state(self) -> MemoryState:
        sim = self.sim
        assert isinstance(sim, MemorySim)
        return sim.state

    def _note_leader(self) -> None:
        token = self.state.leader()
        if token:
            self.last_leader = token.rsplit("|", 1)[0]

    def redis_restarts_empty(self) -> None:
        self._loss()
        self.collect_history()
        put_back(self.state, None)

    def take_snapshot(self) -> None:
        self.snapshot = (self.sim.clock.time(), data_of(self.state))  # type: ignore[assignment]

    def restore_snapshot(self) -> None:
        assert self.snapshot is not None
        self._loss()
        self.collect_history()
        put_back(self.state, self.snapshot[1])  # type: ignore[arg-type]

    def collect_history(self) -> None:
        with self.state.lock:
            for at, fields in self.state.history:
                self.events.setdefault(row_id(at).encode(), dict(fields))

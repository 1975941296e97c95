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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_leaderbeat.config import Config
from celery_leaderbeat.store.calls import ROLE_SITE
from celery_leaderbeat.store.errors import StoreUnreachable
from celery_leaderbeat.store.memory import MemoryStore
from celery_leaderbeat.store.memory_state import MemoryState

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

    redis_url: str = "memory://sim"

    def __post_init__(self) -> None:
        self.state = MemoryState(self.clock.time)
        super().__post_init__()

    def _admin(self) -> Any:
        return None

    def _connect(self, config: Config) -> Any:
        assert self._building is not None, "a store made outside Sim.start"
        return MemoryStore(self.state, config, self.prefix,
                           hook=memory_hook(self.seam, self._building))

    def _connect_guard(self, config: Config) -> Any:
        return MemoryStore(self.state, config, self.prefix, hook=memory_hook(self.seam, "guard"))

    def history(self) -> list[dict[str, str]]:
        with self.state.lock:
            return [dict(fields) for _, fields in self.state.history]

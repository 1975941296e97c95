"""What the tools around the beats ask of the store: the worker guard, and the CLI.

The other half of the seam (the beats' half, and :class:`~celery_leaderbeat.store.base.Store`
which carries both, is in :mod:`~celery_leaderbeat.store.base`):

- **the worker guard** (:class:`GuardStore`): each slot's run recorded started, alive
  and finished, the start decided atomically, so two workers handed the same slot
  cannot both run it (Redis: ``guard.lua``);
- **the CLI** (:class:`ClusterAdmin`): what ``celery leaderbeat`` reads and does beyond
  the lease and the slots: step a leader down (fenced: the release of its own token),
  pause and resume entries, note its actions in the history, read the whole history
  or follow it, forget long-gone nodes, reset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol


@dataclass(frozen=True)
class GuardRun:
    """One guarded run of one slot, as the worker guard records it."""

    task_id: str  #: the slot's deterministic task id: what makes two deliveries one run
    entry: str
    slot_ms: int
    epoch: Any  #: the fencing epoch the slot was sent under ("" when the message has none)
    overlap: str  #: ``allow``, or ``skip``: no start while another run of the entry is alive
    worker: str  #: ``host:pid`` of the worker running it


class RunRecord(NamedTuple):
    """What the guard knows of one slot's run."""

    state: str  #: ``started`` or ``finished``
    worker: str
    alive: bool  #: its liveness has not lapsed (a started run that is not alive was lost)


class GuardStore(Protocol):
    """The worker guard's records: each slot's run starts at most once."""

    def start(self, run: GuardRun, *, will_ask_again: bool = False) -> tuple[str, str]:
        """Start ``run`` or say why not, atomically: ``("run", "" or "rerun")``,
        ``("duplicate", why)`` (finished, or still alive), ``("overlap", holder)``. A run
        recorded started whose liveness lapsed died with its worker: it may run again.
        ``will_ask_again``: a "running" answer is not written to the history yet."""
    def renew(self, run: GuardRun) -> None:
        """Keep ``run`` alive for another lease ttl (and its entry's overlap lock)."""
    def finish(self, run: GuardRun, detail: str) -> None:
        """Record ``run`` finished (``detail``: its outcome); it never runs again."""
    def runs(self, task_ids: list[str]) -> dict[str, RunRecord]:
        """The record of each run the guard knows of, by task id."""


class ClusterAdmin(Protocol):
    """What the CLI reads and does beyond the lease and the slots."""

    @property
    def where(self) -> str:
        """Where this app's state lives, for messages (Redis: the keys' hash tag)."""
    def step_down(self, token: str, reason: str) -> bool:
        """Release the lease held under ``token`` (fenced); False: it was not held."""
    def paused(self) -> dict[str, dict[str, Any]]:
        """Entry name -> the record of its pause (note, when, by whom)."""
    def pause(self, name: str, record: dict[str, Any]) -> None:
        """The leader skips the entry's slots (recorded ``paused``) until resumed."""
    def resume(self, name: str) -> bool:
        """False: it was not paused."""
    def note(self, fields: dict[str, str]) -> None:
        """Add one event to the history."""
    def all_history(self) -> list[dict[str, str]]:
        """Every history event kept, oldest first, each with its ``id``
        (``<ms>-<seq>``: the ms is when it was written)."""
    def follow(self, last_id: str = "$", block_ms: int = 1000
               ) -> tuple[str, list[dict[str, str]]]:
        """Events after ``last_id`` (``$``: from now), waiting up to ``block_ms``; the last
        id read, to pass next time."""
    def forget_nodes(self, node_ids: list[str]) -> None:
        """Remove these nodes from the registry."""
    def reset(self) -> int:
        """Delete this app's state (lease, slots, history, nodes, pauses, requests, guard
        records), not the run-time entries; how many records went."""

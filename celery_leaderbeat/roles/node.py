"""What both roles of one beat process share: the store, the lease, the ledger, the schedule."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone, tzinfo
from typing import Any

from ..config import Config
from ..entries import EntryOptions
from ..store.base import SlotStore, Store, one_step_client
from ..store.keys import Keys
from ..store.ledger import ANCHOR, Event, SlotState
from ..timing.slots import SlotClock, clock_for
from .agenda import Loaded, load
from .dynamic_schedule import reanchor
from .fingerprint import fingerprint
from .lease import LeaseView
from .memory import SentMemory

#: publishes one slot of one entry under a fencing epoch (0: a standby's rescue), with
#: the slot's own task id unless one is given (a triggered run has its own)
SendSlot = Callable[[str, datetime, int, "str | None"], bool]


@dataclass
class Node:
    """One beat process's parts, handed to the leader and the standby rooms."""

    config: Config
    keys: Keys
    store: Store  # the store's seam (store/base.py): Redis today
    lease: LeaseView  # this node's view of store.lease; store.ledger: what the roles use most
    ledger: SlotStore
    send: SendSlot
    schedule: Callable[[], Mapping[str, Any]]  # entry name -> Celery ScheduleEntry
    options: Callable[[], Mapping[str, EntryOptions]]
    tz: tzinfo
    max_interval: Callable[[], float]  # Celery's beat_max_loop_interval, as the scheduler has it
    wake_by: Callable[[], float]  # monotonic time by which the main loop will be back
    observe: Callable[[Sequence[Event]], None]  # what became of slots: signals, metrics
    progress: Callable[[], None]  # the main loop is working, not wedged (a long batch)
    #: the entry names changed after a schedule version (None: read the whole schedule)
    changed_since: Callable[[int], frozenset[str] | None] = lambda version: None

    clocks: dict[str, tuple[Any, Any, Any, SlotClock]] = field(default_factory=dict)
    #: what this process published (it never publishes a slot twice, whatever Redis says)
    sent: SentMemory = field(default_factory=SentMemory)
    #: history events whose record call failed: they ride on the next call
    backlog: list[Event] = field(default_factory=list)
    _fingerprints: dict[str, tuple[tuple[Any, ...], Any, Any, str]] = field(default_factory=dict)
    #: dynamic entry -> the slot state its slots count from (see :mod:`dynamic_schedule`)
    anchors: Callable[[], Mapping[str, SlotState]] = dict
    exact: Callable[[], Collection[str]] = tuple  # dynamic entries anchored before any state
    #: a chunk sender (``send.base.ChunkSend``) under an epoch; None: ``send``, one slot at a time
    sender: Callable[[int], Any] | None = None

    @property
    def client(self) -> Any:
        """The store's Redis client: for claim-and-enqueue in one step only (store/base.py)."""
        return one_step_client(self.store)

    def chunk_send(self, epoch: int) -> Any:
        """What a batch sends its chunks through, under ``epoch`` (0: a standby's rescue)."""
        if self.sender is None:
            return lambda name, slot: self.send(name, slot, epoch, None)
        return self.sender(epoch)

    def track(self, stored: Mapping[str, SlotState], *, start: datetime,
              epoch: int | None, definitions: Mapping[str, str] | None = None,
              trust_memory: bool = False, only: Collection[str] | None = None,
              rolled_back: bool = False, trusted_epoch: int | None = None) -> Loaded:
        """The schedule's entries tracked from ``stored`` states (see :func:`agenda.load`);
        with ``only``, just those entries (a change of a few in a large schedule)."""
        if stored:
            self.lease.observe_epoch(max(state.epoch for state in stored.values()))
        schedule = self.schedule()
        if not trust_memory and not rolled_back:
            # what this node saw settled, by anyone; not an anchor (nothing sent yet): one
            # laid after Redis lost writes must not hide what this node knew before it
            for name, state in stored.items():
                if state.state != ANCHOR:
                    self.sent.know(name, state.slot_ms)
        if only is not None:
            schedule = {name: schedule[name] for name in only if name in schedule}
        else:
            self._forget_unscheduled(schedule)
        runtime = self.anchors()
        planned = reanchor(stored, runtime, self.exact(), only)
        anchored = [name for name, state in planned.items() if state is not stored.get(name)] \
            if planned is not stored else ()
        return load(schedule, planned, start=start, tz=self.tz, options=self.options(),
                    default=EntryOptions.defaults(self.config), epoch=epoch,
                    clock_of=self.clock_of, fingerprint_of=self.fingerprint_of,
                    definitions=definitions, remembered=self.sent.newest_known,
                    trust_memory=trust_memory, rolled_back=rolled_back,
                    trusted_epoch=trusted_epoch, anchored=anchored, runtime=runtime)

    def fingerprint_of(self, name: str, entry: Any, tz: tzinfo, jitter: float | None) -> str:
        """The fingerprint of an entry's definition, computed once per definition: Celery's
        ``merge_inplace`` updates an entry object in place (its schedule, task, arguments
        replaced), so the object alone does not name the definition."""
        parts = (entry, getattr(entry, "schedule", None), getattr(entry, "task", None),
                 getattr(entry, "args", None), getattr(entry, "kwargs", None))
        cached = self._fingerprints.get(name)
        if cached is not None and all(a is b for a, b in zip(cached[0], parts)) \
                and cached[1] == tz and cached[2] == jitter:
            return cached[3]
        fp = fingerprint(entry, tz, jitter)
        self._fingerprints[name] = (parts, tz, jitter, fp)
        return fp

    def _forget_unscheduled(self, schedule: Mapping[str, Any]) -> None:
        """Per-entry caches follow the schedule: an entry removed is forgotten."""
        if len(self.clocks) > len(schedule) or len(self.sent) > len(schedule) \
                or len(self._fingerprints) > len(schedule):
            for cache in (self.clocks, self._fingerprints):
                for name in [n for n in cache if n not in schedule]:
                    del cache[name]
            self.sent.keep_only(schedule)

    def clock_of(self, name: str, schedule_: Any, tz: tzinfo, jitter: float | None) -> SlotClock:
        """An entry's slot clock, built once per schedule object (a takeover at 100,000
        entries spent most of its reload building the same clocks again)."""
        cached = self.clocks.get(name)
        if cached is not None and cached[0] is schedule_ and cached[1] == tz \
                and cached[2] == jitter:
            return cached[3]
        clock = clock_for(schedule_, name=name, tz=tz, jitter=jitter)
        self.clocks[name] = (schedule_, tz, jitter, clock)
        return clock


def utcnow() -> datetime:
    """Wall-clock now, read through ``time.time`` so a test can shift one process's clock."""
    return datetime.fromtimestamp(time.time(), timezone.utc)

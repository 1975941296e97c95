"""What both roles of one beat process share: the store, the Celery side, its memory."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone, tzinfo
from typing import Any

from ..config import Config
from ..entries import EntryOptions
from ..store.base import SlotStore, Store, one_step_client
from ..store.keys import Keys
from ..store.types import Event, SlotState, SlotStatus
from ..timing.slots import SlotClock, clock_for, from_ms, to_ms
from .agenda import Known, Loaded, Reading, load
from .batch import Send
from .dynamic_schedule import reanchor
from .fingerprint import fingerprint
from .lease import LeaseView
from .loss import Losses
from .memory import SentMemory
from .port import CelerySide

#: cap, in seconds, of how far past "now" an entry with no stored state starts
UNKNOWN_STATE_MARGIN = 5.0


@dataclass
class Shared:
    """What the leader and the standby of one beat process share: the store, the Celery
    side, and what this process remembers (per-entry caches, what it sent, events not
    recorded yet)."""

    config: Config
    keys: Keys
    store: Store  # the store's seam (store/base.py): Redis today
    lease: LeaseView  # this node's view of store.lease; store.ledger: what the roles use most
    ledger: SlotStore
    celery: CelerySide  # what only the Celery side knows and does (roles/port.py)

    clocks: dict[str, tuple[Any, Any, Any, SlotClock]] = field(default_factory=dict)
    #: what this process published (it never publishes a slot twice, whatever Redis says)
    sent: SentMemory = field(default_factory=SentMemory)
    #: monotonic: when this process began following the store (it had seen no generation);
    #: ``time`` is looked up at each call, so a test's clock replaces it
    started: float = field(default_factory=lambda: time.monotonic())
    #: history events whose record call failed: they ride on the next call
    backlog: list[Event] = field(default_factory=list)
    _fingerprints: dict[str, tuple[tuple[Any, ...], Any, Any, str]] = field(default_factory=dict)

    @property
    def losses(self) -> Losses:
        """What this node knows of losses of writes (the lease view's: one per node)."""
        return self.lease.losses

    @property
    def client(self) -> Any:
        """The store's Redis client: for claim-and-enqueue in one step only (store/base.py)."""
        return one_step_client(self.store)

    def slot_send(self, epoch: int) -> Send:
        """What publishes one slot at a time under ``epoch`` (0: a standby's rescue)."""
        celery = self.celery
        return lambda name, slot: celery.send_slot(name, slot, epoch, None)

    def chunk_send(self, epoch: int) -> Any:
        """What a batch sends its chunks through, under ``epoch`` (0: a standby's rescue)."""
        sender = self.celery.chunk_sender(epoch)
        return self.slot_send(epoch) if sender is None else sender

    def fresh_start(self) -> datetime:
        """Where an entry without stored state (new, or Redis lost its data) starts: after
        now + ``max_clock_skew`` (:data:`UNKNOWN_STATE_MARGIN` at most), so a slot an
        earlier leader sent just before the data was lost cannot come round again on a
        node whose clock is behind."""
        margin = min(self.config.max_clock_skew, UNKNOWN_STATE_MARGIN)
        return from_ms(to_ms(utcnow()) + int(margin * 1000))

    def track(self, stored: Mapping[str, SlotState], *, start: datetime,
              epoch: int | None, definitions: Mapping[str, str] | None = None,
              trust_memory: bool = False, only: Collection[str] | None = None,
              rolled_back: bool = False, trusted_epoch: int | None = None) -> Loaded:
        """The schedule's entries tracked from ``stored`` states (see :func:`agenda.load`);
        with ``only``, just those entries (a change of a few in a large schedule)."""
        if stored:
            self.lease.observe_epoch(max(state.epoch for state in stored.values()))
        celery = self.celery
        schedule = celery.slot_entries()
        if not trust_memory and not rolled_back:
            # what this node saw settled, by anyone; not an anchor (nothing sent yet): one
            # laid after Redis lost writes must not hide what this node knew before it
            for name, state in stored.items():
                if state.state != SlotStatus.ANCHOR:
                    self.sent.know(name, state.slot_ms)
        if only is not None:
            schedule = {name: schedule[name] for name in only if name in schedule}
        else:
            self._forget_unscheduled(schedule)
        runtime = celery.runtime_anchors()
        planned = reanchor(stored, runtime, celery.anchored_exactly(), only)
        anchored = [name for name, state in planned.items() if state is not stored.get(name)] \
            if planned is not stored else ()
        reading = Reading(celery.timezone(), celery.entry_options(),
                          EntryOptions.defaults(self.config), self.clock_of, self.fingerprint_of)
        known = Known(epoch, definitions=definitions, remembered=self.sent.newest_known,
                      trust_memory=trust_memory, rolled_back=rolled_back,
                      trusted_epoch=trusted_epoch, anchored=anchored, runtime=runtime)
        return load(schedule, planned, start=start, reading=reading, known=known)

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
        """An entry's slot clock, built once per schedule object: a reload (a takeover,
        a schedule change) would otherwise build every entry's clock again."""
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

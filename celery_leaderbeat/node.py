"""What both roles of one beat process share: Redis, the lease, the ledger, the schedule."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone, tzinfo
from typing import Any

from .agenda import Loaded, load
from .config import Config
from .entries import EntryOptions
from .keys import Keys
from .lease import Lease
from .ledger import Event, Ledger, SlotState
from .slots import SlotClock, clock_for

#: publishes one slot of one entry under a fencing epoch (0: a standby's rescue), with
#: the slot's own task id unless one is given (a triggered run has its own)
SendSlot = Callable[[str, datetime, int, "str | None"], bool]


@dataclass
class Node:
    """One beat process's parts, handed to the leader and the standby rooms."""

    config: Config
    keys: Keys
    client: Any
    lease: Lease
    ledger: Ledger
    send: SendSlot
    schedule: Callable[[], Mapping[str, Any]]  # entry name -> Celery ScheduleEntry
    options: Callable[[], Mapping[str, EntryOptions]]
    tz: tzinfo
    max_interval: Callable[[], float]  # Celery's beat_max_loop_interval, as the scheduler has it
    wake_by: Callable[[], float]  # monotonic time by which the main loop will be back
    observe: Callable[[Sequence[Event]], None]  # what became of slots: signals, metrics
    progress: Callable[[], None]  # the main loop is working, not wedged (a long batch)

    clocks: dict[str, tuple[Any, Any, Any, SlotClock]] = field(default_factory=dict)
    #: a chunk sender (``batch.ChunkSend``) under an epoch; None: ``send``, one slot at a time
    sender: Callable[[int], Any] | None = None

    def chunk_send(self, epoch: int) -> Any:
        """What a batch sends its chunks through, under ``epoch`` (0: a standby's rescue)."""
        if self.sender is None:
            return lambda name, slot: self.send(name, slot, epoch, None)
        return self.sender(epoch)

    def track(self, stored: Mapping[str, SlotState], *, start: datetime,
              epoch: int | None) -> Loaded:
        """The schedule's entries tracked from ``stored`` states (see :func:`agenda.load`)."""
        if stored:
            self.lease.observe_epoch(max(state.epoch for state in stored.values()))
        return load(self.schedule(), stored, start=start, tz=self.tz, options=self.options(),
                    default=EntryOptions.defaults(self.config), epoch=epoch,
                    clock_of=self.clock_of)

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

"""The Celery side as the roles see it: one typed port instead of the scheduler itself.

The roles (leader, standby) never hold the Celery ``Scheduler``: they ask this
port for what only the Celery side knows (the schedule and its changes, each
entry's options, Celery's loop interval and time zone) and hand it what only
the Celery side does (publishing a slot, saying a send, noting what a sent slot
changes in its entry, telling signals and metrics). ``celery_leaderbeat.Scheduler``
implements it (:mod:`celery_leaderbeat.integrations`); a test may implement it
with a plain object.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, tzinfo
from typing import Any, Protocol

from ..entries import EntryOptions
from ..store.types import Event, SlotState


class CelerySide(Protocol):
    """What a role asks of the Celery side of its beat process."""

    def slot_entries(self) -> Mapping[str, Any]:
        """Entry name -> the entry as the slots see it (an object with ``.schedule``)."""
        ...

    def entry_options(self) -> Mapping[str, EntryOptions]:
        """Entry name -> its ``leaderbeat`` options (an entry without any: the defaults)."""
        ...

    def overlap_of(self, name: str) -> str:
        """The overlap policy of the entry named ``name`` (its own, else the setting)."""
        ...

    def changed_since(self, version: int) -> frozenset[str] | None:
        """The entry names changed after schedule ``version``; None: read the whole schedule."""
        ...

    def timezone(self) -> tzinfo:
        """The app's time zone, for entries without one of their own."""
        ...

    def loop_interval(self) -> float:
        """Celery's ``beat_max_loop_interval``, as the scheduler has it: the longest sleep."""
        ...

    def wake_by(self) -> float:
        """Monotonic time by which the main loop will be back."""
        ...

    def progress(self) -> None:
        """The main loop is working, not wedged (a long batch moved on)."""
        ...

    def send_slot(self, name: str, slot: datetime, epoch: int,
                  task_id: str | None = None) -> bool:
        """Publish ``slot`` of the entry ``name`` under ``epoch`` (0: a standby's rescue),
        with the slot's own task id unless ``task_id`` is given (a triggered run's)."""
        ...

    def chunk_sender(self, epoch: int) -> Any | None:
        """What a batch sends its chunks through under ``epoch`` (a ``batch.ChunkSend``);
        None: this side sends slot by slot, through :meth:`send_slot`."""
        ...

    def note_sent(self, entry: Any, slot: datetime) -> None:
        """What a sent slot changes in its entry (last run, run count, a one-off done)."""
        ...

    def say_sending_chunk(self, sends: Sequence[tuple[Any, datetime]], epoch: int) -> None:
        """Stock beat's INFO line for each of a chunk's sends."""
        ...

    def observe(self, events: Sequence[Event]) -> None:
        """What became of slots: signals, metrics."""
        ...

    def runtime_anchors(self) -> Mapping[str, SlotState]:
        """Run-time entry -> the slot state its slots count from (see ``dynamic_schedule``)."""
        ...

    def anchored_exactly(self) -> Collection[str]:
        """Run-time entries anchored before any state was stored."""
        ...

    def follows_runtime_entries(self) -> bool:
        """True when the scheduler follows entries defined at run time (a standby then
        wakes at least every ``dynamic_schedule.STANDBY_EVERY`` to look at them)."""
        ...

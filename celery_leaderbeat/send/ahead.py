"""A burst's messages framed ahead of their slot, on the single write (py-amqp).

Most of a RabbitMQ burst's CPU is its messages: built, then encoded by kombu and
py-amqp into frames. A message built from its entry's template computes nothing
from the clock (:mod:`.templates`: one that would, an eta or an expiry, is built
by ``apply_async`` at its send): its frames depend only on the entry, the slot,
the leader's epoch and the connection. So in the idle time before a burst the
leader records each due slot's frames (:class:`~.single_write.Recorder`: py-amqp's
own frame writer, nothing written), and the chunk that sends the slot after its
claim granted it writes those bytes in its one write (:meth:`Ahead.write`). A slot
is still never on the wire before its claim: a recording is only bytes in memory.

A recording is used only on the connection and channel it was made for, under its
epoch and the schedule version it was made with, while no ``before_task_publish``
receiver is connected; anything else is built again at the send, as it would have
been. Only a burst is framed ahead (:data:`FEWEST` slots or more due together), and
what is kept is bounded: at most :data:`MOST` slots, each dropped when used or once
its slot has passed, and all of them when the node stops leading.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, NamedTuple

from celery import signals

from ..timing.slots import to_ms
from .single_write import Gathered, Recorder
from .templates import Messages

logger = logging.getLogger(__name__)

#: how long before a burst its messages are framed (s)
AHEAD = 1.5
#: a burst: at least :data:`FEWEST` slots due within :data:`SPAN` s of the earliest one.
#: Fewer (a chunk's worth) are sent quickly enough as they are, and a schedule spread
#: over time (jitter, anchors of their own) is never walked ahead of its sends
FEWEST = 100
SPAN = 0.1
#: the most slots whose frames are kept at once
MOST = 20_000


class Recording(NamedTuple):
    """One slot's message, framed for one connection and channel under one epoch."""

    frames: bytes
    where: tuple[Any, int]  # (py-amqp connection, channel number)
    epoch: int
    task: str
    after: dict[str, Any]  # the arguments of Celery's after_task_publish


class Ahead:
    """The recordings of one scheduler's enqueuer, by (entry name, slot in ms)."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, int], Recording] = {}
        self._version: Any = None
        #: slots whose frames were used (a send wrote them): what the tests and benches read
        self.used = 0

    def __len__(self) -> int:
        return len(self._kept)

    def __contains__(self, key: tuple[str, datetime]) -> bool:
        return (key[0], to_ms(key[1])) in self._kept

    def keep(self, version: Any) -> None:
        """Recordings are of the schedule as it was at ``version``: another drops them all."""
        if version != self._version:
            self._kept.clear()
            self._version = version

    def clear(self) -> None:
        """Drop every recording (this node stopped leading: its epoch's are of no use)."""
        self._kept.clear()

    def passed(self, now: datetime) -> None:
        """Drop the recordings of slots before ``now`` (sent otherwise, or not sent)."""
        now_ms = to_ms(now)
        for key in [k for k in self._kept if k[1] < now_ms]:
            del self._kept[key]

    def record(self, producer: Any, messages: Messages,
               due: Iterable[tuple[Any, datetime, str]], epoch: int,
               until: float, clock: Callable[[], float]) -> bool:
        """Frame each due (entry, slot, overlap) not recorded yet, until ``clock() >= until``;
        True once ``due`` is done (or nothing can be recorded), False when time ran out."""
        if not messages.usable():
            return True
        with Recorder(producer) as recorder:
            if not recorder.active:
                return True
            for entry, slot, overlap in due:
                key = (entry.name, to_ms(slot))
                if key in self._kept:
                    continue
                if len(self._kept) >= MOST:
                    return True
                self._record(recorder, producer, messages, key, entry, slot, epoch, overlap)
                if clock() >= until:
                    return False
        return True

    def _record(self, recorder: Recorder, producer: Any, messages: Messages,
                key: tuple[str, int], entry: Any, slot: datetime, epoch: int,
                overlap: str) -> None:
        try:
            built = messages.build(entry, slot, epoch, overlap)
            if built.data is None:  # built by apply_async: it may read the clock
                return
            messages.publish(producer, built, signal=False)
        except Exception as exc:  # noqa: BLE001 - only a head start: its send builds it, and says why
            recorder.take()
            logger.debug("leaderbeat: could not frame %s for slot %s ahead: %r", entry.name,
                         slot.isoformat(), exc)
            return
        frames = recorder.take()
        if frames:
            self._kept[key] = Recording(frames, recorder.where, epoch,
                                        built.kwargs["headers"]["task"], built.after)

    def write(self, gathered: Gathered, messages: Messages, name: str, slot: datetime,
              epoch: int) -> bool:
        """Keep the slot's recorded frames in ``gathered`` as its publish, and fire
        ``after_task_publish`` for it; False (nothing done) when no recording fits."""
        recording = self._kept.pop((name, to_ms(slot)), None)
        if recording is None or recording.epoch != epoch or not messages.usable():
            return False
        if not gathered.add(recording.frames, recording.where):
            return False
        self.used += 1
        if signals.after_task_publish.receivers:
            signals.after_task_publish.send(sender=recording.task, **recording.after)
        return True

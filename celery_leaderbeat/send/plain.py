"""The plain path, the reference: Celery builds each message, kombu sends the chunk.

Every message is built by Celery itself (``apply_async`` / ``send_task``), so
task routes, queues, priorities, ``global_keyprefix`` and Celery's
``before_task_publish`` / ``after_task_publish`` signals behave as in stock
beat, with a deterministic task id and the leaderbeat headers added. A chunk
of messages goes out through kombu's own batching (``Producer.batch()``,
kombu 5.7) where the installed kombu and the transport have it; otherwise one
publish per message. The optimisations (:mod:`.sender`) answer as this does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from celery.beat import BeatLazyFunc
from kombu.messaging import Producer

from ..timing.slots import slot_id
from .base import SchedulerSide
from .single_write import Gathered

logger = logging.getLogger(__name__)

#: kombu operations buffered before an automatic flush: well above what one chunk adds
#: (one LPUSH per message, plus PEXPIREs for queues that expire), so a chunk is flushed
#: once, at the end, and counts as sent only then
BATCH_OPERATIONS = 10_000


class DeclaringOnce(Producer):
    """A kombu producer that declares each queue once per channel, not once per message.

    Celery asks for the message's queue to be declared on every publish; kombu
    remembers what it declared, but only after binding a copy of the queue to the
    channel, which cost about a third of building a message. This producer
    remembers the queues it declared on its current channel before that copy.
    """

    def maybe_declare(self, entity: Any, retry: bool = False, **retry_policy: Any) -> Any:
        if not entity:
            return False
        channel = self.channel
        if getattr(self, "_declared_on", None) is not channel:
            self._declared_on = channel
            self._declared: set[int] = set()
        key = hash(entity)
        if key in self._declared:
            return False
        declared = super().maybe_declare(entity, retry, **retry_policy)  # type: ignore[no-untyped-call]
        self._declared.add(key)
        return declared


def _evaluate(value: Any) -> Any:
    return value() if isinstance(value, BeatLazyFunc) else value


def publish(scheduler: SchedulerSide, entry: Any, slot: datetime, epoch: int | None,
            overlap: str = "allow", task_id: str | None = None,
            producer: Any = None) -> Any:
    """Publish ``entry`` for ``slot`` as Celery beat would, plus our id and headers.

    The task id is ``slot_id(prefix, entry, slot)``: the same on every node, so
    a consumer that dedupes by id sees a re-sent slot once. Headers
    ``leaderbeat_slot``, ``leaderbeat_epoch`` and ``leaderbeat_entry`` tell
    tasks and monitoring which slot a message carries (epoch 0: a standby's
    rescue); ``leaderbeat_overlap`` tells the worker guard the entry's overlap
    policy when it is not ``allow``. ``producer`` defaults to the scheduler's.
    """
    app = scheduler.app
    args = [_evaluate(a) for a in (entry.args or ())]
    kwargs = {k: _evaluate(v) for k, v in (entry.kwargs or {}).items()}
    options = dict(entry.options or {})
    headers = dict(options.pop("headers", None) or {})
    headers.update(
        celery_beat_task=True,
        leaderbeat_slot=slot.isoformat(),
        leaderbeat_epoch=epoch,
        leaderbeat_entry=entry.name,
    )
    if overlap not in ("allow", "allow_all"):
        headers.setdefault("leaderbeat_overlap", overlap)  # an entry's own header wins
    options["task_id"] = task_id or slot_id(scheduler.keys.prefix, entry.name, slot)
    options["headers"] = headers
    producer = producer if producer is not None else scheduler.producer
    task = app.tasks.get(entry.task)
    if task is not None:
        return task.apply_async(args, kwargs, producer=producer, **options)
    return app.send_task(entry.task, args, kwargs, producer=producer, **options)


def batches(producer: Any) -> bool:
    """Whether ``producer``'s kombu and transport defer publishes into batches."""
    return hasattr(producer, "batch") and bool(getattr(producer, "supports_batch_publish", False))


@contextmanager
def batched(producer: Any) -> Iterator[None]:
    """Publishes made inside go out in one kombu batch, flushed on exit.

    An exception raised by the flush propagates: nothing published inside can
    then be counted as sent. Without batching (older kombu, another transport)
    each publish goes out at once, as before.
    """
    if not hasattr(producer, "batch"):
        yield
        return
    with producer.batch(max_size=BATCH_OPERATIONS):
        yield


class _Stopped(Exception):
    """``may_send`` said no before the batch was flushed: nothing more of it goes out."""

    def __init__(self, settled: int = 0) -> None:
        super().__init__("stopped")
        self.settled = settled  # slots written before (gathered frames that had to go early)


def _one_publisher(scheduler: SchedulerSide, epoch: int, producer: Any, gathered: Gathered,
                   publish_one: Callable[[Any, datetime, str, Any], None] | None,
                   recorded: Callable[[Gathered, Any, datetime], bool] | None,
                   ) -> Callable[[Any, datetime, str], None]:
    """What publishes one slot of a batch: its frames recorded ahead where the chunk
    gathers frames and ``recorded`` has them, else ``publish_one`` (default :func:`publish`)."""
    def one(entry: Any, slot: datetime, overlap: str) -> None:
        if gathered.active and recorded is not None and recorded(gathered, entry, slot):
            return  # framed ahead of its slot: kept as a publish would be
        if publish_one is None:
            publish(scheduler, entry, slot, epoch, overlap, producer=producer)
        else:
            publish_one(entry, slot, overlap, producer)
    return one


def send_many(scheduler: SchedulerSide, slots: Sequence[tuple[Any, datetime, str]],
              epoch: int, producer: Any = None, may_send: Callable[[], bool] = lambda: True,
              say: Callable[[Any, datetime], None] = lambda entry, slot: None,
              publish_one: Callable[[Any, datetime, str, Any], None] | None = None,
              gather: bool = False,
              recorded: Callable[[Gathered, Any, datetime], bool] | None = None) -> list[bool]:
    """Publish several slots (entry, slot, overlap) in one batch; True for each one sent.

    ``say`` is called before each message is built (the scheduler's INFO line).
    ``publish_one(entry, slot, overlap, producer)`` publishes one message
    (default: :func:`publish`, Celery's ``apply_async``).
    A message that cannot be built or published is logged and answers False;
    the others still go. ``may_send`` is asked once more just before the flush
    (a pause while the batch was built must not publish after the lease ran
    out): when it says no, the batch is discarded and the answer is empty. A
    failed flush answers False for every message of the batch (kombu cannot
    tell which ones Redis ran: "delivery is uncertain", so they are recorded
    unsent, the way a failed publish is). On py-amqp the chunk's publish frames
    may be written in one socket write at the end (``gather``, the single write:
    :class:`~.single_write.Gathered`), with the same rules as a batch; there
    ``recorded(gathered, entry, slot)`` may keep the slot's frames recorded ahead
    (:mod:`.ahead`) instead of a publish (True when it did).
    """
    ok = [False] * len(slots)
    try:
        if callable(producer):  # made on first use: connecting can fail like a publish
            producer = producer()
        producer = producer if producer is not None else scheduler.producer
        with batched(producer), Gathered(producer, enabled=gather) as gathered:
            # kombu's batch or gathered frames: nothing reaches the broker before the end
            deferred = batches(producer) or gathered.active
            one = _one_publisher(scheduler, epoch, producer, gathered, publish_one, recorded)
            for i, (entry, slot, overlap) in enumerate(slots):
                if not deferred and not may_send():
                    return ok[:i]  # published one by one: stop where the lease ran out
                say(entry, slot)
                gathered.at = i
                try:
                    one(entry, slot, overlap)
                    ok[i] = True
                except Exception:  # this message only: logged with its traceback, unsent
                    logger.exception("leaderbeat: could not send %s for slot %s",
                                     entry.name, slot.isoformat())
            if deferred and not may_send():
                raise _Stopped(gathered.settled)
    except _Stopped as stopped:
        return ok[:stopped.settled]  # what went out before (gathered frames written early)
    except Exception:
        logger.exception("leaderbeat: a batch of %d message(s) could not be sent "
                         "(no broker connection, or the flush failed); recorded unsent", len(slots))
        return [False] * len(slots)
    return ok

"""What a batch hands a chunk of granted slots to, and what it answers.

A batch (``roles/batch.py``) claims a chunk of due slots, then hands the
slots the claim granted to a :class:`ChunkSend`. Every send path implements
it: the plain path (Celery builds each message, kombu sends the chunk), and
the optimisations behind it (:mod:`.sender` chooses). The answer is per slot:

- sent: the broker accepted the message (or the claim script enqueued it);
- unsent, :data:`PUBLISH_FAILED`: the broker refused it, or delivery is
  uncertain (a failed flush: kombu cannot say which messages Redis ran);
- unsent, :data:`LEASE_EXPIRED`: not sent because ``may_send`` said no before
  it reached the broker (an answer shorter than the chunk).

The batch records every answer in the slots' history; a path never records.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar

from ..config import Config
from ..store.base import SlotStore
from ..store.keys import Keys

T = TypeVar("T")

#: the history reason of a granted slot the broker refused (or may not have received)
PUBLISH_FAILED = "publish failed"
#: the history reason of a granted slot held back because the lease could not be confirmed
LEASE_EXPIRED = "lease expired"

#: the send paths, as ``status``, ``nodes`` and ``leaderbeat_send_path{path}`` name them
PLAIN = "plain"  # Celery builds each message; kombu's Producer.batch, or one publish each
ONE_STEP = "one_step"  # the claim script runs kombu's commands (the broker is the state's Redis)
SINGLE_WRITE = "single_write"  # py-amqp: a chunk's publish frames in one socket write


class SchedulerSide(Protocol):
    """What the send path asks of the beat Scheduler it sends for (its public face only)."""

    app: Any  # the Celery app: it builds each message
    keys: Keys  # a slot's task id is made from the key prefix
    lb_config: Config

    @property
    def producer(self) -> Any:
        """Celery's producer on the app's connection."""

    @property
    def schedule(self) -> Any:
        """Entry name -> Celery ``ScheduleEntry``."""

    @property
    def ledger(self) -> SlotStore: ...

    @property
    def enqueuer(self) -> Any:
        """The scheduler's :class:`~.sender.Enqueuer`, None before its first chunk."""

    def overlap_of(self, name: str) -> str: ...

    def note_sent(self, entry: Any, slot: datetime) -> None: ...

    def say_sending_chunk(self, sends: Sequence[tuple[Any, datetime]], epoch: int) -> None: ...


class ChunkSend(Protocol):
    """Sends a chunk's granted slots at once; may hand their broker commands to the claim."""

    def prepare(self, slots: Sequence[tuple[str, datetime]]) -> Sequence[tuple[Any, ...] | None]:
        """Per slot, broker commands the claim runs if it grants the slot, or None."""

    def enqueued(self, slots: Sequence[tuple[str, datetime]]) -> None:
        """These slots were granted and enqueued by the claim itself."""

    def send_many(self, slots: Sequence[tuple[str, datetime]],
                  may_send: Callable[[], bool]) -> list[bool]:
        """Publish these granted slots; True for each one the broker accepted.

        ``may_send`` is asked again just before anything reaches the broker. A
        shorter answer means it stopped because it said no (the lease can no
        longer be confirmed): the rest are unsent, :data:`LEASE_EXPIRED`; a False,
        :data:`PUBLISH_FAILED`.
        """


def unsent_reasons(slots: Sequence[T], answer: Sequence[bool]) -> list[tuple[T, str | None]]:
    """Each slot of a :meth:`ChunkSend.send_many` call with why it is unsent, None where it
    was sent: the one place its answer is read (False: :data:`PUBLISH_FAILED`; past the
    end of a shorter answer: :data:`LEASE_EXPIRED`)."""
    if len(answer) > len(slots):
        raise ValueError(f"an answer of {len(answer)} for a chunk of {len(slots)} slots")
    return [(slot, None if i < len(answer) and answer[i] else
             PUBLISH_FAILED if i < len(answer) else LEASE_EXPIRED)
            for i, slot in enumerate(slots)]

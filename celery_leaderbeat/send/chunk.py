"""One batch's chunk sender: the slots a claim granted, sent on the scheduler's path.

:class:`ChunkSender` is the :class:`~.base.ChunkSend` an :class:`~.sender.Enqueuer`
hands a batch under one fencing epoch. It builds (or holds) each slot's message,
hands the claim the commands it runs on the one-step path, publishes what the claim
granted without enqueueing it (:func:`~.plain.send_many`, or kombu's client in one
pipeline for messages held as their Redis commands), and says what each sent slot
changes in this process (:meth:`ChunkSender._went`). The batch records the answers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

from celery import signals

from .ahead import Ahead
from .base import SchedulerSide
from .one_step import Command
from .plain import send_many
from .single_write import Gathered
from .templates import Captured, Messages

logger = logging.getLogger(__name__)


class Enqueuer(Protocol):
    """What a chunk sender uses of the scheduler's :class:`~.sender.Enqueuer`."""

    scheduler: SchedulerSide
    messages: Messages
    ahead: Ahead  # frames recorded ahead of their slots (py-amqp)
    redis: bool  # messages are known as their final Redis commands
    single_write_problem: str | None
    #: slots whose commands went with a claim whose reply never came
    unanswered: list[tuple[str, datetime, int, Captured | None]]

    def build(self, entry: Any, slot: datetime, epoch: int, overlap: str) -> Captured: ...

    def publish_one(self, entry: Any, slot: datetime, epoch: int, overlap: str,
                    producer: Any) -> None: ...

    def final(self, captured: Captured) -> tuple[Command, ...] | None: ...

    def run(self, captured: Sequence[Captured]) -> list[Exception | None]: ...

    def producer(self) -> Any: ...


class ChunkSender:
    """One batch's sender under one fencing epoch (0: a standby's rescue): a
    :class:`~.base.ChunkSend`, on whichever path its :class:`Enqueuer` takes."""

    def __init__(self, enqueuer: Enqueuer, epoch: int, *, fast: bool) -> None:
        self.enqueuer = enqueuer
        self.epoch = epoch
        self.fast = fast
        self._held: dict[tuple[str, datetime], Captured] = {}

    def _entry(self, name: str) -> tuple[Any, str] | None:
        s = self.enqueuer.scheduler
        entry = s.schedule.get(name)
        if entry is None:
            return None
        return entry, s.overlap_of(name)

    def _hold(self, slots: Sequence[tuple[str, datetime]]) -> list[Captured | None]:
        """Build each slot's message and hold it; None for an entry gone or a build that failed."""
        out: list[Captured | None] = []
        build = self.enqueuer.build
        for name, slot in slots:
            found = self._entry(name)
            captured = None
            if found is not None:
                try:
                    captured = build(found[0], slot, self.epoch, found[1])
                except Exception:  # noqa: BLE001 - built again, and its error logged, when sent
                    captured = None
                if captured is not None:
                    self._held[(name, slot)] = captured
            out.append(captured)
        return out

    def prepare(self, slots: Sequence[tuple[str, datetime]]) -> list[tuple[Command, ...] | None]:
        """Each slot's broker commands for the claim script to run, or None (sent after).

        With a ``before_task_publish`` receiver connected nothing is built before the
        claim: the receiver may change each message, so Celery builds it, and the signal
        would fire for slots the claim then refuses. The chunk is claimed first and its
        granted slots built and sent after, batched.
        """
        self._held.clear()
        enqueuer = self.enqueuer
        enqueuer.unanswered = []
        if not self.fast or signals.before_task_publish.receivers:
            return [None] * len(slots)
        final = enqueuer.final
        commands = [final(c) if c is not None else None for c in self._hold(slots)]
        enqueuer.unanswered = [(name, slot, self.epoch, self._held.get((name, slot)))
                               for (name, slot), cmds in zip(slots, commands) if cmds]
        return commands

    def enqueued(self, slots: Sequence[tuple[str, datetime]]) -> None:
        """The claim answered; it granted and enqueued these (in this call, or in an earlier
        attempt whose reply was lost): Celery's after_task_publish, once each."""
        self.enqueuer.unanswered = []
        self.said_enqueued([(name, slot, self._held.pop((name, slot), None))
                            for name, slot in slots], epoch=self.epoch)

    def said_enqueued(self, slots: Sequence[tuple[str, datetime, Captured | None]], *,
                      epoch: int) -> None:
        """Slots the claim script enqueued: what a sent slot changes in its entry, the send
        lines, and ``after_task_publish`` (a message not held is built again for it; not
        when a ``before_task_publish`` receiver would see that build)."""
        s = self.enqueuer.scheduler
        after = bool(signals.after_task_publish.receivers)
        said: list[tuple[Any, datetime]] = []
        for name, slot, captured in slots:
            found = self._entry(name)
            if found is None:
                continue
            said.append((found[0], slot))
            if after and captured is None and self.enqueuer.messages.usable():
                try:
                    captured = self.enqueuer.build(found[0], slot, epoch, found[1])
                except Exception:  # it was sent: only its signal is missing
                    logger.warning("leaderbeat: %s for slot %s was sent; its message could not "
                                   "be built again for after_task_publish", name,
                                   slot.isoformat(), exc_info=True)
            self._went(found[0], slot, captured)
        s.say_sending_chunk(said, epoch)

    def _went(self, entry: Any, slot: datetime, captured: Captured | None = None) -> None:
        """What a sent slot changes in this process, on every path: its entry (last run,
        run count) and, for a message Celery's ``apply_async`` did not publish itself,
        ``after_task_publish`` (``captured``). The slot's history is the batch's to record."""
        self.enqueuer.scheduler.note_sent(entry, slot)
        if captured is not None and signals.after_task_publish.receivers:
            signals.after_task_publish.send(sender=entry.task, **captured.after)

    def send_many(self, slots: Sequence[tuple[str, datetime]],
                  may_send: Callable[[], bool] = lambda: True) -> list[bool]:
        """Publish granted slots that the claim did not enqueue; True for each one sent.

        Shorter than ``slots`` when ``may_send`` said no before the rest reached the
        broker (the lease ran out): the answer covers only what was settled.
        """
        said: list[tuple[Any, datetime]] = []  # the chunk's send lines: one record, at the end
        try:
            return self._publish(slots, may_send, said)
        finally:
            self.enqueuer.scheduler.say_sending_chunk(said, self.epoch)

    def _publish(self, slots: Sequence[tuple[str, datetime]], may_send: Callable[[], bool],
                 said: list[tuple[Any, datetime]]) -> list[bool]:
        ok = [False] * len(slots)
        if self.enqueuer.redis:  # their final commands, in one pipeline after the claim
            self._hold([s for s in slots if s not in self._held])
        held = {i: self._held.pop(s) for i, s in enumerate(slots) if s in self._held}
        todo = [(i, found, slots[i][1]) for i in range(len(slots)) if i not in held
                for found in [self._entry(slots[i][0])] if found is not None]
        s = self.enqueuer.scheduler
        results = send_many(s, [(found[0], slot, found[1]) for _, found, slot in todo],
                            self.epoch, producer=self.enqueuer.producer, may_send=may_send,
                            say=lambda entry, slot: said.append((entry, slot)),
                            publish_one=self._publish_one,
                            gather=self.enqueuer.single_write_problem is None,
                            recorded=self._recorded) if todo else []
        for (i, found, slot), sent in zip(todo, results):
            ok[i] = sent
            if sent:
                self._went(found[0], slot)
        if len(results) < len(todo):  # stopped: nothing from the first unsettled one on
            return ok[:todo[len(results)][0]]
        return self._send_held(held, slots, ok, may_send, said)

    def _send_held(self, held: dict[int, Captured], slots: Sequence[tuple[str, datetime]],
                   ok: list[bool], may_send: Callable[[], bool],
                   said: list[tuple[Any, datetime]]) -> list[bool]:
        """Run the held messages' commands (``ok`` already has the others'); stopped
        before them, the answers up to the first held one."""
        if held and not may_send():
            return ok[:min(held)]
        if held:
            self._run(held, slots, ok)
        for i, captured in held.items():
            again = self._entry(slots[i][0])
            if ok[i] and again is not None:
                said.append((again[0], slots[i][1]))
                self._went(again[0], slots[i][1], captured)
        return ok

    def _run(self, held: dict[int, Captured], slots: Sequence[tuple[str, datetime]],
             ok: list[bool]) -> None:
        """Run the held messages' commands in one pipeline; ``ok[i]`` for each one that ran."""
        try:
            errors = self.enqueuer.run(list(held.values()))
        except Exception:  # no reply: none is said sent (recorded unsent, "publish failed")
            logger.exception("leaderbeat: %d routed message(s) could not be sent", len(held))
            return
        for i, error in zip(held, errors):
            ok[i] = error is None
            if error is not None:
                logger.error("leaderbeat: could not send %s for slot %s", slots[i][0],
                             slots[i][1].isoformat(), exc_info=error)

    def _recorded(self, gathered: Gathered, entry: Any, slot: datetime) -> bool:
        """Keep the slot's frames recorded ahead of it, where they fit (:mod:`.ahead`)."""
        return self.enqueuer.ahead.write(gathered, self.enqueuer.messages, entry.name, slot,
                                         self.epoch)

    def _publish_one(self, entry: Any, slot: datetime, overlap: str, producer: Any) -> None:
        self.enqueuer.publish_one(entry, slot, self.epoch, overlap, producer)

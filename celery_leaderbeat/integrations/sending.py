"""Sending a slot from inside Celery's beat: one at a time, or a batch's sender."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from typing import Any

from ..send.ahead import AHEAD, FEWEST, SPAN
from ..send.base import SINGLE_WRITE
from ..send.plain import publish
from ..send.sender import Enqueuer
from ..timing.slots import to_ms
from .attributes import Attributes

logger = logging.getLogger(__name__)
#: one INFO line per send, in stock beat's words (a chunk's lines in one record); a
#: logger of its own so a busy schedule can quiet it alone
#: (``logging.getLogger("celery_leaderbeat.sends")``)
send_logger = logging.getLogger("celery_leaderbeat.sends")

#: idle time (s) before the next due slot below which a leader prepares no messages
WARM_MIN = 0.1
#: the most a leader spends preparing messages in one idle tick (s)
WARM_MAX = 0.25


class Sending(Attributes):
    """Publishing slots of the schedule's entries, and what a sent slot changes."""

    _warming: Any = None  # (schedule version, epoch, iterator of (entry, overlap)) being warmed
    _warmed: Any = None  # (schedule version, epoch) whose entries are all prepared
    _kept: Any = None  # (enqueuer, schedule version) its messages were last bounded by

    def _warm(self, delay: float, epoch: int) -> float:
        """A leader's idle time: the entries' messages prepared, then the next burst's
        frames recorded (:meth:`_frame_ahead`); what is left of ``delay``."""
        delay = self._warm_templates(delay, epoch)
        return delay if self._warming is not None else self._frame_ahead(delay, epoch)

    def _frame_ahead(self, delay: float, epoch: int) -> float:
        """Within :data:`~..send.ahead.AHEAD` s of a burst (at least
        :data:`~..send.ahead.FEWEST` slots due within :data:`~..send.ahead.SPAN` s of the
        earliest), record their frames (py-amqp's single write: :mod:`..send.ahead`), at
        most half the idle time and :data:`WARM_MAX` per tick.

        Returns what is left of ``delay``; 0 while slots are left to frame and idle time
        remains; further off than that window, the time until it opens (the loop wakes
        then).
        """
        leader, enqueuer = self._leader, self._enqueuer
        if (leader is None or enqueuer is None or not enqueuer.checked
                or enqueuer.path()[0] != SINGLE_WRITE or len(leader.agenda.tracked) < FEWEST):
            return delay
        earliest = leader.agenda.earliest()
        now = time.time()
        if earliest is None or earliest - now > AHEAD:
            return delay if earliest is None else min(delay, earliest - now - AHEAD)
        if delay < WARM_MIN:
            return delay
        started = time.monotonic()
        try:
            sender = self._chunk_sender(epoch)  # recordings of another version dropped
            enqueuer.ahead.passed(datetime.fromtimestamp(now, timezone.utc))
            due = leader.agenda.upcoming(earliest + SPAN)
            if len(due) < FEWEST:
                return delay
            done = enqueuer.ahead.record(  # the first burst too: connected first
                enqueuer.connected_producer(), enqueuer.messages, self._due_entries(due),
                sender.epoch, started + min(delay / 2, WARM_MAX), time.monotonic)
        except Exception as exc:  # noqa: BLE001 - only a head start: the sends build what is missing
            logger.debug("leaderbeat: could not frame messages ahead: %r", exc)
            return delay
        left = max(0.0, delay - (time.monotonic() - started))
        return 0.0 if not done and left >= WARM_MIN else left

    def _due_entries(self, due: list[tuple[str, datetime]]) -> Iterator[tuple[Any, datetime, str]]:
        """(entry, slot, overlap) of each (name, slot) still scheduled when its turn comes."""
        for name, slot in due:
            entry = self.schedule.get(name)
            if entry is not None:
                yield entry, slot, self.overlap_of(name)

    def _warm_templates(self, delay: float, epoch: int) -> float:
        """A leader with ``delay`` s to spare prepares messages of entries not sent yet.

        Uses at most half the idle time (and :data:`WARM_MAX`) in one tick, so the
        next due slot is not late for it; returns what is left of ``delay``, or 0
        while entries are left to prepare and idle time remains (the next tick goes
        on at once: a sparse schedule's one long wait is used, not one slice of it).
        Done again when the schedule changes (only for the entries the change touched,
        when it is known name by name: a storm of run-time edits must not walk the
        whole schedule at every tick) or another epoch leads.
        """
        if delay < WARM_MIN or self._warmed == (self._schedule_version, epoch):
            return delay
        if self._enqueuer is not None and not self._enqueuer.checked:
            # the broker could not be reached: the next send checks it again. Checking from
            # idle time would block the loop on kombu's connection retries at every tick
            # (long enough to stall the heartbeat) while the broker is down.
            return delay
        started = time.monotonic()
        try:
            sender = self._chunk_sender(epoch)
            key = (self._schedule_version, epoch)
            if self._warming is None or self._warming[0] != key:
                self._warming = (key, self._to_warm(epoch))
            if sender.enqueuer.messages.warm(self._warming[1], epoch,
                                             started + min(delay / 2, WARM_MAX),
                                             time.monotonic):
                self._warmed, self._warming = key, None
        except Exception as exc:  # noqa: BLE001 - only a head start: the sends build what is missing
            logger.debug("leaderbeat: could not prepare messages ahead: %r", exc)
            self._warmed, self._warming = (self._schedule_version, epoch), None
        left = max(0.0, delay - (time.monotonic() - started))
        return 0.0 if self._warming is not None and left >= WARM_MIN else left

    def _to_warm(self, epoch: int) -> Iterator[tuple[Any, str]]:
        """The entries left to prepare under ``epoch``: after a change known name by name,
        what was left before it and the entries it touched; else the whole schedule."""
        done = self._warming[0] if self._warming is not None else self._warmed
        left: Iterator[tuple[Any, str]] = self._warming[1] if self._warming is not None \
            else iter(())
        changed = self.changed_since(done[0]) if done is not None and done[1] == epoch \
            else None
        return itertools.chain(left, self._entries_named(sorted(changed))) \
            if changed is not None else self._entries_named(list(self.schedule))

    def _entries_named(self, names: list[str]) -> Iterator[tuple[Any, str]]:
        """(entry, overlap) of each of ``names`` still scheduled when its turn comes."""
        for name in names:
            entry = self.schedule.get(name)
            if entry is not None:
                yield entry, self.overlap_of(name)

    def _chunk_sender(self, epoch: int) -> Any:
        """A batch's chunk sender (``send.base.ChunkSend``), on the path the broker allows:
        one step, the single write, or the plain path (``Enqueuer.path`` says which)."""
        if self._enqueuer is None or not self._enqueuer.checked:
            said = self._enqueuer is not None  # an unreachable broker is said once
            shared = self._connect()
            self._enqueuer = Enqueuer(self, shared.client, quiet=said, memory=shared.sent)
        self._keep_messages(self._enqueuer)
        return self._enqueuer.bind(epoch)

    def _keep_messages(self, enqueuer: Enqueuer) -> None:
        """After a schedule change, the kept messages are bounded by the entries scheduled now,
        and frames recorded ahead under the schedule before it are dropped.

        Only the entries the change touched are looked at when it is known name by
        name; every kept entry otherwise.
        """
        kept, version = self._kept, self._schedule_version
        enqueuer.ahead.keep(version)  # frames recorded under another version are not sent
        if kept is not None and kept[0] is enqueuer and kept[1] == version:
            return
        names = self.changed_since(kept[1]) if kept is not None and kept[0] is enqueuer else None
        enqueuer.messages.keep(self.schedule, self.overlap_of, names)
        self._kept = (enqueuer, version)

    def send_slot(self, name: str, slot: datetime, epoch: int,
                  task_id: str | None = None) -> bool:
        """Publish ``slot`` of the entry named ``name``, if it is still scheduled."""
        entry = self.schedule.get(name)
        return entry is not None and self._send(entry, slot, epoch, task_id)

    def _send(self, entry: Any, slot: datetime, epoch: int, task_id: str | None = None) -> bool:
        """Publish one slot; a failure is logged and reported, never swallowed."""
        self._say_sending(entry, slot, epoch, task_id)
        try:
            publish(self, entry, slot, epoch, self.overlap_of(entry.name), task_id)
        except Exception:  # any publish failure: logged with its traceback, recorded unsent
            logger.exception("leaderbeat: could not send %s for slot %s",
                             entry.name, slot.isoformat())
            return False
        self.note_sent(entry, slot)
        return True

    def _say_sending(self, entry: Any, slot: datetime, epoch: int,
                     task_id: str | None = None) -> None:
        """Stock beat's INFO line for a send."""
        if send_logger.isEnabledFor(logging.INFO):
            send_logger.info("Scheduler: Sending due task %s (%s) for slot %s%s",
                             entry.name, entry.task, slot.isoformat(), _how(epoch, task_id))

    def say_sending_chunk(self, sends: Sequence[tuple[Any, datetime]], epoch: int) -> None:
        """A chunk's sends as one INFO record whose lines are the per-send lines, in order.

        The logging machinery costs more than a line's text (a record, its caller's
        frame, a lock, a flush): one record per chunk of up to a hundred sends pays it
        once per chunk, not once per send.
        """
        if sends and send_logger.isEnabledFor(logging.INFO):
            how = _how(epoch, None)
            send_logger.info("\n".join([
                f"Scheduler: Sending due task {entry.name} ({entry.task}) "
                f"for slot {slot.isoformat()}{how}" for entry, slot in sends]))

    def note_sent(self, entry: Any, slot: datetime) -> None:
        """What a sent slot changes in the entry (a chunk sender calls it for each slot too)."""
        entry.last_run_at = slot
        entry.total_run_count += 1
        if getattr(entry, "leaderbeat_once", False) and self._dynamic is not None:
            self._dynamic.ran(entry, to_ms(slot))


def _how(epoch: int, task_id: str | None) -> str:
    """What a send line adds: epoch 0 is a standby's rescue; a task id of its own, a
    trigger or backfill."""
    if epoch == 0:
        return " (rescue: a standby sends a slot the leader had not claimed)"
    return f" (requested, task id {task_id})" if task_id else ""

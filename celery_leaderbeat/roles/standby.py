"""Standing by: try to lead once per poll, and rescue the slots a leader missed.

A standby follows the schedule too, with no I/O while nothing is due. When a
due slot's fire time is ``leaderbeat_rescue_after`` behind, it asks Redis, in
one call for the whole due batch, to claim the slots nobody claimed yet
(:meth:`Ledger.rescue`; the look before it reads the entries due
:data:`CLAIMED_WITHIN` ago too, so that those a healthy leader claimed need no
look of their own): the script judges "late enough" by Redis ``TIME``, so a
standby with a fast clock cannot pre-empt a healthy leader, waits while the
lease holder is still claiming chunks of a burst, and grants a slot only
from the entry's stored slot and for the definition the leader plans; the
claim is the same monotonic gate the leader uses, so nothing is sent twice. A
healthy leader has claimed them all by then and the call only tells the
standby where each entry stands. A rescued slot is late, not missed. Slots
that fell due before this standby followed the schedule (its start, or Redis
answering again) follow the entry's catch-up policy, as a leader's would: a
rescuer records the ones it passes over, once its claim of the entry was
granted, and after an outage it first leaves a live leader time to claim.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

from ..config import store_name
from ..errors import LeaseLostError
from ..store.base import STORE_ERRORS
from ..store.events import RELEASED
from ..store.types import ClaimItem, Code, Event, Op, SlotStatus
from ..timing.slots import Plan, from_ms
from .agenda import Agenda, Tracked, small_change
from .batch import Outcome, RescueGate, run_batch
from .dynamic_schedule import STANDBY_EVERY
from .shared import Shared, utcnow

logger = logging.getLogger(__name__)

#: seconds before a rescue that Redis answered "not yet" is asked again (by Redis TIME it
#: was early, or the leader is still claiming a burst), doubling while the answer stays
#: the same, up to the cap: a busy leader's burst is not re-planned ten times a second
_EARLY_RETRY = 0.1
_EARLY_RETRY_CAP = 0.5
#: seconds at least between two looks at whether the leader claimed what fell due (one
#: read each): entries due at instants of their own (run-time edits, one-offs, jitter)
#: are checked together, as the leader sends them in passes SEND_GATHER apart
RESCUE_GATHER = 0.1
#: seconds after its time by which a healthy leader has claimed a slot: a look made for the
#: entries ``rescue_after`` late reads, in the same call, those due by this long ago too.
#: Claimed, they move on and need no look of their own; the others wait for theirs (then
#: rescued when still unclaimed). Entries due at instants of their own (edits, one-offs,
#: jitter) are looked at once per rescue_after less this, not once per instant
CLAIMED_WITHIN = 0.5


class Standby:
    """The standing-by half of one beat process."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        #: the moment this node could first have rescued a slot (its start, Redis back)
        self.since = utcnow()
        self.agenda: Agenda | None = None  # read from Redis when first needed
        self._version = -1
        self._unknown: set[str] = set()  # entries with no slot state yet: phase unknown
        self._unknown_checked = 0.0
        self._next_attempt = 0.0  # monotonic: when to try for the lease again
        self._head_start_until = 0.0  # monotonic: last-leader goes first after an outage
        #: monotonic: no look at what fell due before then (a "not yet" answer, a restart
        #: giving the leader its time, the RESCUE_GATHER after the last look)
        self._retry_at = 0.0
        self._early_retry = _EARLY_RETRY  # the next wait after a "not yet"
        self._pubsub: Any = None
        self._skew_refused = False
        self._server_checked = False
        self._differs: set[str] = set()  # entries whose definition is not the leader's (said)
        #: rescue claims whose reply was lost, and when they were asked (monotonic)
        self._inflight: tuple[list[ClaimItem], float] | None = None

    # -- what the scheduler tells it ---------------------------------------------------

    def restart(self, *, head_start: float = 0.0, shift_since: bool = False) -> None:
        """Follow the schedule afresh from now (Redis is back, or the clock stepped).

        ``head_start``: seconds before this node tries for the lease (the node that led
        when Redis went away goes first). ``shift_since``: nor does it rescue what falls
        in that time (under last-leader, what the previous leader sent meanwhile is not
        claimed yet).
        """
        self.since = utcnow()
        self.agenda = None  # Redis may have lost its data: read it again
        self._pubsub = None
        # A leader that lived through the outage claims within a poll of Redis answering
        # (and its progress then holds rescues off): give it that long before rescuing
        # what fell due meanwhile, under the entry's catch-up policy.
        self._retry_at = time.monotonic() + self.shared.config.rescue_after \
            + self.shared.config.standby_poll
        if head_start:
            self._head_start_until = time.monotonic() + head_start
        if shift_since:
            self.since = self.since + timedelta(seconds=head_start)

    def lost_connection(self) -> None:
        self._pubsub = None

    # -- one pass ------------------------------------------------------------------------

    def tick(self, version: int) -> bool:
        """Try to lead, rescue what is overdue, wait; True once this node leads."""
        shared = self.shared
        if not self._server_checked:
            for warning in shared.store.warnings():
                logger.warning("leaderbeat: %s", warning)
            self._server_checked = True
        if not self._clock_ok():
            self._wait(self._poll())
            return False
        now = time.monotonic()
        if self.attempt_due(now):
            if self._try_to_lead(now):
                return True
            self._next_attempt = now + self._poll()
        shared.losses.report_if_due(now, shared.sent)
        if shared.backlog:  # history events a failed call did not write: write them now
            events = list(shared.backlog)
            RescueGate(shared.ledger).record(events)
            del shared.backlog[:len(events)]
        self._rescue(version)
        self._wait(self._timeout())
        return False

    def attempt_due(self, now: float) -> bool:
        """True when this tick tries for the lease (its scheduler looks at the run-time
        entries first: see :meth:`_poll`)."""
        return now >= self._next_attempt and now >= self._head_start_until

    def _try_to_lead(self, now: float) -> bool:
        """One attempt at the lease (after a loss of writes, see
        :meth:`~celery_leaderbeat.roles.loss.Losses.standby_attempted`)."""
        lease, losses = self.shared.lease, self.shared.losses
        acquired = lease.try_acquire(despite_loss=losses.despite_loss(now))
        losses.standby_attempted(now, acquired=acquired, held_back=lease.held_back)
        return acquired

    def _clock_ok(self) -> bool:
        """False while this node's clock is beyond ``max_clock_skew`` (it refuses to lead)."""
        lease, limit = self.shared.lease, self.shared.config.max_clock_skew
        skew = lease.clock_skew
        if skew is None or self._skew_refused:
            skew = lease.measure_skew()
        if abs(skew) > limit:
            if not self._skew_refused:
                logger.warning("leaderbeat: this node's clock is %+.3f s off %s's clock, beyond "
                               "leaderbeat_max_clock_skew=%s; refusing to lead", skew,
                               store_name(self.shared.config), limit)
            self._skew_refused = True
            return False
        if self._skew_refused:
            logger.info("leaderbeat: clock skew %+.3f s is within limits again", skew)
            self._skew_refused = False
            self.since = utcnow()
        return True

    # -- rescue ----------------------------------------------------------------------------

    def _rescue(self, version: int) -> None:
        if self.agenda is None or version != self._version:
            self._follow(version)
        # asked whatever else changes: in a storm of run-time edits the version moves on
        # every tick, and an entry left unknown would never be rescued
        if self._unknown and \
                time.monotonic() - self._unknown_checked >= self.shared.config.rescue_after:
            self._recheck_unknown()
        if self._inflight is not None:
            self._settle_inflight()
        if time.monotonic() < self._retry_at or self.agenda is None:
            return
        now = utcnow()
        cutoff = now - timedelta(seconds=self.shared.config.rescue_after)
        due = self.agenda.pop_due(cutoff, self.since)
        if not due:
            return
        # pop_due takes an entry off the heap once: this takes none of ``due`` again (and
        # nothing at all were rescue_after under CLAIMED_WITHIN)
        looked = due + self.agenda.pop_due(now - timedelta(seconds=CLAIMED_WITHIN), self.since)
        self._retry_at = time.monotonic() + RESCUE_GATHER
        try:
            late = {tracked.name for tracked, _ in due}
            unclaimed = [(tracked, p) for tracked, p in self._still_unclaimed(looked)
                         if tracked.name in late]  # the others: at their own look
            outcome = self._claim_and_send(unclaimed) if unclaimed else None
        finally:
            self.agenda.push_all(looked)
        if outcome is not None:
            self._rescued(outcome)

    def _claim_and_send(self, unclaimed: list[tuple[Tracked, Plan]]) -> Outcome | None:
        """Rescue the slots nobody claimed: claimed here, then sent; None when this node was
        held up past its publish window (what it had not sent is recorded unsent)."""
        gate = RescueGate(self.shared.ledger, self._publish_window())
        try:
            # claimed first (no message built for what a healthy leader claimed), then each
            # chunk's granted slots published in one batch (one pipeline on a Redis broker):
            # a burst must be rescued within about a second of rescue_after, whole
            return run_batch(unclaimed, gate, self.shared.chunk_send(0),
                             memory=self.shared.sent, backlog=self.shared.backlog)
        except STORE_ERRORS:
            # a claim whose reply was lost may have been granted: asked again first
            # thing once Redis answers (granted again to this node, then sent)
            if gate.inflight is not None:
                self._inflight = gate.inflight
            raise
        except LeaseLostError:  # the publish window passed mid-batch (this node paused)
            logger.warning("leaderbeat: standby %s was held up past its publish window "
                           "while rescuing; the slots it had not sent are recorded unsent",
                           self.shared.config.node_id)
            return None

    def _follow(self, version: int) -> None:
        """Read the schedule's changes since the agenda was built, or the whole of it."""
        agenda = self.agenda
        changed = self.shared.celery.changed_since(self._version) \
            if agenda is not None else None
        if (agenda is not None and changed is not None
                and small_change(changed, len(agenda.tracked))):
            self._update(changed, version)
        else:
            self._load(version)

    def _rescued(self, outcome: Outcome) -> None:
        """Say what a rescue batch sent; set aside what it could not claim and why."""
        assert self.agenda is not None
        self.shared.celery.observe(outcome.events)
        if outcome.sent:
            logger.warning("leaderbeat: standby %s rescued %d slot(s) nobody had claimed %.1f s "
                           "after their time", self.shared.config.node_id, outcome.sent,
                           self.shared.config.rescue_after)
        if outcome.waiting:
            self._retry_at = time.monotonic() + self._early_retry
            self._early_retry = min(self._early_retry * 2, _EARLY_RETRY_CAP)
        else:
            self._early_retry = _EARLY_RETRY
        for name in outcome.unknown:
            self.agenda.drop(name)
            self._unknown.add(name)
        for name in outcome.differs:
            self.agenda.drop(name)  # tracked again when this node's schedule changes
            if name not in self._differs:
                self._differs.add(name)
                logger.warning("leaderbeat: standby %s does not rescue %s: its definition of the "
                               "entry is not the one the leader plans (a changed row this node "
                               "has not read yet, or a rolling deploy); said once",
                               self.shared.config.node_id, name)

    def _settle_inflight(self) -> None:
        """A rescue claim whose reply was lost: ask for the same claims again. What this
        node was granted is granted again and sent, within the publish window; past it,
        recorded unsent (a leader may recover it by then)."""
        assert self._inflight is not None
        items, started = self._inflight
        claims = [item for item in items if item.op == Op.CLAIM]
        results = self.shared.ledger.rescue(claims).results if claims else []
        self._inflight = None
        late = time.monotonic() - started >= self._publish_window()
        events: list[Event] = []
        for item, result in zip(claims, results):
            if result is not Code.GRANTED or self.shared.sent.covers(item.name, item.slot_ms):
                continue  # not ours, or sent before the reply went missing
            slot = from_ms(item.slot_ms)
            if not late and self.shared.celery.send_slot(item.name, slot, 0):
                self.shared.sent.note(item.name, item.slot_ms)
                events.append(Event(item.name, item.slot_ms, "sent", "rescued"))
            else:
                events.append(Event(item.name, item.slot_ms, "unsent",
                                    "rescue: the claim's reply was lost"))
        if events:
            RescueGate(self.shared.ledger).record(events)
            self.shared.celery.observe(events)

    def _publish_window(self) -> float:
        """Seconds after its claim call began within which a rescuer may still publish.

        A leader recovers a standby's unconfirmed claim only once it is a lease ttl
        old by Redis TIME; a rescuer paused between its grant and its publish must
        not send after that, or the slot could go twice.
        """
        return max(0.0, self.shared.config.lease_ttl - self.shared.config.safety_margin)

    def _still_unclaimed(self, due: list[tuple[Tracked, Plan]]) -> list[tuple[Tracked, Plan]]:
        """One read of the store for the whole due batch (``Ledger.load``); keep the entries
        nobody has claimed.

        With a healthy leader this is all a standby costs Redis per batch; the others
        only move on to where the leader stands.
        """
        names = [tracked.name for tracked, _ in due]
        stored = self.shared.ledger.load(names)
        self.shared.losses.report_behind(stored, names, self.shared.sent)
        unclaimed = []
        for tracked, p in due:
            state = stored.get(tracked.name)
            if state is not None and state.state != SlotStatus.ANCHOR:
                self.shared.sent.know(tracked.name, state.slot_ms)  # settled, by whoever
            newest = p.newest_sent_ms
            if state is None or (newest is not None and state.slot_ms < newest):
                unclaimed.append((tracked, p))
            else:
                tracked.advance_past(p, state.slot_ms)
        return unclaimed

    def _load(self, version: int) -> None:
        """Read every entry's slot state once (one HGETALL); track those that have one."""
        stored = self.shared.ledger.load()
        self.shared.losses.report_behind(stored, self.shared.celery.slot_entries(),
                                         self.shared.sent)
        loaded = self.shared.track(stored, start=utcnow(), epoch=None)
        # a run-time entry's phase is the entry store's, known before any slot state (the
        # leader writes it as its first state): followed from the start
        self.agenda = Agenda({n: t for n, t in loaded.tracked.items()
                              if n in stored or n in loaded.runtime})
        self._unknown = set(loaded.tracked) - set(stored) - loaded.runtime
        self._unknown_checked = time.monotonic()
        self._version = version
        self._differs.clear()

    def _update(self, names: frozenset[str], version: int) -> None:
        """A change of a few entries: read just their states (one read)."""
        assert self.agenda is not None
        ordered = sorted(names)
        stored = self.shared.ledger.load(ordered)
        self.shared.losses.report_behind(stored, ordered, self.shared.sent)
        loaded = self.shared.track(stored, start=utcnow(), epoch=None, only=ordered)
        for name in ordered:
            if name in loaded.tracked and (name in stored or name in loaded.runtime):
                self.agenda.add(loaded.tracked[name])
                self._unknown.discard(name)
            else:
                self.agenda.drop(name)
                if name in loaded.tracked:
                    self._unknown.add(name)
                else:
                    self._unknown.discard(name)
        self._differs -= names
        self._version = version

    def _recheck_unknown(self) -> None:
        """Entries that had no state: one read per rescue_after until the leader anchors them."""
        assert self.agenda is not None
        self._unknown_checked = time.monotonic()
        found = self.shared.ledger.load(sorted(self._unknown))
        if not found:
            return
        self.shared.losses.report_behind(found, found, self.shared.sent)
        loaded = self.shared.track(found, start=utcnow(), epoch=None, only=sorted(found))
        for name, tracked in loaded.tracked.items():
            if name in found and name in self._unknown:
                self.agenda.add(tracked)
                self._unknown.discard(name)

    # -- waiting ---------------------------------------------------------------------------

    def _poll(self) -> float:
        """Seconds between two tries for the lease. A standby that follows run-time entries
        looks at what changed at each (``Scheduler._tick``), so they are at most
        ``STANDBY_EVERY`` apart: a change is in its schedule within a second of its save,
        read at a wake it makes anyway. No save wakes a standby: in a storm of saves, a
        wake per save would cost it as much as taking every change in."""
        poll = self.shared.config.standby_poll
        return min(poll, STANDBY_EVERY) if self.shared.celery.follows_runtime_entries() else poll

    def _timeout(self) -> float:
        now = time.monotonic()
        poll = self._poll()
        left = min(max(self._next_attempt, self._head_start_until) - now, poll)
        if self.agenda is not None:
            rescue = self.agenda.delay(time.time() - self.shared.config.rescue_after, poll)
            left = min(left, max(rescue, self._retry_at - now))
        return max(0.01, left)

    def _wait(self, timeout: float) -> None:
        """Sleep up to ``timeout``, waking at once when the leader publishes 'released'."""
        if self._pubsub is None:
            self._pubsub = self.shared.store.events.subscribe()
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if self._pubsub.next(left) == RELEASED:
                self._released()
                return

    def _released(self) -> None:
        self._next_attempt = 0.0
        self._head_start_until = 0.0  # whoever went first has let go: try now

    def close(self) -> None:
        # Dropped, not closed: on SIGTERM close() runs inside the signal handler, on
        # top of a standby blocked reading this very socket; closing it there makes
        # redis-py's unwinding fail. Its last reference goes with that frame.
        self._pubsub = None

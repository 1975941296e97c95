"""Leading: track the schedule, claim and send every due slot, live through outages.

A leader sleeps until its next slot (the heartbeat renews the lease all the
while), then sends every due slot in chunks (:mod:`batch`). It re-reads the
slot states from Redis when it is elected and whenever the schedule changes,
so it continues exactly where the previous leader (or a rescuing standby)
stopped. It stops leading by raising :class:`Resign`; the scheduler steps down.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from datetime import datetime, timedelta
from typing import Any

from ..config import store_name
from ..errors import NotReplicatedError
from ..store.base import STORE_ERRORS, STORE_UNREACHABLE
from ..store.ledger import REMOVED
from ..store.types import Code, Event, Op, SlotState, SlotStatus
from ..timing.slots import from_ms, plan, to_ms
from .agenda import (
    Agenda,
    Loaded,
    Tracked,
    Unsent,
    adopt_refused_anchors,
    small_change,
)
from .batch import CHUNK, LeaderGate, report_unsent, run_batch, say_capped_once
from .degraded import Outage
from .dynamic_schedule import LEADER_LOOK
from .loss import loss_grace
from .requests import WAKE, LeaderSide, carry_out
from .shared import Shared, utcnow

logger = logging.getLogger(__name__)

#: state of an entry nobody schedules any more, and backfill records, older than this go
PRUNE_AFTER = 30 * 86400.0
#: node records not seen for this long go
FORGET_NODES_AFTER = 3600.0
#: seconds between two prunes (the first comes a minute after the election)
PRUNE_EVERY = 3600.0
#: seconds a send pass follows the one before at the soonest. Each pass costs about a
#: millisecond of CPU whatever it sends (a claim round trip, a publish, its log lines):
#: slots that fall due at instants of their own (jitter, one-offs, run-time entries each
#: with its phase) would each pay it alone. So a slot due within this of the last pass
#: waits for the next one, with whatever else fell due meanwhile; a slot due after a
#: quiet spell (a burst, a lone entry) goes at once.
SEND_GATHER = 0.1


class Resign(Exception):
    """This node must stop leading now; with ``release`` it gives the lease up at once."""

    def __init__(self, why: str, *, release: bool = False) -> None:
        super().__init__(why)
        self.release = release


class Leader:
    """The leading half of one beat process, from its election to its step-down."""

    def __init__(self, shared: Shared, since: datetime) -> None:
        self.shared = shared
        #: due slots before this moment were missed (no node could send them): the
        #: catch-up policy decides; later ones are on time. A standby's own start.
        self.since = since
        self.agenda = Agenda()
        self.gate = LeaderGate(shared.lease, shared.ledger)
        self.outage: Outage | None = None  # set while leading through a Redis outage
        self._version = -1
        self._capped: set[str] = set()  # entries whose catch-up hit max_catchup (logged)
        self._paused: set[str] = set()  # entries seen skipped as paused (logged once)
        self._requests_pending = True  # requests may have queued while nobody led
        self._pubsub: Any = None
        #: what earlier leaders left unconfirmed is reported once, by the first reload that
        #: gets through (an election whose first load failed reports on the next one)
        self._reported = False
        shared.losses.new_term()  # what a loss means for this leader (roles/loss.py)
        self._recover_later: list[Unsent] = []  # a standby's claims too young to take over
        self._recover_at = 0.0  # monotonic: when to try those again
        self._prune_at = time.monotonic() + 60.0
        #: a fresh process elected over state it never saw: its catch-up waits until then
        self._catchup_held: tuple[datetime, datetime] | None = None  # (elected, until)
        self._next_pass = 0.0  # monotonic: the next send pass, at the soonest (SEND_GATHER)
        self._held: set[str] = set()  # entries whose catch-up waits for the hold's end

    @property
    def tracked(self) -> dict[str, Tracked]:
        return self.agenda.tracked

    def elected(self, version: int) -> None:
        """Load the state in Redis; report what an earlier leader claimed and never sent."""
        self.reload(version, report=True)

    def _hold_catchup_if_fresh(self, stored: Mapping[str, SlotState]) -> None:
        """A process that began following the store less than a loss grace ago, elected
        over state it holds, cannot tell that state from an older snapshot restored between
        two calls of a leader that is still alive: the slots that leader sent after the
        snapshot are due before this election, and it reports the loss within the grace.
        So this leader claims no slot due before its election until a loss grace after
        its start (see :meth:`_held_back`); an entry with nothing to catch up sends as
        usual. A store that holds no settled slot (a cluster's first start, even with
        several beats starting together) holds nothing back."""
        grace = loss_grace(self.shared.config)
        left = self.shared.started + grace - time.monotonic()
        if left > 0 and any(state.state != SlotStatus.ANCHOR for state in stored.values()):
            now = utcnow()
            self._catchup_held = (now, now + timedelta(seconds=left))
            logger.info("leaderbeat: %s started %.1f s ago, over state it never saw: slots "
                        "due before its election wait %.1f s, until any loss is reported",
                        self.shared.config.node_id, grace - left, left)

    def _held_back(self, part: list[Any], now: datetime) -> list[Any]:
        """The due entries of ``part`` that may be claimed now.

        While the catch-up is held (see :meth:`_hold_catchup_if_fresh`), an entry whose
        plan sends a slot due before the election waits, its later slots with it (claims
        go oldest first), until the hold ends; then it is planned as it would have been
        at the election (the same slots caught up, the window judged from then), and its
        later slots follow at the next tick.
        """
        if self._catchup_held is None:
            return part
        elected, until = self._catchup_held
        ready = []
        for tracked, plan_ in part:
            if now >= until and tracked.name in self._held:
                self._held.discard(tracked.name)
                plan_ = plan(tracked.clock, last=tracked.last, now=elected, since=self.since,
                             policy=tracked.options.policy)
            elif now < until and (tracked.name in self._held or any(
                    tracked.clock.fire_time(slot) < elected for slot in plan_.send)):
                self._held.add(tracked.name)
                tracked.next_fire = until
                self.agenda.push(tracked)
                continue
            ready.append((tracked, plan_))
        if now >= until and not self._held:
            self._catchup_held = None
        return ready

    def reload(self, version: int, *, report: bool = False) -> None:
        """Rebuild what the leader tracks from the schedule and the state in Redis."""
        shared, losses = self.shared, self.shared.losses
        start = shared.fresh_start()
        stored, definitions = shared.ledger.load_with_definitions()
        if report:  # just elected
            self._hold_catchup_if_fresh(stored)
        trusted = losses.trusts_memory
        rolled_back = losses.rollback_pending
        loaded = shared.track(stored, start=start, epoch=shared.lease.epoch,
                            definitions=definitions, trust_memory=trusted,
                            rolled_back=rolled_back and not losses.led_through,
                            trusted_epoch=losses.own_writes_kept)
        report = (report or not self._reported) and not rolled_back
        unsent: list[Unsent] = []
        if report:
            unsent += loaded.unsent
            # older unconfirmed claims a newer claim replaced (a standby rescued the
            # entry's next slot before this leader was elected): reported all the same
            for (name, slot_ms), state in shared.ledger.overtaken().items():
                if name in loaded.tracked:
                    unsent.append(Unsent(name, from_ms(slot_ms), state.state == SlotStatus.CLAIMED,
                                         state.claimed_ms, overtaken=True))
        if loaded.anchors:
            refused = _anchor(shared, loaded, "new")
            shared.backlog.extend(losses.margin_missed(loaded, refused, stored, since=self.since,
                                                       memory=shared.sent,
                                                       lost=rolled_back or trusted))
            losses.watch_reports()
            shared.backlog.extend(losses.take_reports(self.since))
        shared.backlog.extend(losses.unaware_rolled_back(self.since))
        losses.reloaded()
        self._publish_definitions(loaded.tracked, definitions)
        self._mark_definitions()
        self.agenda = Agenda(loaded.tracked)
        self._version = version
        losses.vanished_while_held = False
        if report:
            self._recover_later = report_unsent(unsent, gate=self.gate, send=self._send,
                                                recover=shared.config.recover_unsent,
                                                memory=shared.sent)
            self._recover_at = time.monotonic() + shared.config.lease_ttl
            self._reported = True

    def rolled_back(self, why: str) -> None:
        """Redis holds older state than this node has seen: what it says was sent or claimed
        may be behind what was. Every entry starts again from now (or after what this
        process itself sent), and the generation counter is lifted past the loss."""
        logger.warning("leaderbeat: %s; every entry starts again from now, without catch-up "
                       "(slots sent before the loss are never sent again)", why)
        self._version = -1
        lease, losses = self.shared.lease, self.shared.losses
        losses.rolled_back(lease.epoch, proved=lambda: losses.lease_proved_all_along(
            lease, reported=self._reported, earliest=self.agenda.earliest(),
            recovering=bool(self._recover_later)))
        if losses.led_through:
            logger.warning("leaderbeat: %s kept its lease through the loss: it carries on "
                           "after the newest slot of each entry it knew settled",
                           self.shared.config.node_id)

    def update(self, names: Collection[str], version: int) -> None:
        """Take in a change of a few entries: work in proportion to the change, not the
        schedule (one read of their states; those with no state anchored)."""
        shared = self.shared
        names = sorted(names)
        start = shared.fresh_start()
        stored, definitions = shared.ledger.load_with_definitions(names)
        loaded = shared.track(stored, start=start, epoch=shared.lease.epoch,
                            definitions=definitions, only=names)
        if loaded.anchors:
            _anchor(shared, loaded, "changed")
        for name in names:
            if name in loaded.tracked:
                self.agenda.add(loaded.tracked[name])
            else:
                self.agenda.drop(name)
        self._publish_definitions(loaded.tracked, definitions, names)
        self._version = version

    def tick(self, version: int) -> float:
        """Send every due slot; the seconds until the next one (at most ``max_interval``)."""
        if self.outage is not None:
            return self._tick_degraded(self.outage)
        self._check_lease()
        self._keep_up(version)
        self._send_due()
        poll = self.shared.config.standby_poll
        return min(self.delay(),
                   min(poll, LEADER_LOOK) if self.shared.celery.runtime_anchors() else poll)

    def _check_lease(self) -> None:
        """Resign unless this leader may send: its lease proved in time, its heartbeat
        alive, its clock near Redis's."""
        shared, lease = self.shared, self.shared.lease
        if not lease.is_held():
            if shared.config.store_down_policy == "last-leader" and not lease.lost:
                shared.store.ping()  # unreachable: the last leader goes on (degraded mode)
            raise Resign("lease not confirmed in time (self-fencing)")
        stopped = lease.heartbeat_stopped()
        if stopped is not None:  # nothing renews the lease any more: let it go now
            raise Resign(f"the heartbeat thread stopped ({stopped})", release=True)
        skew = lease.clock_skew
        if skew is not None and abs(skew) > shared.config.max_clock_skew:
            raise Resign(f"clock is {skew:+.3f} s off {store_name(shared.config)}'s clock, beyond "
                         f"leaderbeat_max_clock_skew={shared.config.max_clock_skew}", release=True)

    def _keep_up(self, version: int) -> None:
        """What comes before sending: the schedule's changes, the unconfirmed claims left
        to recover, requests, reports of a loss of writes, the hourly prune."""
        shared = self.shared
        if self._version != version:
            changed = shared.celery.changed_since(self._version) if self._version >= 0 else None
            if changed is not None and small_change(changed, len(self.tracked)):
                self.update(changed, version)
            else:
                self.reload(version)
        if self._recover_later and time.monotonic() >= self._recover_at:
            later, self._recover_later = self._recover_later, []
            self._recover_later = report_unsent(later, gate=self.gate, send=self._send,
                                                recover=True, memory=shared.sent)
            self._recover_at = time.monotonic() + shared.config.lease_ttl
        self.notice_requests()
        if shared.losses.waiting_for_reports:
            shared.backlog.extend(shared.losses.take_reports(self.since))
        if time.monotonic() >= self._prune_at:
            self._prune()
        if self._requests_pending:
            self._carry_out_requests()

    def _carry_out_requests(self) -> None:
        shared, lease = self.shared, self.shared.lease
        # A fenced call that checks the generation first: Redis restored from an older
        # snapshot that still held this leader's lease brings back requests already
        # carried out, and nothing else in this tick has noticed yet (a rollback found
        # here re-anchors first; then requests queued before the loss are dropped)
        shared.losses.check_generation(*lease.credentials())
        token, _ = lease.credentials()
        carry_out(LeaderSide(shared.ledger, shared.store.requests, lease.epoch or 0, token,
                             shared.keys.prefix, self._publish,
                             known=lambda name: name in self.tracked,
                             stored=self._stored_slot, memory=shared.sent,
                             lost_at=shared.losses.lost_at,
                             store=store_name(shared.config)), utcnow())
        self._requests_pending = False  # only now: a failed pop leaves them pending

    def _send_due(self) -> None:
        """Claim and send every due slot, in chunks."""
        shared = self.shared
        if time.monotonic() < self._next_pass:
            return
        now = utcnow()
        earliest = self.agenda.earliest() or now.timestamp()
        due: list[Any] = []
        started, sent = time.monotonic(), 0
        try:
            # The first chunk's entries are planned and claimed before the rest of a
            # burst is planned: its first message leaves milliseconds after the slot.
            limit: int | None = CHUNK
            while popped := self.agenda.pop_due(now, self.since, limit=limit):
                batch = self._held_back(popped, now)
                due += batch
                say_capped_once(batch, self._capped)
                outcome = run_batch(batch, self.gate, shared.chunk_send(shared.lease.epoch or 0),
                                    memory=shared.sent, backlog=shared.backlog,
                                    progress=shared.celery.progress)
                shared.celery.observe(outcome.events)
                self._say_paused(outcome.events)
                sent += outcome.sent
                self._next_pass = started + SEND_GATHER
                if limit is None or len(popped) < limit:
                    break
                limit = None
            if sent:
                logger.info("leaderbeat: sent %d slot(s) of %d due entries in %.0f ms, "
                            "%.0f ms after the earliest was due", sent, len(due),
                            (time.monotonic() - started) * 1000,
                            (now.timestamp() - earliest) * 1000)
        finally:
            self.agenda.push_all(due)
            self._record_broken()

    def _publish_definitions(self, tracked: dict[str, Tracked], stored: dict[str, str],
                             names: Collection[str] | None = None) -> None:
        """Tell rescuers what this leader plans: each entry's fingerprint, and REMOVED for an
        entry it no longer schedules (removed, or a disabled row): a standby that has not
        seen the change yet must not rescue it. An entry that comes back later finds
        REMOVED, not its own fingerprint, and starts again from its next slot."""
        changes = {name: t.fingerprint for name, t in tracked.items()
                   if t.fingerprint and stored.get(name) is None}
        changes.update({name: REMOVED for name in (stored if names is None else names)
                        if name not in tracked and stored.get(name) not in (None, REMOVED)})
        self.shared.ledger.write_definitions(changes)

    def _mark_definitions(self) -> None:
        """Mark the stored definitions as this leader's (its epoch, fenced by its lease).

        Until the newest leader has marked them, no standby rescues: the fingerprints
        stored may still be an earlier leader's (a rolling deploy, a row changed on one
        node), which this one does not plan. Written at every full reload, so right
        after the election: the rescue gap is one round trip.
        """
        try:
            self.shared.ledger.mark_definitions(*self.shared.lease.credentials())
        except NotReplicatedError as exc:  # a mark sends nothing: safe to go on
            logger.warning("leaderbeat: %s for the mark of the definitions; going on", exc)

    def _prune(self) -> None:
        """Nothing grows without bound: state of removed entries, old backfills, dead nodes."""
        self._prune_at = time.monotonic() + PRUNE_EVERY
        slots, backfills, nodes = self.shared.ledger.prune(
            self.shared.celery.slot_entries(), keep_ms=int(PRUNE_AFTER * 1000),
            node_keep_s=FORGET_NODES_AFTER)
        if slots or backfills or nodes:
            logger.info("leaderbeat: pruned the state of %d entries no longer scheduled, %d old "
                        "backfill records and %d node records not seen for %.0f s",
                        slots, backfills, nodes, FORGET_NODES_AFTER)

    def _stored_slot(self, name: str) -> int | None:
        """The entry's last slot as this leader tracks it (claimed, sent or passed)."""
        tracked = self.tracked.get(name)
        return to_ms(tracked.last) if tracked is not None else None

    def delay(self, limit: float | None = None) -> float:
        """Seconds until the next due slot (at most ``limit``), and no sooner than the next
        send pass may start (:data:`SEND_GATHER`)."""
        until = self.agenda.delay(time.time(), float(limit or self.shared.celery.loop_interval()))
        return max(until, min(self._next_pass - time.monotonic(), SEND_GATHER))

    def _say_paused(self, events: list[Event]) -> None:
        """One INFO line when an entry's slots start being skipped as paused, one on resume."""
        for ev in events:
            if ev.event == "skipped" and ev.detail == "paused" and ev.name not in self._paused:
                self._paused.add(ev.name)
                logger.info("leaderbeat: %s (epoch %s) skips %s: paused from the CLI",
                            self.shared.config.node_id, self.shared.lease.epoch, ev.name)
            elif ev.event == "sent" and ev.name in self._paused:
                self._paused.discard(ev.name)
                logger.info("leaderbeat: %s (epoch %s) sends %s again: resumed",
                            self.shared.config.node_id, self.shared.lease.epoch, ev.name)

    def _send(self, name: str, slot: datetime) -> bool:
        return self.shared.celery.send_slot(name, slot, self.shared.lease.epoch or 0)

    def _publish(self, name: str, slot: datetime, task_id: str | None) -> bool:
        return self.shared.celery.send_slot(name, slot, self.shared.lease.epoch or 0, task_id)

    def notice_requests(self) -> None:
        """Has the CLI queued a request? A look at the subscription's buffer, no round trip.

        The leader wakes at least every ``standby_poll`` for this (an idle wake-up costs
        no Redis command); messages that arrive while it sleeps or sends wait in the
        subscription, so none is missed.
        """
        if self._pubsub is None:
            self._pubsub = self.shared.store.events.subscribe()
            # a request queued while there was no subscription woke nobody: look anyway
            self._requests_pending = True
        while (message := self._pubsub.next(0.0)) is not None:
            if message == WAKE:
                self._requests_pending = True

    def close(self) -> None:
        self._pubsub = None  # dropped, not closed: see Standby.close

    def _record_broken(self) -> None:
        broken = self.agenda.take_broken()
        if broken:
            self.shared.ledger.record(self.shared.lease.epoch or 0, [
                Event(name, to_ms(utcnow()), "error", why) for name, why in broken])

    # -- store_down_policy = "last-leader" ------------------------------------------------

    def store_unreachable(self, exc: BaseException) -> bool:
        """The store stopped answering: True while this leader goes on (degraded), else False.

        Only a leader whose lease is still valid by its own deadline may go on: one
        resumed from a long pause whose link is down must not send while another leads.
        Only an unreachable store starts an outage: one that answers with an error
        (READONLY during a failover, OOM, a script error) still lets standbys claim
        and rescue, so sending without claims could send twice.
        """
        if (self.outage is None and self.shared.config.store_down_policy == "last-leader"
                and isinstance(exc, STORE_UNREACHABLE)
                and self.shared.lease.is_held()):
            self.outage = Outage.begin(self.shared.config)
        return self.outage is not None

    def _tick_degraded(self, outage: Outage) -> float:
        """Redis is unreachable: send from the agenda alone; reconcile once Redis answers."""
        if outage.expired():  # a hard cap, checked first: also when PING answers, writes fail
            self.outage = None
            raise Resign(f"{store_name(self.shared.config)} unreachable for longer than "
                         "leaderbeat_degraded_max_seconds="
                         f"{self.shared.config.degraded_max_seconds}")
        outage.send_due(self.agenda, utcnow(), self.since, self._send, self.shared.sent)
        try:
            self.shared.store.ping()
        except STORE_ERRORS:
            return min(self.delay(), 1.0)
        try:
            reconciled = outage.reconcile(self.shared.lease, self.shared.ledger,
                                          self.shared.celery.wake_by)
        except STORE_ERRORS:
            return min(self.delay(), 1.0)  # still flapping: the outage stays as it was
        self.outage = None  # only now: a Redis error above leaves the outage in place
        if not reconciled:
            raise Resign(f"another node leads after the {store_name(self.shared.config)} outage")
        return 0.0


def _say_anchored(loaded: Any, store: str) -> None:
    """One line per kind of anchor and reload, not per entry: after a Redis restart that
    lost its data this is the only trace. Unknown state is "start from now", never "never
    ran"; a slot this node remembers sending is never sent again."""
    total = len(loaded.tracked)
    runtime = [item.name for item in loaded.anchors
               if item.name in loaded.runtime and item.op in (Op.REANCHOR, Op.DEFINE)]
    if runtime:  # their phase is the save's, as the entry store says: nothing to warn of
        logger.debug("leaderbeat: %d run-time entries start at their anchor in the entry "
                     "store: %s", len(runtime), ", ".join(runtime[:10]))
    for op, said in ((Op.ANCHOR, (f"had no slot state in {store} (new entries, or {store} lost "
                      "its data); they start from now, without catch-up")),
                     (Op.REANCHOR, "have a changed definition; they start again from now"),
                     (Op.RESTORE, ("had lost the slot state of what this node sent "
                      f"({store} restarted empty or went back to older state while this node "
                      "led); they carry on after what it sent")),
                     (Op.ROLLED_BACK, ("had a slot state older than a slot this node sent "
                      f"({store} went back to older state, or a lagging replica); they start "
                      "from now, without catch-up, like entries with no state"))):
        names = [item.name for item in loaded.anchors if item.op == op
                 and not (item.op == Op.REANCHOR and item.name in loaded.runtime)]
        if names:
            log = logger.info if op == Op.ANCHOR else logger.warning
            log("leaderbeat: %d of %d entries %s: %s", len(names), total, said,
                ", ".join(names[:10]))


def _anchor(shared: Shared, loaded: Loaded, what: str) -> list[Any]:
    """Claim the anchors of ``what`` (new, changed) entries; a refused one is adopted.
    Returns, per anchor, what the claim answered."""
    try:
        refused = shared.ledger.claim(*shared.lease.credentials(), loaded.anchors)
    except NotReplicatedError as exc:  # anchors send nothing: safe to go on
        logger.warning("leaderbeat: %s for the anchors of %s entries; going on", exc, what)
        refused = [Code.GRANTED] * len(loaded.anchors)
    adopt_refused_anchors(loaded, refused)
    _say_anchored(loaded, store_name(shared.config))
    return list(refused)

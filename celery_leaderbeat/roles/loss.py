"""What this node knows of losses of writes: the store restarted empty, restored from an
older snapshot, or failed over to a replica that lagged.

A store may detect such a loss (:class:`~celery_leaderbeat.store.base.LossDetection`, an
optional capability: its state carries a generation that only goes up while nothing is
lost). :class:`Losses` is the roles' side of it, one per node, shared by the lease view,
the leader and the standby: the highest generation the node saw, whether its lease
vanished while it held it, the leader's rollback and what it may still trust, the
entries it anchored knowing of no loss, the margins it records missed, and when a
standby holds back or reports a loss again. With a store that cannot detect a loss it
asks the store nothing: no rollback is ever answered, no report made or read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from ..config import Config, store_name
from ..errors import LeaseLostError
from ..store.base import LossDetection
from ..store.types import Code, Event, Op, SlotStatus
from ..timing.slots import from_ms, to_ms
from .agenda import Loaded, margin_slots
from .memory import SentMemory

if TYPE_CHECKING:
    from datetime import datetime

logger = logging.getLogger(__name__)

#: the history's reason for a slot skipped by that margin
MARGIN_REASON = ("slot state lost (Redis lost writes): started again after a margin, "
                 "not sent since the loss")

#: seconds between two looks for a report of a loss of writes (see Losses.take_reports)
LOST_REPORTS_EVERY = 0.5


def loss_grace(config: Config) -> float:
    """Seconds a standby holds back once Redis lost writes and nobody holds the lease.

    The node that led finds its lease gone at its next claim or heartbeat renewal
    (every ``renew_interval``) and tries again within a ``standby_poll``: it knows what
    it sent, so it carries on where Redis lost track. A standby elected instead would
    start every entry again after a margin. Only a loss makes anyone wait: a crashed
    leader's lease expires and a standby takes it at its next poll as ever.
    """
    return config.renew_interval + 2 * config.standby_poll


class ProvingLease(Protocol):
    """What :meth:`Losses.lease_proved_all_along` reads of the lease view (roles/lease.py)."""

    confirmed_at: float | None  #: when the latest call that proved the lease began
    longest_gap: float  #: the longest time between two such calls since it was taken

    def is_held(self) -> bool: ...


class Losses:
    """This node's knowledge of the losses of writes it saw or was told of."""

    def __init__(self, config: Config, detection: LossDetection | None = None) -> None:
        self.config = config
        #: the store's loss detection; None: the store cannot tell it lost writes
        self.detection = detection
        #: the highest state generation an acquire attempt read (standbys learn it so)
        self.highest_generation = 0
        #: as far as this node knows, it held the lease last: it acquired it, and no attempt
        #: since found another holder. After Redis lost writes it goes first (acquire.lua)
        self.led_last = False
        #: the leader key vanished while this node's lease was still valid: Redis lost its
        #: data (restarted empty, an older snapshot) while this node led, so no other node
        #: can have sent a later slot than those it remembers sending
        self.vanished_while_held = False
        #: monotonic: Redis lost writes and nobody led; the node that led goes first until then
        self._wait_until: float | None = None
        self._report_again_at = 0.0  # monotonic: when to report a loss not dealt with again
        self.new_term()

    # -- the lease ---------------------------------------------------------------------

    def observe_generation(self, generation: int) -> None:
        """An acquire attempt read the state generation ``generation``."""
        if self.detection is not None:
            self.detection.observe_generation(generation)

    def attempted(self, generation: int, *, acquired: bool) -> None:
        """An acquire attempt that was not held back answered."""
        self.highest_generation = max(self.highest_generation, generation)
        self.led_last = acquired
        if not acquired:
            # another node leads: what this node sent before its lease vanished is no longer
            # all that was sent (a leader elected later must not carry on from its memory)
            self.vanished_while_held = False

    def lease_lost(self, exc: LeaseLostError, *, held: bool) -> None:
        """A call of this leader's found the lease gone. Held by nobody while it was still
        valid here (``held``): Redis lost its data under this leader, which then carries on
        after what it knew was settled (whichever call saw it first: a renewal, a claim, an
        anchor or a reset after a rollback)."""
        if exc.answered and exc.holder is None and held:
            self.vanished_while_held = True

    # -- the leader ----------------------------------------------------------------------

    def new_term(self) -> None:
        """A leader was elected: it knows of no rollback yet."""
        self.rollback_pending = False  # Redis went back to older state: re-anchor every entry
        #: with a rollback another node reported: this leader's epoch (its writes stand)
        self.own_writes_kept: int | None = None
        #: with a rollback this leader found itself, its lease proved all along: nobody
        #: else led or rescued since the snapshot, so it carries on from what it knew settled
        self.led_through = False
        #: entries anchored afresh with no loss known: name -> (slot clock, anchor ms)
        self._unaware: dict[str, tuple[Any, int]] = {}
        self._reports_at = 0.0  # monotonic: when to look for reports of a loss again
        self._reports_until = 0.0  # monotonic: when to stop looking

    def rolled_back(self, epoch: int | None, *, proved: Callable[[], bool]) -> None:
        """Redis holds older state than this node has seen: the leader re-anchors every
        entry, and the generation counter is lifted past the loss. ``proved``: whether
        the leader's lease proved all along (see :meth:`lease_proved_all_along`)."""
        self.rollback_pending = True
        detection = self.detection
        if detection is not None and epoch is not None:
            detection.reset_generation(epoch)  # this leader re-anchors and records the margin
        reported = detection is not None and detection.loss_reported
        # another node reported it: nothing this leader saw went back, so the slot states
        # it wrote itself (under its epoch) are still what it wrote
        self.own_writes_kept = epoch if reported else None
        self.led_through = not reported and proved()

    def lease_proved_all_along(self, lease: ProvingLease, *, reported: bool,
                               earliest: float | None, recovering: bool) -> bool:
        """May a leader, which found Redis gone back to older state holding its own lease,
        trust what it knows settled, as one whose lease vanished does?

        Only if its lease was in the snapshot: a reload of this leader's got through
        before the loss was found (``reported``; a leader elected after the restore finds
        it at its first claim; the reset claim that follows proves the lease is still this
        one, else nothing is granted). And only if nobody else can have led or rescued
        since the snapshot: every call that proved the lease came within the loss grace of
        the one before, and so did the claim that found the loss (a longer gap, a pause or
        a Redis that stopped answering, leaves room for the lease to lapse, or for a
        standby to lead after the grace once Redis lost the key and send slots the
        restore then erased), and none of its entries is ``rescue_after`` late
        (``earliest``: a standby may have rescued that slot, unknown here), nor are
        unconfirmed claims still waiting to be recovered (``recovering``).
        """
        now = time.monotonic()
        grace = loss_grace(self.config)
        if not reported or not lease.is_held() or lease.confirmed_at is None:
            return False
        if lease.longest_gap >= grace or now - lease.confirmed_at >= grace:
            return False
        late = earliest is not None and earliest < time.time() - self.config.rescue_after
        return not late and not recovering

    @property
    def trusts_memory(self) -> bool:
        """Only a node that led until Redis lost its data knows nobody sent anything later."""
        return self.vanished_while_held or self.led_through

    def reloaded(self) -> None:
        """The leader re-anchored after what this node knew: the rollback is dealt with."""
        self.rollback_pending = False
        self.own_writes_kept = None
        self.led_through = False

    def check_generation(self, token: str, epoch: int) -> None:
        """Raise when the store lost writes this node saw (nothing without detection)."""
        if self.detection is not None:
            self.detection.check_generation(token, epoch)

    def lost_at(self) -> int | None:
        """The store's time (ms) a leader last started again after a loss; None if never."""
        return self.detection.lost_at() if self.detection is not None else None

    def _lost_reports(self) -> dict[str, int]:
        return self.detection.lost_reports() if self.detection is not None else {}

    # -- the margins ---------------------------------------------------------------------

    def margin_missed(self, loaded: Loaded, refused: list[Any], stored: dict[str, Any], *,
                      since: datetime, memory: SentMemory, lost: bool) -> list[Event]:
        """The slots an entry whose state Redis lost skips: from the leader's ``since`` (or
        after the newest slot it knows was settled, or the slot Redis still holds settled)
        up to its anchor, after the margin (nothing sent before the loss may come round
        again). Not sent after the loss, so recorded ``missed``, with the reason; they ride
        on the next claim call.

        Only where the loss is known (``lost``: Redis went back to older state, or lost
        the lease under this leader; or this node knows a slot of the entry that Redis no
        longer has; or another node reported one, see :meth:`take_reports`): an empty
        Redis that no live node remembers looks like a first start, where an entry
        anchored after the margin missed nothing. Entries anchored afresh that way are
        kept for a lease ttl, in case a node that saw the loss reports it.
        """
        events: list[Event] = []
        reports = self._lost_reports()  # what nodes that saw a loss knew settled
        for item, result in zip(loaded.anchors, refused):
            tracked = loaded.tracked.get(item.name)
            if item.op not in (Op.ANCHOR, Op.ROLLED_BACK) or result is not Code.GRANTED \
                    or tracked is None:
                continue
            self._unaware.pop(item.name, None)
            known = [s for s in (memory.newest_known(item.name),  # by anyone
                                 reports.get(item.name)) if s is not None]
            settled = max(known) if known else None
            if settled is None and not lost:
                if item.op == Op.ANCHOR:
                    self._unaware[item.name] = (tracked.clock, item.slot_ms)
                continue
            state = stored.get(item.name)
            # Rolled back: a slot Redis still holds was settled, but an anchor ('a') is only
            # where an entry starts: nothing before it was settled under it (a leader elected
            # after the loss may have anchored afresh, knowing of none, and led no further)
            held = state.slot_ms if state is not None and state.state != SlotStatus.ANCHOR else None
            events += margin_events(item.name, tracked.clock, settled, item.slot_ms,
                                    since=since, stored=held)
        return events

    def watch_reports(self) -> None:
        """Entries were anchored knowing of no loss: look for reports for a lease ttl."""
        if self._unaware:
            self._reports_until = time.monotonic() + self.config.lease_ttl

    @property
    def waiting_for_reports(self) -> bool:
        """Entries anchored afresh knowing of no loss wait for a report of one."""
        return bool(self._unaware)

    def take_reports(self, since: datetime) -> list[Event]:
        """Entries this leader anchored afresh knowing of no loss: has a node that saw Redis
        lose writes reported what it knew settled? Their margin's slots are recorded
        ``missed`` from there (asked at the election and every half second for a lease
        ttl after it: a standby reports once it sees the loss)."""
        now = time.monotonic()
        if not self._unaware or now < self._reports_at:
            return []
        if now >= self._reports_until:
            self._unaware.clear()
            return []
        self._reports_at = now + LOST_REPORTS_EVERY
        reports = self._lost_reports()
        events: list[Event] = []
        for name in [n for n in self._unaware if n in reports]:
            clock, anchor_ms = self._unaware.pop(name)
            events += margin_events(name, clock, reports[name], anchor_ms, since=since)
        return events

    def unaware_rolled_back(self, since: datetime) -> list[Event]:
        """Entries this leader anchored afresh knowing of no loss: there was one after all
        (another node reported it). Their margin is recorded from the newest slot reported
        settled, else from this leader's start. A leader that led through the loss held its
        lease since before the snapshot, so since those anchors: the loss came after them
        and says nothing of their start (a report of an earlier one may still come, see
        :meth:`take_reports`)."""
        if not self.rollback_pending or not self._unaware or self.led_through:
            return []
        reports = self._lost_reports()
        events: list[Event] = []
        for name, (clock, anchor_ms) in self._unaware.items():
            events += margin_events(name, clock, reports.get(name), anchor_ms, since=since)
        self._unaware.clear()
        return events

    # -- the standby ---------------------------------------------------------------------

    def despite_loss(self, now: float) -> bool:
        """A standby has held back long enough: it takes the lease despite the loss."""
        return self._wait_until is not None and now >= self._wait_until

    def standby_attempted(self, now: float, *, acquired: bool, held_back: bool) -> None:
        """One attempt at the lease by a standby. Redis lost writes and nobody leads: the
        node that led goes first; this one holds back for :func:`loss_grace` from the
        first such answer, then takes the lease (the node that led is gone too, or cut
        off)."""
        if acquired or not held_back:
            self._wait_until = None
        elif self._wait_until is None:
            grace = loss_grace(self.config)
            self._wait_until = now + grace
            logger.warning("leaderbeat: %s holds older state than standby %s has seen and "
                           "nobody leads; the node that led goes first (this one waits up to "
                           "%.1f s)", store_name(self.config), self.config.node_id, grace)

    def report_if_due(self, now: float, memory: SentMemory) -> None:
        """Redis answered older state than this node has seen: said again every poll
        until a leader has dealt with it (Redis may have lost the report too)."""
        detection = self.detection
        if detection is None:
            return
        if detection.loss_seen or (detection.below and now >= self._report_again_at):
            self._report_again_at = now + self.config.standby_poll
            self.report(memory.settled(), say=detection.loss_seen)

    def report_behind(self, stored: dict[str, Any], names: Iterable[str],
                      memory: SentMemory) -> None:
        """Report the entries of ``names`` whose slot state in Redis is older than one this
        node knew settled: Redis lost writes (claims only move forward). A state gone is
        not taken for a loss here (the leader prunes entries it has not scheduled for 30
        days): Redis restarted empty shows as the generation counter gone back."""
        if self.detection is None:
            return
        behind = {}
        for name in names:
            known = memory.newest_known(name)
            state = stored.get(name)
            if known is not None and state is not None and state.slot_ms < known:
                behind[name] = known
        if behind:
            self.report(behind)

    def report(self, settled: dict[str, int], *, say: bool = True) -> None:
        """Redis lost writes this node knows of: say so, and what it knew settled.

        A leader elected after the loss that is a new process knows of none: it would
        carry on from what an older snapshot holds (sending again what was sent after
        it), or anchor entries Redis forgot after its margin as on a first start. Told,
        it starts again as after any rollback, and records the slots its margin skips
        from what this node knew settled (kept a few lease ttls).
        """
        if self.detection is None:
            return
        if say:
            logger.warning("leaderbeat: standby %s finds %s lost writes it had seen; it "
                           "says so (the leader starts every entry again, as after any "
                           "rollback) and reports the newest slots it knew settled of %d "
                           "entries", self.config.node_id, store_name(self.config), len(settled))
        self.detection.report_lost(settled)


def margin_events(name: str, clock: Any, known: int | None, anchor_ms: int, *,
                  since: datetime, stored: int | None = None) -> list[Event]:
    """``name``'s slots up to its anchor, after the margin, recorded ``missed`` with the
    margin's reason: from the slot after ``known`` (the newest a live node knows was
    settled: this process's memory, or a node's report of the loss) or ``stored`` (the
    slot Redis still holds settled), whichever is newer.

    A slot a live node knows settled starts the margin even before the leader's
    ``since``: this leader may have been elected only after the loss (it led before it,
    paused, and stepped down on finding it), and the slots between that slot and its
    election came due while Redis held no state a rescuer could follow. A slot only
    Redis holds (an older snapshot) starts it no earlier than ``since``: the leaders
    before the loss sent the slots after it, unknown to every live node.
    """
    if known is not None:
        start = from_ms(max(known, stored if stored is not None else known) + 1)
    elif stored is not None:
        start = max(since, from_ms(stored + 1))
    else:
        start = since
    listed, older = margin_slots(clock, start, from_ms(anchor_ms))
    events = [Event(name, to_ms(slot), "missed", MARGIN_REASON) for slot in listed]
    if older:
        events.append(Event(name, to_ms(listed[0]), "missed",
                            f"{older} older slots not listed ({MARGIN_REASON})"))
    return events

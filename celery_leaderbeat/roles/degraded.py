"""``store_down_policy="last-leader"``: the leader sends on through an outage of the store.

The node that held the lease when Redis stopped answering keeps sending from
its own agenda, without claims, for at most ``leaderbeat_degraded_max_seconds``.
When Redis answers again it renews the lease, or takes it again if it expired
(standbys give it one lease ttl to do so), and claims every slot it sent
meanwhile, so the next leader continues after them. A slot another leader
claimed too (a partition, not an outage) may have gone twice: the log names it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime

from ..config import Config, store_name
from ..errors import LeaseLostError, NotReplicatedError
from ..store.base import SlotStore
from ..store.types import ClaimItem, Code, Event, Op, Refused
from ..timing.slots import from_ms, to_ms
from .agenda import Agenda
from .lease import LeaseView
from .memory import SentMemory

logger = logging.getLogger(__name__)


class Outage:
    """One Redis outage lived through as the last leader, and the slots sent meanwhile."""

    def __init__(self, config: Config, started: float) -> None:
        self.config = config
        self.started = started  # monotonic
        self.sent: list[tuple[str, datetime]] = []

    @classmethod
    def begin(cls, config: Config) -> Outage:
        """The leader lost Redis with its lease not known lost: it goes on, degraded."""
        logger.warning("leaderbeat: store_down_policy=last-leader: %s keeps sending from its "
                       "own state for at most %s s while %s is unreachable",
                       config.node_id, config.degraded_max_seconds, store_name(config))
        return cls(config, time.monotonic())

    def send_due(self, agenda: Agenda, now: datetime, since: datetime,
                 send: Callable[[str, datetime], bool], memory: SentMemory) -> None:
        """Send every due slot from the local agenda alone: no claims, nothing recorded yet.

        A slot this process published before (a batch cut short by the outage) is not
        sent again.
        """
        for tracked, p in agenda.pop_due(now, since):
            for slot in p.send:
                if not memory.covers(tracked.name, to_ms(slot)) and send(tracked.name, slot):
                    memory.note(tracked.name, to_ms(slot))
                    self.sent.append((tracked.name, slot))
            tracked.advance_past(p)
            agenda.push(tracked)

    def expired(self) -> bool:
        """True once the outage has lasted longer than ``degraded_max_seconds``."""
        return time.monotonic() - self.started > self.config.degraded_max_seconds

    def reconcile(self, lease: LeaseView, ledger: SlotStore, wake_by: Callable[[], float]) -> bool:
        """Redis is back: record what was sent while it was away, under a valid lease.

        Returns False, having claimed nothing, when another node leads by now. A Redis
        error on the way leaves the outage as it was (same start, same slots), so a
        flapping Redis neither loses the record nor restarts the degraded clock.
        """
        sent = list(self.sent)
        logger.info("leaderbeat: %s answers again; reconciling %d slot(s) sent while it was "
                    "unreachable", store_name(self.config), len(sent))
        try:
            lease.renew()
        except LeaseLostError:
            lease.stop_heartbeat()
            if not lease.try_acquire():
                logger.warning("leaderbeat: another node leads after the outage; %d slot(s) this "
                               "node sent meanwhile may be sent again (store_down_policy="
                               "last-leader)", len(sent))
                return False
            lease.start_heartbeat(wake_by)
        items = [ClaimItem(name, to_ms(slot), Op.CLAIM) for name, slot in sent]
        try:
            states = ledger.claim(*lease.credentials(), items)
        except NotReplicatedError as exc:  # already sent: recording them is all that is left
            logger.warning("leaderbeat: %s for the slots sent during the outage; recording them",
                           exc)
            states = [Code.GRANTED] * len(items)
        refused = [item for item, state in zip(items, states) if isinstance(state, Refused)]
        if refused:
            logger.warning("leaderbeat: %d slot(s) sent during the outage were also claimed by "
                           "another leader: %s", len(refused),
                           ", ".join(f"{i.name}@{from_ms(i.slot_ms).isoformat()}"
                                     for i in refused[:10]))
        granted = [i for i in items if i not in refused]
        ledger.record(lease.credentials()[1],
                      [Event(i.name, i.slot_ms, "sent",
                             f"while {store_name(self.config)} was unreachable")
                       for i in granted])
        self.sent = self.sent[len(sent):]
        return True

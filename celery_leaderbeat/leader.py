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
from datetime import datetime
from typing import Any

import redis

from .agenda import Agenda, Tracked, Unsent, adopt_refused_anchors
from .batch import LeaderGate, report_unsent, run_batch, say_capped_once
from .degraded import Outage
from .errors import NotReplicatedError
from .ledger import CLAIMED, Event
from .node import Node, utcnow
from .requests import WAKE, carry_out
from .slots import from_ms, to_ms

logger = logging.getLogger(__name__)

#: cap, in seconds, of how far past "now" an entry with no stored state starts
UNKNOWN_STATE_MARGIN = 5.0


class Resign(Exception):
    """This node must stop leading now; with ``release`` it gives the lease up at once."""

    def __init__(self, why: str, *, release: bool = False) -> None:
        super().__init__(why)
        self.release = release


class Leader:
    """The leading half of one beat process, from its election to its step-down."""

    def __init__(self, node: Node, since: datetime) -> None:
        self.node = node
        #: due slots before this moment were missed (no node could send them): the
        #: catch-up policy decides; later ones are on time. A standby's own start.
        self.since = since
        self.agenda = Agenda()
        self.gate = LeaderGate(node.lease, node.ledger)
        self.outage: Outage | None = None  # set while leading through a Redis outage
        self._version = -1
        self._unsent: list[Unsent] = []
        self._capped: set[str] = set()  # entries whose catch-up hit max_catchup (logged)
        self._paused: set[str] = set()  # entries seen skipped as paused (logged once)
        self._requests_pending = True  # requests may have queued while nobody led
        self._pubsub: Any = None

    @property
    def tracked(self) -> dict[str, Tracked]:
        return self.agenda.tracked

    def elected(self, version: int) -> None:
        """Load the state in Redis; report what an earlier leader claimed and never sent."""
        self.reload(version, report=True)

    def reload(self, version: int, *, report: bool = False) -> None:
        """Rebuild what the leader tracks from the schedule and the state in Redis."""
        node = self.node
        # An entry without stored state (new, or Redis lost its data) starts after
        # now + max_clock_skew (5 s at most): a slot an earlier leader sent just before
        # the data was lost cannot come round again on a node whose clock is behind.
        margin = min(node.config.max_clock_skew, UNKNOWN_STATE_MARGIN)
        start = from_ms(to_ms(utcnow()) + int(margin * 1000))
        loaded = node.track(node.ledger.load(), start=start, epoch=node.lease.epoch)
        overtaken: list[tuple[str, int]] = []
        if report:
            self._unsent += loaded.unsent
            # older unconfirmed claims a newer claim replaced (a standby rescued the
            # entry's next slot before this leader was elected): reported all the same
            for (name, slot_ms), state in node.ledger.overtaken().items():
                overtaken.append((name, slot_ms))
                if name in loaded.tracked:
                    self._unsent.append(Unsent(name, from_ms(slot_ms), state.state == CLAIMED))
        if loaded.anchors:
            try:
                refused = node.ledger.claim(*node.lease.credentials(), loaded.anchors)
            except NotReplicatedError as exc:  # anchors send nothing: safe to go on
                logger.warning("leaderbeat: %s for the anchors of new entries; going on", exc)
                refused = [None] * len(loaded.anchors)
            adopt_refused_anchors(loaded, refused)
            # One line per reload, not per entry: after a Redis restart that lost its data
            # this is the only trace. Unknown state is "start from now", never "never ran".
            logger.info("leaderbeat: %d of %d entries had no slot state in Redis (new entries, "
                        "or Redis lost its data); they start from now, without catch-up: %s",
                        len(loaded.anchors), len(loaded.tracked),
                        ", ".join(item.name for item in loaded.anchors[:10]))
        self.agenda = Agenda(loaded.tracked)
        self._version = version
        if self._unsent:
            unsent, self._unsent = self._unsent, []
            report_unsent(unsent, gate=self.gate, send=self._send,
                          recover=node.config.recover_unsent)
        node.ledger.forget_overtaken(overtaken)

    def tick(self, version: int) -> float:
        """Send every due slot; the seconds until the next one (at most ``max_interval``)."""
        if self.outage is not None:
            return self._tick_degraded(self.outage)
        node, lease = self.node, self.node.lease
        if not lease.is_held():
            if node.config.redis_down_policy == "last-leader" and not lease.lost:
                node.client.ping()  # unreachable: the last leader goes on (degraded mode)
            raise Resign("lease not confirmed in time (self-fencing)")
        stopped = lease.heartbeat_stopped()
        if stopped is not None:  # nothing renews the lease any more: let it go now
            raise Resign(f"the heartbeat thread stopped ({stopped})", release=True)
        skew = lease.clock_skew
        if skew is not None and abs(skew) > node.config.max_clock_skew:
            raise Resign(f"clock is {skew:+.3f} s off Redis TIME, beyond "
                         f"leaderbeat_max_clock_skew={node.config.max_clock_skew}", release=True)
        if self._version != version:
            self.reload(version)
        self.notice_requests()
        if self._requests_pending:
            self._requests_pending = False
            carry_out(node.ledger, node.keys, lease.epoch or 0, node.keys.prefix, self._publish,
                      utcnow(), known=lambda name: name in self.tracked)
        now = utcnow()
        earliest = self.agenda.earliest() or now.timestamp()
        due = self.agenda.pop_due(now, self.since)
        try:
            if due:
                started = time.monotonic()
                say_capped_once(due, self._capped)
                outcome = run_batch(due, self.gate, node.chunk_send(node.lease.epoch or 0),
                                    progress=node.progress)
                node.observe(outcome.events)
                self._say_paused(outcome.events)
                if outcome.sent:
                    logger.info("leaderbeat: sent %d slot(s) of %d due entries in %.0f ms, "
                                "%.0f ms after the earliest was due", outcome.sent, len(due),
                                (time.monotonic() - started) * 1000,
                                (now.timestamp() - earliest) * 1000)
        finally:
            self.agenda.push_all(due)
            self._record_broken()
        return min(self.delay(), self.node.config.standby_poll)

    def delay(self, limit: float | None = None) -> float:
        return self.agenda.delay(time.time(), float(limit or self.node.max_interval()))

    def _say_paused(self, events: list[Event]) -> None:
        """One INFO line when an entry's slots start being skipped as paused, one on resume."""
        for ev in events:
            if ev.event == "skipped" and ev.detail == "paused" and ev.name not in self._paused:
                self._paused.add(ev.name)
                logger.info("leaderbeat: %s (epoch %s) skips %s: paused from the CLI",
                            self.node.config.node_id, self.node.lease.epoch, ev.name)
            elif ev.event == "sent" and ev.name in self._paused:
                self._paused.discard(ev.name)
                logger.info("leaderbeat: %s (epoch %s) sends %s again: resumed",
                            self.node.config.node_id, self.node.lease.epoch, ev.name)

    def _send(self, name: str, slot: datetime) -> bool:
        return self.node.send(name, slot, self.node.lease.epoch or 0, None)

    def _publish(self, name: str, slot: datetime, task_id: str | None) -> bool:
        return self.node.send(name, slot, self.node.lease.epoch or 0, task_id)

    def notice_requests(self) -> None:
        """Has the CLI queued a request? A look at the subscription's buffer, no round trip.

        The leader wakes at least every ``standby_poll`` for this (an idle wake-up costs
        no Redis command); messages that arrive while it sleeps or sends wait in the
        subscription, so none is missed.
        """
        if self._pubsub is None:
            self._pubsub = self.node.client.pubsub(ignore_subscribe_messages=True)
            self._pubsub.subscribe(self.node.keys.events)
        while (message := self._pubsub.get_message(timeout=0.0)) is not None:
            if message.get("data") in (WAKE.encode(), WAKE):
                self._requests_pending = True

    def close(self) -> None:
        self._pubsub = None  # dropped, not closed: see Standby.close

    def _record_broken(self) -> None:
        broken = self.agenda.take_broken()
        if broken:
            self.node.ledger.record(self.node.lease.epoch or 0, [
                Event(name, to_ms(utcnow()), "error", why) for name, why in broken])

    # -- redis_down_policy = "last-leader" ------------------------------------------------

    def redis_unreachable(self) -> bool:
        """Redis stopped answering: True while this leader goes on (degraded), else False.

        Only a leader whose lease is still valid by its own deadline may go on: one
        resumed from a long pause whose link is down must not send while another leads.
        """
        if (self.outage is None and self.node.config.redis_down_policy == "last-leader"
                and self.node.lease.is_held()):
            self.outage = Outage.begin(self.node.config)
        return self.outage is not None

    def _tick_degraded(self, outage: Outage) -> float:
        """Redis is unreachable: send from the agenda alone; reconcile once Redis answers."""
        if outage.expired():  # a hard cap, checked first: also when PING answers, writes fail
            self.outage = None
            raise Resign("Redis unreachable for longer than leaderbeat_degraded_max_seconds="
                         f"{self.node.config.degraded_max_seconds}")
        outage.send_due(self.agenda, utcnow(), self.since, self._send)
        try:
            self.node.client.ping()
        except (redis.RedisError, OSError):
            return min(self.delay(), 1.0)
        try:
            reconciled = outage.reconcile(self.node.lease, self.node.ledger, self.node.wake_by)
        except (redis.RedisError, OSError):
            return min(self.delay(), 1.0)  # still flapping: the outage stays as it was
        self.outage = None  # only now: a Redis error above leaves the outage in place
        if not reconciled:
            raise Resign("another node leads after the Redis outage")
        return 0.0

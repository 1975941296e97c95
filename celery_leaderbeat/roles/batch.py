"""One batch of due slots: claim a chunk, send what was granted, record; repeat.

The order is the guarantee: nothing is published before Redis granted its
claim, and a leader publishes nothing once its lease can no longer be
confirmed (self-fencing), so a slot is sent at most once. Claims go in chunks
of at most :data:`CHUNK` items, and the record of one chunk (sent, unsent and
why, refused and by whom) rides on the claim of the next, so a batch costs
about one Redis round trip per chunk and none per entry. A node paused in the
middle of a batch holds at most one chunk claimed and unsent; the rest stays
unclaimed, for a standby to rescue or the next leader to send.

A chunk never holds two slots of one entry: a claim overwrites the entry's
last slot, so after a crash every claimed, unconfirmed slot must still be the
one the slots hash shows. An entry catching up on several slots therefore
spreads over several chunks, one slot each.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from ..errors import LeaseLostError, NotReplicatedError
from ..send.base import ChunkSend
from ..store.base import SlotStore
from ..store.calls import named
from ..store.types import (
    BackfillRefused,
    ClaimItem,
    ClaimResult,
    Code,
    Event,
    Op,
    Refused,
    SlotStatus,
)
from ..timing.slots import Plan, from_ms, to_ms
from .agenda import Tracked, Unsent
from .lease import LeaseView
from .memory import SentMemory

logger = logging.getLogger(__name__)

#: claim items per script call: what a leader can publish in well under a renew interval
CHUNK = 100

#: publishes one slot of one entry; False when the broker refused it
Send = Callable[[str, datetime], bool]


class _OneByOne:
    """A per-slot :data:`Send` as a :class:`ChunkSend`."""

    def __init__(self, send: Send) -> None:
        self.send = send

    def prepare(self, slots: Sequence[tuple[str, datetime]]) -> Sequence[tuple[Any, ...] | None]:
        return [None] * len(slots)

    def enqueued(self, slots: Sequence[tuple[str, datetime]]) -> None:
        pass

    def send_many(self, slots: Sequence[tuple[str, datetime]],
                  may_send: Callable[[], bool]) -> list[bool]:
        out: list[bool] = []
        for name, slot in slots:
            if not may_send():  # the lease ran out mid-chunk: stop here
                break
            out.append(self.send(name, slot))
        return out


class Gate(Protocol):
    """Who claims: the leader (fenced by its lease) or a standby (rescue, no lease)."""

    detail: str  # the history detail of a slot this gate sent
    records_refusals: bool  # a refused claim goes to the history (the leader's, not a rescue's)

    def claim(self, items: Sequence[ClaimItem],
              events: Sequence[Event]) -> Sequence[ClaimResult]: ...

    def may_send(self) -> bool: ...

    def record(self, events: Sequence[Event]) -> None: ...


class LeaderGate:
    """Claims under the lease: refused wholesale once another node leads."""

    detail = ""
    records_refusals = True

    def __init__(self, lease: LeaseView, ledger: SlotStore) -> None:
        self.lease = lease
        self.ledger = ledger

    @named("chunk.lead")
    def claim(self, items: Sequence[ClaimItem],
              events: Sequence[Event]) -> Sequence[ClaimResult]:
        try:
            return self.ledger.claim(*self.lease.credentials(), items, events)
        except LeaseLostError as exc:
            # the key vanished while the lease was valid: Redis lost its data
            self.lease.losses.lease_lost(exc, held=self.lease.is_held())
            raise

    def may_send(self) -> bool:
        return self.lease.is_held()

    @named("chunk.lead_record")
    def record(self, events: Sequence[Event]) -> None:
        self.ledger.record(self.lease.epoch or 0, events)


class RescueGate:
    """A standby's claims: granted only for slots ``rescue_after`` late by Redis TIME."""

    detail = "rescued"
    records_refusals = False  # the normal case: the leader claimed it first

    def __init__(self, ledger: SlotStore, window: float = float("inf"), *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ledger = ledger
        self.redis_now_ms = 0
        self.window = window
        self.clock = clock
        self._claimed_at: float | None = None
        #: the items of a claim call whose reply has not come (yet, or ever)
        self.inflight: tuple[list[ClaimItem], float] | None = None

    @named("chunk.rescue")
    def claim(self, items: Sequence[ClaimItem],
              events: Sequence[Event]) -> Sequence[ClaimResult]:
        started = self.clock()
        self.inflight = (list(items), started)  # until the reply is in hand
        claimed = self.ledger.rescue(items, events)
        self.inflight = None
        self._claimed_at = started
        self.redis_now_ms = claimed.redis_now_ms
        return claimed.results

    def may_send(self) -> bool:
        """The claim is the only gate, for as long as the publish window lasts: a rescuer
        paused between its grant and its publish must not send after a leader may have
        recovered the slot."""
        return self._claimed_at is None or self.clock() - self._claimed_at < self.window

    @named("chunk.rescue_record")
    def record(self, events: Sequence[Event]) -> None:
        self.ledger.record(0, events)


@dataclass
class Outcome:
    """What one batch did."""

    sent: int = 0
    refused: int = 0
    events: list[Event] = field(default_factory=list)  # what was recorded, for signals/metrics
    waiting: list[str] = field(default_factory=list)  # not late enough (rescue) or ahead
    unknown: list[str] = field(default_factory=list)  # rescue: the entry has no state yet
    differs: list[str] = field(default_factory=list)  # rescue: the leader plans another definition


@dataclass(slots=True)
class _Row:
    """One slot of a chunk: what was asked and what the claim answered."""

    tracked: Tracked
    slot: datetime
    slot_ms: int
    item: ClaimItem
    result: ClaimResult

    @property
    def key(self) -> tuple[str, datetime]:
        return self.tracked.name, self.slot

    @property
    def granted(self) -> bool:
        """Granted (with or without its broker commands): this node sends it."""
        return self.result in (Code.GRANTED, Code.UNQUEUED)


def run_batch(due: Sequence[tuple[Tracked, Plan]], gate: Gate, send: Send | ChunkSend, *,
              memory: SentMemory | None = None, backlog: list[Event] | None = None,
              record_missed: bool = True,
              progress: Callable[[], None] = lambda: None) -> Outcome:
    """Claim, send and record the due slots; advance each entry past what was settled.

    ``progress`` is called after every chunk claimed: a batch of tens of thousands of
    slots takes longer than the lease ttl, and the heartbeat must tell that working
    loop from a wedged one. ``memory`` holds what this process published: a granted
    slot it covers is recorded, never published again (a claim whose reply was lost
    is granted again on the retry; the chunk before it may have gone out already).

    Raises LeaseLostError when the leader's claim was refused (another node leads)
    or its lease expired while sending; what was sent is recorded first, and the
    slots not yet claimed stay unclaimed. Any other error (a Redis call failed)
    leaves every entry advanced past what was settled, and no further; events whose
    record call failed go to ``backlog`` and ride on the next batch's first call.
    """
    sender: ChunkSend = (send if hasattr(send, "send_many")  # type: ignore[assignment]
                         else _OneByOne(send))
    batch = _Batch(due, gate, sender, memory if memory is not None else SentMemory(),
                   backlog if backlog is not None else [], record_missed)
    finished = False
    try:
        for chunk in chunks(due):
            progress()
            chunk = [c for c in chunk if c[0].name not in batch.stopped]
            if not chunk:
                continue
            if not gate.may_send():
                batch.fenced = True
                break
            with _shield() as stopping:  # a stop signal waits until this chunk is out
                rows, replicated = batch.claim(chunk)
                enqueued, sent = batch.send(rows, replicated)
                for row in rows:
                    batch.settle(row, replicated, enqueued, sent)
                if stopping:  # record what went out before the signal acts:
                    batch.record(keep=False)  # its handler releases the lease first
        finished = True
    finally:
        try:
            batch.record(keep=True)
        finally:
            batch.advance(finished)
    if batch.fenced:
        raise LeaseLostError("lease expired while sending (self-fencing)")
    return batch.outcome


class _Batch:
    """One batch's state from chunk to chunk: what to record next, where each entry
    stands, which entries stopped at a slot left unsettled."""

    def __init__(self, due: Sequence[tuple[Tracked, Plan]], gate: Gate, sender: ChunkSend,
                 memory: SentMemory, backlog: list[Event], record_missed: bool) -> None:
        self.due, self.gate, self.sender, self.memory = due, gate, sender, memory
        self.backlog = backlog
        self.outcome = Outcome()
        self.pending: list[Event] = list(backlog)  # recorded by the next call
        backlog.clear()
        # A leader records what its plan passes over at once; a rescuer only once its claim
        # of the entry was granted (several standbys plan the same batch: one records it).
        self.deferred: dict[str, list[Event]] = {}
        if record_missed:
            for tracked, p in due:
                if gate.records_refusals:
                    self.pending += missed_events(tracked, p)
                elif p.missed:
                    self.deferred[tracked.name] = missed_events(tracked, p)
        self.position = {tracked.name: tracked.last for tracked, _ in due}
        self.stopped: set[str] = set()  # entries with a slot left unsettled: not advanced past it
        self.fenced = False

    def claim(self, chunk: Sequence[tuple[Tracked, datetime, Op, datetime]]
              ) -> tuple[list[_Row], bool]:
        """Claim a chunk (writing what is pending); its rows, and whether the claims
        reached ``min_replicas`` replicas."""
        # each slot in ms once: a burst does this bookkeeping for every message
        slots_ms = [to_ms(slot) for _, slot, _, _ in chunk]
        wanted = [(t.name, slot) for (t, slot, op, _), ms in zip(chunk, slots_ms)
                  if op == Op.CLAIM and not self.memory.covers(t.name, ms)]
        commands = dict(zip(wanted, self.sender.prepare(wanted)))
        items = [ClaimItem(t.name, ms, op, ms if fire is slot else to_ms(fire), to_ms(prev),
                           t.fingerprint, commands.get((t.name, slot)) or ())
                 for (t, slot, op, prev), ms in zip(chunk, slots_ms)
                 for fire in [t.clock.fire_time(slot)]]
        writing, self.pending = self.pending, []  # written by the claim call, even when refused
        self.outcome.events += writing
        replicated = True
        try:
            results = self.gate.claim(items, writing)
        except NotReplicatedError as exc:
            # Granted on the master, but a failover could lose the claims: sending could
            # then duplicate. Not sending keeps G1; what was granted is recorded unsent,
            # what was refused is handled as any refusal.
            logger.warning("leaderbeat: %s; not sending this chunk", exc)
            results, replicated = exc.results or [Code.GRANTED] * len(items), False
        except LeaseLostError:
            raise  # the events were written: the script writes them before its check
        except Exception:
            self.backlog.extend(writing)  # may not have been written: written again later
            raise
        rows = [_Row(t, slot, ms, item, result) for (t, slot, _, _), ms, item, result
                in zip(chunk, slots_ms, items, results)]
        return rows, replicated

    def send(self, rows: Sequence[_Row], replicated: bool
             ) -> tuple[set[tuple[str, datetime]], dict[tuple[str, datetime], bool]]:
        """Publish what was granted and not enqueued by the claim itself; the slots the
        claim enqueued, and per slot published whether the broker accepted it."""
        covered = {row.key for row in rows if self.memory.covers(row.tracked.name, row.slot_ms)}
        granted = [row.key for row in rows
                   if row.granted and row.item.op == Op.CLAIM and row.key not in covered]
        enqueued = {row.key for row in rows
                    if row.result is Code.GRANTED and row.item.enqueue and replicated}
        # this leader's own slots asked again, enqueued by an attempt whose reply was lost:
        # they reached the broker, and this process has not said so yet
        again = [row.key for row in rows
                 if row.result is Code.ENQUEUED and row.key not in covered]
        self.sender.enqueued([g for g in granted if g in enqueued] + again)
        to_send = [g for g in granted if g not in enqueued]
        sent: dict[tuple[str, datetime], bool] = {}
        if to_send and replicated and not self.fenced:
            sent = dict(zip(to_send, self.sender.send_many(to_send, self.gate.may_send)))
        self.fenced = self.fenced or (replicated and len(sent) < len(to_send))
        return enqueued, sent

    def settle(self, row: _Row, replicated: bool, enqueued: set[tuple[str, datetime]],
               sent: dict[tuple[str, datetime], bool]) -> None:
        """What one claim's answer means for its entry: where it stands, what to record."""
        name = row.tracked.name
        match row.result:
            case Code.GRANTED | Code.UNQUEUED:
                self._moved(name, row.slot)
                if row.item.op == Op.CLAIM:
                    self._granted(row, replicated, row.key in enqueued, sent.get(row.key))
            case Code.ENQUEUED:  # its 'sent' event is in the history already
                self._moved(name, row.slot)
                if not self.memory.covers(name, row.slot_ms):
                    self._note_sent(name, row.slot_ms, recorded=True)
            case Code.PAUSED:  # skipped past: resuming does not replay it
                self.position[name] = max(self.position[name], row.slot)
                self.pending.append(Event(name, row.slot_ms, "skipped", "paused"))
            case Refused(state=state, reason=reason):
                self.position[name] = max(self.position[name], from_ms(state.slot_ms))
                if (row.item.op == Op.CLAIM and self.gate.records_refusals
                        and state.state != SlotStatus.SKIPPED):
                    self.outcome.refused += 1
                    self.pending.append(Event(name, row.slot_ms, "skipped", reason))
            case Code.EARLY | Code.DIFFERS | Code.UNKNOWN as code:
                self.stopped.add(name)
                {Code.EARLY: self.outcome.waiting, Code.DIFFERS: self.outcome.differs,
                 Code.UNKNOWN: self.outcome.unknown}[code].append(name)
            case BackfillRefused():
                raise ValueError(f"a claim of {name!r} answered {row.result} (backfill only)")

    def _moved(self, name: str, slot: datetime) -> None:
        """The entry's claim of ``slot`` went through: the slots it passed over are told."""
        self.position[name] = max(self.position[name], slot)
        self.pending += self.deferred.pop(name, ())

    def _granted(self, row: _Row, replicated: bool, enqueued: bool, sent: bool | None) -> None:
        name, slot_ms = row.tracked.name, row.slot_ms
        if self.memory.covers(name, slot_ms):  # granted again after a lost reply
            self.pending.append(_already_sent(self.memory, name, slot_ms, self.gate.detail))
        elif enqueued:  # granted and enqueued in one step: the claim wrote its 'sent' event
            self._note_sent(name, slot_ms, recorded=True)
        elif not replicated:
            self.pending.append(Event(name, slot_ms, "unsent", "not replicated"))
        elif sent is None:
            self.pending.append(Event(name, slot_ms, "unsent", "lease expired"))
        elif sent:
            self._note_sent(name, slot_ms, recorded=False)
        else:
            self.pending.append(Event(name, slot_ms, "unsent", "publish failed"))

    def _note_sent(self, name: str, slot_ms: int, *, recorded: bool) -> None:
        """A slot reached the broker; ``recorded``: its 'sent' event is written already."""
        self.memory.note(name, slot_ms)
        self.outcome.sent += 1
        event = Event(name, slot_ms, "sent", self.gate.detail)
        (self.outcome.events if recorded else self.pending).append(event)

    def record(self, *, keep: bool) -> None:
        """Write what is pending; with ``keep``, kept in the backlog when the call fails
        (else still pending: the batch's last record tries again)."""
        if not self.pending:
            return
        try:
            self.gate.record(self.pending)
        except Exception:
            if keep:
                self.backlog.extend(self.pending)
            raise
        self.outcome.events += self.pending
        self.pending = []

    def advance(self, finished: bool) -> None:
        """Advance each entry past what was settled, even when a call failed: an entry left
        behind would plan the same slots again (the memory keeps them from going out
        twice, but they would be claimed and recorded again)."""
        for tracked, p in self.due:
            last = self.position[tracked.name]
            whole = finished and not self.fenced and tracked.name not in self.stopped
            if last != tracked.last:  # settled in Redis, by this node or another (where
                self.memory.know(tracked.name, to_ms(last))  # it stood: perhaps only planned)
            if whole:
                tracked.advance_past(p, to_ms(last))
            else:
                tracked.advance(last)


_HELD = {getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
         if hasattr(signal, name)}


@contextmanager
def _shield() -> Iterator[list[int]]:
    """Hold SIGTERM, SIGINT, SIGHUP and SIGQUIT back while one chunk is claimed and sent.

    Celery's handler raises ``SystemExit`` wherever the main thread is: landing
    between a claim and its publish, it left the chunk claimed and never sent
    (lost, at most once). While a chunk is in hand a stand-in handler only notes
    the signal; once the chunk is out the real handlers are back and the noted
    signals are sent again, a few milliseconds late. (Masking the main thread is
    not enough: the kernel hands the signal to the heartbeat thread instead.)
    SIGKILL cannot be held: that window stays. Only the main thread can do this.
    """
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return
    previous = {}
    for sig in _HELD:
        handler = signal.getsignal(sig)
        if handler is not None:  # None: not set from Python, cannot be put back
            previous[sig] = signal.signal(sig, lambda signum, frame: noted.append(signum))
    try:
        yield noted
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in noted:
            os.kill(os.getpid(), signum)


def chunks(due: Sequence[tuple[Tracked, Plan]], size: int = CHUNK
           ) -> list[list[tuple[Tracked, datetime, Op, datetime]]]:
    """The claims of a batch in chunks of at most ``size``, never two of one entry in one.

    Round ``r`` holds each entry's ``r``-th slot to send (oldest first); an entry
    that passes over newer missed slots without sending them ends with a skip.
    Each claim carries the slot before it (the entry's last, then the previous
    claim's): a rescue is granted only when that is the stored slot.
    """
    rounds: list[list[tuple[Tracked, datetime, Op, datetime]]] = []
    for tracked, p in due:
        ops = [(s, Op.CLAIM) for s in p.send]
        if (not p.send or p.last > p.send[-1]) and p.last > tracked.last:
            ops.append((p.last, Op.SKIP))  # missed slots newer than anything sent
        prev = tracked.last
        for r, (slot, op) in enumerate(ops):
            if r == len(rounds):
                rounds.append([])
            rounds[r].append((tracked, slot, op, prev))
            prev = slot
    return [rnd[i:i + size] for rnd in rounds for i in range(0, len(rnd), size)]


def _already_sent(memory: SentMemory, name: str, slot_ms: int, detail: str) -> Event:
    """A granted slot this process covers: recorded, not published again."""
    if memory.published(name, slot_ms):
        return Event(name, slot_ms, "sent", (detail + "; " if detail else "")
                     + "recorded again (the first record's reply was lost)")
    return Event(name, slot_ms, "skipped", "older than a slot this node sent")


def missed_events(tracked: Tracked, p: Plan) -> list[Event]:
    """History events for the slots ``p`` passes over; the oldest only as a count."""
    events = [Event(tracked.name, to_ms(m.slot), "missed", m.reason) for m in p.missed]
    if p.missed_total > len(p.missed):
        events.append(Event(tracked.name, to_ms(p.last), "missed",
                            f"{p.missed_total - len(p.missed)} older slots not listed"))
    return events


def say_capped_once(due: Sequence[tuple[Tracked, Plan]], capped: set[str]) -> None:
    """A catch-up larger than ``max_catchup`` is logged once per entry, not per tick."""
    for tracked, p in due:
        policy = tracked.options.policy
        if (policy.mode == "all" and tracked.name not in capped
                and any(m.reason == "max_catchup" for m in p.missed)):
            capped.add(tracked.name)
            logger.warning("leaderbeat: entry %r has more missed slots than max_catchup=%d: "
                           "the newest %d are sent, %d older ones are only recorded as missed "
                           "(said once per entry)", tracked.name, policy.max_catchup,
                           policy.max_catchup, p.missed_total)


def report_unsent(unsent: Sequence[Unsent], *, gate: LeaderGate, send: Send,
                  recover: bool, memory: SentMemory) -> list[Unsent]:
    """Slots claimed by an earlier leader (or a standby) and never confirmed sent.

    Each is reported once (its state becomes 'u'). A slot this process itself
    published (its record was lost with a reply) is recorded sent, never re-sent.
    With ``recover`` (``leaderbeat_recover_unsent``) every other such slot, reported
    before or not, is re-sent under its own task id, through a 'recover' claim: it
    is granted only while the slot is still unconfirmed in Redis (a late 'sent'
    record of its claimant wins), and a standby's claim only once it is older than
    the lease ttl (its claimant publishes within that time or not at all).
    Returns the slots to try again later (a standby's claim too young to take over).
    """
    mine = [u for u in unsent if memory.published(u.name, to_ms(u.slot))]
    others = [u for u in unsent if not memory.published(u.name, to_ms(u.slot))]
    new = [(u.name, u.slot) for u in others if u.unreported]
    if new:
        logger.warning("leaderbeat: %d slot(s) were claimed but not confirmed sent by an "
                       "earlier leader: %s%s", len(new),
                       ", ".join(f"{n}@{s.isoformat()}" for n, s in new[:10]),
                       "" if recover else " (leaderbeat_recover_unsent is off: not re-sent)")
    events = [Event(n, to_ms(s), "unsent", "claimed by an earlier leader") for n, s in new]
    events += [_already_sent(memory, u.name, to_ms(u.slot), "") for u in mine]
    later: list[Unsent] = []
    if recover and others and gate.may_send():
        results = gate.claim([ClaimItem(u.name, to_ms(u.slot), Op.RECOVER) for u in others],
                             events)
        events = _recovered(others, results, later, gate=gate, send=send, memory=memory)
    gate.record(events)
    if not recover:
        gate.ledger.forget_overtaken([(u.name, to_ms(u.slot)) for u in others if u.overtaken])
    return later


def _recovered(others: Sequence[Unsent], results: Sequence[Any], later: list[Unsent], *,
               gate: LeaderGate, send: Send, memory: SentMemory) -> list[Event]:
    """Send each recovery claim that was granted; the events to record. A claim too
    early (a standby's, younger than the lease ttl) goes to ``later``."""
    events: list[Event] = []
    for u, result in zip(others, results):
        slot_ms = to_ms(u.slot)
        if result is Code.EARLY:
            later.append(u._replace(unreported=False))
        elif result is not Code.GRANTED:
            continue  # confirmed sent meanwhile, or moved on: nothing to recover
        elif memory.published(u.name, slot_ms):  # listed twice: the first went out
            events.append(_already_sent(memory, u.name, slot_ms, "recovered"))
        elif gate.may_send() and send(u.name, u.slot):
            memory.note(u.name, slot_ms)
            events.append(Event(u.name, slot_ms, "sent", "recovered"))
        else:
            events.append(Event(u.name, slot_ms, "unsent", "recovery: not sent"))
    return events

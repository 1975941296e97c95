"""Requests from the CLI to whichever node leads: trigger an entry, backfill slots.

The CLI pushes a JSON request onto the store's request queue, which publishes
``request`` on the events; the leader, which listens to them between batches,
pops every pending request at once (each is taken by one leader) and carries it
out. A leader that dies between popping and sending loses that request (at most
once); the history says what was done. A backfill whose grant call fails goes
back to the queue, with the requests after it.
Redis going back to older state (a restore from an older snapshot) can bring
back a request already carried out: one queued before the leader saw the loss
is dropped and recorded (at most once).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..store.base import RequestQueue, SlotStore
from ..store.events import REQUEST
from ..store.types import BackfillRefused, Event
from ..timing.slots import from_ms, to_ms
from .memory import SentMemory

logger = logging.getLogger(__name__)

#: the message on the events that wakes the leader for a request
WAKE = REQUEST

#: namespace of a triggered run's task id (fixed forever, like slot ids)
_TRIGGER_NAMESPACE = uuid.UUID("8f3a1c62-7d4e-5b90-a1c3-747269676572")


@dataclass(frozen=True)
class Request:
    """One request: ``trigger`` an entry now, or ``backfill`` some of its slots."""

    op: str
    entry: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    note: str = ""
    slots_ms: tuple[int, ...] = ()
    #: the store's time (ms) when it was queued (None: queued by an older version)
    queued_ms: int | None = None

    def dumps(self) -> str:
        return json.dumps({"op": self.op, "entry": self.entry, "id": self.id,
                           "note": self.note, "slots_ms": list(self.slots_ms),
                           "queued_ms": self.queued_ms})

    @classmethod
    def loads(cls, raw: Any) -> Request:
        data = json.loads(raw)
        queued = data.get("queued_ms")
        return cls(op=data["op"], entry=data["entry"], id=data.get("id", ""),
                   note=data.get("note", ""), slots_ms=tuple(data.get("slots_ms") or ()),
                   queued_ms=int(queued) if queued is not None else None)


def submit(queue: RequestQueue, request: Request) -> None:
    """CLI side: queue ``request``, stamped with the store's time, and wake the leader."""
    queue.push(dataclasses.replace(request, queued_ms=queue.now_ms()).dumps())


def trigger_task_id(prefix: str, entry: str, request_id: str) -> str:
    """The task id of a triggered run: its own, never a scheduled slot's."""
    return str(uuid.uuid5(_TRIGGER_NAMESPACE, f"{prefix}\x1f{entry}\x1f{request_id}"))


#: publishes one run of an entry: (entry, slot, task id or None for the slot's own) -> sent
Publish = Callable[[str, datetime, str | None], bool]


@dataclass(frozen=True)
class LeaderSide:
    """What carrying out requests needs of the leader."""

    ledger: SlotStore
    queue: RequestQueue
    epoch: int
    token: str  # the leader's lease: the claim script grants backfills under it
    prefix: str  # the key prefix: a triggered run's task id is made from it
    publish: Publish
    known: Callable[[str], bool]  # is the entry scheduled?
    #: the entry's last slot as the leader tracks it (claimed, sent or passed)
    stored: Callable[[str], int | None] = lambda name: None
    memory: SentMemory = field(default_factory=SentMemory)
    #: the store's time (ms) a leader last started again after a loss of writes, or None
    #: (see :class:`~celery_leaderbeat.roles.loss.Losses`)
    lost_at: Callable[[], int | None] = lambda: None
    store: str = "Redis"  #: the store as the history and the log name it


def carry_out(leader: LeaderSide, now: datetime) -> int:
    """Leader side: pop and carry out every pending request. Returns how many.

    A backfill never sends a slot at or after the entry's last slot as the leader
    tracks it (those are the schedule's to send, when due), nor one the leader's
    memory says this process published, nor one the claim script refuses.
    """
    raw = leader.queue.pop(1000)
    events: list[Event] = []
    lost_at = leader.lost_at() if raw else None
    for at, item in enumerate(raw):
        try:
            request = Request.loads(item)
        except (ValueError, KeyError, TypeError):
            logger.warning("leaderbeat: dropped an unreadable request %r", item)
            continue
        refused = _refused(request, leader, now, lost_at)
        if refused is not None:
            events.append(refused)
        elif request.op == "trigger":
            events.append(_trigger(request, leader, now))
        elif request.op == "backfill":
            try:
                asked = _ask_backfill(leader, request)
            except Exception:
                # nothing of it was published: it and the requests after it go back, first
                # in line (a grant whose reply was lost is granted again to the same request)
                _queue_again(leader.queue, raw[at:])
                if events:
                    with contextlib.suppress(Exception):
                        leader.ledger.record(leader.epoch, events)
                raise
            events += _backfill(request, asked, leader.publish, leader.memory)
    if events:
        leader.ledger.record(leader.epoch, events)
    return len(raw)


def _refused(request: Request, leader: LeaderSide, now: datetime,
             lost_at: int | None) -> Event | None:
    """The event of a request not carried out at all, or None to carry it out."""
    if lost_at is not None and request.queued_ms is not None and request.queued_ms <= lost_at:
        # the store went back to older state, which may bring back a request already
        # carried out: at most once, each is dropped and said so
        logger.warning("leaderbeat: %s request %s for %r was queued before %s lost "
                       "writes; not carried out (it may have been already)", request.op,
                       request.id, request.entry, leader.store)
        return Event(request.entry, to_ms(now), "skipped",
                     f"{request.op} {request.id}: queued before {leader.store} lost writes "
                     "(it may have been carried out then)")
    if not leader.known(request.entry):
        logger.warning("leaderbeat: %s request for %r: no such entry", request.op,
                       request.entry)
        return Event(request.entry, to_ms(now), "error", f"{request.op}: no such entry")
    return None


def _trigger(request: Request, leader: LeaderSide, now: datetime) -> Event:
    """Publish a run of the entry now, under a task id of its own."""
    task_id = trigger_task_id(leader.prefix, request.entry, request.id)
    if not leader.publish(request.entry, now, task_id):
        return Event(request.entry, to_ms(now), "unsent", "trigger: publish failed")
    logger.info("leaderbeat: triggered %s now (task %s)%s", request.entry, task_id,
                f": {request.note}" if request.note else "")
    return Event(request.entry, to_ms(now), "triggered", request.note or f"request {request.id}")


def _queue_again(queue: RequestQueue, raw: list[str]) -> None:
    try:
        queue.requeue(raw)
    except Exception:  # noqa: BLE001 - the store failing: they are lost (at most once)
        logger.warning("leaderbeat: %d request(s) lost: Redis failed while carrying them out",
                       len(raw))


def _ask_backfill(leader: LeaderSide, request: Request) -> list[tuple[int, str | None, str]]:
    """Which of the requested slots to send, each once ever, and only one nobody sent.

    Per slot: (slot, None to send it or the history event's name, its detail).
    Only slots the schedule has settled (before the entry's last slot) qualify: a
    later one is the schedule's own, sent when due, and backfilling it would send
    it twice. What the command saw when it queued the request may be stale by now
    (a standby rescued a slot meanwhile, or Redis went back to older state and
    brought the request back): the claim script decides each slot atomically from
    what Redis holds now, and ``memory`` refuses what this process sent itself.
    """
    last_ms, memory = leader.stored(request.entry), leader.memory
    out: list[tuple[int, str | None, str]] = []
    ask = []
    for slot_ms in sorted(set(request.slots_ms)):
        if last_ms is None or slot_ms >= last_ms:
            out.append((slot_ms, "skipped",
                        "backfill: not settled by the schedule yet (sent when due)"))
        elif memory.published(request.entry, slot_ms):
            out.append((slot_ms, "skipped", "backfill: sent on time"))
        elif memory.backfilled(request.entry, slot_ms):
            out.append((slot_ms, "skipped", "backfill: sent before (by this node)"))
        else:
            ask.append(slot_ms)
    results = leader.ledger.backfill(leader.token, leader.epoch, request.entry, ask,
                                     request.id) if ask else []
    out += [(slot_ms, "skipped", result.reason.detail) if isinstance(result, BackfillRefused)
            else (slot_ms, None, "") for slot_ms, result in zip(ask, results)]
    return sorted(out)


def _backfill(request: Request, asked: list[tuple[int, str | None, str]],
              publish: Publish, memory: SentMemory) -> list[Event]:
    """Publish the slots :func:`_ask_backfill` granted; the history events of every slot."""
    events = []
    sent = 0
    for slot_ms, refused, detail in asked:
        if refused is not None:
            events.append(Event(request.entry, slot_ms, refused, detail))
        elif publish(request.entry, from_ms(slot_ms), None):
            sent += 1
            memory.note_backfill(request.entry, slot_ms)
            events.append(Event(request.entry, slot_ms, "sent", f"backfill {request.id}"))
        else:
            events.append(Event(request.entry, slot_ms, "unsent", "backfill: publish failed"))
    logger.info("leaderbeat: backfilled %d of %d slot(s) of %s", sent, len(request.slots_ms),
                request.entry)
    return events

"""Requests from the CLI to whichever node leads: trigger an entry, backfill slots.

The CLI pushes a JSON request onto the store's request queue, which publishes
``request`` on the events; the leader, which listens to them between batches,
pops every pending request at once (each is taken by one leader) and carries it
out. A leader that dies between popping and sending loses that request (at most
once); the history says what was done.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..store.base import RequestQueue, SlotStore
from ..store.events import REQUEST
from ..store.ledger import Event
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

    def dumps(self) -> str:
        return json.dumps({"op": self.op, "entry": self.entry, "id": self.id,
                           "note": self.note, "slots_ms": list(self.slots_ms)})

    @classmethod
    def loads(cls, raw: Any) -> Request:
        data = json.loads(raw)
        return cls(op=data["op"], entry=data["entry"], id=data.get("id", ""),
                   note=data.get("note", ""), slots_ms=tuple(data.get("slots_ms") or ()))


def submit(queue: RequestQueue, request: Request) -> None:
    """CLI side: queue ``request`` and wake the leader."""
    queue.push(request.dumps())


def trigger_task_id(prefix: str, entry: str, request_id: str) -> str:
    """The task id of a triggered run: its own, never a scheduled slot's."""
    return str(uuid.uuid5(_TRIGGER_NAMESPACE, f"{prefix}\x1f{entry}\x1f{request_id}"))


#: publishes one run of an entry: (entry, slot, task id or None for the slot's own) -> sent
Publish = Callable[[str, datetime, str | None], bool]


def carry_out(ledger: SlotStore, queue: RequestQueue, epoch: int, prefix: str, publish: Publish,
              now: datetime, known: Callable[[str], bool],
              stored: Callable[[str], int | None] = lambda name: None,
              memory: SentMemory | None = None) -> int:
    """Leader side: pop and carry out every pending request. Returns how many.

    ``stored`` gives an entry's last slot as the leader tracks it: a backfill
    never sends a slot at or after it (those are the schedule's to send, when
    due), nor one ``memory`` says this process published.
    """
    raw = queue.pop(1000)
    events: list[Event] = []
    for item in raw:
        try:
            request = Request.loads(item)
        except (ValueError, KeyError, TypeError):
            logger.warning("leaderbeat: dropped an unreadable request %r", item)
            continue
        if not known(request.entry):
            logger.warning("leaderbeat: %s request for %r: no such entry", request.op,
                           request.entry)
            events.append(Event(request.entry, to_ms(now), "error",
                                f"{request.op}: no such entry"))
        elif request.op == "trigger":
            task_id = trigger_task_id(prefix, request.entry, request.id)
            if publish(request.entry, now, task_id):
                logger.info("leaderbeat: triggered %s now (task %s)%s", request.entry, task_id,
                            f": {request.note}" if request.note else "")
                events.append(Event(request.entry, to_ms(now), "triggered",
                                    request.note or f"request {request.id}"))
            else:
                events.append(Event(request.entry, to_ms(now), "unsent", "trigger: publish failed"))
        elif request.op == "backfill":
            events += _backfill(queue, request, publish, stored(request.entry),
                                memory or SentMemory())
    if events:
        ledger.record(epoch, events)
    return len(raw)


def _backfill(queue: RequestQueue, request: Request, publish: Publish,
              last_ms: int | None, memory: SentMemory) -> list[Event]:
    """Send each requested slot once ever: the queue marks what a backfill sent.

    Only slots the schedule has settled (before the entry's last slot) qualify: a
    later one is the schedule's own, sent when due, and backfilling it would send
    it twice.
    """
    events = []
    sent = 0
    for slot_ms in sorted(request.slots_ms):
        if last_ms is None or slot_ms >= last_ms:
            events.append(Event(request.entry, slot_ms, "skipped",
                                "backfill: not settled by the schedule yet (sent when due)"))
        elif memory.published(request.entry, slot_ms):
            events.append(Event(request.entry, slot_ms, "skipped", "backfill: sent on time"))
        elif not queue.mark_backfilled(request.entry, slot_ms, request.id):
            events.append(Event(request.entry, slot_ms, "skipped", "backfill: sent before"))
        elif publish(request.entry, from_ms(slot_ms), None):
            sent += 1
            events.append(Event(request.entry, slot_ms, "sent", f"backfill {request.id}"))
        else:
            events.append(Event(request.entry, slot_ms, "unsent", "backfill: publish failed"))
    logger.info("leaderbeat: backfilled %d of %d slot(s) of %s", sent, len(request.slots_ms),
                request.entry)
    return events

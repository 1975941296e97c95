"""One batch of the leader: claim every due slot in one call, send the granted, record.

The order is the guarantee: nothing is published before Redis granted its
claim under this node's token, and nothing is published once the lease can
no longer be confirmed (self-fencing), so a slot is sent at most once. What
happened to each slot (sent, unsent and why, missed and why) goes to the
history in one more call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from .agenda import Tracked, Unsent, claim_items, missed_events
from .errors import LeaseLostError, NotReplicatedError
from .lease import Lease
from .ledger import Event, Ledger, SlotState
from .slots import Plan, from_ms, to_ms

logger = logging.getLogger(__name__)

#: publishes one slot of one entry; False when the broker refused it
Send = Callable[[str, datetime], bool]


def claim_and_send(due: Sequence[tuple[Tracked, Plan]], *, lease: Lease, ledger: Ledger,
                   send: Send, capped: set[str]) -> int:
    """Claim, send and record one batch; advance each entry. Returns how many were sent.

    Raises LeaseLostError when the claim was refused (another node leads) or the
    lease expired while sending; the slots not sent are recorded ``unsent``.
    """
    items = claim_items(due)
    replicated = True
    try:
        results = ledger.claim(*lease.credentials(), items) if items else []
    except NotReplicatedError as exc:
        # Granted on the master, but a failover could lose the claims: sending could
        # then duplicate. Not sending keeps G1; the slots are recorded unsent.
        logger.warning("leaderbeat: %s; not sending this batch", exc)
        replicated = False
        results = [None] * len(items)
    refused: dict[str, SlotState] = {}
    granted: set[tuple[str, int]] = set()
    for item, state in zip(items, results):
        if state is None:
            granted.add((item.name, item.slot_ms))
        else:
            refused[item.name] = state
    events: list[Event] = []
    fenced = False
    for tracked, p in due:
        for slot in p.send:
            if (tracked.name, to_ms(slot)) not in granted:
                continue
            if not replicated:
                events.append(Event(tracked.name, to_ms(slot), "unsent", "not replicated"))
            elif fenced or not lease.is_held():
                fenced = True
                events.append(Event(tracked.name, to_ms(slot), "unsent", "lease expired"))
            elif send(tracked.name, slot):
                events.append(Event(tracked.name, to_ms(slot), "sent"))
            else:
                events.append(Event(tracked.name, to_ms(slot), "unsent", "publish failed"))
        events += missed_events(tracked, p)
        _say_capped_once(tracked, p, capped)
        if tracked.name in refused:
            tracked.advance(max(p.last, from_ms(refused[tracked.name].slot_ms)))
        else:
            tracked.advance(p.last)
    if events:
        ledger.record(lease.credentials()[1], events)
    if fenced:
        raise LeaseLostError("lease expired while sending (self-fencing)")
    return sum(1 for ev in events if ev.event == "sent")


def _say_capped_once(tracked: Tracked, p: Plan, capped: set[str]) -> None:
    """A catch-up larger than ``max_catchup`` is logged once per entry, not per tick."""
    policy = tracked.options.policy
    if (policy.mode == "all" and tracked.name not in capped
            and any(m.reason == "max_catchup" for m in p.missed)):
        capped.add(tracked.name)
        logger.warning("leaderbeat: entry %r has more missed slots than max_catchup=%d: "
                       "the newest %d are sent, %d older ones are only recorded as missed "
                       "(said once per entry)", tracked.name, policy.max_catchup,
                       policy.max_catchup, p.missed_total)


def report_unsent(unsent: Sequence[Unsent], *, lease: Lease, ledger: Ledger, send: Send,
                  recover: bool) -> None:
    """Slots claimed by an earlier leader and never confirmed sent.

    Each is reported once (its state becomes 'u'); with ``recover``
    (``leaderbeat_recover_unsent``) every such slot, reported before or not, is
    re-sent under its own task id, so a consumer deduping by id sees it once.
    """
    new = [(n, s) for n, s, unreported in unsent if unreported]
    if new:
        logger.warning("leaderbeat: %d slot(s) were claimed but not confirmed sent by an "
                       "earlier leader: %s%s", len(new),
                       ", ".join(f"{n}@{s.isoformat()}" for n, s in new[:10]),
                       "" if recover else " (leaderbeat_recover_unsent is off: not re-sent)")
    events = [Event(n, to_ms(s), "unsent", "claimed by an earlier leader") for n, s in new]
    if recover:
        events += [Event(name, to_ms(slot), "sent", "recovered")
                   for name, slot, _ in unsent if send(name, slot)]
    ledger.record(lease.credentials()[1], events)

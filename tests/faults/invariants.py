"""The invariants every fault run is checked against (the README's G1 and G3).

- I1 (at most once): no slot (entry, slot time) is published twice, by anyone,
  and no task id twice. A trigger has a task id of its own and is left out.
- I2 (accounted for): every slot of an entry from its first accounted slot up to
  a horizon is published, or recorded in the history with a reason: ``missed``,
  ``unsent``, ``skipped`` as ``paused``, ``window``, ``disabled``, ``error``.
  A ``skipped`` "already claimed by ..." is the leader's refusal, not a reason
  the slot was not sent, and does not count.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import redis

from celery_leaderbeat.roles.loss import MARGIN_REASON
from celery_leaderbeat.store.keys import Keys
from celery_leaderbeat.timing.slots import slot_id

#: history events that say why a slot was not published
REASONS = {"missed", "unsent", "window", "disabled", "error"}
#: how the reason of a slot skipped by the margin of an entry anchored afresh begins
MARGIN_REASON_START = MARGIN_REASON.split(":")[0]


@dataclass(frozen=True)
class Published:
    """One message the recording publisher took instead of the broker."""

    node: str
    name: str
    slot_ms: int  # the slot the leaderbeat_slot header names
    header_slot: str
    epoch: int | None
    task_id: str
    at: float  # virtual wall time of the publish
    via: str = "schedule"  # or "backfill", "request" (a trigger)

    def triggered(self, prefix: str) -> bool:
        slot = datetime.fromtimestamp(self.slot_ms / 1000, timezone.utc)
        return self.task_id != slot_id(prefix, self.name, slot)


def history(client: redis.Redis, keys: Keys) -> list[dict[str, str]]:
    """Every event in the history stream, oldest first, as ``str`` fields."""
    out = []
    for _, fields in client.xrange(keys.history):
        out.append({(k.decode() if isinstance(k, bytes) else k):
                    (v.decode() if isinstance(v, bytes) else v) for k, v in fields.items()})
    return out


def duplicates(published: Sequence[Published], prefix: str) -> list[str]:
    """I1: one line per slot (or task id) published more than once."""
    problems = []
    scheduled = [p for p in published if not p.triggered(prefix)]
    by_slot = Counter((p.name, p.header_slot) for p in scheduled)
    for (name, slot), n in sorted(by_slot.items()):
        if n > 1:
            who = [f"{p.node}@epoch{p.epoch}+{p.at % 3600:.1f}s" for p in scheduled
                   if p.name == name and p.header_slot == slot]
            problems.append(f"I1: {name} slot {slot} published {n} times ({', '.join(who)})")
    doubled = {(name, slot) for (name, slot), n in by_slot.items() if n > 1}
    by_id = Counter(p.task_id for p in published)
    for tid, n in sorted(by_id.items()):
        if n == 1:
            continue
        same = {(p.name, p.header_slot) for p in published if p.task_id == tid}
        if not same <= doubled:  # a slot twice is said once, above
            problems.append(f"I1: task id {tid} published {n} times")
    return problems


def unaccounted(published: Sequence[Published], events: Iterable[Mapping[str, Any]],
                intervals: Mapping[str, float], horizon_ms: int, prefix: str) -> list[str]:
    """I2: one line per entry with slots up to ``horizon_ms`` neither published nor recorded.

    Checked without assuming a phase (an entry re-anchors after Redis lost its
    data): between two consecutive accounted slots (published, or recorded with
    a reason) of an entry no more than one interval may pass, and the last one
    must be less than an interval before the horizon. A ``missed`` event "N older
    slots not listed" accounts for the gap that ends at its slot. An entry starts
    at its first slot published by the schedule or recorded with a reason (a
    backfill may publish slots from before the entry's first one).

    An entry anchored afresh with no known state (Redis lost its data and no node
    remembers) takes a new phase: its slots from the anchoring node's start up to the
    anchor are recorded ``missed`` with the margin's reason. The old phase's last slot
    lies less than an interval before that start, the new phase's first less than one
    after it: the gap that ends at the first such record may be up to two intervals
    (an old-phase slot in it came due under the new phase as the slot recorded).
    """
    accounted: dict[str, set[int]] = defaultdict(set)
    summarised: dict[str, set[int]] = defaultdict(set)
    rephased: dict[str, set[int]] = defaultdict(set)  # margin records: a new phase
    starts: dict[str, int] = {}
    for p in published:
        if not p.triggered(prefix):
            accounted[p.name].add(p.slot_ms)
        if p.via == "schedule":
            starts[p.name] = min(starts.get(p.name, p.slot_ms), p.slot_ms)
    for ev in events:
        name, slot = ev.get("entry"), ev.get("slot")
        if not name or not slot:
            continue
        kind, detail = ev.get("event"), ev.get("detail") or ""
        if kind in REASONS or (kind == "skipped" and detail == "paused"):
            accounted[name].add(int(slot))
            starts[name] = min(starts.get(name, int(slot)), int(slot))
        if kind == "missed" and "older slots not listed" in detail:
            summarised[name].add(int(slot))
        if kind == "missed" and detail.startswith(MARGIN_REASON_START):
            rephased[name].add(int(slot))
    problems = []
    for name, interval in sorted(intervals.items()):
        step = int(interval * 1000)
        if name not in starts:
            continue
        slots = sorted(s for s in accounted[name] if starts[name] <= s <= horizon_ms)
        if not slots:
            continue
        gaps = [(a, b) for a, b in itertools.pairwise(slots)
                if b - a > step + 1 and b not in summarised[name]
                and not (b in rephased[name] and b - a < 2 * step)]
        if horizon_ms - slots[-1] > step + 1:
            gaps.append((slots[-1], horizon_ms))
        if gaps:
            shown = ", ".join(f"after {_iso(a)} until {_iso(b)}" for a, b in gaps[:3])
            problems.append(f"I2: {name}: slots neither published nor recorded with a reason "
                            f"{shown}{' ...' if len(gaps) > 3 else ''}")
    return problems


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%H:%M:%S.%f")[:-3]

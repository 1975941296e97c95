"""The invariants every fault run is checked against (the README's G1 and G3).

- I1 (at most once): no slot (entry, slot time) is published twice, by anyone,
  and no task id twice. A trigger has a task id of its own and is left out.
- I2 (accounted for): every slot of an entry from its first known slot up to a
  horizon is published, or recorded in the history with a reason: ``missed``,
  ``unsent``, ``skipped`` as ``paused``, ``window``, ``disabled``, ``error``.
  A ``skipped`` "already claimed by ..." is the leader's refusal, not a reason
  the slot was not sent, and does not count.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import redis

from celery_leaderbeat.keys import Keys
from celery_leaderbeat.slots import slot_id

#: history events that say why a slot was not published
REASONS = {"missed", "unsent", "window", "disabled", "error"}


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
                intervals: Mapping[str, float], horizon_ms: int,
                since_ms: Mapping[str, int] | None = None) -> list[str]:
    """I2: one line per entry with slots up to ``horizon_ms`` neither published nor recorded.

    An entry's slots are its first known slot (published or in the history, or
    ``since_ms[name]``) plus whole intervals.
    """
    sent: dict[str, set[int]] = defaultdict(set)
    for p in published:
        sent[p.name].add(p.slot_ms)
    reasoned: dict[str, set[int]] = defaultdict(set)
    seen: dict[str, set[int]] = defaultdict(set)
    for ev in events:
        name, slot = ev.get("entry"), ev.get("slot")
        if not name or not slot:
            continue
        seen[name].add(int(slot))
        if ev.get("event") in REASONS or (ev.get("event") == "skipped"
                                          and ev.get("detail") == "paused"):
            reasoned[name].add(int(slot))
    problems = []
    for name, interval in sorted(intervals.items()):
        step = int(interval * 1000)
        known = sent[name] | seen[name]
        first = (since_ms or {}).get(name)
        if first is None:
            if not known:
                continue
            first = min(known)
        lost = [s for s in range(first, horizon_ms + 1, step)
                if s not in sent[name] and s not in reasoned[name]]
        if lost:
            shown = ", ".join(_iso(s) for s in lost[:4])
            problems.append(f"I2: {name}: {len(lost)} slot(s) neither published nor recorded "
                            f"with a reason: {shown}{' ...' if len(lost) > 4 else ''}")
    return problems


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%H:%M:%S.%f")[:-3]

"""The soak's figures (pure: no processes): publishes, executions, guard events, lateness.

- published more than once: (entry, slot) pairs the recording consumer saw twice or more;
- executed twice: (entry, slot) pairs the task body recorded twice or more; split into
  reruns of a run whose worker was SIGKILLed before it recorded finishing (with
  ``acks_late`` the broker redelivers it and the guard runs it again, by design: a
  killed run may not have done its work) and the others (the guard's promise broken);
- published, never executed: unless the guard recorded a reason (a ``skipped`` that is not
  a duplicate) for it;
- lateness: first publish, and first execution, minus the slot time (p50, p99, worst).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


def slot_ms(value: Any) -> int:
    return round(datetime.fromisoformat(str(value)).timestamp() * 1000)


def percentiles(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, p50, p99 and worst of ``values`` (nearest-rank), seconds rounded to ms."""
    if not values:
        return {"n": 0, "p50": None, "p99": None, "worst": None}
    ordered = sorted(values)

    def rank(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, max(0, int(p * len(ordered) + 0.5) - 1))], 3)

    return {"n": len(ordered), "p50": rank(0.50), "p99": rank(0.99),
            "worst": round(ordered[-1], 3)}


def soak_figures(*, published: Iterable[tuple[str | None, Any, str, float]],
                 executed: Iterable[Mapping[str, Any]], history: Iterable[Mapping[str, str]],
                 end_ms: int, killed_workers: Mapping[str, float] | None = None,
                 limit: int = 20) -> dict[str, Any]:
    """Figures from publishes ``(entry, slot, task id, received)``, execution rows and history.

    Slots newer than ``end_ms`` are left out of "published, never executed".
    ``killed_workers``: worker node name (before the ``@``) -> wall time of its SIGKILL.
    """
    killed = dict(killed_workers or {})
    pubs = _publishes(published)
    runs = _runs(executed)
    hist = _History.read(history)

    twice_pub = sorted(k for k, v in pubs.items() if len(v) > 1)
    twice_run = sorted(k for k, v in runs.items() if len(v) > 1)
    reruns = [k for k in twice_run
              if _killed_mid_run(runs[k], hist.finished_by.get(k, ()), killed)]
    rerun_set = set(reruns)
    twice_other = [k for k in twice_run if k not in rerun_set]
    never_run = sorted(k for k in pubs if k not in runs and k[1] <= end_ms)
    explained = [k for k in never_run if k in hist.guard_skips]
    unexplained = [k for k in never_run if k not in hist.guard_skips]

    return {
        "slots_published": len(pubs),
        "publishes": sum(len(v) for v in pubs.values()),
        "published_more_than_once": len(twice_pub),
        "extra_publishes": sum(len(pubs[k]) - 1 for k in twice_pub),
        "published_more_than_once_examples": [_pub_text(k, pubs[k]) for k in twice_pub[:limit]],
        "history_sent_more_than_once": sum(1 for n in hist.sent.values() if n > 1),
        "slots_executed": len(runs),
        "executions": sum(len(v) for v in runs.values()),
        "executed_twice": len(twice_other),
        "executed_twice_examples": [_run_text(k, runs[k]) for k in twice_other[:limit]],
        "executed_twice_rerun_after_worker_kill": len(reruns),
        "executed_twice_rerun_examples": [_run_text(k, runs[k]) for k in reruns[:limit]],
        "published_never_executed": len(unexplained),
        "published_never_executed_examples": [f"{e}@{s}" for e, s in unexplained[:limit]],
        "published_not_executed_guard_reason": len(explained),
        "guard_events": dict(hist.events),
        "lateness_publish_s": percentiles(
            [min(r for r, _ in v) - k[1] / 1000 for k, v in pubs.items()]),
        "lateness_execution_s": percentiles(
            [min(float(r.get("at", 0)) for r in v) - k[1] / 1000 for k, v in runs.items()]),
    }


def _publishes(published: Iterable[tuple[str | None, Any, str, float]]
               ) -> dict[tuple[str, int], list[tuple[float, str]]]:
    """(received, task id) of each publish, by (entry, slot ms); those without headers left out."""
    pubs: dict[tuple[str, int], list[tuple[float, str]]] = defaultdict(list)
    for entry, slot, task_id, received in published:
        if entry is None or slot is None:
            continue
        pubs[(entry, slot_ms(slot))].append((received, task_id))
    return pubs


def _runs(executed: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], list[Mapping[str, Any]]]:
    """The execution rows by (entry, slot ms); those without an entry or slot left out."""
    runs: dict[tuple[str, int], list[Mapping[str, Any]]] = defaultdict(list)
    for row in executed:
        if row.get("entry") is None or row.get("slot") is None:
            continue
        runs[(str(row["entry"]), slot_ms(row["slot"]))].append(row)
    return runs


def _slot_key(h: Mapping[str, str]) -> tuple[str, int] | None:
    """A history event's (entry, slot ms); None when it names no slot."""
    slot = h.get("slot", "")
    return (h.get("entry", ""), int(slot)) if slot.isdigit() else None


@dataclass
class _History:
    """What the soak's figures take from the history: the guard's and the beats' events
    counted, the guard's overlap skips, the 'sent' events and the nodes that recorded a
    run finished, by (entry, slot ms)."""

    events: Counter[str] = field(default_factory=Counter)
    guard_skips: dict[tuple[str, int], str] = field(default_factory=dict)
    sent: Counter[tuple[str, int]] = field(default_factory=Counter)
    finished_by: dict[tuple[str, int], set[str]] = field(
        default_factory=lambda: defaultdict(set))

    @classmethod
    def read(cls, history: Iterable[Mapping[str, str]]) -> _History:
        hist = cls()
        for h in history:
            hist.add(h)
        return hist

    def add(self, h: Mapping[str, str]) -> None:
        event, detail = h.get("event", ""), h.get("detail", "")
        if event == "started":
            self.events["guard started" + (" (rerun)" if detail.startswith("rerun") else "")] += 1
        elif event == "skipped":
            self._skipped(h, detail)
        elif event == "finished":
            self.events["guard finished"] += 1
            key = _slot_key(h)
            if key is not None:
                self.finished_by[key].add(h.get("node", ""))
        elif event == "sent":
            key = _slot_key(h)
            if key is not None:
                self.sent[key] += 1

    def _skipped(self, h: Mapping[str, str], detail: str) -> None:
        if detail.startswith("duplicate"):
            self.events["guard skipped duplicate"] += 1
        elif detail.startswith("overlap"):
            self.events["guard skipped overlap"] += 1
            key = _slot_key(h)
            if key is not None:
                self.guard_skips[key] = detail
        else:  # a beat's: the slot was claimed by another node
            self.events["beat skipped"] += 1


def _killed_mid_run(rows: Sequence[Mapping[str, Any]], finished_by: Iterable[str],
                    killed: Mapping[str, float]) -> bool:
    """Every run of a slot but the last: its worker was killed after it began, and no
    'finished' from its process is in the (copied) history."""
    rows = sorted(rows, key=lambda r: float(r.get("at", 0)))
    for r in rows[:-1]:
        name = str(r.get("hostname", "")).split("@")[0]
        pid = str(r.get("pid", ""))
        finished = any(node.endswith(":" + pid) for node in finished_by)
        if not (name in killed and killed[name] >= float(r.get("at", 0)) and not finished):
            return False
    return True


def _pub_text(key: tuple[str, int], publishes: Sequence[tuple[float, str]]) -> str:
    times = sorted(publishes)
    ids = {t for _, t in times}
    return (f"{key[0]}@{key[1]}: {len(times)} publishes "
            f"(+{times[-1][0] - times[0][0]:.2f}s, {len(ids)} task id(s))")


def _run_text(key: tuple[str, int], rows: Sequence[Mapping[str, Any]]) -> str:
    rows = sorted(rows, key=lambda r: float(r.get("at", 0)))
    return (f"{key[0]}@{key[1]}: " + ", ".join(
        f"{r.get('hostname')} at {float(r.get('at', 0)) - key[1] / 1000:+.2f}s"
        f"{' redelivered' if r.get('redelivered') else ''} epoch {r.get('epoch')}"
        for r in rows))

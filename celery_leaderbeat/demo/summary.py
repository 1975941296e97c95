"""What the demo measured: slots expected and run, duplicates, misses, lateness, failovers.

Pure functions over what the demo read from Redis at the end: the runs the
worker recorded, the leaderbeat history stream and each entry's anchor. No
Redis, no clock. The expected slots are computed here from the schedule,
independently of celery_leaderbeat's own slot code, so the demo checks the
scheduler instead of repeating it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import pairwise
from typing import Any

from ..timing.iso import from_iso


@dataclass(frozen=True)
class Rhythm:
    """How an entry's slots fall: every ``period`` s from its anchor, or on multiples of it."""

    period: float
    aligned: bool  # True: a cron step (slots on the wall clock's multiples of ``period``)

    def slots(self, anchor_ms: int, until_ms: int) -> list[int]:
        """The slots strictly after ``anchor_ms``, up to and including ``until_ms``."""
        step = round(self.period * 1000)
        first = (anchor_ms // step + 1) * step if self.aligned else anchor_ms + step
        return list(range(first, until_ms + 1, step))


@dataclass(frozen=True)
class Signalled:
    """One fault the demo injected: ``signal`` sent to the leader ``node`` at ``at`` (s)."""

    signal: str
    at: float
    beat: int
    pid: int
    node: str


def slot_ms(iso: str | None) -> int | None:
    """The ``leaderbeat_slot`` header (ISO time) as epoch milliseconds."""
    if not iso:
        return None
    moment = from_iso(iso)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return round(moment.timestamp() * 1000)


def stream_ms(event_id: str) -> int:
    """The Redis time, in ms, at which a stream event was written (its id's first part)."""
    return int(event_id.split("-", 1)[0])


def summarize(*, runs: Sequence[Mapping[str, Any]], history: Sequence[Mapping[str, str]],
              anchors: Mapping[str, int], rhythms: Mapping[str, Rhythm], until: float,
              signals: Sequence[Signalled], beat_of: Mapping[str, int],
              origin: float) -> dict[str, Any]:
    """The demo's verdict as one JSON-able dict.

    ``history`` rows carry their stream ``id``; ``until`` is the end of the run
    window (s); times in the result are seconds, relative to ``origin`` where
    they are points in time.
    """
    until_ms = round(until * 1000)
    expected = {(name, s) for name, anchor in anchors.items()
                for s in rhythms[name].slots(anchor, until_ms)}
    sends = sorted(((stream_ms(h["id"]), h) for h in history if h.get("event") == "sent"),
                   key=lambda pair: pair[0])
    failovers = [_failover(sig, history, sends, beat_of, origin) for sig in signals]
    leaderless = [(round(sig.at * 1000), round(sig.at * 1000 + f["new_leader_elected_after_s"]
                                               * 1000))
                  for sig, f in zip(signals, failovers) if f["new_leader_elected_after_s"]]
    return {
        **_slots(runs, expected, leaderless),
        "missed_recorded_by_leaderbeat": sum(1 for h in history if h.get("event") == "missed"),
        **_lateness(runs),
        "failovers": failovers,
        **_gaps([ms for ms, _ in sends], origin),
        "window_s": [round(min(anchors.values(), default=until_ms) / 1000 - origin, 1),
                     round(until - origin, 1)],
    }


def _slots(runs: Sequence[Mapping[str, Any]], expected: set[tuple[str, int]],
           leaderless: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """What ran against what was due: duplicates, misses, runs outside the window."""
    counts = Counter((str(r.get("entry")), slot_ms(r.get("slot"))) for r in runs)
    ran = {key for key in counts if key in expected}
    missed = sorted(expected - ran, key=lambda k: (k[1], k[0]))
    return {
        "expected": len(expected),
        "executed": len(ran),
        "runs": sum(counts.values()),
        "duplicates": sum(n - 1 for n in counts.values() if n > 1),
        "duplicate_slots": [_slot_row(k) for k, n in sorted(counts.items(), key=str) if n > 1],
        "missed": len(missed),
        "missed_slots": [_slot_row(k) for k in missed],
        # a miss outside every signal-to-election window would be a scheduler bug
        "missed_outside_failovers": sum(1 for _, ms in missed
                                        if not any(a <= ms <= b for a, b in leaderless)),
        "runs_outside_window": sum(1 for key in counts if key not in expected),
    }


def _lateness(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The latest run after its slot, and which slot it was."""
    lateness = [(float(r["started"]) - (slot_ms(r.get("slot")) or 0) / 1000, r) for r in runs
                if r.get("slot")]
    worst = max(lateness, key=lambda pair: pair[0], default=None)
    if worst is None:
        return {"worst_lateness_s": None, "worst_lateness_slot": None}
    late, run = worst
    return {"worst_lateness_s": round(late, 3),
            "worst_lateness_slot": _slot_row((str(run["entry"]), slot_ms(run["slot"])))}


def _gaps(sends_ms: Sequence[int], origin: float) -> dict[str, Any]:
    """The longest wait between consecutive sends, and when it ended."""
    gap, gap_end = _longest_gap(sends_ms)
    return {"longest_gap_s": round(gap / 1000, 3) if gap is not None else None,
            "longest_gap_ended_at_s": round(gap_end / 1000 - origin, 1) if gap_end else None}


def _slot_row(key: tuple[str, int | None]) -> dict[str, Any]:
    name, ms = key
    iso = (datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")
           if ms is not None else None)
    return {"entry": name, "slot": iso}


def _longest_gap(times_ms: Sequence[int]) -> tuple[int | None, int | None]:
    """The longest wait between consecutive sends, and when it ended."""
    gaps = [(b - a, b) for a, b in pairwise(times_ms)]
    if not gaps:
        return None, None
    return max(gaps)


def _failover(sig: Signalled, history: Sequence[Mapping[str, str]],
              sends: Sequence[tuple[int, Mapping[str, str]]], beat_of: Mapping[str, int],
              origin: float) -> dict[str, Any]:
    """How long the schedule waited after ``sig``: to a new leader, and to its first send."""
    at_ms = round(sig.at * 1000)
    elected = next((h for h in history if h.get("event") == "elected"
                    and stream_ms(h["id"]) >= at_ms and h.get("node") != sig.node), None)
    released = next((h for h in history if h.get("event") == "released"
                     and stream_ms(h["id"]) >= at_ms and h.get("node") == sig.node), None)
    first = next(((ms, h) for ms, h in sends if ms >= at_ms and h.get("node") != sig.node),
                 None)
    before = [ms for ms, _ in sends if ms < at_ms]
    row: dict[str, Any] = {
        "signal": sig.signal,
        "at_s": round(sig.at - origin, 1),
        "beat": sig.beat,
        "pid": sig.pid,
        "released_after_s": None,  # a SIGKILLed leader never releases: its lease expires
        "new_leader_beat": beat_of.get(elected["node"]) if elected else None,
        "new_leader_elected_after_s": None,
        "first_send_by_another_beat_after_s": None,
        "send_gap_s": None,
    }
    if released:
        row["released_after_s"] = round((stream_ms(released["id"]) - at_ms) / 1000, 3)
    if elected:
        row["new_leader_elected_after_s"] = round((stream_ms(elected["id"]) - at_ms) / 1000, 3)
    if first:
        row["first_send_by_another_beat_after_s"] = round((first[0] - at_ms) / 1000, 3)
        if before:
            row["send_gap_s"] = round((first[0] - before[-1]) / 1000, 3)
    return row

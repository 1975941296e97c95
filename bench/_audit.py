"""What bench/reliability.py reads back: the broker, the history stream, and the audit.

A ``Drain`` thread takes every message off the broker every 20 ms (Recorder:
LRANGE + DEL in MULTI), so each message is seen exactly once and its
``received`` time is at most ~20 ms after the broker had it. ``history()``
reads the whole history stream of a prefix. ``audit()`` puts the two side by
side, per entry and slot:

- **twice**: an (entry, slot) the broker received more than once;
- **unrecorded**: a due slot neither published nor named by a history event
  (``sent``, ``unsent``, ``missed``, ``skipped``) -- a hole in the grid of an
  entry's slots, or after its last known slot, with no record;
- **recorded, not published**: a due slot not published but recorded, by reason.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections import Counter, defaultdict
from datetime import datetime
from typing import Any, cast

import redis

from celery_leaderbeat.store.keys import Keys
from tests.support.recorder import Message, Recorder

SLOT_EVENTS = ("sent", "unsent", "missed", "skipped")
NOT_LISTED = re.compile(r"(\d+) older slots not listed")


class Drain:
    """A Recorder drained by a background thread every ``period`` s."""

    def __init__(self, client: redis.Redis, period: float = 0.02) -> None:
        self.recorder = Recorder(client)
        self.period = period
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                with self._lock:
                    self.recorder.drain()
            except redis.RedisError:
                pass

    @property
    def count(self) -> int:
        return len(self.recorder.messages)

    @property
    def messages(self) -> list[Message]:
        with self._lock:
            return list(self.recorder.messages)

    def wait_count(self, n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.count < n:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def first_after(self, t: float, timeout: float, where: Any = None) -> Message | None:
        """The first message received after wall time ``t`` (matching ``where``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in self.messages:
                if m.received > t and (where is None or where(m)):
                    return m
            time.sleep(0.02)
        return None

    def close(self) -> list[Message]:
        self._stop.set()
        self._thread.join(5)
        with self._lock:
            self.recorder.drain()
        return self.recorder.messages


def history(client: redis.Redis, prefix: str) -> list[dict[str, str]]:
    """Every event of the prefix's history stream, oldest first."""
    rows = []
    # a client without decode_responses answers bytes; XRANGE, every entry with its fields
    stream = cast("list[tuple[bytes, dict[bytes, bytes]]]", client.xrange(Keys(prefix).history))
    for event_id, fields in stream:
        row = {k.decode(): v.decode() for k, v in fields.items()}
        row["id"] = event_id.decode()
        rows.append(row)
    return rows


def slot_ms(m: Message) -> int:
    return round(datetime.fromisoformat(str(m.slot)).timestamp() * 1000)


def pid_of(m: Message) -> int | None:
    found = re.match(r"gen(\d+)@", str(m.headers.get("origin") or ""))
    return int(found.group(1)) if found else None


def audit(messages: list[Message], events: list[dict[str, str]], every: float, until: float,
          since: float = 0.0) -> dict[str, Any]:
    """Slots twice, slots unrecorded and slots recorded-not-published, for slots due
    in [``since``, ``until``] (wall time, s) of entries every ``every`` s."""
    step = round(every * 1000)
    pub = _published(messages)
    hist, notes = _recorded(events)
    lo, hi = since * 1000, until * 1000
    twice = _twice(pub, hist)
    names = {n for n, _ in pub} | {n for n, _ in hist}
    unrecorded: list[dict[str, Any]] = []
    counted = 0
    reasons: Counter = Counter()
    sent_not_published = []
    for name in sorted(names):
        known = sorted({s for n, s in pub if n == name} | {s for n, s in hist if n == name})
        for s in _holes(known, step, hi):
            if not lo <= s <= hi:
                continue
            if any(n >= s for n in notes.get(name, [])):
                counted += 1
            else:
                unrecorded.append({"entry": name, "slot": s})
        for s in known:
            if lo <= s <= hi and (name, s) not in pub:
                evs = hist[(name, s)]
                reasons[" / ".join(sorted({f"{e['event']}: {e.get('detail', '')}"
                                           for e in evs}))] += 1
                if any(e["event"] == "sent" for e in evs):
                    sent_not_published.append({"entry": name, "slot": s})
    return {"published": len(messages), "slots_twice": len(twice),
            "messages_twice": sum(len(t["copies"]) - 1 for t in twice),
            "unrecorded": len(unrecorded), "unrecorded_counted_only": counted,
            "recorded_not_published": dict(reasons),
            "history_sent_not_published": len(sent_not_published),
            "twice_detail": twice[:20], "unrecorded_detail": unrecorded[:200]}


def _published(messages: list[Message]) -> dict[tuple[str, int], list[Message]]:
    """The messages of each (entry, slot ms) the broker received."""
    pub: dict[tuple[str, int], list[Message]] = defaultdict(list)
    for m in messages:
        if m.entry is not None and m.slot is not None:
            pub[(m.entry, slot_ms(m))].append(m)
    return pub


def _recorded(events: list[dict[str, str]]
              ) -> tuple[dict[tuple[str, int], list[dict[str, str]]], dict[str, list[int]]]:
    """The slot events of each (entry, slot ms), and each entry's slots whose event says
    "N older slots not listed" (the slots before one are counted, not recorded each)."""
    hist: dict[tuple[str, int], list[dict[str, str]]] = defaultdict(list)
    notes: dict[str, list[int]] = defaultdict(list)
    for e in events:
        if e.get("event") in SLOT_EVENTS and e.get("entry") and e.get("slot"):
            hist[(e["entry"], int(e["slot"]))].append(e)
            if NOT_LISTED.search(e.get("detail", "")):
                notes[e["entry"]].append(int(e["slot"]))
    return hist, notes


def _twice(pub: dict[tuple[str, int], list[Message]],
           hist: dict[tuple[str, int], list[dict[str, str]]]) -> list[dict[str, Any]]:
    """Each (entry, slot) the broker received more than once: its copies and its history."""
    twice = []
    for (name, slot), ms in sorted(pub.items()):
        if len(ms) > 1:
            twice.append({"entry": name, "slot": slot,
                          "copies": [{"epoch": m.epoch, "pid": pid_of(m), "id": m.id,
                                      "received": round(m.received, 3)} for m in ms],
                          "history": [f"{e['event']} {e.get('detail', '')} epoch {e.get('epoch')}"
                                      for e in hist.get((name, slot), [])]})
    return twice


def _holes(known: list[int], step: int, hi: float) -> list[int]:
    """The slots of an entry's grid (every ``step`` ms) missing from ``known`` (sorted):
    between two known ones, and after the last up to ``hi``."""
    holes = []
    for a, b in itertools.pairwise(known):
        k = round((b - a) / step) - 1
        holes += [a + i * step for i in range(1, k + 1)]
    s = known[-1] + step
    while s <= hi:
        holes.append(s)
        s += step
    return holes


def by_source(messages: list[Message]) -> Counter:
    """'leader' (epoch > 0) or 'rescue' (epoch 0) counts."""
    return Counter("rescue" if m.epoch == 0 else "leader" for m in messages)

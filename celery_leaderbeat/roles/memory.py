"""What this process published: the memory that outlives a lost Redis reply.

Every Redis call can fail after the server ran it: a claim granted, a
``sent`` record written, and the reply lost. Redis can also lose writes it
acknowledged (restarted empty, restored from an older snapshot, failed over
to a lagging replica). Either way the slot states in Redis may say less than
what this process knows it did. The rule: what this process published is
never published again by it, whatever Redis says, and its memory never moves
backwards because of a reply that did not arrive.

The memory is per process and per entry: the newest slot published and the
few slots before it (exact, for recovery checks). It is bounded by the number
of entries, and forgets entries that leave the schedule.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

#: exact slots remembered per entry besides the newest
RECENT = 16
#: slots this process backfilled, remembered per entry (a backfill's range is capped)
BACKFILLS = 1000


class SentMemory:
    """The slots this process published, per entry."""

    def __init__(self) -> None:
        self._newest: dict[str, int] = {}
        self._recent: dict[str, deque[int]] = {}
        #: the newest slot of each entry this process saw settled by anyone (sent, claimed
        #: or passed over: read from Redis, or learnt from a refused claim)
        self._known: dict[str, int] = {}
        #: slots this process sent for a backfill request (older than the entry's last
        #: slot, so neither ``covers`` nor ``published`` tells them)
        self._backfilled: dict[str, deque[int]] = {}

    def note(self, name: str, slot_ms: int) -> None:
        """``slot_ms`` of ``name`` was published by this process."""
        recent = self._recent.get(name)
        if recent is None:
            recent = self._recent[name] = deque(maxlen=RECENT)
        recent.append(slot_ms)
        if slot_ms > self._newest.get(name, -1):
            self._newest[name] = slot_ms

    def published(self, name: str, slot_ms: int) -> bool:
        """True when this process published exactly this slot (as far as it remembers)."""
        return slot_ms in self._recent.get(name, ())

    def note_backfill(self, name: str, slot_ms: int) -> None:
        """``slot_ms`` of ``name`` was published by this process for a backfill."""
        done = self._backfilled.get(name)
        if done is None:
            done = self._backfilled[name] = deque(maxlen=BACKFILLS)
        done.append(slot_ms)

    def backfilled(self, name: str, slot_ms: int) -> bool:
        """True when this process backfilled exactly this slot (as far as it remembers):
        Redis going back to older state can bring a backfill request back."""
        return slot_ms in self._backfilled.get(name, ())

    def covers(self, name: str, slot_ms: int) -> bool:
        """True when ``slot_ms`` is not newer than a slot this process published.

        The schedule's slots go out oldest first and claims only move forward, so a
        slot at or before one this process sent is either that slot or one it passed.
        """
        return slot_ms <= self._newest.get(name, -1)

    def know(self, name: str, slot_ms: int) -> None:
        """``slot_ms`` of ``name`` is settled, by this process or another."""
        if slot_ms > self._known.get(name, -1):
            self._known[name] = slot_ms

    def newest_known(self, name: str) -> int | None:
        """The newest slot of ``name`` this process knows was settled, by anyone: where a
        leader that led until Redis lost its data carries on from (its own sends alone
        are not enough: another leader may have sent later slots before it led again)."""
        sent, known = self._newest.get(name), self._known.get(name)
        if sent is None:
            return known
        return sent if known is None else max(sent, known)

    def settled(self) -> dict[str, int]:
        """Per entry, the newest slot this process knows was settled (:meth:`newest_known`)."""
        return {name: known for name in {*self._newest, *self._known}
                if (known := self.newest_known(name)) is not None}

    def items(self) -> Iterable[tuple[str, int]]:
        return self._newest.items()

    def keep_only(self, names: Iterable[str]) -> None:
        """Forget entries no longer scheduled (bounded by the schedule, not its history)."""
        keep = set(names)
        for name in [n for n in self._newest if n not in keep]:
            del self._newest[name]
            self._recent.pop(name, None)
        for name in [n for n in self._known if n not in keep]:
            del self._known[name]
        for name in [n for n in self._backfilled if n not in keep]:
            del self._backfilled[name]

    def __len__(self) -> int:
        return max(len(self._newest), len(self._known))

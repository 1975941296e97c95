"""The in-memory store's run-time entries: ``entries.lua`` in Python, under the state's lock."""

from __future__ import annotations

from ..errors import EntryExists, EntryNotFound
from .entry_store import REMOVED_CAP
from .memory_state import MemoryState
from .records import Changes, Saved, Stored


class MemoryEntries:
    """The run-time entries of one in-memory store: ``entries.lua``."""

    def __init__(self, state: MemoryState) -> None:
        self.state = state

    def _bump(self) -> int:
        self.state.entries_version += 1
        return self.state.entries_version

    def save(self, name: str, *, fingerprint: str, timing: str, enabled: bool,
             definition: str, how: str = "upsert", anchor_ms: int | None = None,
             first_ms: int | None = None) -> Saved:
        s = self.state
        with s.lock:
            current = s.entries.get(name)
            micros = s.now_us()
            anchor = (micros // 1_000_000 + (1 if micros % 1_000_000 else 0)) * 1000
            if current is not None:
                if how == "create":
                    raise EntryExists(name, "a runtime entry of that name is stored")
                if current.fingerprint == fingerprint and current.enabled == enabled:
                    return Saved(False, current.version, current.anchor_ms)
                if current.timing == timing and (current.enabled or not enabled):
                    anchor = current.anchor_ms
            elif how == "update":
                raise EntryNotFound(name, "among the runtime entries")
            if anchor_ms is not None:
                anchor = anchor_ms
            version = self._bump()
            kept = anchor_ms is not None or (current is not None and current.kept)
            s.entries[name] = Stored(name, version, anchor, fingerprint, timing, enabled, None,
                                     definition, kept)
            s.entries_changed[name] = version
            s.entries_removed.pop(name, None)
            if enabled:
                first = anchor if first_ms is None else min(anchor, first_ms)
                s.slots.setdefault(name, f"{first}|0|a")
            return Saved(True, version, anchor)

    def delete(self, name: str) -> bool:
        s = self.state
        with s.lock:
            if s.entries.pop(name, None) is None:
                return False
            version = self._bump()
            s.entries_changed.pop(name, None)
            s.entries_removed[name] = version
            extra = len(s.entries_removed) - REMOVED_CAP
            if extra > 0:
                oldest = sorted(s.entries_removed.items(), key=lambda kv: kv[1])[:extra]
                s.entries_floor = oldest[-1][1]
                for gone, _ in oldest:
                    del s.entries_removed[gone]
            return True

    def finish(self, name: str, fingerprint: str, slot_ms: int) -> bool:
        s = self.state
        with s.lock:
            current = s.entries.get(name)
            if current is None or current.fingerprint != fingerprint or not current.enabled:
                return False
            version = self._bump()
            s.entries[name] = Stored(name, version, current.anchor_ms, current.fingerprint,
                                     current.timing, False, slot_ms, current.definition,
                                     current.kept)
            s.entries_changed[name] = version
            return True

    def get(self, name: str) -> Stored | None:
        with self.state.lock:
            stored: Stored | None = self.state.entries.get(name)
            return stored

    def all(self) -> dict[str, Stored]:
        with self.state.lock:
            return dict(self.state.entries)

    def names(self) -> list[str]:
        with self.state.lock:
            return list(self.state.entries)

    def changes(self, seen: int) -> Changes:
        s = self.state
        with s.lock:
            version = s.entries_version
            if version == seen:
                return Changes(version, seen < 0, {}, [])
            full = seen < s.entries_floor or seen > version
            if full:
                names = list(s.entries)
            else:
                names = sorted((n for n, v in s.entries_changed.items() if v > seen),
                               key=lambda n: s.entries_changed[n])
            removed = [] if full else sorted(
                (n for n, v in s.entries_removed.items() if v > seen),
                key=lambda n: s.entries_removed[n])
            return Changes(version, full or seen < 0, {n: s.entries[n] for n in names}, removed)

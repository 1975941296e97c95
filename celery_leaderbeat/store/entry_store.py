"""The Redis store of entries defined at run time: atomic, versioned, read by change.

Every entry is one hash field (a header line, then its JSON definition; never
pickle). One script (``lua/entries.lua``) does every write, so a save is atomic:
it bumps one version counter, stamps the entry with it and notes the name in a
sorted set of changes. A node that has seen version ``v`` asks for what changed
since ``v`` and gets only those names (and the removed ones): a change costs in
proportion to what changed, not to the number of entries. When nothing changed
the same call answers with the version alone.

Every call can fail, before or after Redis ran it. A save repeated after a lost
reply finds its own definition stored and changes nothing; a repeated delete
answers "unknown", which :meth:`EntryStore.delete` reports as False.
"""

from __future__ import annotations

from typing import Any

from ..errors import EntryExists, EntryNotFound, ScriptError
from .keys import Keys
from .records import Changes, Saved, Stored
from .scripts import source, text

#: removed names remembered for nodes that are behind; older ones force a full read
REMOVED_CAP = 10_000


def parse_stored(name: str, raw: Any) -> Stored:
    """One entry as ``entries.lua`` stores it: a header line, then the definition JSON."""
    header, _, body = text(raw).partition("\n")
    version, anchor, fp, timing, enabled, ran, kept = header.split("|")
    return Stored(name, int(version), int(anchor), fp, timing, enabled == "1",
                  int(ran) if ran else None, body, kept == "1")


#: an update refused: no entry of that name is stored (the name this module always used)
EntryUnknown = EntryNotFound


class EntryStore:
    """The dynamic entries of one key prefix (the Redis
    :class:`~celery_leaderbeat.store.base.EntryDefinitions`)."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._script = client.register_script(source("entries"))

    def _call(self, *args: Any) -> Any:
        k = self.keys
        return self._script(keys=[k.entries, k.entries_meta, k.entries_changed,
                                  k.entries_removed, k.slots], args=list(args))

    def save(self, name: str, *, fingerprint: str, timing: str, enabled: bool,
             definition: str, how: str = "upsert", anchor_ms: int | None = None,
             first_ms: int | None = None) -> Saved:
        """Store one definition atomically (see ``lua/entries.lua`` for ``how``).

        An enabled entry with no slot state gets its first one, at its anchor (or
        ``first_ms``, a one-off's slot less 1 ms, when earlier), in the same step.
        """
        reply = self._call("save", name, how, fingerprint, timing, "1" if enabled else "0",
                           "" if anchor_ms is None else str(anchor_ms), definition,
                           "" if first_ms is None else str(first_ms))
        code = int(reply[0])
        if code == 2:
            raise EntryExists(name, "a runtime entry of that name is stored")
        if code == 3:
            raise EntryNotFound(name, "among the runtime entries")
        if code not in (0, 1):
            raise ScriptError(f"entries.lua answered {reply!r} to a save")
        return Saved(code == 1, int(reply[1]), int(reply[2]))

    def delete(self, name: str) -> bool:
        """Remove one entry; False when none was stored (or a retried delete already ran)."""
        return int(self._call("delete", name, REMOVED_CAP)[0]) == 1

    def finish(self, name: str, fingerprint: str, slot_ms: int) -> bool:
        """A one-off entry ran its slot: disable it, recording the slot (this definition only)."""
        return int(self._call("finish", name, fingerprint, slot_ms)[0]) == 1

    def get(self, name: str) -> Stored | None:
        raw = self.client.hget(self.keys.entries, name)
        return None if raw is None else parse_stored(name, raw)

    def all(self) -> dict[str, Stored]:
        return {text(k): parse_stored(text(k), v)
                for k, v in self.client.hgetall(self.keys.entries).items()}

    def names(self) -> list[str]:
        return [text(k) for k in self.client.hkeys(self.keys.entries)]

    def changes(self, seen: int) -> Changes:
        """What changed since version ``seen`` (-1: everything). One round trip."""
        reply = self._call("changes", seen)
        version, full, n = int(reply[0]), bool(int(reply[1])), int(reply[2])
        saved: dict[str, Stored] = {}
        for i in range(3, 3 + 2 * n, 2):
            name = text(reply[i])
            if reply[i + 1] is not None and reply[i + 1] is not False:
                saved[name] = parse_stored(name, reply[i + 1])
        removed = [text(name) for name in reply[3 + 2 * n:]]
        return Changes(version, full or seen < 0, saved, removed)


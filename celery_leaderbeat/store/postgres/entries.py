"""The seam's run-time entries over :mod:`.entries_sql`."""

from __future__ import annotations

from ...errors import EntryExists, EntryNotFound
from ..records import Changes, Saved, Stored
from . import entries_sql
from .place import Place


def _stored(row: entries_sql.Row) -> Stored:
    return Stored(row.name, row.version, row.anchor_ms, row.fingerprint, row.timing,
                  row.enabled, row.ran_ms, row.definition, row.kept)


class PostgresEntries:
    """The run-time entries of one app: every save atomic and versioned, read by change."""

    def __init__(self, place: Place) -> None:
        self.place = place

    def save(self, name: str, *, fingerprint: str, timing: str, enabled: bool,
             definition: str, how: str = "upsert", anchor_ms: int | None = None,
             first_ms: int | None = None) -> Saved:
        """Store one definition (``how``: upsert, create or update)."""
        asked = entries_sql.Save(name, how, fingerprint, timing, enabled, definition,
                                 anchor_ms, first_ms)
        code, version, anchor = self.place.run(entries_sql.save, asked)
        if code == 2:
            raise EntryExists(name, "a runtime entry of that name is stored")
        if code == 3:
            raise EntryNotFound(name, "among the runtime entries")
        return Saved(code == 1, version, anchor)

    def delete(self, name: str) -> bool:
        return self.place.run(entries_sql.delete, name) is not None

    def finish(self, name: str, fingerprint: str, slot_ms: int) -> bool:
        return self.place.run(entries_sql.finish, name, fingerprint, slot_ms) is not None

    def get(self, name: str) -> Stored | None:
        row = self.place.run(entries_sql.get, name)
        return None if row is None else _stored(row)

    def all(self) -> dict[str, Stored]:
        return {row.name: _stored(row) for row in self.place.run(entries_sql.all_rows)}

    def names(self) -> list[str]:
        return list(self.all())

    def changes(self, seen: int) -> Changes:
        """What changed since version ``seen`` (-1: everything)."""
        version, full, saved, removed = self.place.run(entries_sql.changes, seen)
        return Changes(version, full or seen < 0, {r.name: _stored(r) for r in saved},
                       removed)

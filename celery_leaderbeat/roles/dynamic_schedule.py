"""How a running beat follows the entries defined at run time.

The scheduler calls :meth:`DynamicSchedule.refresh` on every tick (a leader with
run-time entries wakes at least every :data:`LEADER_LOOK`, a standby at each try for
the lease, at most :data:`STANDBY_EVERY` apart; no save wakes anyone); at most every
:data:`POLL` seconds on the leader, at each try for the lease (and every
:data:`STANDBY_EVERY`) on a standby, it asks the store what changed since the version
it has seen: one script call that answers with the version
alone when nothing changed, else with only the changed entries. Each one is
checked with start-up's rules and put into (or taken out of) the scheduler's
entries; the scheduler then bumps its schedule version, which makes the
leader and the standby rebuild what they track.

Each entry has an *anchor* in the store: when it was created, when its
timing last changed, when it was last enabled again, or, for an imported
entry, its last run elsewhere. :func:`reanchor` makes the slot state the roles
plan from start at the anchor when the stored slot is older, so an entry
enabled again starts at its next slot instead of catching up on the time it
was off, and plans an entry with no state yet from its anchor (a new entry's
first slot is one interval after the save; an imported one keeps its phase).
A changed definition is re-anchored by the leader's fingerprint check.

What each dynamic ``ScheduleEntry`` carries (for the roles and for tooling):
``leaderbeat_source`` ("dynamic"), ``leaderbeat_version`` (the store version
of its last change), ``leaderbeat_fingerprint`` (a hash of its whole
definition), ``leaderbeat_timing`` (a hash of what decides its slots),
``leaderbeat_anchor_ms`` and ``leaderbeat_once`` (a one-off entry).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, MutableMapping
from typing import Any

from ..config import Config
from ..entries import EntryOptions, split_entries
from ..errors import ConfigurationError
from ..store.base import EntryDefinitions, Stored
from ..store.dynamic import Entry
from ..store.types import SlotState, SlotStatus
from ..timing.slots import to_ms

logger = logging.getLogger(__name__)

#: seconds between two looks at the store's version (each look is one script call, and one
#: that finds changes costs the leader three more: their states, their anchors, their
#: definitions). A storm of changes is taken in a few at a time, well within the second a
#: change has to be in force; at 20 changes a second a leader's ticks cost 15-26 % less than
#: looking every 0.1 s (docs/benchmarks.md)
POLL = 0.25
#: seconds a leader with run-time entries sleeps at most: Celery's loop sleeps what a tick
#: returns, deaf to the events channel, and a change must be in force within a second
LEADER_LOOK = 0.5
#: seconds at most between two looks of a standby: it looks at each try for the lease
#: (``Standby._poll``), every ``standby_poll`` but no further apart than this, so a change is
#: in force on every node within a second of its save. No save wakes a standby: it plans
#: with a definition only to rescue a slot, ``leaderbeat_rescue_after`` (2 s) after the
#: slot's time at the earliest, and in a storm of saves a wake per save would cost it as
#: much as taking every change in (docs/benchmarks.md). An elected standby looks at once,
#: before it loads (``Scheduler._become_leader``)
STANDBY_EVERY = 0.9


class DynamicSchedule:
    """Keeps a scheduler's dynamic entries in step with the store."""

    def __init__(self, store: EntryDefinitions, config: Config, *,
                 entries: MutableMapping[str, Any], options: MutableMapping[str, EntryOptions],
                 make_entry: Callable[[str, dict[str, Any]], Any],
                 static: Callable[[], Collection[str]]) -> None:
        self.store = store
        self.config = config
        self._entries = entries
        self._options = options
        self._make_entry = make_entry
        self._static = static
        self.seen = -1  # the store version this node follows
        #: active dynamic entry -> its anchor, as the slot state it is planned from
        self.anchors: dict[str, SlotState] = {}
        #: entries whose anchor holds even before they have state (see :func:`reanchor`)
        self.exact: set[str] = set()
        self._refused: dict[str, int] = {}  # name -> version refused (said once)
        #: monotonic: the next look may ask the store from then on (one per POLL)
        self.next_look = 0.0

    @property
    def names(self) -> Collection[str]:
        """The dynamic entries in the schedule now (enabled, valid)."""
        return self.anchors.keys()

    def refresh(self, *, force: bool = False, every: float = POLL) -> set[str]:
        """Take in what changed in the store; the names whose entry changed (empty: none).

        At most one look every ``every`` seconds (:data:`POLL`, or :data:`STANDBY_EVERY`
        on a standby), unless ``force``.

        The work is in proportion to the changes: nothing here walks every entry
        (except after a full read, when the node was too far behind).
        """
        now = time.monotonic()
        if not force and now < self.next_look:
            return set()
        self.next_look = now + every
        changes = self.store.changes(self.seen)  # may raise: nothing changed here then
        if changes.version == self.seen and not changes.full:
            return set()
        gone = set(changes.removed)
        if changes.full:
            gone |= set(self.anchors) - set(changes.saved)
        before = len(self.anchors)
        touched = {name for name in gone if name in self.anchors}
        for name in gone:
            self._drop(name)
        for name, stored in changes.saved.items():
            was = name in self.anchors
            self._apply(name, stored)
            if was or name in self.anchors:
                touched.add(name)
        self.seen = changes.version
        # a whole read is news; a storm of edits would write a line per change at INFO
        logger.log(logging.INFO if changes.full else logging.DEBUG,
                   "leaderbeat: dynamic entries at version %d: %d in the schedule (%+d), "
                   "%d changed", changes.version, len(self.anchors), len(self.anchors) - before,
                   len(touched))
        return touched

    def _apply(self, name: str, stored: Stored) -> None:
        if name in self._static():
            if self._refused.get(name) != stored.version:
                logger.error("leaderbeat: dynamic entry %r is ignored: beat_schedule has an entry "
                             "of that name", name)
                self._refused[name] = stored.version
            return
        if not stored.enabled:
            self._drop(name)
            return
        try:
            entry = Entry.from_stored(stored)
            built, options = split_entries({name: entry.raw()}, self.config)
        except (ConfigurationError, ValueError, KeyError, TypeError) as exc:
            # saved by another version, or a zone this host lacks: the others go on
            logger.error("leaderbeat: dynamic entry %r (version %d) is left out: %s",
                         name, stored.version, exc)
            self._drop(name)
            return
        made = self._make_entry(name, built[name])
        anchor = stored.anchor_ms
        if entry.at is not None:
            # its one slot must stay ahead of its anchor, even when read late; a time
            # already past when saved follows the catch-up policy
            anchor = min(anchor, to_ms(entry.at) - 1)
        made.leaderbeat_source = "dynamic"
        made.leaderbeat_version = stored.version
        made.leaderbeat_fingerprint = stored.fingerprint
        made.leaderbeat_timing = stored.timing
        made.leaderbeat_anchor_ms = anchor
        made.leaderbeat_once = entry.at is not None
        self._entries[name] = made
        self._options[name] = options[name]
        self.anchors[name] = SlotState(anchor, 0, SlotStatus.ANCHOR)
        # planned from its anchor (the save, by Redis TIME) before it has state: the
        # leader's own anchoring would add its margin for unknown state (up to 5 s)
        self.exact.add(name)

    def _drop(self, name: str) -> None:
        self.exact.discard(name)
        if self.anchors.pop(name, None) is not None:
            self._entries.pop(name, None)
            self._options.pop(name, None)

    def ran(self, entry: Any, slot_ms: int) -> None:
        """A one-off entry's slot was sent: record it and disable the entry."""
        try:
            if self.store.finish(entry.name, entry.leaderbeat_fingerprint, slot_ms):
                logger.info("leaderbeat: one-off entry %s ran; it is now disabled", entry.name)
        except Exception as exc:  # noqa: BLE001 - it cannot run twice anyway (its slot is claimed)
            logger.warning("leaderbeat: could not mark one-off entry %s as run (%s); it will "
                           "not run again, but shows as enabled", entry.name, exc)


def reanchor(stored: Mapping[str, SlotState], anchors: Mapping[str, SlotState],
             exact: Collection[str] = (), names: Collection[str] | None = None
             ) -> Mapping[str, SlotState]:
    """Slot states to plan from: a dynamic entry's starts at its anchor when older.

    ``anchors`` holds each dynamic entry's anchor as a slot state (built once per
    change). An entry with no stored state starts at its anchor too when it is in
    ``exact`` (every entry the store holds: its anchor is Redis TIME at the save, or
    an imported entry's last run elsewhere, the same on every node). The leader
    writes a state planned this way to Redis (``agenda.load``'s ``anchored``), so a
    standby rescues from it. With ``names`` (a change of a few entries) only those
    are looked at: the cost follows the change, not the schedule.
    """
    if not anchors:
        return stored
    out = dict(stored)
    for name, state in stored.items():
        anchor = anchors.get(name)
        if anchor is not None and state.slot_ms < anchor.slot_ms:
            out[name] = anchor
    candidates = exact if names is None else [n for n in names if n in exact]
    for name in candidates:
        if name not in stored and name in anchors:
            out[name] = anchors[name]
    return out

"""The schedule the Scheduler keeps: ``beat_schedule``, run-time entries, its version.

The version goes up with every change; which entries a change touched is kept
for the last :data:`CHANGE_LOG` versions, so the leader and the standbys update
only those (an older version means a full reload).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from datetime import tzinfo
from typing import Any

from ..entries import EntryOptions, split_entries
from ..errors import ConfigurationError
from ..roles.dynamic_schedule import POLL, STANDBY_EVERY, DynamicSchedule
from ..store.base import EntryDefinitions
from ..store.types import SlotState
from ..timing.slots import clock_for
from .attributes import Attributes

#: schedule versions whose changed names are kept (an older one means a full reload)
CHANGE_LOG = 64

class ScheduleState(Attributes):
    """``beat_schedule`` read and checked, run-time entries followed, changes versioned."""

    def setup_schedule(self) -> None:
        """Read ``beat_schedule``; harmless on standbys (no I/O, nothing sent).

        As in Celery's own schedulers, ``beat_schedule`` is merged first and the
        default entries (``celery.backend_cleanup``) are installed after: the merge
        drops every entry it does not name. Every entry's slot clock is built once
        here, so a schedule the leader could not follow stops start-up with the
        other problems, not a later election.
        """
        entries, options = split_entries(self.app.conf.beat_schedule or {}, self.lb_config)
        self._entry_options = options
        self.merge_inplace(entries)
        self.install_default_entries(self.data)
        problems = []
        for name, entry in self.schedule.items():
            opts = options.get(name) or EntryOptions.defaults(self.lb_config)
            try:
                clock_for(entry.schedule, name=name, tz=self.zone_of(name), jitter=opts.jitter)
            except ConfigurationError as exc:
                problems += exc.problems
        if problems:
            raise ConfigurationError(problems)

    def merge_inplace(self, b: Any) -> None:
        super().merge_inplace(b)
        self._schedule_version += 1

    def update_from_dict(self, dict_: Any) -> None:
        super().update_from_dict(dict_)
        self._schedule_version += 1

    def add(self, **kwargs: Any) -> Any:
        entry = super().add(**kwargs)
        self._schedule_version += 1
        return entry

    def changed_since(self, version: int) -> frozenset[str] | None:
        """The entry names changed after schedule ``version``, or None when some change
        since then is not known name by name (the whole schedule must be read again)."""
        if version >= self._schedule_version:
            return frozenset()
        known = [names for v, names in self._changes if v > version]
        if len(known) != self._schedule_version - version:
            return None
        return frozenset().union(*known)

    def slot_entries(self) -> Mapping[str, Any]:
        """The entries slots are computed from: name -> an object with ``.schedule``."""
        return self.schedule  # type: ignore[no-any-return]

    def entry_options(self) -> Mapping[str, EntryOptions]:
        """Entry name -> its ``leaderbeat`` options, for the entries that have any."""
        return self._entry_options

    def overlap_of(self, name: str) -> str:
        """The entry's overlap policy: its own, else ``leaderbeat_overlap``."""
        options = self._entry_options.get(name)
        return options.overlap if options is not None else self.lb_config.overlap

    def timezone(self) -> tzinfo:
        """The app's time zone, for entries without one of their own."""
        return self.app.timezone  # type: ignore[no-any-return]

    def zone_of(self, name: str) -> tzinfo:
        """The zone the entry's slots are read in: its own (``leaderbeat`` options), else
        the app's."""
        options = self._entry_options.get(name)
        return (options.tz if options is not None else None) or self.timezone()

    def runtime_anchors(self) -> Mapping[str, SlotState]:
        """Run-time entry -> the slot state its slots count from (none behind a base)."""
        return self._dynamic.anchors if self._dynamic is not None else {}

    def anchored_exactly(self) -> Collection[str]:
        """Run-time entries anchored before any state was stored."""
        return self._dynamic.exact if self._dynamic is not None else ()

    def follows_runtime_entries(self) -> bool:
        """True unless a base scheduler keeps its own entries (no run-time entries then)."""
        return self._dynamic is not None

    def _follow_dynamic(self, store: EntryDefinitions) -> DynamicSchedule | None:
        """Entries defined at run time (not behind a base scheduler: it has its own store)."""
        if self.lb_config.base_scheduler is not None:
            return None
        for name in list(self._dynamic.names if self._dynamic else ()):
            self.schedule.pop(name, None)  # a forked child reads them again
        return DynamicSchedule(store, self.lb_config,
                               entries=self.schedule, options=self._entry_options,
                               make_entry=self._maybe_entry,
                               static=lambda: self.app.conf.beat_schedule or {})

    def _follow_changes(self, *, force: bool = False) -> None:
        """Run-time entries that changed go into the schedule, under a new version (looked
        at every POLL on the leader; on a standby at each try for the lease, and every
        STANDBY_EVERY while it may not try: a head start, a clock beyond max_clock_skew;
        now with ``force``)."""
        if self._dynamic is not None:
            if self._leader is not None:
                every = POLL
            else:
                every = STANDBY_EVERY
                force = force or (self._standby is not None
                                  and self._standby.attempt_due(time.monotonic()))
            touched = self._dynamic.refresh(force=force, every=every)
            if touched:  # the roles update only what changed
                self._schedule_version += 1
                self._changes.append((self._schedule_version, frozenset(touched)))
                del self._changes[:-CHANGE_LOG]

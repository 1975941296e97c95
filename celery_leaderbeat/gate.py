"""Gating another Scheduler class: its schedule, our lease and claims (docs/architecture.md).

With ``leaderbeat_base_scheduler = "django_celery_beat.schedulers:DatabaseScheduler"``
(or Celery's ``PersistentScheduler``, or any ``celery.beat.Scheduler`` subclass),
``celery_leaderbeat.Scheduler`` builds, once per base class, the class
``LeaderbeatGate<Base>(GateMixin, Base)`` and returns an instance of it. The base
keeps what it owns: the schedule's definition (``setup_schedule``, ``.schedule``,
its store, the admin). The gate keeps the rest:

- the tick is leaderbeat's: the base's ``tick()`` (and with it django-celery-beat's
  ``is_due()``, which writes to the database) never runs, on any node;
- the gate reads the base's ``.schedule`` at the base's pace (its ``max_interval``;
  5 s for django-celery-beat, whose ``schedule`` property is where it notices
  database changes) and bumps the schedule version when a cheap fingerprint of the
  entries changed, so the leader and the standbys re-read them;
- slots come from each entry's schedule, never from ``last_run_at``;
- the base's ``sync()`` runs only on the leader (a standby never writes to the
  base's store), and once more before the lease is released on a graceful stop;
  on promotion the base re-reads everything, on demotion it drops its dirty state.

What differs between bases lives in an :class:`Adapter`; django-celery-beat's is
in :mod:`celery_leaderbeat.django`.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from celery import beat
from celery.utils.imports import symbol_by_name

from .entries import split_entries
from .errors import ConfigurationError
from .leader import Leader
from .node import Node
from .scheduler import Scheduler
from .slots import clock_for
from .standby import Standby

logger = logging.getLogger(__name__)

SETTING = "leaderbeat_base_scheduler"


def resolve_base(value: Any) -> type | None:
    """The Scheduler class named by ``leaderbeat_base_scheduler`` (None when unset).

    Accepts ``module:Class``, ``module.Class`` or the class itself; raises
    :class:`ConfigurationError` naming the setting, the value and the rule.
    """
    if value is None or value == "":
        return None
    cls = value
    if isinstance(value, str):
        try:
            cls = symbol_by_name(value)
        except Exception as exc:  # noqa: BLE001 - any import failure is the user's to see
            raise ConfigurationError(
                f"{SETTING}={value!r} is not importable ({type(exc).__name__}: {exc})") from None
    if not (isinstance(cls, type) and issubclass(cls, beat.Scheduler)):
        raise ConfigurationError(
            f"{SETTING}={value!r} must name a celery.beat.Scheduler subclass, not {cls!r}")
    if issubclass(cls, Scheduler):
        raise ConfigurationError(
            f"{SETTING}={value!r} is celery_leaderbeat.Scheduler itself: name the scheduler "
            "it gates, e.g. 'django_celery_beat.schedulers:DatabaseScheduler'")
    return cls


@functools.cache
def gate_class(base: type) -> type:
    """``LeaderbeatGate<Base>(GateMixin, Base)``, built once per base class."""
    name = f"LeaderbeatGate{base.__name__}"
    return type(name, (GateMixin, base), {"__module__": __name__, "__qualname__": name,
                                          "gated": base})


class Adapter:
    """What the gate does that depends on the base; this one suits any Scheduler."""

    def __init__(self, scheduler: GateMixin) -> None:
        self.scheduler = scheduler

    def prepare(self, entries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """``beat_schedule`` entries (cron strings parsed) about to be stored by the base."""
        return entries

    def view(self, entry: Any) -> Any | None:
        """The entry as the slots see it (an object with ``.schedule``); None: no slots."""
        return entry

    def key(self, entry: Any) -> tuple[Any, ...]:
        """What, if changed, changes the entry's slots or messages (the fingerprint)."""
        return (entry.task, repr(entry.schedule), repr(entry.args), repr(entry.kwargs),
                repr(entry.options))

    def sent(self, entry: Any, slot: datetime, *, leading: bool) -> None:
        """``slot`` of ``entry`` was published (by the leader, or by a standby's rescue)."""

    def housekeeping(self, leader: Leader) -> None:
        """On the leader, after each read of the schedule."""

    def promoted(self) -> None:
        """This node leads now: the base re-reads everything it holds."""

    def demoted(self) -> None:
        """This node no longer leads: the base forgets what it has not written."""


def adapter_for(base: type) -> type[Adapter]:
    """django-celery-beat's adapter for its DatabaseScheduler (and subclasses), else the generic."""
    if any(c.__module__ == "django_celery_beat.schedulers" and c.__name__ == "DatabaseScheduler"
           for c in base.__mro__):
        from .django import DatabaseAdapter

        return DatabaseAdapter
    return Adapter


class GateMixin(Scheduler):
    """Leaderbeat's tick around a base Scheduler's schedule (see the module docstring)."""

    gated: type = beat.Scheduler  # the base class; set by gate_class

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self.adapter = adapter_for(self.gated)(self)
        self._gate_entries: dict[str, Any] = {}  # the base's entries, as last read
        self._gate_view: dict[str, Any] = {}  # the same, as the slots see them
        self._gate_keys: dict[str, tuple[Any, ...]] = {}  # fingerprint, entry by entry
        self._gate_bad: dict[str, tuple[Any, ...]] = {}  # entries left out, and their key
        self._gate_static: set[str] = set()  # names that came from beat_schedule
        self._gate_read_at = float("-inf")  # monotonic time of the last read
        super().__init__(app, *args, **kwargs)

    # -- the schedule definition: the base's -----------------------------------------

    def setup_schedule(self) -> None:
        """The base's own set-up; then one read, where a bad beat_schedule entry is fatal."""
        super(Scheduler, self).setup_schedule()
        self._refresh(force=True, strict=True)

    def merge_inplace(self, b: Any) -> None:
        super().merge_inplace(self._prepare(b))

    def update_from_dict(self, dict_: Any) -> None:
        super().update_from_dict(self._prepare(dict_))

    def _prepare(self, mapping: Any) -> dict[str, Any]:
        """Our per-entry options and cron strings out of ``beat_schedule``-style entries."""
        entries, options = split_entries(mapping or {}, self.lb_config)
        self._entry_options.update(options)
        self._gate_static.update(entries)
        return self.adapter.prepare(entries)

    def _slot_entries(self) -> Mapping[str, Any]:
        return self._gate_view

    @property
    def info(self) -> str:
        base = f"{self.gated.__module__}:{self.gated.__qualname__}"
        return f"{super().info} base={base}"

    # -- reading the base's schedule at its pace ------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Read the base's schedule when due, then leaderbeat's tick (never the base's)."""
        self._refresh()
        delay = super().tick()
        # wake for the next read too: a leader otherwise sleeps until its next slot
        return max(0.0, min(delay, self._gate_read_at + self._gate_pace() - time.monotonic()))

    def _gate_pace(self) -> float:
        """Seconds between reads of the base's schedule: its own loop interval."""
        return float(self.max_interval or 5.0)

    def _refresh(self, *, force: bool = False, strict: bool = False) -> None:
        """Read ``.schedule``; bump the schedule version when the fingerprint changed."""
        started = time.monotonic()
        if not force and started - self._gate_read_at < self._gate_pace():
            return
        self._gate_read_at = started
        try:
            entries = dict(self.schedule)  # the base notices changes to its store here
        except Exception:
            logger.exception("leaderbeat: could not read the schedule of %s; keeping the "
                             "last one read", self.gated.__name__)
            if strict:
                raise
            return
        keys: dict[str, tuple[Any, ...]] = {}
        view: dict[str, Any] = {}
        problems: list[str] = []
        for name, entry in entries.items():
            key: tuple[Any, ...] = ()
            try:
                key = self.adapter.key(entry)
                shown = self.adapter.view(entry)
                if shown is not None and self._gate_keys.get(name) != key:
                    self._check_clock(name, shown)  # new or changed: can we follow it?
            except Exception as exc:  # noqa: BLE001 - one bad entry never stops the others
                if strict and name in self._gate_static:
                    problems += getattr(exc, "problems", None) or [f"entry {name!r}: {exc}"]
                elif self._gate_bad.get(name) != key:
                    logger.error("leaderbeat: entry %r is left out of the schedule: %s", name, exc)
                self._gate_bad[name] = key
                continue
            self._gate_bad.pop(name, None)
            keys[name] = key
            if shown is not None:
                view[name] = shown
        if problems:
            raise ConfigurationError(problems)
        changed = keys != self._gate_keys or view.keys() != self._gate_view.keys()
        self._gate_entries, self._gate_view, self._gate_keys = entries, view, keys
        if changed:
            self._schedule_version += 1
        if self._leader is not None:
            self.adapter.housekeeping(self._leader)

    def _check_clock(self, name: str, shown: Any) -> None:
        options = self._entry_options.get(name)
        clock_for(shown.schedule, name=name,
                  tz=(options.tz if options else None) or self.app.timezone,
                  jitter=options.jitter if options else None)

    def force_refresh(self) -> None:
        """Read the base's schedule at the next tick, whatever its pace."""
        self._gate_read_at = float("-inf")

    # -- sending ---------------------------------------------------------------------------

    def _send_slot(self, name: str, slot: datetime, epoch: int, *args: Any, **kwargs: Any) -> bool:
        # from the snapshot, not .schedule: that read is a query on a database scheduler
        entry = self._gate_entries.get(name)
        if entry is None or name not in self._gate_view:
            return False
        if not self._send(entry, slot, epoch, *args, **kwargs):
            return False
        self.adapter.sent(entry, slot, leading=self._leader is not None)
        return True

    # -- roles: the base writes only while this node leads ------------------------------------

    def _become_leader(self, node: Node, standby: Standby) -> Leader:
        leader = super()._become_leader(node, standby)
        self.adapter.promoted()
        self._refresh(force=True)  # a standby's view may be a max_interval old
        return leader

    def _step_down(self, why: str, release: bool = False) -> None:
        super()._step_down(why, release)
        self.adapter.demoted()

    def sync(self) -> None:
        """The base's sync, only while this node leads (a standby never writes)."""
        if self._leader is not None and not self._closed:
            super(Scheduler, self).sync()

    def close(self) -> None:
        """Sync the base while still leading, then release the lease (standbys read after)."""
        if not self._closed and self._leader is not None and self._pid == os.getpid():
            try:
                super(Scheduler, self).sync()
            except Exception:
                logger.exception("leaderbeat: the base scheduler's sync failed on close")
        super().close()

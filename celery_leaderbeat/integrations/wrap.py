"""Wrapping another Scheduler class: its schedule, our lease and claims.

With ``leaderbeat_base_scheduler = "django_celery_beat.schedulers:DatabaseScheduler"``
(or Celery's ``PersistentScheduler``, or any ``celery.beat.Scheduler`` subclass),
``celery_leaderbeat.Scheduler`` builds, once per base class, the class
``Leaderbeat<Base>(WrapMixin, Scheduler, Base)`` and returns an instance of it. The base
keeps what it owns: the schedule's definition (``setup_schedule``, ``.schedule``,
its store, the admin). Leaderbeat keeps the rest:

- the tick is leaderbeat's: the base's ``tick()`` (and with it django-celery-beat's
  ``is_due()``, which writes to the database) never runs, on any node;
- the wrapper reads the base's ``.schedule`` at the base's pace (its ``max_interval``)
  and bumps the schedule version when a cheap fingerprint of the entries changed,
  so the leader and the standbys re-read them; an adapter may do that read, and
  the writes of its bookkeeping, on a thread of its own (django-celery-beat's does,
  once a second), so that neither ever holds up sending;
- before the leader tracks new or changed entries, the adapter may anchor them in
  Redis at a slot of its choosing (else an entry with no stored slot starts from
  "now"): a one-off row just before its one slot;
- slots come from each entry's schedule, never from ``last_run_at``;
- the base's ``sync()`` runs only on the leader (a standby never writes absolute
  values to the base's store), and once more before the lease is released on a
  graceful stop; on promotion the base re-reads everything.

What differs between bases lives in an :class:`Adapter`; django-celery-beat's is
in :mod:`celery_leaderbeat.integrations.django`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery import beat

from ..entries import EntryOptions, split_entries
from ..errors import ConfigurationError, LeaseLostError, NotReplicatedError
from ..roles.leader import Leader
from ..roles.shared import Shared
from ..roles.standby import Standby
from ..store.base import STORE_ERRORS
from ..store.types import ClaimItem, Op
from ..timing.slots import clock_for, to_ms
from .adapter import Adapter, Snapshot
from .schedule import CHANGE_LOG

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .lifecycle import Lifecycle
    from .schedule import ScheduleState
    from .sending import Sending
    from .trouble import Trouble

    class _Glue(ScheduleState, Sending, Trouble, Lifecycle):
        """``celery_leaderbeat.Scheduler`` as this mixin's ``super()``, for the type checker."""
else:
    _Glue = object


def adapter_for(base: type) -> type[Adapter]:
    """django-celery-beat's adapter for its DatabaseScheduler (and subclasses), else the generic."""
    if any(c.__module__ == "django_celery_beat.schedulers" and c.__name__ == "DatabaseScheduler"
           for c in base.__mro__):
        from .django import DatabaseAdapter

        return DatabaseAdapter
    return Adapter


class WrapMixin(_Glue):
    """Leaderbeat's tick around a base Scheduler's schedule (see the module docstring).

    A mixin: :func:`celery_leaderbeat.scheduler.wrap_class` puts it before
    ``celery_leaderbeat.Scheduler`` and the base, so ``super()`` is leaderbeat's and
    :attr:`wrapped` is the base's.
    """

    wrapped: type = beat.Scheduler  # the base class; set by wrap_class
    sends_chunks = False  # slot by slot: the base's entries and bookkeeping follow each send

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self.adapter = adapter_for(self.wrapped)(self)
        self._base_entries: dict[str, Any] = {}  # the base's entries, as last read
        self._base_view: dict[str, Any] = {}  # the same, as the slots see them
        self._base_keys: dict[str, tuple[Any, ...]] = {}  # fingerprint, entry by entry
        self._base_bad: dict[str, tuple[Any, ...]] = {}  # entries left out, and their key
        self._base_static: set[str] = set()  # names that came from beat_schedule
        self._base_read_at = float("-inf")  # monotonic time of the last read
        self._base_pending: Snapshot | None = None  # read by the thread, not applied yet
        self._base_lock = threading.Lock()
        self._base_thread: Any = None
        self._base_thread_pid: int | None = None
        super().__init__(app, *args, **kwargs)

    # -- the schedule definition: the base's -----------------------------------------

    def setup_schedule(self) -> None:
        """The base's own set-up; then one read, where a bad beat_schedule entry is fatal."""
        try:
            self.wrapped.setup_schedule(self)  # type: ignore[attr-defined]
        except Exception as exc:
            clearer = self.adapter.setup_failure(exc)
            if clearer is None:
                raise
            raise clearer from exc
        self._refresh(force=True, strict=True)

    def merge_inplace(self, b: Any) -> None:
        super().merge_inplace(self._prepare(b))

    def update_from_dict(self, dict_: Any) -> None:
        super().update_from_dict(self._prepare(dict_))

    def _prepare(self, mapping: Any) -> dict[str, Any]:
        """Our per-entry options and cron strings out of ``beat_schedule``-style entries."""
        entries, options = split_entries(mapping or {}, self.lb_config)
        self._entry_options.update(options)
        self._base_static.update(entries)
        return self.adapter.prepare(entries)

    def slot_entries(self) -> Mapping[str, Any]:
        return self._base_view

    def base_entries(self) -> Mapping[str, Any]:
        """The base's entries as last read (``.schedule`` is a query on a database scheduler)."""
        return self._base_entries

    @property
    def info(self) -> str:
        base = f"{self.wrapped.__module__}:{self.wrapped.__qualname__}"
        return f"{super().info} base={base}"

    # -- reading the base's schedule at its pace ------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Read the base's schedule when due, then leaderbeat's tick (never the base's)."""
        with self._ticking():
            return self._tick_wrapped()

    def _tick_wrapped(self) -> float:
        if self.adapter.background:
            return self._tick_background()
        self._refresh()
        delay: float = super().tick()
        # wake for the next read too: a leader otherwise sleeps until its next slot
        return max(0.0, min(delay, self._base_read_at + self._base_pace() - time.monotonic()))

    def _base_pace(self) -> float:
        """Seconds between reads of the base's schedule: its own loop interval."""
        return float(self.max_interval or 5.0)

    def _refresh(self, *, force: bool = False, strict: bool = False) -> None:
        """Read ``.schedule`` here and now; apply what changed."""
        started = time.monotonic()
        if not force and started - self._base_read_at < self._base_pace():
            return
        self._base_read_at = started
        snapshot = self._read(strict=strict)
        if snapshot is not None:
            self._apply(snapshot)
        if self._leader is not None:
            self.adapter.housekeeping(self._leader)

    def _read(self, *, strict: bool = False,
              entries: dict[str, Any] | None = None) -> Snapshot | None:
        """Read ``.schedule`` (unless ``entries`` were read already) and see each entry as
        the slots do; None: unreadable."""
        if entries is None:
            entries = self._read_base_schedule(strict=strict)
            if entries is None:
                return None
        keys: dict[str, tuple[Any, ...]] = {}
        view: dict[str, Any] = {}
        problems: list[str] = []
        # taken once: on the database thread, the tick's _apply may replace them meanwhile
        known_keys, known_view = self._base_keys, self._base_view
        for name, entry in entries.items():
            key: tuple[Any, ...] = ()
            try:
                key = self.adapter.key(entry)
                if known_keys.get(name) == key and name in known_view:
                    shown = known_view[name]  # the same object: its slot clock is reused
                else:
                    shown = self._view_entry(name, entry)
            except Exception as exc:  # noqa: BLE001 - one bad entry never stops the others
                problems += self._leave_out(name, key, exc, strict=strict)
                continue
            self._base_bad.pop(name, None)
            keys[name] = key
            if shown is not None:
                view[name] = shown
        if problems:
            raise ConfigurationError(problems)
        return Snapshot(entries, view, keys)

    def _read_base_schedule(self, *, strict: bool) -> dict[str, Any] | None:
        """The base's ``.schedule`` now; None: unreadable (raised instead when ``strict``)."""
        try:
            return dict(self.schedule)  # the base notices changes to its store here
        except Exception:
            logger.exception("leaderbeat: could not read the schedule of %s; keeping the "
                             "last one read", self.wrapped.__name__)
            if strict:
                raise
            return None

    def _view_entry(self, name: str, entry: Any) -> Any | None:
        """A new or changed entry as the slots see it (None: no slots), its schedule checked:
        raises when its slots cannot be followed."""
        shown = self.adapter.view(entry)
        if shown is not None:
            self._check_clock(name, shown)
        return shown

    def _leave_out(self, name: str, key: tuple[Any, ...], exc: Exception, *,
                   strict: bool) -> list[str]:
        """Leave out an entry whose key or view raised ``exc``. Returns its problems when
        the read is ``strict`` and it came from beat_schedule (the start-up fails on them);
        otherwise it is logged, once for each definition (``key``)."""
        problems: list[str] = []
        if strict and name in self._base_static:
            problems = list(getattr(exc, "problems", None) or [f"entry {name!r}: {exc}"])
        elif self._base_bad.get(name) != key:
            logger.error("leaderbeat: entry %r is left out of the schedule: %s", name, exc)
        self._base_bad[name] = key
        return problems

    def _apply(self, snapshot: Snapshot) -> bool:
        """Make ``snapshot`` the schedule; False when it must wait (Redis did not answer)."""
        entries, view, keys = snapshot
        changed = keys != self._base_keys or view.keys() != self._base_view.keys()
        if changed and self._leader is not None:
            fresh = {name: shown for name, shown in view.items()
                     if self._base_keys.get(name) != keys[name]}
            if not self._anchor(self._leader.shared, fresh):
                return False
        touched = {name for name in keys.keys() | self._base_keys.keys()
                   if keys.get(name) != self._base_keys.get(name)}
        touched |= view.keys() ^ self._base_view.keys()
        self._base_entries, self._base_view, self._base_keys = entries, view, keys
        if changed:
            self._schedule_version += 1  # the roles take in just the entries touched
            self._changes.append((self._schedule_version, frozenset(touched)))
            del self._changes[:-CHANGE_LOG]
        return True

    def _anchor(self, shared: Shared, view: Mapping[str, Any]) -> bool:
        """Store the anchors the adapter asks for before the leader tracks ``view``."""
        items = []
        for name, at in self.adapter.anchors(view).items():
            opts = self._entry_options.get(name) or EntryOptions.defaults(self.lb_config)
            fp = shared.fingerprint_of(name, view[name], self.zone_of(name), opts.jitter)
            items.append(ClaimItem(name, to_ms(at), Op.ANCHOR, fingerprint=fp))
        if not items:
            return True
        try:
            shared.ledger.claim(*shared.lease.credentials(), items)
        except NotReplicatedError as exc:  # stored on the primary: idempotent, go on
            logger.warning("leaderbeat: %s for the anchors of %d entries; going on", exc,
                           len(items))
        except STORE_ERRORS + (LeaseLostError,) as exc:
            logger.warning("leaderbeat: could not store the anchors of %d entries (%s); the "
                           "schedule change waits for the next tick", len(items), exc)
            return False
        return True

    # -- reading on a background thread (django-celery-beat) -------------------------------

    def _tick_background(self) -> float:
        """Pick up what the database thread read; leaderbeat's tick; wake for the next pass."""
        thread = self._base_thread
        if thread is None or not thread.alive() or self._base_thread_pid != os.getpid():
            thread = self._start_thread()  # first tick, or a fresh process (worker -B fork)
        with self._base_lock:
            snapshot, self._base_pending = self._base_pending, None
        if snapshot is not None and not self._apply(snapshot):
            with self._base_lock:  # tried again next tick, unless a newer read replaced it
                self._base_pending = self._base_pending or snapshot
        now = time.monotonic()
        if self._leader is not None and now - self._base_read_at >= thread.pace:
            self._base_read_at = now
            self.adapter.housekeeping(self._leader)
        delay: float = super().tick()
        # wake just after the thread's next pass, to pick up what it read
        wake: float = max(thread.next_pass + 0.05, time.monotonic() + 0.05) - time.monotonic()
        return max(0.0, min(float(delay), wake))

    def _start_thread(self) -> Any:
        if self._base_thread is not None and self._base_thread_pid == os.getpid():
            self._base_thread.stop(timeout=1.0)
        self._base_thread_pid = os.getpid()
        self._base_thread = self.adapter.thread(self._background_pass)
        self._base_thread.start()
        return self._base_thread

    def _background_pass(self) -> None:
        """On the database thread: write the bookkeeping, read the schedule if it changed."""
        self.adapter.flush()
        try:
            entries = self.adapter.read()
        except Exception:
            logger.exception("leaderbeat: could not read the schedule of %s; keeping the "
                             "last one read", self.wrapped.__name__)
            return
        if entries is None:
            return  # nothing changed
        snapshot = self._read(entries=entries)
        if snapshot is not None:
            with self._base_lock:
                self._base_pending = snapshot

    def _check_clock(self, name: str, shown: Any) -> None:
        options = self._entry_options.get(name)
        clock_for(shown.schedule, name=name, tz=self.zone_of(name),
                  jitter=options.jitter if options else None)

    # -- sending ---------------------------------------------------------------------------

    def observe(self, events: Any) -> None:
        # the snapshot, not .schedule: that read is a query on a database scheduler
        self._telemetry.slots(events, len(self._base_view),
                              lambda: self._shared.lease.epoch if self._shared else None)
        if self._labels_version != self._schedule_version:  # a removed entry's series go
            self._labels_version = self._schedule_version
            self._telemetry.metrics.keep_entries(self._base_view)

    def send_slot(self, name: str, slot: datetime, epoch: int, *args: Any, **kwargs: Any) -> bool:
        # from the snapshot, not .schedule: that read is a query on a database scheduler
        entry = self._base_entries.get(name)
        if entry is None or name not in self._base_view:
            return False
        if not self._send(entry, slot, epoch, *args, **kwargs):
            return False
        self.adapter.sent(entry, slot, leading=self._leader is not None)
        return True

    # -- roles: the base writes only while this node leads ------------------------------------

    def _become_leader(self, shared: Shared, standby: Standby) -> Leader:
        # before the leader's first load: it anchors unknown entries at "now"
        if not self._anchor(shared, self._base_view):
            logger.warning("leaderbeat: elected without the anchors of one-off entries")
        leader = super()._become_leader(shared, standby)
        self.adapter.promoted()
        if not self.adapter.background:
            self._refresh(force=True)  # a standby's view may be a max_interval old
        return leader

    def _step_down(self, why: str, release: bool = False) -> None:
        super()._step_down(why, release)
        self.adapter.demoted()

    def sync(self) -> None:
        """The adapter's sync: the base's, only while this node leads (a standby never
        writes absolute values); django-celery-beat's bookkeeping, on any node."""
        if not self._closed:
            self.adapter.sync(leading=self._leader is not None)

    def close(self) -> None:
        """Stop the database thread, write what is pending while still leading, then
        release the lease (standbys read after). Called from inside a tick (a signal
        handler), it waits for the tick to unwind, as the scheduler's own close does."""
        if self._close_waits_for_tick():
            return
        if not self._closed and self._pid == os.getpid():
            if self._base_thread is not None and self._base_thread_pid == os.getpid():
                self._base_thread.stop()
            try:
                self.adapter.sync(leading=self._leader is not None)
            except Exception:
                logger.exception("leaderbeat: the base scheduler's sync failed on close")
        super().close()

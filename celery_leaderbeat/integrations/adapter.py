"""What wrapping a base scheduler does that depends on the base: the :class:`Adapter`.

The generic one suits any ``celery.beat.Scheduler``; django-celery-beat's is
:class:`celery_leaderbeat.integrations.django.DatabaseAdapter`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple

from ..roles.leader import Leader


class Snapshot(NamedTuple):
    """One read of the base's schedule: its entries, as the slots see them, fingerprints."""

    entries: dict[str, Any]
    view: dict[str, Any]
    keys: dict[str, tuple[Any, ...]]


class Adapter:
    """What wrapping a base does that depends on it; this one suits any Scheduler."""

    #: read the schedule and write bookkeeping on a thread of their own (:meth:`thread`)
    background = False

    def __init__(self, scheduler: Any) -> None:
        #: leaderbeat's Scheduler and the base in one object (``wrap.WrapMixin``): an
        #: adapter calls the base's own methods on it, which only the base class types
        self.scheduler = scheduler

    def setup_failure(self, exc: Exception) -> Exception | None:
        """What the base's set-up failing with ``exc`` means to a user (a clearer error
        to raise instead); None: ``exc`` as it is."""
        return None

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

    def anchors(self, view: Mapping[str, Any]) -> dict[str, datetime]:
        """Entries of ``view`` (new or changed) to anchor at a slot of their own before a
        leader tracks them (else an entry with no stored slot starts from "now")."""
        return {}

    def sync(self, *, leading: bool) -> None:
        """The base's sync, only while this node leads: a standby never writes."""
        if leading:
            self.scheduler.wrapped.sync(self.scheduler)

    def flush(self) -> None:
        """On the background thread: write what is pending."""

    def read(self) -> dict[str, Any] | None:
        """On the background thread: the entries, or None when nothing changed."""
        raise NotImplementedError

    def thread(self, work: Any) -> Any:
        """The background thread running ``work`` (only when :attr:`background`)."""
        raise NotImplementedError

    def promoted(self) -> None:
        """This node leads now: the base re-reads everything it holds."""

    def demoted(self) -> None:
        """This node no longer leads: the base forgets what it has not written."""

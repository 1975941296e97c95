"""What the web view shows, read through :class:`~celery_leaderbeat.ops.cluster.Cluster`.

The cluster (leader, lease, nodes, store), one page of the entries, one entry and its
slots' history. The rows are the CLI's (``status --json``, ``nodes --json``,
``history --json``); a page builds only its own rows, so a page of 50 costs the same
at 10 entries as at 10,000. Building the definitions (``beat_schedule`` parsed, the
django-celery-beat table read, the runtime entries) costs about 25 ms per 1,000
entries: they are built once, then rebuilt in the background every
:data:`DEFINITIONS_EVERY` seconds while pages keep the last ones.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from celery.schedules import schedule as celery_schedule

from ..entries import EntryOptions
from ..ops.cluster import Cluster, EntryRow, HistoryEvent, Leader, NodeRow
from ..store.connection import describe
from ..store.types import SlotState, SlotStatus
from ..timing.slots import clock_for, from_ms, slot_id

logger = logging.getLogger(__name__)

#: seconds a page may show definitions built this long ago (a new or removed entry
#: shows on the entries page within about this long)
DEFINITIONS_EVERY = 5.0
#: the newest history events of one entry its page shows
ENTRY_HISTORY = 100
#: what the state filter offers: a state of the last slot, or "paused"
STATE_FILTERS = ("paused", *(status.label for status in SlotStatus))


def public(leader: Leader | None) -> dict[str, Any] | None:
    """The leader as ``--json`` shows it: without its fencing token."""
    return None if leader is None else {k: v for k, v in leader.items() if k != "token"}


@dataclass(frozen=True)
class Definitions:
    """Every configured entry (static, database, runtime) and where each comes from."""

    schedule: dict[str, Any]
    options: dict[str, EntryOptions]
    static: frozenset[str]
    dynamic: frozenset[str]
    dynamic_all: frozenset[str]
    #: every configured name and every name with a slot in the store, sorted
    names: tuple[str, ...]
    built_at: float

    def schedule_text(self, name: str) -> str | None:
        """``name``'s schedule as people read it; None when it is not configured here."""
        entry = self.schedule.get(name)
        return None if entry is None else schedule_text(entry["schedule"])


def schedule_text(value: Any) -> str:
    """A ``beat_schedule`` schedule as people read it: ``every 60 s``, ``crontab: ...``."""
    if type(value) is celery_schedule:  # its subclasses (solar ...) say more as text
        value = value.run_every
    if isinstance(value, timedelta):
        return f"every {value.total_seconds():g} s"
    if isinstance(value, (int, float)):
        return f"every {value:g} s"
    text = str(value)
    return text[1:-1] if text.startswith("<") and text.endswith(">") else text


@dataclass(frozen=True)
class Page:
    """One page of the entries, as ``/api/status`` returns it."""

    leader: dict[str, Any] | None
    entries: list[EntryRow]
    total: int
    offset: int
    limit: int
    #: each entry's schedule, as people read it (None: not configured here)
    schedules: dict[str, str | None]

    def as_json(self) -> dict[str, Any]:
        """``status --json`` for this page: its rows (each with its ``schedule`` too),
        and where the page lies in the whole."""
        rows = [{**row, "schedule": self.schedules.get(row["entry"])} for row in self.entries]
        return {"leader": self.leader, "entries": rows, "total": self.total,
                "offset": self.offset, "limit": self.limit}


class ClusterView:
    """The reads behind every page; one per web app, shared by its threads."""

    def __init__(self, cluster: Cluster, definitions_every: float = DEFINITIONS_EVERY,
                 after_rebuild: Callable[[], None] | None = None) -> None:
        """``after_rebuild`` runs in the background thread when it is done (Django's
        admin closes that thread's database connection with it)."""
        self.cluster = cluster
        self.definitions_every = definitions_every
        self.after_rebuild = after_rebuild
        self._definitions: Definitions | None = None
        self._lock = threading.Lock()
        self._rebuilding = False

    # -- the cluster page ------------------------------------------------------------

    def overview(self) -> dict[str, Any]:
        """Leader and lease, nodes, and the store's health, as ``/api/cluster`` gives them."""
        leader = public(self.cluster.leader())
        if leader is not None:
            leader["since"] = self.leading_since(leader["epoch"])
        return {"leader": leader, "nodes": self.nodes(), "store": self.store_health()}

    def leading_since(self, epoch: int, look_back: int = 1000) -> str | None:
        """When the leader of ``epoch`` was elected, from the newest ``look_back`` events;
        None when its election is older than those."""
        for event in reversed(self.cluster.history(look_back)):
            if event.get("event") == "elected" and event.get("epoch") == str(epoch):
                return event["time"]
        return None

    def nodes(self) -> list[NodeRow]:
        return self.cluster.nodes()

    def store_health(self) -> dict[str, Any]:
        """Where the state lives, how long a round trip takes, what the server warns of."""
        config = self.cluster.config
        started = time.perf_counter()
        try:
            self.cluster.store.ping()
            warnings = self.cluster.store.warnings()
        except Exception as exc:  # noqa: BLE001 - shown on the page; the next poll asks again
            return {"redis": describe(config.store_url or config.redis_url), "prefix": config.key_prefix,
                    "ok": False, "ping_ms": None, "warnings": [], "error": str(exc)}
        return {"redis": describe(config.store_url or config.redis_url), "prefix": config.key_prefix, "ok": True,
                "ping_ms": round((time.perf_counter() - started) * 1000, 2),
                "warnings": warnings, "error": None}

    # -- the entries page ------------------------------------------------------------

    def page(self, offset: int = 0, limit: int = 50, query: str = "", state: str = ""
             ) -> Page:
        """Entries ``offset`` to ``offset + limit`` of those whose name contains ``query``
        (and whose last slot is in ``state``, or that are paused), sorted by name.

        Only the page's slots are read, unless ``state`` filters on them (then all)."""
        definitions, paused = self.definitions(), self.cluster.paused()
        names: list[str] | tuple[str, ...] = definitions.names
        if query:
            folded = query.casefold()
            names = [n for n in names if folded in n.casefold()]
        if state == "paused":
            names = [n for n in names if n in paused]
        elif state:
            every = self.cluster.ledger.load()
            names = [n for n in names
                     if n in every and every[n].state.label == state]
        chosen = list(names[offset:offset + limit])
        rows = self.rows(chosen, definitions, self.cluster.ledger.load(chosen), paused)
        return Page(public(self.cluster.leader()), rows, len(names), offset, limit,
                    {name: definitions.schedule_text(name) for name in chosen})

    def entry(self, name: str) -> dict[str, Any]:
        """One entry's row, and its newest history events (oldest first), grouped by slot.

        Raises :class:`~celery_leaderbeat.errors.EntryNotFound` for a name that is no
        entry."""
        definitions, stored = self.definitions(), self.cluster.ledger.load([name])
        if name not in definitions.schedule and name not in stored:
            self.cluster.check_entry(name)  # a new entry passes; a typo raises, with hints
            definitions = self.definitions(fresh=True)
        row = self.rows([name], definitions, stored, self.cluster.paused())[0]
        history = self.cluster.history(ENTRY_HISTORY, name)
        slots = slots_of(history)
        if row["state"] == "claimed" and row["last_slot"] not in {s["slot"] for s in slots}:
            # claimed and not yet confirmed sent: the store knows it, the history not yet
            slots.insert(0, {"slot": row["last_slot"], "outcome": "claimed", "events": [],
                             "detail": "claimed; not confirmed sent yet",
                             "node": row["rescued_by"], "epoch": row["epoch"], "time": None})
        return {"entry": row, "schedule": definitions.schedule_text(name), "slots": slots,
                "history": history}

    def rows(self, names: list[str], definitions: Definitions, stored: dict[str, SlotState],
             paused: dict[str, dict[str, Any]]) -> list[EntryRow]:
        """The rows ``status`` shows for ``names`` (``Cluster.entries`` for just these)."""
        rows = [self._row(name, definitions, stored.get(name), paused.get(name))
                for name in names]
        runs = self.cluster.runs([row["task_id"] for row in rows if row["task_id"]])
        for row in rows:
            row["run"] = runs.get(row["task_id"] or "")
        return rows

    def _row(self, name: str, definitions: Definitions, state: SlotState | None,
             paused: dict[str, Any] | None) -> EntryRow:
        schedule = definitions.schedule
        row = EntryRow(entry=name, source=self._source(name, definitions),
                       configured=name in schedule or name.startswith("celery."),
                       last_slot=None, state=None, epoch=None, task_id=None, rescued_by=None,
                       run=None, next_due=None, paused=paused)
        if state is not None:
            last = from_ms(state.slot_ms)
            row["last_slot"], row["state"] = last.isoformat(), state.state.label
            row["epoch"], row["rescued_by"] = state.epoch, state.node
            sent = state.state not in (SlotStatus.ANCHOR, SlotStatus.SKIPPED)
            row["task_id"] = (slot_id(self.cluster.config.key_prefix, name, last) if sent
                              else None)
        if name in schedule:
            opts = definitions.options.get(name) or EntryOptions.defaults(self.cluster.config)
            clock = clock_for(schedule[name]["schedule"], name=name,
                              tz=opts.tz or self.cluster.app.timezone, jitter=opts.jitter)
            after = from_ms(state.slot_ms) if state else datetime.now(timezone.utc)
            row["next_due"] = clock.fire_time(clock.next_after(after)).isoformat()
        return row

    @staticmethod
    def _source(name: str, definitions: Definitions) -> str:
        if name in definitions.static or name.startswith("celery."):
            return "static"
        if name in definitions.dynamic_all:
            return "dynamic" if name in definitions.dynamic else "dynamic (disabled)"
        return "database" if name in definitions.schedule else "-"

    # -- definitions, rebuilt in the background ----------------------------------------

    def definitions(self, fresh: bool = False) -> Definitions:
        """The definitions: built now the first time (or when ``fresh``); afterwards the
        last ones, with a rebuild started in the background once they are old."""
        current = self._definitions
        if current is None or fresh:
            current = self._definitions = self._build()
            return current
        if time.monotonic() - current.built_at > self.definitions_every:
            with self._lock:
                start, self._rebuilding = not self._rebuilding, True
            if start:
                threading.Thread(target=self._rebuild, name="leaderbeat-web-definitions",
                                 daemon=True).start()
        return current

    def _rebuild(self) -> None:
        try:
            self._definitions = self._build()
        except Exception:  # pages keep the last definitions; the next page retries
            logger.warning("leaderbeat web: cannot rebuild the entries' definitions",
                           exc_info=True)
        finally:
            with self._lock:
                self._rebuilding = False
            if self.after_rebuild is not None:
                self.after_rebuild()

    def _build(self) -> Definitions:
        cluster = self.cluster
        schedule, options = cluster.schedule()
        static = frozenset(name for name in schedule
                           if name in (cluster.app.conf.beat_schedule or {}))
        dynamic, dynamic_options = cluster.dynamic_entries()
        dynamic_all = frozenset(cluster.store.entries.names())
        every = {**dynamic, **schedule}
        names = tuple(sorted({*every, *cluster.ledger.load()}))
        return Definitions(every, {**dynamic_options, **options}, static, frozenset(dynamic),
                           dynamic_all, names, time.monotonic())


#: how each event reads as a slot's outcome: (event, the detail's start) -> outcome
_OUTCOMES = (("sent", "rescued", "rescued"), ("sent", "recovered", "recovered"),
             ("sent", "backfill", "backfilled"), ("sent", "", "sent"),
             ("missed", "", "missed"), ("skipped", "", "skipped"), ("unsent", "", "unsent"),
             ("triggered", "", "triggered"), ("error", "", "error"))


def outcome(event: HistoryEvent) -> str | None:
    """What one history event says happened to its slot; None for events about no slot
    (paused, resumed, audit, elected ...)."""
    kind, detail = event.get("event", ""), event.get("detail", "")
    for name, starts, says in _OUTCOMES:
        if kind == name and detail.startswith(starts):
            return says
    return None


def slots_of(history: list[HistoryEvent]) -> list[dict[str, Any]]:
    """The slots the history names, newest first: each slot's outcome (its last event's),
    who sent it, why it was missed or skipped, and every event about it."""
    slots: dict[str, dict[str, Any]] = {}
    for event in history:
        says = outcome(event)
        if says is None or not event.get("slot"):
            continue
        slot = slots.setdefault(event["slot"], {"slot": event["slot"], "events": []})
        slot["events"].append(event)
        slot.update(outcome=says, detail=event.get("detail", ""), node=event.get("node"),
                    epoch=event.get("epoch"), time=event["time"])
    return sorted(slots.values(), key=lambda s: s["slot"], reverse=True)

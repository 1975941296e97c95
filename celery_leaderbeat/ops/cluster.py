"""One app's leaderbeat state in the store, as the CLI reads it and acts on it.

Reads: the leader, every entry's last slot (and, with the worker guard, whether
that run started and finished), the nodes, the history. Acts: step a leader
down, pause and resume an entry, queue a trigger or a backfill for the leader,
reset everything. Nothing here runs inside a beat; every write is one that a
running cluster handles safely (a released lease is fenced, a paused entry is
skipped at its next claim, requests are popped by exactly one leader). It
reaches the store only through its interfaces (``store/base.py``).
"""

from __future__ import annotations

import socket
import time
from datetime import datetime, timezone
from typing import Any, TypedDict, cast

from ..config import Config
from ..entries import EntryOptions, split_entries
from ..errors import BackfillRefused, EntryNotFound
from ..roles.requests import Request, submit
from ..store.base import Store
from ..store.open import open_store
from ..store.types import SlotStatus
from ..timing.clocks import IntervalClock
from ..timing.slots import clock_for, from_ms, slot_id, to_ms

#: a node not seen for this many renew intervals is shown as gone
GONE_AFTER_RENEWS = 3


class Leader(TypedDict):
    """The lease holder."""

    node: str
    epoch: int
    lease_ms_left: int
    #: the lease's fencing token (``node|epoch``); ``--json`` leaves it out
    token: str


class EntryRow(TypedDict):
    """One entry as ``status`` shows it (times are ISO strings, UTC)."""

    entry: str
    #: static (beat_schedule), dynamic, dynamic (disabled), database (django-celery-beat), -
    source: str
    configured: bool
    last_slot: str | None
    state: str | None
    epoch: int | None
    task_id: str | None
    #: the node that claimed the last slot
    rescued_by: str | None
    run: str | None
    next_due: str | None
    paused: dict[str, Any] | None


class NodeRow(TypedDict, total=False):
    """One registered beat: what it wrote (host, pid, version, clock_skew, ...), and how
    long ago."""

    node: str
    role: str | None
    seen_ago: float | None
    gone: bool
    host: str
    pid: int
    version: str
    clock_skew: float | None
    epoch: int | None
    last_seen: float
    instance: str
    following_since: float | None
    send_path: str | None


class _EventBase(TypedDict):
    id: str
    time: str


class HistoryEvent(_EventBase, total=False):
    """One history event; which fields it has depends on ``event``."""

    event: str
    entry: str
    slot: str
    node: str
    epoch: str
    detail: str


class Cluster:
    """Read and act on one app's leaderbeat state."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.config = Config.from_app(app)
        self.store: Store = open_store(self.config)
        self.ledger = self.store.ledger
        self._dynamic_names: set[str] = set()

    # -- reading ---------------------------------------------------------------------------

    def leader(self) -> Leader | None:
        """The node holding the lease, or None."""
        token, ms_left = self.store.lease.holder()
        if not token:
            return None
        node, epoch = token.rsplit("|", 1)
        return Leader(node=node, epoch=int(epoch), lease_ms_left=int(ms_left), token=token)

    def schedule(self) -> tuple[dict[str, Any], dict[str, EntryOptions]]:
        """``beat_schedule``, plus the rows of a django-celery-beat base scheduler."""
        entries, options = split_entries(self.app.conf.beat_schedule or {}, self.config)
        base = self.config.base_scheduler
        if base is not None and hasattr(base, "Model") and hasattr(base, "Entry"):
            from ..integrations.django import database_rows

            entries = {**database_rows(self.app, base), **entries}
        return entries, options

    def kind_of(self, name: str) -> str | None:
        """What defines ``name``: 'beat_schedule entry', 'runtime entry' (or 'runtime
        entry (disabled)'), 'django-celery-beat entry'; None when nothing does."""
        if name in (self.app.conf.beat_schedule or {}) or name.startswith("celery."):
            return "beat_schedule entry"
        stored = self.store.entries.get(name)
        if stored is not None:
            return "runtime entry" + ("" if stored.enabled else " (disabled)")
        if name in self.schedule()[0]:
            return "django-celery-beat entry"
        return None

    def check_entry(self, name: str) -> None:
        """Raise :class:`EntryNotFound` (with the nearest names) unless ``name`` is an entry
        of ``beat_schedule``, of the database, a runtime entry, or has state in the store."""
        schedule, _ = self.schedule()
        if (name in schedule or name in self.ledger.load([name])
                or self.store.entries.get(name) is not None):
            return
        kinds = "beat_schedule, the runtime entries"
        if self.config.base_scheduler is not None:
            kinds += ", the django-celery-beat table"
        known = {*schedule, *self.store.entries.all(), *self.ledger.load()}
        raise EntryNotFound(name, f"in {kinds} or the slots in {self.store.admin.where}",
                            known)

    def paused(self) -> dict[str, dict[str, Any]]:
        return self.store.admin.paused()

    def entries(self) -> list[EntryRow]:
        """Every entry (configured or left in Redis): last slot, state, run, next due, paused."""
        schedule, options = self.schedule()
        static = set(self.app.conf.beat_schedule or {})  # the rows of a database are not
        dynamic = self.dynamic_entries()
        schedule, options = {**dynamic[0], **schedule}, {**dynamic[1], **options}
        stored, paused = self.ledger.load(), self.paused()
        rows: list[EntryRow] = []
        for name in sorted(set(schedule) | set(stored)):
            state = stored.get(name)
            row = EntryRow(entry=name, source=self._source(name, static, dynamic),
                           configured=name in schedule or name.startswith("celery."),
                           last_slot=None, state=None, epoch=None, task_id=None,
                           rescued_by=None, run=None, next_due=None, paused=paused.get(name))
            if state is not None:
                last = from_ms(state.slot_ms)
                sent = state.state not in (SlotStatus.ANCHOR, SlotStatus.SKIPPED)
                row["last_slot"], row["state"] = last.isoformat(), state.state.label
                row["epoch"], row["rescued_by"] = state.epoch, state.node
                row["task_id"] = slot_id(self.config.key_prefix, name, last) if sent else None
            if name in schedule:
                opts = options.get(name) or EntryOptions.defaults(self.config)
                clock = clock_for(schedule[name]["schedule"], name=name,
                                  tz=opts.tz or self.app.timezone, jitter=opts.jitter)
                after = from_ms(state.slot_ms) if state else datetime.now(timezone.utc)
                row["next_due"] = clock.fire_time(clock.next_after(after)).isoformat()
            rows.append(row)
        runs = self.runs([row["task_id"] for row in rows if row["task_id"]])
        for row in rows:
            row["run"] = runs.get(row["task_id"] or "")
        return rows

    def dynamic_entries(self) -> tuple[dict[str, Any], dict[str, EntryOptions]]:
        """The enabled dynamic entries, as :meth:`schedule` gives the static ones."""
        from ..store.dynamic import Entry  # late: it imports celery.schedules

        raw: dict[str, Any] = {}
        every = self.store.entries.all()
        self._dynamic_names = set(every)
        for name, stored in every.items():
            if stored.enabled:
                try:
                    raw[name] = Entry.from_stored(stored).raw()
                except (ValueError, KeyError):
                    continue  # shown without a next slot
        try:
            return split_entries(raw, self.config)
        except Exception:  # noqa: BLE001 - one entry this host cannot read: show the others bare
            return {}, {}

    def _source(self, name: str, static: set[str], dynamic: tuple[dict[str, Any], Any]) -> str:
        if name in static or name.startswith("celery."):
            return "static"
        if name in dynamic[0] or name in self._dynamic_names:
            return "dynamic" if name in dynamic[0] else "dynamic (disabled)"
        return "database" if self.config.base_scheduler is not None else "-"

    def runs(self, task_ids: list[str]) -> dict[str, str]:
        """The worker guard's record of each run: started (on whom) or finished."""
        return {task_id: (f"finished on {run.worker}" if run.state == "finished" else
                          f"running on {run.worker}" if run.alive else
                          f"started on {run.worker}, lost")
                for task_id, run in self.store.guard.runs(task_ids).items()}

    def nodes(self) -> list[NodeRow]:
        """Every registered beat, gone ones marked; it only reads (the leader's
        housekeeping removes records of nodes long gone)."""
        now = time.time()
        gone_after = GONE_AFTER_RENEWS * self.config.renew_interval
        rows: list[NodeRow] = []
        for node_id, info in sorted(self.ledger.nodes().items()):
            seen = info.get("last_seen")
            ago = None if seen is None else round(now - seen, 1)
            gone = ago is None or ago > gone_after
            role = f"gone (was {info.get('role')})" if gone else info.get("role")
            rows.append(cast(NodeRow, {**info, "node": node_id, "seen_ago": ago, "gone": gone,
                                       "role": role}))
        return rows

    def history(self, count: int, entry: str | None = None) -> list[HistoryEvent]:
        rows = self.ledger.history(count if entry is None else max(count * 20, 1000))
        if entry is not None:
            rows = [row for row in rows if row.get("entry") == entry][-count:]
        return [_readable(row) for row in rows]

    def follow(self, cursor: str | None = None, block_ms: int = 1000
               ) -> tuple[str, list[HistoryEvent]]:
        """History events after ``cursor`` (None: from now; blocks up to ``block_ms``)."""
        cursor, rows = self.store.admin.follow(cursor, block_ms)
        return cursor, [_readable(row) for row in rows]

    def node_health(self, host: str | None = None) -> tuple[bool, str]:
        """Is this host's beat a live leader or a healthy standby? (ok, one line of reason)."""
        host = host or socket.gethostname()
        mine = [row for row in self.nodes() if row.get("host") == host]
        if not mine:
            return False, f"no beat on host {host} is registered in {self.store.admin.where}"
        row = min(mine, key=lambda r: r.get("seen_ago") or 1e9)
        if row.get("gone"):
            return False, (f"{row.get('node')} last seen {row.get('seen_ago')} s ago (more than "
                           f"{GONE_AFTER_RENEWS} renew intervals): not running or cannot reach Redis")
        skew = row.get("clock_skew")
        if skew is not None and abs(skew) > self.config.max_clock_skew:
            return False, (f"{row.get('node')} clock is {skew:+.3f} s off Redis TIME, beyond "
                           f"leaderbeat_max_clock_skew={self.config.max_clock_skew}")
        leader = self.leader()
        if leader and leader["node"] == row.get("node"):
            return True, f"{leader['node']} leads (epoch {leader['epoch']})"
        return True, (f"{row.get('node')} is a healthy standby (seen {row.get('seen_ago')} s ago); "
                      f"leader: {leader['node'] if leader else 'none'}")

    def leads_here(self, host: str | None = None) -> bool:
        """Does the node holding the lease run on this host?"""
        leader = self.leader()
        if leader is None:
            return False
        info = self.ledger.nodes().get(leader["node"]) or {}
        return bool(info.get("host") == (host or socket.gethostname()))

    # -- acting ----------------------------------------------------------------------------

    def step_down(self) -> Leader | None:
        """Release the current leader's lease: a standby takes over at once (fenced)."""
        leader = self.leader()
        if leader is None:
            return None
        released = self.store.admin.step_down(leader["token"],
                                              "step-down (celery leaderbeat step-down)")
        return leader if released else None

    def wait_for_leader(self, other_than: str, timeout: float) -> tuple[Leader | None, float]:
        """The next leader (a token other than ``other_than``) within ``timeout`` s, and
        how long it took."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            leader = self.leader()
            if leader and leader["token"] != other_than:
                return leader, time.monotonic() - started
            time.sleep(0.005)
        return None, time.monotonic() - started

    def pause(self, name: str, note: str) -> None:
        self.check_entry(name)
        record = {"note": note, "at": datetime.now(timezone.utc).isoformat(),
                  "by": f"{socket.gethostname()}"}
        self.store.admin.pause(name, record)
        self._note(name, "paused", note)

    def resume(self, name: str) -> bool:
        self.check_entry(name)
        removed = self.store.admin.resume(name)
        if removed:
            self._note(name, "resumed", "")
        return removed

    def trigger(self, name: str, note: str) -> Request:
        self.check_entry(name)
        request = Request("trigger", name, note=note)
        submit(self.store.requests, request)
        return request

    def backfill_slots(self, name: str, start: datetime, end: datetime
                       ) -> tuple[list[datetime], list[datetime], datetime | None]:
        """The entry's slots in [start, end]: (never sent, already sent, history horizon)."""
        self.check_entry(name)
        schedule, options = self.schedule()
        if name not in schedule:
            raise BackfillRefused(self._not_backfillable(name))
        opts = options.get(name) or EntryOptions.defaults(self.config)
        clock = clock_for(schedule[name]["schedule"], name=name, tz=opts.tz or self.app.timezone,
                          jitter=opts.jitter)
        slots: list[datetime] = []
        s = clock.next_after(start - _MS)
        if isinstance(clock, IntervalClock) and not clock.relative:
            # an interval's slots are anchor + k x every: the phase is the stored last slot
            stored = self.ledger.load([name]).get(name)
            if stored is None:
                raise BackfillRefused(f"entry {name!r} has no slot in {self.store.admin.where} "
                                      "yet: the phase of its interval is unknown")
            anchor = from_ms(stored.slot_ms)
            s = anchor + -((anchor - start) // clock.every) * clock.every
        while s <= end and len(slots) <= 100_000:
            slots.append(s)
            s = clock.next_after(s)
        done: set[int] = set()
        horizon: datetime | None = None
        for row in self.store.admin.all_history():
            if horizon is None:
                horizon = from_ms(int(row["at"]))
            if row.get("entry") == name and row.get("event") in ("sent", "triggered"):
                done.add(int(row.get("slot") or 0))
        done |= self.store.requests.backfilled(name)
        never = [s for s in slots if to_ms(s) not in done]
        return never, [s for s in slots if to_ms(s) in done], horizon

    def backfill(self, name: str, slots: list[datetime], note: str) -> Request:
        request = Request("backfill", name, note=note, slots_ms=tuple(to_ms(s) for s in slots))
        submit(self.store.requests, request)
        return request

    def reset(self) -> int:
        """Delete this app's state (lease, claims, history, nodes, pauses), not its entries."""
        return self.store.admin.reset()

    def _not_backfillable(self, name: str) -> str:
        kind = self.kind_of(name)
        if kind is not None:
            kinds = "beat_schedule" + (" and django-celery-beat" if self.config.base_scheduler
                                       is not None else "")
            return f"entry {name!r} is a {kind}: backfill knows the slots of {kinds} entries only"
        return (f"entry {name!r} is no longer scheduled (only its state is left in "
                f"{self.store.admin.where}): its slots are unknown")

    def _note(self, name: str, event: str, detail: str) -> None:
        self.store.admin.note({"event": event, "entry": name, "detail": detail,
                               "node": f"cli@{socket.gethostname()}"})


_MS = from_ms(1) - from_ms(0)


def _readable(row: dict[str, str]) -> HistoryEvent:
    fields = dict(row)
    when = datetime.fromtimestamp(int(fields.pop("at")) / 1000, timezone.utc)
    out: dict[str, Any] = dict(fields, time=when.isoformat(timespec="milliseconds"))
    if row.get("slot"):
        out["slot"] = from_ms(int(row["slot"])).isoformat()
    return cast(HistoryEvent, out)

"""One call of the worker guard about one run: its rows locked, what they say at the
server's instant, and the writes every rule shares (the rules: :mod:`.guard_sql`)."""

from __future__ import annotations

from typing import Any, NamedTuple

from ..base import GuardRun
from .schema import qualified


class Ttls(NamedTuple):
    """How long a run's record is kept, and its liveness (the lease ttl), in ms."""

    record_ms: int
    lease_ms: int


# The upserts lock the row whether it exists or not (DO UPDATE locks the one found, and
# retries when a sweep deletes it meanwhile); the assignment changes nothing. The run's
# upsert also returns the server's clock, read once both rows are locked.
_ENTRY = """
INSERT INTO {schema}.guard_locks AS g (app, entry) VALUES (%(app)s, %(entry)s)
ON CONFLICT (app, entry) DO UPDATE SET app = g.app
RETURNING holder, lock_until, held_slot_ms, held_worker, held_cancelled, held_until,
          waiting_until
"""
_RUN = """
INSERT INTO {schema}.guard_runs AS r (app, run_id) VALUES (%(app)s, %(run_id)s)
ON CONFLICT (app, run_id) DO UPDATE SET app = r.app
RETURNING state, token, worker, record_until, alive_token, alive_worker, alive_until,
          clock_timestamp()
"""
#: an expiry ``ms`` after the call's instant
LATER = "%(now)s + %(ms)s * interval '1 millisecond'"
# the lock handed to a waiting slot: the run that held it is gone, and its slot with it
_HAND_LOCK = ("UPDATE {schema}.guard_locks SET holder = %(holder)s, lock_until = " + LATER
              + ", held_until = NULL WHERE app = %(app)s AND entry = %(entry)s")
_FREE_LOCK = """
UPDATE {schema}.guard_locks SET holder = NULL, lock_until = NULL, held_until = NULL
WHERE app = %(app)s AND entry = %(entry)s
"""
_FORGET_WAITING = """
WITH gone AS (DELETE FROM {schema}.guard_waiting WHERE app = %(app)s AND entry = %(entry)s)
UPDATE {schema}.guard_locks SET waiting_until = NULL WHERE app = %(app)s AND entry = %(entry)s
"""
# waiting slots in the order of a Redis sorted set: by slot, then the task id's bytes
_FIRST_WAITING = """
SELECT task_id, message FROM {schema}.guard_waiting WHERE app = %(app)s AND entry = %(entry)s
ORDER BY slot_ms, task_id COLLATE "C" LIMIT 1
"""
_COUNT = """
INSERT INTO {schema}.guard_decisions AS d (app, entry, policy, decision, n)
VALUES (%(app)s, %(entry)s, %(policy)s, %(decision)s, 1)
ON CONFLICT (app, entry, policy, decision) DO UPDATE SET n = d.n + 1
"""
_HISTORY = """
INSERT INTO {schema}.history (app, event, entry, slot_ms, node, epoch, detail)
VALUES (%(app)s, %(event)s, %(entry)s, %(slot_ms)s, %(node)s, %(epoch)s, %(detail)s)
"""
_SET_RECORD = ("UPDATE {schema}.guard_runs SET state = %(state)s, token = %(token)s,"
               " worker = %(worker)s, record_until = " + LATER
               + " WHERE app = %(app)s AND run_id = %(run_id)s")


def live(value: Any, until: Any, now: Any) -> Any:
    """``value`` while ``until`` is after ``now``, else None (as a key past its ttl)."""
    return value if until is not None and until > now else None


class Holder(NamedTuple):
    """The run that holds the slot: state (``s``/``f``), its token, its worker."""

    state: str
    token: int
    worker: str


class Call:
    """One call about one run, its rows locked: what they say now, and the writes."""

    def __init__(self, conn: Any, schema: str, app: str, run: GuardRun, ttls: Ttls,
                 now: Any = None) -> None:
        self.conn, self.schema, self.app, self.run, self.ttls = conn, schema, app, run, ttls
        self.policy = "allow_all" if run.overlap == "allow" else run.overlap
        self.now = now
        self.lock: str | None = None
        self.held_slot, self.held_cancelled = 0, False
        self.holder: Holder | None = None
        self.alive = False

    @classmethod
    def locked(cls, conn: Any, schema: str, app: str, run: GuardRun, ttls: Ttls) -> Call:
        """The call with its entry's row and its run's row locked, and what they say."""
        call = cls(conn, schema, app, run, ttls)
        entry = call.q(_ENTRY).fetchone()
        record = call.q(_RUN).fetchone()
        call.now = record[7]
        call.read(entry, record)
        return call

    def read(self, entry: Any, record: Any) -> None:
        now = self.now
        self.lock = live(entry[0], entry[1], now)
        self.held_slot = live(entry[2], entry[5], now) or 0
        self.held_cancelled = bool(live(entry[4], entry[5], now))
        if entry[6] is not None and entry[6] <= now:  # the waiting slots lapsed
            self.forget_waiting()
        self.alive = live(record[4], record[6], now) is not None
        if live(record[0], record[3], now):
            self.holder = Holder(record[0], record[1], record[2])
        elif self.alive:  # the record lapsed while the run goes on
            self.holder = Holder("s", record[4], record[5])

    def q(self, text: str, **params: Any) -> Any:
        run = self.run
        return self.conn.execute(qualified(text, self.schema), {
            "app": self.app, "entry": run.entry, "run_id": run.run_id, "task": run.task_id,
            "now": self.now, **params})

    def history(self, event: str, detail: str, slot: int | None = None) -> None:
        run = self.run
        epoch = str(run.epoch)
        self.q(_HISTORY, event=event, slot_ms=run.slot_ms if slot is None else slot,
               node=run.worker, epoch=int(epoch) if epoch.isdigit() else 0, detail=detail)

    def count(self, decision: str) -> None:
        self.q(_COUNT, policy=self.policy, decision=decision)

    def forget_waiting(self) -> None:
        """The entry's waiting slots lapsed: they go."""
        self.q(_FORGET_WAITING)

    def first_waiting(self) -> tuple[str, str] | None:
        row = self.q(_FIRST_WAITING).fetchone()
        return (row[0], row[1]) if row else None

    def promote(self) -> str | None:
        """Hand the lock to the first waiting slot for two leases; its message, or None
        when none waits."""
        first = self.first_waiting()
        if first is None:
            return None
        self.q(_HAND_LOCK, holder=first[0], ms=2 * self.ttls.lease_ms)
        return first[1]

    def hand_on(self) -> str:
        """The run holding the lock ended: free it and hand it on; the message, or ""."""
        if self.lock != self.run.task_id:
            return ""
        message = self.promote()
        if message is None:
            self.q(_FREE_LOCK)
        return message or ""

    def record(self, state: str, token: int, worker: str) -> None:
        self.q(_SET_RECORD, state=state, token=token, worker=worker, ms=self.ttls.record_ms)

    def cancelled_said(self, outcome: str) -> str:
        """The outcome of a run that ends, said 'cancelled' when a newer slot replaced it."""
        if self.lock != self.run.task_id or not self.held_cancelled \
                or outcome.startswith("cancelled:"):
            return outcome
        return f"cancelled: replaced ({outcome})"

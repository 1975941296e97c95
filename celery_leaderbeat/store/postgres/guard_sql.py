"""The worker guard's records in SQL: ``guard.lua``'s rules, one transaction per call.

Row locks stand in for the script's atomicity. Every call about a run locks, in this
order, its entry's row of ``guard_locks`` (every call about the entry waits on it), then
the run's row of ``guard_runs`` (two deliveries of one run wait on it), and a start
last the app's ``guard_fence`` row; the sweep takes entry rows only, in name order, so
no two calls wait on each other in a circle. Once the rows are locked the server's clock
is read once: every expiry of the call is decided and written against that instant (a
row whose time has passed counts as absent, as a Redis key past its ttl would).

The functions take ``(conn, schema, app, ...)`` and run through ``Place.run``: their
names are the fault sites (``start_run``, ``renew_run``, ``finish_run``,
``release_run``, ``sweep_waiting``, ``read_runs``, ``read_decisions``).
"""

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
# returns the server's clock, read once both rows are locked.
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
_LATER = "%(now)s + %(ms)s * interval '1 millisecond'"
# the lock handed to a waiting slot: the run that held it is gone, and its slot with it
_HAND_LOCK = ("UPDATE {schema}.guard_locks SET holder = %(holder)s, lock_until = " + _LATER
              + ", held_until = NULL WHERE app = %(app)s AND entry = %(entry)s")
_FREE_LOCK = """
UPDATE {schema}.guard_locks SET holder = NULL, lock_until = NULL, held_until = NULL
WHERE app = %(app)s AND entry = %(entry)s
"""
_TAKE_LOCK = ("UPDATE {schema}.guard_locks SET holder = %(task)s, lock_until = " + _LATER
              + ", held_slot_ms = %(slot_ms)s, held_worker = %(worker)s,"
              " held_cancelled = false, held_until = " + _LATER
              + " WHERE app = %(app)s AND entry = %(entry)s")
# the held record's expiry is kept (a record gone stays one without expiry, as SET KEEPTTL)
_CANCEL_HELD = """
UPDATE {schema}.guard_locks SET held_cancelled = true,
    held_slot_ms = CASE WHEN held_until > %(now)s THEN held_slot_ms END,
    held_until = CASE WHEN held_until > %(now)s THEN held_until ELSE 'infinity' END
WHERE app = %(app)s AND entry = %(entry)s
"""
_EXTEND_LOCK = ("UPDATE {schema}.guard_locks SET lock_until = " + _LATER + ","
                " held_until = CASE WHEN held_until > %(now)s THEN " + _LATER
                + " ELSE held_until END WHERE app = %(app)s AND entry = %(entry)s")
_FORGET_WAITING = """
WITH gone AS (DELETE FROM {schema}.guard_waiting WHERE app = %(app)s AND entry = %(entry)s)
UPDATE {schema}.guard_locks SET waiting_until = NULL WHERE app = %(app)s AND entry = %(entry)s
"""
# waiting slots in the order of a Redis sorted set: by slot, then the task id's bytes
_FIRST_WAITING = """
SELECT task_id, message FROM {schema}.guard_waiting WHERE app = %(app)s AND entry = %(entry)s
ORDER BY slot_ms, task_id COLLATE "C" LIMIT 1
"""
_IS_WAITING = """
SELECT 1 FROM {schema}.guard_waiting
WHERE app = %(app)s AND entry = %(entry)s AND task_id = %(task)s
"""
_WAIT = ("""
WITH added AS (
    INSERT INTO {schema}.guard_waiting AS w (app, entry, task_id, slot_ms, message)
    VALUES (%(app)s, %(entry)s, %(task)s, %(slot_ms)s, %(message)s)
    ON CONFLICT (app, entry, task_id) DO UPDATE SET message = excluded.message
    RETURNING (xmax = 0) AS new
), kept AS (
    UPDATE {schema}.guard_locks SET waiting_until = """ + _LATER + """
    WHERE app = %(app)s AND entry = %(entry)s
)
SELECT new FROM added
""")
_STOP_WAITING = """
DELETE FROM {schema}.guard_waiting WHERE app = %(app)s AND entry = %(entry)s AND task_id = %(task)s
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
               " worker = %(worker)s, record_until = " + _LATER
               + " WHERE app = %(app)s AND run_id = %(run_id)s")
_SET_ALIVE = ("UPDATE {schema}.guard_runs SET alive_token = %(token)s,"
              " alive_worker = %(worker)s, alive_until = " + _LATER
              + " WHERE app = %(app)s AND run_id = %(run_id)s")
_STARTED = ("UPDATE {schema}.guard_runs SET state = 's', token = %(token)s,"
            " worker = %(worker)s,"
            " record_until = %(now)s + %(record_ms)s * interval '1 millisecond',"
            " alive_token = %(token)s, alive_worker = %(worker)s, alive_until = "
            + _LATER + " WHERE app = %(app)s AND run_id = %(run_id)s")
_END_ALIVE = """
UPDATE {schema}.guard_runs SET alive_token = NULL, alive_worker = NULL, alive_until = NULL
WHERE app = %(app)s AND run_id = %(run_id)s
"""
# the next token: above the last one, and never below the server's clock in µs
_FENCE = """
INSERT INTO {schema}.guard_fence AS f (app, fence)
VALUES (%(app)s, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
ON CONFLICT (app) DO UPDATE SET fence = greatest(f.fence + 1, excluded.fence)
RETURNING fence
"""
_NOW = "SELECT clock_timestamp()"
# entries with waiting slots whose lock lapsed, or whose waiting slots did: only those,
# so the 100 looked at are ones to act on however many entries have slots waiting behind
# a live run (a row lock re-checks the condition on the row's newest version); one a
# concurrent call holds is looked at by the next sweep
_WAITING_ENTRIES = """
SELECT g.entry, g.holder, g.lock_until, g.waiting_until FROM {schema}.guard_locks AS g
WHERE g.app = %(app)s
  AND (g.lock_until IS NULL OR g.lock_until <= clock_timestamp()
       OR g.waiting_until IS NULL OR g.waiting_until <= clock_timestamp())
  AND EXISTS (SELECT 1 FROM {schema}.guard_waiting AS w
              WHERE w.app = g.app AND w.entry = g.entry)
ORDER BY g.entry LIMIT 100 FOR UPDATE SKIP LOCKED
"""
# runs whose record and liveness both lapsed: nothing reads them any more
_PRUNE_RUNS = """
DELETE FROM {schema}.guard_runs WHERE app = %(app)s AND run_id IN (
    SELECT run_id FROM {schema}.guard_runs
    WHERE app = %(app)s AND coalesce(record_until, '-infinity') <= %(now)s
      AND coalesce(alive_until, '-infinity') <= %(now)s
    LIMIT 1000 FOR UPDATE SKIP LOCKED)
"""
_RUNS = """
SELECT run_id, state, worker, alive_until > clock_timestamp() FROM {schema}.guard_runs
WHERE app = %(app)s AND run_id = ANY(%(ids)s) AND record_until > clock_timestamp()
"""
_DECISIONS = "SELECT entry, policy, decision, n FROM {schema}.guard_decisions WHERE app = %(app)s"


def _live(value: Any, until: Any, now: Any) -> Any:
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
        self.lock = _live(entry[0], entry[1], now)
        self.held_slot = _live(entry[2], entry[5], now) or 0
        self.held_cancelled = bool(_live(entry[4], entry[5], now))
        if entry[6] is not None and entry[6] <= now:  # the waiting slots lapsed
            self.q(_FORGET_WAITING)
        self.alive = _live(record[4], record[6], now) is not None
        if _live(record[0], record[3], now):
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


def renew_run(conn: Any, schema: str, app: str, run: GuardRun, ttls: Ttls,
              token: int) -> tuple[bool, str]:
    """Keep the run alive (its record too unless finished) and its entry's lock;
    ``(False, worker of the run holding the slot)`` when superseded."""
    with conn.transaction():
        call = Call.locked(conn, schema, app, run, ttls)
        if call.holder and call.holder.token != token:
            return False, call.holder.worker
        call.q(_SET_ALIVE, token=token, worker=run.worker, ms=ttls.lease_ms)
        if call.holder is None or call.holder.state != "f":
            call.record("s", token, run.worker)
        if call.lock == run.task_id:
            call.q(_EXTEND_LOCK, ms=ttls.lease_ms)
        return True, ""


def finish_run(conn: Any, schema: str, app: str, run: GuardRun, ttls: Ttls, token: int,
               detail: str) -> tuple[bool, str]:
    """Record the run finished and hand its entry's turn on: ``(True, message or "")``;
    ``(False, worker)`` when superseded (noted in the history only)."""
    with conn.transaction():
        call = Call.locked(conn, schema, app, run, ttls)
        if call.holder and call.holder.token != token:
            call.history("finished", f"{detail}; superseded: the slot ran again on "
                                     f"{call.holder.worker}")
            return False, call.holder.worker
        call.record("f", token, run.worker)
        call.q(_END_ALIVE)
        call.history("finished", call.cancelled_said(detail))
        return True, call.hand_on()


def release_run(conn: Any, schema: str, app: str, run: GuardRun, ttls: Ttls,
                detail: str) -> str:
    """This worker terminated the run: record it finished, hand the turn on (the message
    to publish, or "")."""
    with conn.transaction():
        call = Call.locked(conn, schema, app, run, ttls)
        held = call.holder
        if call.lock != run.task_id or held is None or held.state != "s":
            return ""
        call.record("f", held.token, held.worker)
        call.q(_END_ALIVE)
        call.history("finished", detail)
        return call.hand_on()


def start_run(conn: Any, schema: str, app: str, run: GuardRun, ttls: Ttls,
              will_ask_again: bool) -> tuple[str, str, int]:
    """Start the run or say why not: guard.lua's start, its answer as a triple."""
    with conn.transaction():
        call = Call.locked(conn, schema, app, run, ttls)
        held = call.holder
        if held and held.state == "f":
            call.history("skipped", f"duplicate: already ran on {held.worker}")
            return "duplicate", f"finished on {held.worker}", 0
        if held and call.alive:
            if not will_ask_again:
                call.history("skipped", f"duplicate: running on {held.worker}")
            return "duplicate", f"running on {held.worker}", 0
        waited = False
        if call.policy != "allow_all" and run.retry == 0:
            refused = overlap_check(call)
            if refused is not None:
                return refused[0], refused[1], 0
            waited = take_lock(call)
        token = int(conn.execute(qualified(_FENCE, schema), {"app": app}).fetchone()[0])
        call.q(_STARTED, token=token, worker=run.worker, record_ms=ttls.record_ms,
               ms=ttls.lease_ms)
        notes = [f"retry {run.retry}" if run.retry else "after wait" if waited else ""]
        if held:
            call.history("started", "; ".join(
                [n for n in notes if n] + ["rerun: the first run was lost with its worker"]))
            return "run", "rerun", token
        call.history("started", notes[0])
        return "run", "", token


def take_lock(call: Call) -> bool:
    """The slot starts: it holds its entry's lock and waits no more; True if it waited."""
    run, lease_ms = call.run, call.ttls.lease_ms
    call.q(_TAKE_LOCK, slot_ms=run.slot_ms, worker=run.worker, ms=lease_ms)
    waited = bool(call.q(_STOP_WAITING).rowcount == 1)
    call.count("started_after_wait" if waited else "started")
    return waited


def wait_here(call: Call) -> tuple[str, str]:
    """This slot waits for the entry's run (recorded once, however often delivered)."""
    run, lock = call.run, call.lock
    row = call.q(_WAIT, slot_ms=run.slot_ms, message=run.message,
                 ms=call.ttls.record_ms).fetchone()
    if row is not None and row[0]:
        call.history("buffered", f"waits for {lock or 'the slots before it'}")
        call.count("buffered")
    return "wait", lock or ""


def skipped(call: Call, why: str, holder: str | None) -> tuple[str, str]:
    call.history("skipped", f"overlap: {why}")
    call.count("skipped")
    return "overlap", holder or ""


def overlap_check(call: Call) -> tuple[str, str] | None:
    """None: this slot may start; else the answer that says why not."""
    run, lock, policy = call.run, call.lock, call.policy
    if lock == run.task_id:
        return None  # handed the lock: its turn came
    first = call.first_waiting()
    head = first[0] if first else None
    if call.q(_IS_WAITING).fetchone():  # waits already: a message delivered again
        return None if not lock and head == run.task_id else ("wait", lock or "")
    if run.handed_over:
        return skipped(call, "no longer waits", lock)
    if not lock and not head:
        return None
    if policy == "skip":
        return skipped(call, f"{lock or head} still runs", lock or head)
    if policy == "buffer_all":
        return wait_here(call)
    if head:  # buffer_one, cancel_other: one slot waits already and is kept
        return skipped(call, f"{head} waits already", lock or head)
    if policy == "cancel_other" and lock and call.held_slot > run.slot_ms:
        return skipped(call, f"older than the running slot ({lock})", lock)  # delivered late
    reply = wait_here(call)
    if policy == "cancel_other" and lock:  # no slot waits: the lock's holder runs
        call.history("cancelled", f"replaced by slot {run.slot_text or run.slot_ms}",
                     call.held_slot)
        call.count("cancelled")
        call.q(_CANCEL_HELD)
        return "cancel", reply[1]
    return reply


def sweep_waiting(conn: Any, schema: str, app: str, lease_ms: int) -> list[str]:
    """Hand the turn to the first waiting slot of each entry whose lock lapsed; the
    messages to publish. Forgets runs whose record and liveness both lapsed."""
    out = []
    with conn.transaction():
        rows = conn.execute(qualified(_WAITING_ENTRIES, schema), {"app": app}).fetchall()
        now = conn.execute(_NOW).fetchone()[0]
        for entry, holder, lock_until, waiting_until in rows:
            run = GuardRun("", entry, 0, "", "", "")
            call = Call(conn, schema, app, run, Ttls(0, lease_ms), now)
            if waiting_until is None or waiting_until <= now:
                call.q(_FORGET_WAITING)
            elif _live(holder, lock_until, now) is None:
                message = call.promote()
                if message is not None:
                    out.append(message)
        conn.execute(qualified(_PRUNE_RUNS, schema), {"app": app, "now": now})
    return out


def read_runs(conn: Any, schema: str, app: str,
              ids: list[str]) -> list[tuple[str, str, str, bool]]:
    """``(run id, state, worker, alive)`` of each run whose record is kept."""
    return list(conn.execute(qualified(_RUNS, schema), {"app": app, "ids": ids}).fetchall())


def read_decisions(conn: Any, schema: str, app: str) -> list[tuple[str, str, str, int]]:
    return list(conn.execute(qualified(_DECISIONS, schema), {"app": app}).fetchall())

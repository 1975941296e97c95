"""The worker guard's records in SQL: ``guard_*.lua``'s rules, one transaction per call.

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

from typing import Any

from ..base import GuardRun
from .guard_call import LATER, Call, Ttls, live
from .schema import qualified

_TAKE_LOCK = ("UPDATE {schema}.guard_locks SET holder = %(task)s, lock_until = " + LATER
              + ", held_slot_ms = %(slot_ms)s, held_worker = %(worker)s,"
              " held_cancelled = false, held_until = " + LATER
              + " WHERE app = %(app)s AND entry = %(entry)s")
# the held record's expiry is kept (a record gone stays one without expiry, as SET KEEPTTL)
_CANCEL_HELD = """
UPDATE {schema}.guard_locks SET held_cancelled = true,
    held_slot_ms = CASE WHEN held_until > %(now)s THEN held_slot_ms END,
    held_until = CASE WHEN held_until > %(now)s THEN held_until ELSE 'infinity' END
WHERE app = %(app)s AND entry = %(entry)s
"""
_EXTEND_LOCK = ("UPDATE {schema}.guard_locks SET lock_until = " + LATER + ","
                " held_until = CASE WHEN held_until > %(now)s THEN " + LATER
                + " ELSE held_until END WHERE app = %(app)s AND entry = %(entry)s")
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
    UPDATE {schema}.guard_locks SET waiting_until = """ + LATER + """
    WHERE app = %(app)s AND entry = %(entry)s
)
SELECT new FROM added
""")
_STOP_WAITING = """
DELETE FROM {schema}.guard_waiting WHERE app = %(app)s AND entry = %(entry)s AND task_id = %(task)s
"""
_SET_ALIVE = ("UPDATE {schema}.guard_runs SET alive_token = %(token)s,"
              " alive_worker = %(worker)s, alive_until = " + LATER
              + " WHERE app = %(app)s AND run_id = %(run_id)s")
_STARTED = ("UPDATE {schema}.guard_runs SET state = 's', token = %(token)s,"
            " worker = %(worker)s,"
            " record_until = %(now)s + %(record_ms)s * interval '1 millisecond',"
            " alive_token = %(token)s, alive_worker = %(worker)s, alive_until = "
            + LATER + " WHERE app = %(app)s AND run_id = %(run_id)s")
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
    """Start the run or say why not: guard_start.lua, its answer as a triple."""
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
    run, lock = call.run, call.lock
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
    return _by_policy(call, lock, head)


def _by_policy(call: Call, lock: str | None, head: str | None) -> tuple[str, str]:
    """Another run holds the entry, or a slot waits for it: what the policy does."""
    policy = call.policy
    if policy == "skip":
        return skipped(call, f"{lock or head} still runs", lock or head)
    if policy == "buffer_all":
        return wait_here(call)
    if head:  # buffer_one, cancel_other: one slot waits already and is kept
        return skipped(call, f"{head} waits already", lock or head)
    if policy == "cancel_other" and lock:
        if call.held_slot > call.run.slot_ms:  # delivered late
            return skipped(call, f"older than the running slot ({lock})", lock)
        return _cancel_held(call)
    return wait_here(call)


def _cancel_held(call: Call) -> tuple[str, str]:
    """cancel_other with no slot waiting: this one waits, the lock's holder is cancelled."""
    reply = wait_here(call)
    run = call.run
    call.history("cancelled", f"replaced by slot {run.slot_text or run.slot_ms}",
                 call.held_slot)
    call.count("cancelled")
    call.q(_CANCEL_HELD)
    return "cancel", reply[1]


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
                call.forget_waiting()
            elif live(holder, lock_until, now) is None:
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

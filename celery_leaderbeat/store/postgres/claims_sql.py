"""A chunk's claim in one transaction: fence, read, decide (:mod:`.rules`), write.

Two round trips (psycopg's pipeline mode): ``BEGIN`` and 1-3 below, then the writes and
the ``COMMIT``. The transaction, in order (the lease row before slot rows, as in every call that locks
both, so no two calls deadlock):

1. the fence. A leader's call updates its lease row where holder, epoch and expiry still
   match (renewing it, noting its progress, raising the generation): zero rows, and
   nothing is claimed. The row stays locked until commit, so a takeover waits for the
   chunk and then finds the lease renewed; a chunk that waited behind a takeover finds
   the holder changed. A rescue holds no lease: it raises the row's generation and reads
   the leader's progress and definitions. A generation below the one the caller saw
   (or a loss a node reported) rolls the whole transaction back (:class:`OlderState`);
2. the events (the previous chunk's sends ride on the next claim): history rows, and
   ``sent`` / ``unsent`` marks on the entries' slots; written whatever the fence said:
   they say what already happened;
3. what the items touch (:mod:`.chunk_reads`);
4. the decisions, in Python (:func:`.rules.decide`), then one write per table. A grant
   is an ``INSERT … ON CONFLICT … DO UPDATE … WHERE`` it is the same claimant's (or a
   recovery) ``RETURNING`` on (entry, slot): a slot granted before to anyone else
   returns no row, the server's ``grants_written`` raises, and the whole transaction
   is rolled back, its ``COMMIT`` never run (the rules saw the grants already; this is
   the last word should they ever disagree).

Each column of rows goes as one array literal (:mod:`.arrays`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..types import Op
from . import rules
from .arrays import bool_array, int_array, text_array
from .chunk_reads import known, pairs, read
from .lease_sql import NOW_MS
from .pipelined import transaction
from .schema import qualified


class Fence(NamedTuple):
    """Who may claim: a leader (holder, epoch, lease ttl) or a rescuer (holder None); and
    the highest generation the caller has seen (0: none)."""

    holder: str | None
    epoch: int
    ttl_ms: int = 0
    seen_generation: int = 0
    #: a leader starting again after a loss of writes: the generation is lifted above this
    #: and above the loss a node reported (and not checked against ``seen_generation``)
    lift_above: int | None = None


@dataclass(frozen=True)
class Limits:
    """The call's allowances (ms), as ``lead.lua`` and ``rescue.lua`` take them."""

    ahead_ms: int = 0  #: lead: a claimed slot's fire time ahead of the server's clock
    recover_age_ms: int = 0  #: lead: a standby's claim younger than this is not recovered
    rescue_after_ms: int = 0  #: rescue: a slot unclaimed this long past its fire time
    busy_ms: int = 0  #: rescue: the lease holder claimed within this: it is busy
    #: how long a statement waits for a row lock, and the transaction may sit idle
    #: between its round trips, before the server ends it (0: the server's settings). A
    #: claim stalled mid-transaction holds the lease row: bounded so, a takeover or a
    #: rescue waits at most this long for it
    wait_ms: int = 0


class Answer(NamedTuple):
    """A claim call's answer: per item a :data:`rules.Answer`; ``lost`` when fenced off."""

    answers: list[rules.Answer]
    now_ms: int
    marked: int  #: slots the events marked sent
    lost: bool = False
    holder: str | None = None  #: lost: who holds the lease now (None: nobody)
    generation: int = 0  #: the app's generation after this call


class OlderState(Exception):
    """The server holds older state than the caller has seen: nothing was written."""

    def __init__(self, generation: int, seen: int, *, reported: bool = False) -> None:
        if reported:
            text = (f"a node found the database lost writes it had seen (generation "
                    f"{seen}); nothing is claimed until a leader starts again past it")
        else:
            text = (f"the database holds older state than this node has seen "
                    f"(generation {generation} < {seen})")
        super().__init__(text)
        self.generation, self.seen, self.reported = generation, seen, reported


#: the transaction's bounds on waiting for a lock and on sitting idle (see Limits.wait_ms)
BOUNDS = ("SELECT set_config('lock_timeout', %(wait)s, true),"
          " set_config('idle_in_transaction_session_timeout', %(wait)s, true)")


class GrantConflict(Exception):
    """A slot the rules granted was granted to another claimant meanwhile (rolled back)."""


# The history rows, in order, and the slots 'sent' events mark (their overtaken records
# dropped: sent after all), in one statement; how many were marked.
_EVENTS = """
WITH e AS (
    SELECT * FROM unnest(%(names)s::text[], %(slots)s::bigint[], %(events)s::text[],
                         %(details)s::text[]) WITH ORDINALITY AS e(entry, slot_ms, event, detail, n)
), noted AS (
    INSERT INTO {schema}.history (app, event, entry, slot_ms, node, epoch, detail)
    SELECT %(app)s, e.event, e.entry, e.slot_ms, %(node)s, %(epoch)s, e.detail FROM e ORDER BY n
), marked AS (
    UPDATE {schema}.slots AS s SET state = 's' FROM e
    WHERE e.event = 'sent' AND s.app = %(app)s AND s.entry = e.entry AND s.slot_ms = e.slot_ms
    RETURNING 1
), dropped AS (
    DELETE FROM {schema}.overtaken AS o USING e
    WHERE e.event = 'sent' AND o.app = %(app)s AND o.entry = e.entry AND o.slot_ms = e.slot_ms
)
SELECT count(*) FROM marked
"""
# A standby (epoch 0) marks only its own claim unsent; a leader reports any.
_MARK_UNSENT = """
UPDATE {schema}.slots AS s SET state = 'u'
FROM unnest(%(names)s::text[], %(slots)s::bigint[]) AS e(entry, slot_ms)
WHERE s.app = %(app)s AND s.entry = e.entry AND s.slot_ms = e.slot_ms AND s.state = 'c'
      AND (%(epoch)s <> 0 OR s.node = %(node)s)
"""
# The generation goes up in every call that may write; the old value comes back too,
# so a call made against older state than the caller has seen can be rolled back whole.
_FENCE = """
WITH fenced AS (
    UPDATE {schema}.lease
    SET expires_at = clock_timestamp() + %(ttl_ms)s * interval '1 millisecond',
        progress_at = CASE WHEN %(claims)s THEN clock_timestamp() ELSE progress_at END,
        generation = CASE WHEN %(reset)s
            THEN greatest(generation, %(lift)s, coalesce(loss_generation, 0)) + 1
            ELSE generation + 1 END,
        loss_generation = CASE WHEN %(reset)s THEN NULL ELSE loss_generation END,
        backfill_floor_ms = CASE WHEN %(reset)s
            THEN greatest(coalesce(backfill_floor_ms, 0), """ + NOW_MS + """ + %(ahead_ms)s)
            ELSE backfill_floor_ms END,
        lost_at_ms = CASE WHEN %(reset)s THEN """ + NOW_MS + """ ELSE lost_at_ms END
    WHERE app = %(app)s AND holder = %(holder)s AND epoch = %(epoch)s
          AND expires_at > clock_timestamp()
    RETURNING generation
)
SELECT """ + NOW_MS + """, (SELECT generation FROM fenced), l.generation, l.loss_generation
FROM (SELECT 1) AS one LEFT JOIN {schema}.lease AS l ON l.app = %(app)s
"""
_RESCUE_VIEW = """
WITH raised AS (
    UPDATE {schema}.lease AS l SET generation = generation + 1 WHERE app = %(app)s
    RETURNING l.epoch, l.defined_epoch, l.generation, l.loss_generation,
              l.holder IS NOT NULL AND l.expires_at > clock_timestamp()
              AND l.progress_at > clock_timestamp() - %(busy_ms)s * interval '1 millisecond'
              AS busy
)
SELECT """ + NOW_MS + """, r.generation, r.generation - 1, r.loss_generation,
       r.epoch, r.defined_epoch, r.busy
FROM (SELECT 1) AS one LEFT JOIN raised AS r ON true
"""
_RAISE = """
WITH raised AS (
    UPDATE {schema}.lease SET generation = generation + 1 WHERE app = %(app)s
    RETURNING generation
)
SELECT NULL, (SELECT generation FROM raised), (SELECT generation - 1 FROM raised), NULL
"""
_HOLDER = """
SELECT holder FROM {schema}.lease
WHERE app = %(app)s AND holder IS NOT NULL AND expires_at > clock_timestamp()
"""
# A grant asked again by its own claimant, or taken over by a recovery, updates the row;
# anything else conflicting writes no row, and grants_written (migration 0009) then
# raises GRANT_CONFLICT: the transaction is aborted before the COMMIT queued behind it.
_GRANT = """
WITH granted AS (
    INSERT INTO {schema}.grants AS g (app, entry, slot_ms, epoch, node, recovered)
    SELECT %(app)s, w.entry, w.slot_ms, %(epoch)s, %(node)s, w.recovered
    FROM unnest(%(names)s::text[], %(slots)s::bigint[], %(recovered)s::boolean[])
         AS w(entry, slot_ms, recovered)
    ON CONFLICT (app, entry, slot_ms) DO UPDATE
        SET epoch = excluded.epoch, node = excluded.node, recovered = excluded.recovered,
            granted_at = clock_timestamp()
        WHERE excluded.recovered OR (g.epoch = excluded.epoch AND g.node = excluded.node)
    RETURNING 1
)
SELECT {schema}.grants_written(count(*), %(wanted)s) FROM granted
"""
#: the SQLSTATE grants_written raises when a grant was not written
GRANT_CONFLICT = "LB001"
# Every row a chunk writes carries its claimant's epoch, node and claim time.
_STORE = """
INSERT INTO {schema}.slots AS s (app, entry, slot_ms, epoch, state, node, claimed_ms)
SELECT %(app)s, w.entry, w.slot_ms, %(epoch)s, w.state, %(node)s, %(claimed)s::bigint
FROM unnest(%(names)s::text[], %(slots)s::bigint[], %(states)s::text[])
     AS w(entry, slot_ms, state)
ON CONFLICT (app, entry) DO UPDATE
    SET slot_ms = excluded.slot_ms, epoch = excluded.epoch, state = excluded.state,
        node = excluded.node, claimed_ms = excluded.claimed_ms
"""
_OVERTAKE = """
INSERT INTO {schema}.overtaken (app, entry, slot_ms, epoch, state, node, claimed_ms)
SELECT %(app)s, w.entry, w.slot_ms, w.epoch, w.state, w.node, w.claimed_ms
FROM unnest(%(names)s::text[], %(slots)s::bigint[], %(epochs)s::bigint[], %(states)s::text[],
            %(nodes)s::text[], %(claimed)s::bigint[])
     AS w(entry, slot_ms, epoch, state, node, claimed_ms)
ON CONFLICT (app, entry, slot_ms) DO UPDATE
    SET epoch = excluded.epoch, state = excluded.state, node = excluded.node,
        claimed_ms = excluded.claimed_ms
"""
_FORGET_OVERTAKEN = """
DELETE FROM {schema}.overtaken AS o
USING unnest(%(names)s::text[], %(slots)s::bigint[]) AS w(entry, slot_ms)
WHERE o.app = %(app)s AND o.entry = w.entry AND o.slot_ms = w.slot_ms
"""
_DEFINE = """
INSERT INTO {schema}.definitions (app, entry, fingerprint)
SELECT %(app)s, w.entry, w.fingerprint
FROM unnest(%(names)s::text[], %(fingerprints)s::text[]) AS w(entry, fingerprint)
ON CONFLICT (app, entry) DO UPDATE SET fingerprint = excluded.fingerprint
"""
_DEFINED_BY = "UPDATE {schema}.lease SET defined_epoch = %(epoch)s WHERE app = %(app)s"
_BACKFILL = """
INSERT INTO {schema}.backfilled (app, entry, slot_ms, request_id)
SELECT %(app)s, w.entry, w.slot_ms, w.request_id
FROM unnest(%(names)s::text[], %(slots)s::bigint[], %(requests)s::text[])
     AS w(entry, slot_ms, request_id)
ON CONFLICT (app, entry, slot_ms) DO NOTHING
"""


class Events(NamedTuple):
    """History events as columns: entry, slot (ms), event, detail."""

    names: list[str]
    slots: list[int]
    events: list[str]
    details: list[str]


def claim(conn: Any, schema: str, app: str, node: str, fence: Fence, limits: Limits,
          events: Events, items: Sequence[rules.Item]) -> Answer:
    """Write ``events``, then decide and write ``items``, in one transaction and two
    round trips (pipelined: the events, the fence and the reads; then the writes and the
    commit). GrantConflict: nothing was written."""
    run = _runner(conn, schema, app)
    answers: list[rules.Answer] = []
    holder = None
    try:
        with transaction(conn) as pipeline:
            fenced = _fence(run, conn, fence, limits, items)
            marked = write_events(run, node, fence.epoch, events)
            reads = read(run, items) if items else None
            pipeline.sync()
            generation, chunk = _fenced(fenced.fetchone(), fence, node, limits)
            done = marked() if callable(marked) else marked
            if chunk is None:
                holder = run(_HOLDER, {})  # its row comes with the commit
            elif reads is not None:
                known(chunk, reads)
                answers = [rules.decide(chunk, item) for item in items]
                _write(run, chunk)
    except Exception as exc:
        if getattr(exc, "sqlstate", None) == GRANT_CONFLICT:
            raise GrantConflict(str(exc)) from None
        raise
    if chunk is None:
        row = holder.fetchone() if holder is not None else None
        return Answer([], 0, done, lost=True, holder=row and row[0], generation=generation)
    return Answer(answers, chunk.now_ms, done, generation=generation)


def _runner(conn: Any, schema: str, app: str) -> Callable[[str, dict[str, Any]], Any]:
    def run(text: str, params: dict[str, Any]) -> Any:
        return conn.execute(qualified(text, schema), {"app": app, **params})
    return run


def _fence(run: Any, conn: Any, fence: Fence, limits: Limits,
           items: Sequence[rules.Item]) -> Any:
    """Queue the call's bounds and its fence (a leader's) or its view of the lease (a
    rescue's): the lease row first, then slot rows, in every call that takes both, so two
    calls never wait for each other's locks in opposite orders."""
    if limits.wait_ms:
        conn.execute(BOUNDS, {"wait": f"{limits.wait_ms}ms"})
    if fence.holder is None:
        return run(_RESCUE_VIEW, {"busy_ms": limits.busy_ms})
    return run(_FENCE, {"holder": fence.holder, "epoch": fence.epoch,
                        "reset": fence.lift_above is not None,
                        "lift": fence.lift_above or 0, "ahead_ms": limits.ahead_ms,
                        "ttl_ms": fence.ttl_ms,
                        "claims": any(i.op is Op.CLAIM for i in items)})


def _fenced(row: Any, fence: Fence, node: str,
            limits: Limits) -> tuple[int, rules.Chunk | None]:
    """The generation after the fence (OlderState: roll back) and the chunk (None: a
    leader's lease is no longer held)."""
    resetting = fence.lift_above is not None
    generation = _generation(row, 0 if resetting else fence.seen_generation,
                             check_loss=not resetting)
    return generation, _chunk(row, fence, node, limits)


def _generation(row: Any, seen: int, *, check_loss: bool = False) -> int:
    """The app's generation after the fence. Raises OlderState (rolling the transaction
    back) when it was below ``seen`` before this call, or when a node reported a loss of
    writes no leader has started again past (``check_loss``: a claim's or a rescue's)."""
    _, raised, before, loss = row[:4]
    before = int(before or 0)
    if before < seen:
        raise OlderState(before, seen)
    if loss is not None and check_loss:
        raise OlderState(before, int(loss), reported=True)
    return int(raised) if raised is not None else before


def record(conn: Any, schema: str, app: str, node: str, epoch: int, events: Events,
           seen_generation: int = 0, wait_ms: int = 0) -> tuple[int, int]:
    """Write ``events`` alone (the history, the sent and unsent marks), raising the
    generation; (slots marked sent, the generation). OlderState: nothing written (the
    writes went with the generation's read, in one round trip, and are rolled back; the
    COMMIT follows in a second). ``wait_ms``: the bounds a claim sets (it holds the
    lease row between its round trips as a claim does)."""
    run = _runner(conn, schema, app)
    with transaction(conn) as pipeline:
        if wait_ms:
            conn.execute(BOUNDS, {"wait": f"{wait_ms}ms"})
        raised = run(_RAISE, {})
        marked = write_events(run, node, epoch, events)
        pipeline.sync()
        generation = _generation(raised.fetchone(), seen_generation)
        return int(marked() if callable(marked) else marked), generation


def _chunk(row: Any, fence: Fence, node: str, limits: Limits) -> rules.Chunk | None:
    """What the fence answered (None: a leader's lease is no longer held)."""
    if fence.holder is not None:
        if row[1] is None:  # the fence updated no row: the lease is not held so
            return None
        return rules.Chunk(lead=True, epoch=fence.epoch, node=node, now_ms=int(row[0]),
                           ahead_ms=limits.ahead_ms, recover_age_ms=limits.recover_age_ms)
    now_ms, _, _, _, epoch, defined_epoch, busy = row
    behind = defined_epoch is not None and epoch is not None and defined_epoch != epoch
    return rules.Chunk(lead=False, epoch=0, node=node, now_ms=int(now_ms),
                       rescue_after_ms=limits.rescue_after_ms, leader_busy=bool(busy),
                       definitions_behind=behind)


def write_events(run: Any, node: str, epoch: int, events: Events) -> Any:
    """The history rows, and the slots ``sent`` and ``unsent`` events mark: how many sent,
    or (pipelined) a callable that says so once the results are in."""
    if not events.names:
        return 0
    unsent = [(n, s) for n, s, e in zip(events.names, events.slots, events.events)
              if e == "unsent"]
    if unsent:
        run(_MARK_UNSENT, {**pairs(unsent), "epoch": epoch, "node": node})
    cursor = run(_EVENTS, {"node": node, "epoch": epoch, "names": text_array(events.names),
                           "slots": int_array(events.slots),
                           "events": text_array(events.events),
                           "details": text_array(events.details)})
    return lambda: int(cursor.fetchone()[0])


def _write(run: Any, chunk: rules.Chunk) -> None:
    """Queue one statement per table the decisions changed."""
    _write_slots(run, chunk)
    if chunk.defined:
        run(_DEFINE, {"names": text_array(chunk.defined),
                      "fingerprints": text_array(chunk.defined.values())})
    if chunk.defined_epoch is not None:
        run(_DEFINED_BY, {"epoch": chunk.defined_epoch})
    if chunk.new_backfills:
        run(_BACKFILL, {**pairs(list(chunk.new_backfills)),
                        "requests": text_array(chunk.new_backfills.values())})


def _write_slots(run: Any, chunk: rules.Chunk) -> None:
    """The grants (checked on the server: GRANT_CONFLICT), the slots' states and the
    overtaken claims."""
    epoch, node, claimed = chunk.claimant()
    if chunk.new_grants:
        keys = list(chunk.new_grants)
        run(_GRANT, {**pairs(keys), "recovered": bool_array(k in chunk.recovered for k in keys),
                     "wanted": len(keys), "epoch": epoch, "node": node})
    if chunk.written:
        written = chunk.written
        run(_STORE, {"names": text_array(written),
                     "slots": int_array(r.slot_ms for r in written.values()),
                     "states": text_array(r.state.value for r in written.values()),
                     "epoch": epoch, "node": node, "claimed": claimed})
    if chunk.overtaken_added:
        run(_OVERTAKE, _row_columns([(n, r) for (n, _), r in chunk.overtaken_added.items()]))
    if chunk.overtaken_dropped:
        run(_FORGET_OVERTAKEN, pairs(sorted(chunk.overtaken_dropped)))


def _row_columns(rows: list[tuple[str, rules.Row]]) -> dict[str, str]:
    return {"names": text_array(n for n, _ in rows),
            "slots": int_array(r.slot_ms for _, r in rows),
            "epochs": int_array(r.epoch for _, r in rows),
            "states": text_array(r.state.value for _, r in rows),
            "nodes": text_array(r.node for _, r in rows),
            "claimed": int_array(r.claimed_ms for _, r in rows)}

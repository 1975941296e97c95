"""What a chunk's claim reads before deciding: the entries' slot rows locked (in name
order, so two claimants never deadlock), their fingerprints, the paused entries, the
overtaken and granted slots, and for a backfill the history's reach, the floor, the
backfill records and the ``sent`` events. Queued in the claim's first round trip.

The reads of the tables with a row per entry or per slot (slots, definitions, grants) are
one primary-key lookup per key (a ``LATERAL`` subquery per element of the array,
``OFFSET 0`` or ``FOR UPDATE`` keeping the planner from flattening it), whatever the
planner believes of the table. With ``entry = ANY(...)`` instead, a table not analysed
since it filled (a new cluster, a first burst) was planned as a scan of every row of
the app, filtered against the array: 2-3 ms a read at 10,000 entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ..types import Op, SlotStatus
from . import rules
from .arrays import int_array, text_array

# Locked one by one in the order of the names (sorted by the caller), each row's lock
# taken as its lookup finds it.
_SLOTS = """
SELECT s.entry, s.slot_ms, s.epoch, s.state, s.node, s.claimed_ms
FROM unnest(%(names)s::text[]) AS w(entry)
CROSS JOIN LATERAL (
    SELECT entry, slot_ms, epoch, state, node, claimed_ms FROM {schema}.slots
    WHERE app = %(app)s AND entry = w.entry FOR UPDATE
) AS s
"""
_DEFINITIONS = """
SELECT d.entry, d.fingerprint
FROM unnest(%(names)s::text[]) AS w(entry)
CROSS JOIN LATERAL (
    SELECT entry, fingerprint FROM {schema}.definitions
    WHERE app = %(app)s AND entry = w.entry OFFSET 0
) AS d
"""
# The pauses and the overtaken claims are few: every row of the app's, filtered.
_PAUSED = "SELECT entry FROM {schema}.paused WHERE app = %(app)s AND entry = ANY(%(names)s::text[])"
_OVERTAKEN = """
SELECT entry, slot_ms, epoch, state, node, claimed_ms FROM {schema}.overtaken
WHERE app = %(app)s AND entry = ANY(%(names)s::text[])
"""
_GRANTS = """
SELECT g.entry, g.slot_ms, g.epoch, g.node
FROM unnest(%(names)s::text[], %(slots)s::bigint[]) AS w(entry, slot_ms)
CROSS JOIN LATERAL (
    SELECT entry, slot_ms, epoch, node FROM {schema}.grants
    WHERE app = %(app)s AND entry = w.entry AND slot_ms = w.slot_ms OFFSET 0
) AS g
"""
# How far back the history is whole: after its newest pruned row, else from the start
# (nothing was ever pruned); not at all while it is empty (as on every store).
_BACKFILL_VIEW = """
SELECT coalesce(l.history_whole_ms,
                (SELECT 0 FROM {schema}.history WHERE app = %(app)s LIMIT 1)),
       l.backfill_floor_ms
FROM {schema}.lease AS l WHERE l.app = %(app)s
"""
_BACKFILLED = """
SELECT b.entry, b.slot_ms, b.request_id
FROM unnest(%(names)s::text[], %(slots)s::bigint[]) AS w(entry, slot_ms)
JOIN {schema}.backfilled AS b ON b.app = %(app)s AND b.entry = w.entry AND b.slot_ms = w.slot_ms
"""
_SENT = """
SELECT DISTINCT h.entry, h.slot_ms
FROM unnest(%(names)s::text[], %(slots)s::bigint[]) AS w(entry, slot_ms)
JOIN {schema}.history AS h
  ON h.app = %(app)s AND h.event = 'sent' AND h.entry = w.entry AND h.slot_ms = w.slot_ms
"""


class Reads(NamedTuple):
    """The cursors of the reads a chunk queued (their rows come with the sync)."""

    slots: Any
    definitions: Any
    paused: Any
    overtaken: Any
    grants: Any
    backfill: Any  #: the history's reach and the floor; then backfilled and sent slots
    backfilled: Any
    sent: Any


def read(run: Any, items: Sequence[rules.Item]) -> Reads:
    """Queue what the items touch: slot rows locked, fingerprints, pauses, overtaken,
    grants."""
    names = text_array(sorted({i.name for i in items}))
    claimed = [(i.name, i.slot_ms) for i in items if i.op is Op.CLAIM]
    paused = overtaken = grants = None
    slots = run(_SLOTS, {"names": names})
    definitions = run(_DEFINITIONS, {"names": names})
    if claimed:
        paused = run(_PAUSED, {"names": names})
        grants = run(_GRANTS, pairs(claimed))
    if any(i.op in (Op.RECOVER, Op.BACKFILL) for i in items):
        overtaken = run(_OVERTAKEN, {"names": names})
    backfill = backfilled = sent = None
    asked = [(i.name, i.slot_ms) for i in items if i.op is Op.BACKFILL]
    if asked:
        backfill = run(_BACKFILL_VIEW, {})
        backfilled = run(_BACKFILLED, pairs(asked))
        sent = run(_SENT, pairs(asked))
    return Reads(slots, definitions, paused, overtaken, grants, backfill, backfilled, sent)


def pairs(keys: Sequence[tuple[str, int]]) -> dict[str, str]:
    """(entry, slot) keys as the two array literals a statement unnests."""
    return {"names": text_array([n for n, _ in keys]), "slots": int_array([s for _, s in keys])}


def known(chunk: rules.Chunk, reads: Reads) -> None:
    """The reads' rows, into ``chunk``."""
    for entry, slot, epoch, state, node, at in reads.slots.fetchall():
        chunk.slots[entry] = rules.Row(int(slot), int(epoch), SlotStatus(state), node, at)
    chunk.definitions.update(reads.definitions.fetchall())
    if reads.paused is not None:
        chunk.paused.update(row[0] for row in reads.paused.fetchall())
    if reads.overtaken is not None:
        for entry, slot, epoch, state, node, at in reads.overtaken.fetchall():
            chunk.overtaken[(entry, int(slot))] = rules.Row(int(slot), int(epoch),
                                                            SlotStatus(state), node, at)
    if reads.grants is not None:
        for entry, slot, epoch, node in reads.grants.fetchall():
            chunk.grants[(entry, int(slot))] = rules.Row(int(slot), int(epoch),
                                                         SlotStatus.CLAIMED, node)
    if reads.backfill is not None:
        whole, floor = reads.backfill.fetchone()
        chunk.history_whole_ms = None if whole is None else int(whole)
        chunk.floor_ms = int(floor or 0)
        chunk.backfilled.update(((e, int(s)), r) for e, s, r in reads.backfilled.fetchall())
        chunk.sent.update((e, int(s)) for e, s in reads.sent.fetchall())

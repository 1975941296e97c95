"""What a chunk's claim reads before deciding: the entries' slot rows locked (in name
order, so two claimants never deadlock), their fingerprints, the paused entries, the
overtaken and granted slots, and for a backfill the history's reach, the floor, the
backfill records and the ``sent`` events. Queued in the claim's first round trip."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ..types import Op, SlotStatus
from . import rules

_SLOTS = """
SELECT entry, slot_ms, epoch, state, node, claimed_ms FROM {schema}.slots
WHERE app = %(app)s AND entry = ANY(%(names)b::text[]) ORDER BY entry FOR UPDATE
"""
_DEFINITIONS = """
SELECT entry, fingerprint FROM {schema}.definitions
WHERE app = %(app)s AND entry = ANY(%(names)b::text[])
"""
_PAUSED = "SELECT entry FROM {schema}.paused WHERE app = %(app)s AND entry = ANY(%(names)b::text[])"
_OVERTAKEN = """
SELECT entry, slot_ms, epoch, state, node, claimed_ms FROM {schema}.overtaken
WHERE app = %(app)s AND entry = ANY(%(names)b::text[])
"""
# One primary-key lookup per slot asked for, whatever the table's size: OFFSET 0 keeps
# the planner from flattening the LATERAL into a join that reads every grant the app kept.
_GRANTS = """
SELECT g.entry, g.slot_ms, g.epoch, g.node
FROM unnest(%(names)b::text[], %(slots)b::bigint[]) AS w(entry, slot_ms)
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
FROM unnest(%(names)b::text[], %(slots)b::bigint[]) AS w(entry, slot_ms)
JOIN {schema}.backfilled AS b ON b.app = %(app)s AND b.entry = w.entry AND b.slot_ms = w.slot_ms
"""
_SENT = """
SELECT DISTINCT h.entry, h.slot_ms
FROM unnest(%(names)b::text[], %(slots)b::bigint[]) AS w(entry, slot_ms)
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
    names = sorted({i.name for i in items})
    claimed = [(i.name, i.slot_ms) for i in items if i.op is Op.CLAIM]
    paused = overtaken = grants = None
    slots = run(_SLOTS, {"names": names})
    definitions = run(_DEFINITIONS, {"names": names})
    if claimed:
        paused = run(_PAUSED, {"names": names})
        grants = run(_GRANTS, {"names": [n for n, _ in claimed],
                               "slots": [s for _, s in claimed]})
    if any(i.op in (Op.RECOVER, Op.BACKFILL) for i in items):
        overtaken = run(_OVERTAKEN, {"names": names})
    backfill = backfilled = sent = None
    asked = [(i.name, i.slot_ms) for i in items if i.op is Op.BACKFILL]
    if asked:
        pairs = {"names": [n for n, _ in asked], "slots": [s for _, s in asked]}
        backfill = run(_BACKFILL_VIEW, {})
        backfilled = run(_BACKFILLED, pairs)
        sent = run(_SENT, pairs)
    return Reads(slots, definitions, paused, overtaken, grants, backfill, backfilled, sent)


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

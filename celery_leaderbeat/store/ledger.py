"""The schedule's shared state in Redis: slot claims, last slots, history, nodes.

It knows nothing of leadership beyond the token it is handed: a leader's claim
goes through ``lead.lua``, which grants a slot only while the leader key holds
that token (fencing) and only when the slot is newer than the entry's last one
(monotonic claims), so no slot is ever granted twice; a standby's through
``rescue.lua``. Each operation is one script call; what the scripts answer is
decoded in one place, :func:`decode`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..config import Config
from ..errors import LeaseLostError, NotReplicatedError, RolledBackError, ScriptError
from .keys import Keys
from .scripts import Scripts, status, text
from .types import (
    BackfillReason,
    BackfillRefused,
    Claimed,
    ClaimItem,
    ClaimResult,
    Code,
    Event,
    Op,
    Refused,
    SlotState,
    SlotStatus,
)

#: the fingerprint stored for an entry the leader no longer schedules (removed, disabled)
REMOVED = "-"
#: the field of the definitions hash that holds the epoch of the leader that wrote them
DEFINED_BY = "|epoch"
#: the field of the backfilled hash that holds Redis TIME (ms) of the last re-anchoring
#: after Redis lost writes (see check_generation in prelude.lua)
LOST_AT = "|lost_at"

#: a node's report of what it knew settled before Redis lost writes is kept this many
#: lease ttls (a leader elected after the loss looks for reports during one ttl)
LOST_KEPT_TTLS = 3

#: claim items and history events per script call at most (bounds one call's run time)
_MAX_PER_CALL = 2000

#: ms a leader's claimed slot may lie ahead of Redis TIME beyond ``max_clock_skew``
_AHEAD_GRACE_MS = 1000
#: a rescue waits while the lease holder claimed something this recently (ms): a live
#: leader in the middle of a burst gets to its slots; a dead one stops claiming
_BUSY_LEADER_MS = 1000


class Ledger:
    """Reads and writes the shared schedule state under one key prefix."""

    def __init__(self, client: Any, scripts: Scripts, keys: Keys, config: Config) -> None:
        self.client = client
        self.scripts = scripts
        self.keys = keys
        self.config = config
        #: the highest generation of the state this node has seen (see prelude.lua)
        self.generation = 0
        #: the epoch of a leader re-anchoring every entry after Redis went back to older
        #: state: its next call lifts the counter (a call of another term drops it)
        self._reset_epoch: int | None = None
        #: Redis answered a lower generation than this node has seen (it lost writes):
        #: set until the node reported what it knew settled (:meth:`report_lost`)
        self.loss_seen = False
        self._loss_below: int | None = None  # the counter when the loss was seen
        #: the last rollback answered was a loss another node reported
        self.loss_reported = False

    def claim(self, token: str, epoch: int, items: Sequence[ClaimItem],
              events: Sequence[Event] = ()) -> list[ClaimResult]:
        """Leader: write ``events``, then claim ``items`` in order, in one call.

        Returns a :data:`ClaimResult` per item (see :class:`Code`; :class:`Refused` with
        the stored slot that refused it). Raises LeaseLostError (and grants nothing; the
        events are written all the same: they say what already happened) when ``token``
        no longer leads, and NotReplicatedError when ``min_replicas`` replicas did not
        acknowledge.
        """
        results: list[ClaimResult] = []
        for batch_events, batch_items in _calls(events, items):
            reply = self._lead(token, epoch, batch_events, batch_items)
            self._check_fenced(reply, "lead", token)
            results += decode("lead", batch_items, reply)
            if self.config.min_replicas and batch_items:
                self._wait_for_replicas(results)
        return results

    def check_generation(self, token: str, epoch: int) -> None:
        """Leader: raise when Redis lost writes this node saw (RolledBackError) or ``token``
        no longer leads (LeaseLostError); before acting on state a restore may have
        brought back. Renews the lease; writes nothing else."""
        reply = self._call("check", [token, self._ttl_ms(), self._ahead_ms(),
                                     *self._seen(epoch)])
        self._check_fenced(reply, "check", token)

    def mark_definitions(self, token: str, epoch: int) -> None:
        """Leader: mark the stored definitions as what this leader plans (its epoch), fenced;
        until the newest leader did, no standby rescues."""
        reply = self._call("define", [token, self._ttl_ms(), epoch, self._ahead_ms(),
                                      *self._seen(epoch)])
        self._check_fenced(reply, "define", token)

    def backfill(self, token: str, epoch: int, name: str, slots: Sequence[int],
                 request_id: str) -> list[ClaimResult]:
        """Leader: grant a backfill of each of ``name``'s ``slots`` (ms), in one call.

        Returns per slot :attr:`Code.GRANTED` (recorded backfilled by ``request_id``: it
        is never granted again), else :class:`BackfillRefused` with the reason: decided in
        Redis, at this moment, from the stored slot, the history and the backfill records,
        whatever the CLI saw when it queued the request. Raises LeaseLostError when
        ``token`` no longer leads.
        """
        results: list[ClaimResult] = []
        for start in range(0, len(slots), _MAX_PER_CALL):
            batch = slots[start:start + _MAX_PER_CALL]
            reply = self._call("backfill", [token, self._ttl_ms(), epoch, self._ahead_ms(),
                                            *self._seen(epoch), name, request_id, *batch])
            self._check_fenced(reply, "backfill", token)
            results += decode("backfill", [ClaimItem(name, s, Op.BACKFILL) for s in batch],
                              reply)
        return results

    def _check_fenced(self, reply: Any, script: str, token: str) -> None:
        """A fenced call's reply: raises when Redis went back to older state, or when
        ``token`` no longer leads (saying who does, as the store answered)."""
        self._check_generation(reply)
        if status(reply, script) == 0:
            holder = text(reply[1]) if len(reply) > 1 and reply[1] else None
            lost = LeaseLostError(f"{script} refused: lease {token} lost; held by "
                                  f"{holder or 'nobody'}")
            lost.holder, lost.answered = holder, True
            raise lost

    def lost_at(self) -> int | None:
        """Redis TIME (ms) when a leader last re-anchored after Redis lost writes (see
        :meth:`reset_generation`): a request queued before it may be one a restore brought
        back."""
        mark = self.client.hget(self.keys.backfilled, LOST_AT)
        return int(mark) if mark is not None else None

    def rescue(self, items: Sequence[ClaimItem], events: Sequence[Event] = ()) -> Claimed:
        """Standby: claim slots nobody claimed ``rescue_after`` past their fire time.

        No lease is needed: the claim is the only gate. An item is refused as
        :attr:`Code.EARLY` while Redis TIME is before its fire time + ``rescue_after``,
        and as :attr:`Code.UNKNOWN` when its entry has no state (its phase is not known).
        """
        results: list[ClaimResult] = []
        now_ms = 0
        for batch_events, batch_items in _calls(events, items):
            args: list[Any] = [int(self.config.rescue_after * 1000), self.config.history_length,
                               self.config.node_id, _BUSY_LEADER_MS, self.generation or "",
                               *_event_args(batch_events)]
            for item in batch_items:
                args += [item.name, item.slot_ms, item.op.value, item.fire_ms,
                         "" if item.prev_ms is None else item.prev_ms, item.fingerprint]
            reply = self._call("rescue", args)
            self._check_generation(reply)
            status(reply, "rescue")
            now_ms = int(reply[1])
            results += decode("rescue", batch_items, reply)
            if self.config.min_replicas:
                self._wait_for_replicas(results)
        return Claimed(results, now_ms)

    def record(self, epoch: int, events: Iterable[Event]) -> int:
        """Write events to the history; ``sent`` events also mark their slot sent."""
        marked = 0
        events = list(events)
        if not events:
            return 0
        for batch_events, _ in _calls(events, ()):
            reply = self._call("record", [epoch, self.config.history_length, self.config.node_id,
                                          self.generation or "", *_event_args(batch_events)])
            self._check_generation(reply)
            marked += int(reply[2])
        return marked

    def observe_generation(self, generation: int | None) -> None:
        """Note a generation seen elsewhere (an acquire attempt's reply); a lower one than
        this node has seen means Redis lost writes (:attr:`loss_seen`)."""
        if generation is not None:
            self._note_generation(generation)

    def _note_generation(self, generation: int) -> None:
        if generation >= self.generation:
            self.generation = generation
            self._loss_below = None
        else:
            if self._loss_below is None or generation < self._loss_below:
                self.loss_seen = True  # once per loss: the counter then climbs again
            self._loss_below = generation

    @property
    def below(self) -> bool:
        """Redis's generation counter was last seen below the highest this node has seen:
        a loss no leader has dealt with yet (its 'reset' lifts the counter above)."""
        return self._loss_below is not None

    def report_lost(self, settled: dict[str, int]) -> None:
        """This node saw Redis lose writes: say so (``lost.lua``: the leader then starts
        again as after any rollback, even one that is a new process and knows of no
        loss), and keep, for a while, the newest slot of each entry it knew settled: the
        leader records the slots its margin skips from there."""
        args: list[Any] = [self.config.node_id,
                           int(LOST_KEPT_TTLS * self.config.lease_ttl * 1000), self.generation]
        for name, slot_ms in settled.items():
            args += [name, slot_ms]
        self.scripts.lost(keys=[self.keys.lost, self.keys.backfilled, self.keys.generation],
                          args=args)
        self.loss_seen = False

    def lost_reports(self) -> dict[str, int]:
        """Per entry, the newest slot any node reported settled before Redis lost writes."""
        out: dict[str, int] = {}
        for field, value in self.client.hgetall(self.keys.lost).items():
            name = text(field).rpartition("|")[0]
            out[name] = max(out.get(name, -1), int(value))
        return out

    def reset_generation(self, epoch: int) -> None:
        """The next call of the leader of ``epoch`` re-anchors after a loss of writes: it
        lifts the counter (and the loss seen is dealt with: the leader records the
        margin). The first call made takes it, answered or not: a retry finds the loss
        again and asks again; a call of another epoch drops it."""
        self._reset_epoch = epoch
        self.loss_seen = False

    def _check_generation(self, reply: Any) -> None:
        if isinstance(reply, list) and reply and reply[0] == 2:
            seen = self.generation
            self._note_generation(int(reply[1]))
            #: another node reported the loss (this one saw nothing older): what this
            #: node wrote itself is still there
            self.loss_reported = len(reply) > 2 and int(reply[1]) >= seen
            if self.loss_reported:
                error = RolledBackError(
                    "another node found Redis lost writes it had seen (restarted empty, "
                    "restored from an older snapshot, or a lagging replica was promoted)")
            else:
                error = RolledBackError(
                    f"Redis holds older state than this node has seen (generation "
                    f"{int(reply[1])} < {seen}): restored from an older snapshot, or a "
                    "lagging replica was promoted")
            error.generation = int(reply[1])
            raise error
        if isinstance(reply, list) and len(reply) > 3 and reply[0] == 1:
            self.observe_generation(int(reply[3]))

    def _lead(self, token: str, epoch: int, events: Sequence[Event],
              items: Sequence[ClaimItem]) -> Any:
        # a standby's claim is recovered once it is a lease ttl old: the publish window
        args: list[Any] = [token, self._ttl_ms(), epoch, self.config.history_length,
                           self.config.node_id, self._ahead_ms(), self._ttl_ms(),
                           *self._seen(epoch), *_event_args(events)]
        for item in items:
            args += [item.name, item.slot_ms, item.op.value, item.fire_ms, item.fingerprint]
        keys = self._keys()
        if any(item.enqueue for item in items):
            args += _enqueue_section(items, keys)
        return self.scripts.lead(keys=keys, args=args)

    def _call(self, script: str, args: list[Any]) -> Any:
        return getattr(self.scripts, script)(keys=self._keys(), args=args)

    def _keys(self) -> list[Any]:
        """The keys every slot script takes, in the order ``prelude.lua`` names them."""
        return [self.keys.leader, self.keys.slots, self.keys.history, self.keys.overtaken,
                self.keys.paused, self.keys.definitions, self.keys.progress,
                self.keys.generation, self.keys.backfilled, self.keys.epoch]

    def _ttl_ms(self) -> int:
        return int(self.config.lease_ttl * 1000)

    def _ahead_ms(self) -> int:
        """How far (ms) a leader's claimed slot may lie ahead of Redis TIME."""
        return int(self.config.max_clock_skew * 1000) + _AHEAD_GRACE_MS

    def _seen(self, epoch: int) -> list[Any]:
        """A leader's generation arguments: the highest seen and ''; or, in the first call
        of the term that asked :meth:`reset_generation`, 'reset' and the generation to
        lift the counter above."""
        reset, self._reset_epoch = self._reset_epoch == epoch, None
        if reset:
            return ["reset", self.generation]
        return [self.generation or "", ""]

    def _wait_for_replicas(self, results: list[ClaimResult]) -> None:
        """Block until ``min_replicas`` replicas have the claims, or raise NotReplicatedError.

        WAIT's own timeout stays well inside the socket timeout: a WAIT that outlived
        it would read as "Redis unreachable" instead of "no replica acknowledged".
        """
        timeout_ms = max(1, int(min(self.config.renew_interval / 2,
                                    self.config.redis_socket_timeout / 2) * 1000))
        acked = int(self.client.execute_command("WAIT", self.config.min_replicas, timeout_ms))
        if acked < self.config.min_replicas:
            error = NotReplicatedError(
                f"no replica acknowledged the claims in time ({acked} of "
                f"leaderbeat_min_replicas={self.config.min_replicas} within {timeout_ms} ms)")
            error.results = results  # what was granted, and what was refused anyway
            raise error

    def load(self, names: Sequence[str] | None = None) -> dict[str, SlotState]:
        """Every entry's last slot (one HGETALL), or only those of ``names`` (one HMGET, by
        ``states.lua``: the names and their states cross as one JSON text each way)."""
        if names is None:
            raw = self.client.hgetall(self.keys.slots).items()
            return {text(k): parse_slot_state(v) for k, v in raw if v is not None}
        if not names:
            return {}
        reply = self.scripts.states(keys=[self.keys.slots], args=[json.dumps(list(names))])
        return {name: parse_slot_state(v)
                for name, v in zip(names, json.loads(reply)) if v is not False}

    def load_with_definitions(self, names: Sequence[str] | None = None
                              ) -> tuple[dict[str, SlotState], dict[str, str]]:
        """Every entry's last slot and the fingerprints stored beside them, or only those
        of ``names`` (one round trip either way)."""
        if names is not None and not names:
            return {}, {}
        pipe = self.client.pipeline(transaction=False)
        if names is None:
            pipe.hgetall(self.keys.slots)
            pipe.hgetall(self.keys.definitions)
            slots, definitions = (dict(r) for r in pipe.execute())
        else:
            pipe.hmget(self.keys.slots, list(names))
            pipe.hmget(self.keys.definitions, list(names))
            raw_slots, raw_defs = pipe.execute()
            slots = {n: v for n, v in zip(names, raw_slots) if v is not None}
            definitions = {n: v for n, v in zip(names, raw_defs) if v is not None}
        return ({text(k): parse_slot_state(v) for k, v in slots.items()},
                {text(k): text(v) for k, v in definitions.items() if text(k) != DEFINED_BY})

    def prune(self, scheduled: Iterable[str], *, keep_ms: int, node_keep_s: float) -> list[int]:
        """Drop the state of entries nobody schedules any more, old backfill records and
        node records not seen for ``node_keep_s``; returns how many of each went.

        Only entries ``scheduled`` does not name are candidates, and only when their last
        slot is older than ``keep_ms`` (so another node's newer schedule keeps its state
        during a rolling deploy), and never an unconfirmed claim (it is reported first).
        """
        names = set(scheduled)
        unscheduled = [text(k) for k in self.client.hkeys(self.keys.slots) if text(k) not in names]
        backfilled = [text(k) for k in self.client.hkeys(self.keys.backfilled)]
        seconds, micros = self.client.time()
        cutoff = int(seconds) * 1000 + int(micros) // 1000 - keep_ms
        reply = self.scripts.prune(
            keys=[self.keys.slots, self.keys.definitions, self.keys.backfilled, self.keys.nodes,
                  self.keys.overtaken],
            args=[cutoff, time.time() - node_keep_s, len(unscheduled), *unscheduled,
                  *backfilled])
        return [int(x) for x in reply]

    def write_definitions(self, fingerprints: dict[str, str]) -> None:
        """Store the fingerprints of the definitions the leader plans (:data:`REMOVED` for
        an entry it no longer schedules: no standby may rescue it)."""
        if fingerprints:
            self.client.hset(self.keys.definitions, mapping=fingerprints)

    def overtaken(self) -> dict[tuple[str, int], SlotState]:
        """Claimed, unconfirmed slots that a newer claim of the same entry replaced."""
        out = {}
        for field, value in self.client.hgetall(self.keys.overtaken).items():
            name, _, slot = text(field).rpartition("|")
            out[(name, int(slot))] = parse_slot_state(value)
        return out

    def tidy(self) -> None:
        """Nothing owed: the scripts trim the history as they write it (``XADD MAXLEN``)."""

    def forget_overtaken(self, fields: Sequence[tuple[str, int]]) -> None:
        """Drop overtaken slots once a leader has reported (and maybe re-sent) them."""
        if fields:
            self.client.hdel(self.keys.overtaken, *[f"{name}|{slot}" for name, slot in fields])

    def history(self, count: int = 50) -> list[dict[str, str]]:
        """The newest ``count`` history events, oldest first."""
        rows = self.client.xrevrange(self.keys.history, count=count)
        out = []
        for event_id, fields in reversed(rows):
            row = {text(k): text(v) for k, v in fields.items()}
            row["id"] = text(event_id)
            row["at"] = row["id"].partition("-")[0]  # the stream id starts with when (ms)
            out.append(row)
        return out

    def register_node(self, role: str, info: dict[str, Any]) -> dict[str, Any] | None:
        """Publish this node's role and details in the node registry; the record it replaced."""
        record = dict(info, role=role, last_seen=time.time())
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(self.keys.nodes, self.config.node_id)
        pipe.hset(self.keys.nodes, self.config.node_id, json.dumps(record))
        replaced, _ = pipe.execute()
        return json.loads(text(replaced)) if replaced else None

    def unregister_node(self) -> None:
        self.client.hdel(self.keys.nodes, self.config.node_id)

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {text(k): json.loads(text(v)) for k, v in self.client.hgetall(self.keys.nodes).items()}


def _calls(events: Sequence[Event], items: Sequence[ClaimItem]
           ) -> Iterator[tuple[Sequence[Event], Sequence[ClaimItem]]]:
    """One script call, or several of at most ``_MAX_PER_CALL`` events or items each."""
    if len(events) + len(items) <= _MAX_PER_CALL:
        yield events, items
        return
    for start in range(0, len(events), _MAX_PER_CALL):
        yield events[start:start + _MAX_PER_CALL], ()
    for start in range(0, len(items), _MAX_PER_CALL):
        yield (), items[start:start + _MAX_PER_CALL]


def _enqueue_section(items: Sequence[ClaimItem], keys: list[Any]) -> list[Any]:
    """The claim script's trailing ARGV: each item's broker commands, keys added to ``keys``.

    Per item in order: its commands as one word ('l' for LPUSH, 'e' for PEXPIRE, each
    followed by its key's index into KEYS; '' for none), then each command's argument;
    last, the length of the section. Two arguments a message, not four: redis-py packs
    every argument on its own, a fair part of a chunk's CPU.
    """
    at: dict[str, int] = {}
    section: list[Any] = []
    for item in items:
        word = []
        for name, key, _ in item.enqueue:
            if key not in at:
                keys.append(key)
                at[key] = len(keys)  # Lua counts KEYS from 1
            if name not in _COMMAND_LETTERS:
                raise ValueError(f"claim item {item.name!r}: broker command {name!r} is not "
                                 f"supported by the claim script (only lpush and pexpire)")
            word.append(_COMMAND_LETTERS[name] + str(at[key]))
        section.append("".join(word))
        section += [arg for _, _, arg in item.enqueue]
    return section + [len(section)]


#: the claim script's letter for each broker command it runs
_COMMAND_LETTERS = {"lpush": "l", "pexpire": "e"}


def _event_args(events: Sequence[Event]) -> list[Any]:
    """A slot script's events: their count, then four arguments each."""
    args: list[Any] = [len(events)]
    for ev in events:
        args += [ev.name, ev.slot_ms, ev.event, ev.detail]
    return args


def decode(script: str, items: Sequence[ClaimItem], reply: Any) -> list[ClaimResult]:
    """The per-item results of a slot script's reply ``{1, now, marked, generation, ...}``.

    An integer is a :class:`Code`; from ``backfill`` a text is a :class:`BackfillReason`,
    from the others the stored value that refused the item. Anything else raises
    ScriptError naming the script, the answer and the item.
    """
    answers = reply[4:]
    if len(answers) != len(items):
        raise ScriptError(f"{script}.lua answered {len(answers)} results for {len(items)} items")
    return [_decode_one(script, item, answer) for item, answer in zip(items, answers)]


def _decode_one(script: str, item: ClaimItem, answer: Any) -> ClaimResult:
    try:
        if isinstance(answer, int):
            return Code(answer)
        if script == "backfill":
            return BackfillRefused(BackfillReason(text(answer)))
        if isinstance(answer, (bytes, str)):
            return Refused.by(parse_slot_state(answer), item.slot_ms)
    except ValueError:
        pass
    raise ScriptError(f"{script}.lua answered {answer!r} for {item.op.value} of {item.name!r} "
                      f"at {item.slot_ms}, which this version does not understand")


def parse_slot_state(raw: Any) -> SlotState:
    """A slot state as the slots hash stores it: ``slot|epoch|state[|node|claimed_ms]``."""
    slot, epoch, state, *rest = text(raw).split("|", 3)
    node, claimed = None, None
    if rest:
        node, _, at = rest[0].rpartition("|")
        if not node or not at.isdigit():  # written by an older version: no claim time
            node, at = rest[0], ""
        claimed = int(at) if at else None
    # by the table: a standby's look parses a thousand states, and calling the enum is
    # the dearest step after building the state (an unknown letter still raises there)
    return SlotState(int(slot), int(epoch), _STATUS.get(state) or SlotStatus(state), node,
                     claimed)


_STATUS = {status.value: status for status in SlotStatus}

"""The in-memory store's slots: the slot scripts (``lead.lua``, ``rescue.lua``,
``record.lua``, ``backfill.lua``, ``define.lua``, ``check.lua`` over ``prelude.lua``:
one call's rules in :mod:`.memory_claim`), ``prune.lua`` and ``lost.lua`` in Python,
under the state's one lock.

:class:`MemoryLedger` answers each slot call in the scripts' reply shape, so the
node-side half of :class:`~celery_leaderbeat.store.ledger.Ledger` (the generation this
node saw, the loss it reports, :func:`~celery_leaderbeat.store.ledger.decode` into
:class:`~celery_leaderbeat.store.types.Code`, ``Refused`` and ``BackfillRefused``) is
the same code for both stores.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ..config import Config
from .keys import Keys
from .ledger import (
    _BUSY_LEADER_MS,
    LOST_KEPT_TTLS,
    Ledger,
    _calls,
    decode,
    parse_slot_state,
)
from .memory_claim import claim_call
from .memory_state import MemoryState, parts, row
from .scripts import status
from .types import Claimed, ClaimItem, ClaimResult, Code, Event, Op, SlotState


class MemoryLedger(Ledger):
    """The slots of one in-memory store (the :class:`~celery_leaderbeat.store.base.SlotStore`)."""

    def __init__(self, state: MemoryState, config: Config) -> None:
        super().__init__(None, None, Keys(config.key_prefix), config)  # type: ignore[arg-type]
        self.state = state

    def _lead(self, token: str, epoch: int, events: Sequence[Event],
              items: Sequence[ClaimItem]) -> Any:
        return self._run("lead", token, self._ttl_ms(), epoch, events, items)

    def _call(self, script: str, args: list[Any]) -> Any:
        """``check``, ``define`` and ``backfill`` as their scripts take them (the fenced
        head: token, ttl, [epoch,] ahead, seen, lift_above)."""
        if script == "check":
            token, ttl, ahead, seen, lift = args[:5]
            return self._run("lead", token, ttl, 0, (), (), seen=(seen, lift), ahead=ahead)
        token, ttl, epoch, ahead, seen, lift = args[:6]
        if script == "define":
            reply = self._run("lead", token, ttl, epoch, (), [ClaimItem("", 0, Op.DEFINE)],
                              seen=(seen, lift), ahead=ahead)
            return reply[:4]
        if script == "backfill":
            name, request_id, *slots = args[6:]
            items = [ClaimItem(name, int(slot), Op.BACKFILL, int(slot), fingerprint=request_id)
                     for slot in slots]
            return self._run("lead", token, ttl, epoch, (), items, seen=(seen, lift),
                             ahead=ahead)
        raise ValueError(f"the in-memory store has no slot script {script!r}")

    def rescue(self, items: Sequence[ClaimItem], events: Sequence[Event] = ()) -> Claimed:
        results: list[ClaimResult] = []
        now_ms = 0
        for batch_events, batch_items in _calls(events, items):
            reply = self._run("rescue", "", int(self.config.rescue_after * 1000), 0,
                              batch_events, batch_items)
            self._check_generation(reply)
            status(reply, "rescue")
            now_ms = int(reply[1])
            # no stored state: the phase is not known (the script answers UNKNOWN)
            answers = [Code.UNKNOWN.value if r is None else r for r in reply[4:]]
            results += decode("rescue", batch_items, [*reply[:4], *answers])
        return Claimed(results, now_ms)

    def record(self, epoch: int, events: Iterable[Event]) -> int:
        marked = 0
        events = list(events)
        for batch_events, _ in _calls(events, ()) if events else ():
            reply = self._run("record", "", "", epoch, batch_events, ())
            self._check_generation(reply)
            marked += int(reply[2])
        return marked

    def _run(self, mode: str, token: str, ms: int | str, epoch: int, events: Sequence[Event],
             items: Sequence[ClaimItem], *, seen: tuple[Any, Any] | None = None,
             ahead: int | str | None = None) -> Any:
        """One slot call under the state's lock, as :func:`claim_call` takes it."""
        lead = mode == "lead"
        if ahead is None:
            ahead = self._ahead_ms() if lead else _BUSY_LEADER_MS if mode == "rescue" else ""
        if seen is None:
            seen = tuple(self._seen(epoch)) if lead else (self.generation or "", "")
        recover_age = self._ttl_ms() if lead else ""
        args = [mode, token, ms, epoch, self.config.history_length, self.config.node_id, ahead,
                recover_age, 0, *seen]
        with self.state.lock:
            return claim_call(self.state, args, events, items)

    def _wait_for_replicas(self, results: list[ClaimResult]) -> None:
        """One process holds the only copy: there is no replica to wait for."""

    def lost_at(self) -> int | None:
        with self.state.lock:
            return self.state.lost_at

    def report_lost(self, settled: dict[str, int]) -> None:
        s = self.state
        with s.lock:
            for name, slot_ms in settled.items():
                s.lost[f"{name}|{self.config.node_id}"] = int(slot_ms)
            if settled:
                s.lost_until = s.now_ms() + int(LOST_KEPT_TTLS * self.config.lease_ttl * 1000)
            seen = s.loss if s.loss is not None else -1
            if self.generation > seen and (s.generation or 0) < self.generation:
                s.loss = self.generation
        self.loss_seen = False

    def lost_reports(self) -> dict[str, int]:
        out: dict[str, int] = {}
        with self.state.lock:
            for field, value in self.state.lost_reports().items():
                name = field.rpartition("|")[0]
                out[name] = max(out.get(name, -1), value)
        return out

    def load(self, names: Sequence[str] | None = None) -> dict[str, SlotState]:
        with self.state.lock:
            slots = self.state.slots
            chosen = slots if names is None else {n: slots[n] for n in names if n in slots}
            return {name: parse_slot_state(value) for name, value in chosen.items()}

    def load_with_definitions(self, names: Sequence[str] | None = None
                              ) -> tuple[dict[str, SlotState], dict[str, str]]:
        with self.state.lock:
            defs = self.state.definitions
            chosen = defs if names is None else {n: defs[n] for n in names if n in defs}
            return self.load(names), dict(chosen)

    def prune(self, scheduled: Iterable[str], *, keep_ms: int, node_keep_s: float) -> list[int]:
        names = set(scheduled)
        s = self.state
        with s.lock:
            cutoff = s.now_ms() - keep_ms
            dropped = [0, 0, 0]
            for name, stored in list(s.slots.items()):
                slot, _, state, _, _ = parts(stored)
                if name not in names and slot < cutoff and state not in ("c", "u"):
                    del s.slots[name]
                    s.definitions.pop(name, None)
                    dropped[0] += 1
            for field in list(s.backfilled):
                if int(field.rpartition("|")[2]) < cutoff:
                    del s.backfilled[field]
                    dropped[1] += 1
            node_cutoff = time.time() - node_keep_s
            for node, record in list(s.nodes.items()):
                seen = json.loads(record).get("last_seen")
                if seen is not None and float(seen) < node_cutoff:
                    del s.nodes[node]
                    dropped[2] += 1
            return dropped

    def write_definitions(self, fingerprints: dict[str, str]) -> None:
        with self.state.lock:
            self.state.definitions.update(fingerprints)

    def overtaken(self) -> dict[tuple[str, int], SlotState]:
        with self.state.lock:
            out = {}
            for field, value in self.state.overtaken.items():
                name, _, slot = field.rpartition("|")
                out[(name, int(slot))] = parse_slot_state(value)
            return out

    def forget_overtaken(self, fields: Sequence[tuple[str, int]]) -> None:
        with self.state.lock:
            for name, slot in fields:
                self.state.overtaken.pop(f"{name}|{slot}", None)

    def history(self, count: int = 50) -> list[dict[str, str]]:
        with self.state.lock:
            rows = self.state.history[-count:] if count > 0 else []
            return [row(at, fields) for at, fields in rows]

    def register_node(self, role: str, info: dict[str, Any]) -> dict[str, Any] | None:
        record = dict(info, role=role, last_seen=time.time())
        with self.state.lock:
            replaced = self.state.nodes.get(self.config.node_id)
            self.state.nodes[self.config.node_id] = json.dumps(record)
        return json.loads(replaced) if replaced else None

    def unregister_node(self) -> None:
        with self.state.lock:
            self.state.nodes.pop(self.config.node_id, None)

    def nodes(self) -> dict[str, dict[str, Any]]:
        with self.state.lock:
            return {node: json.loads(record) for node, record in self.state.nodes.items()}

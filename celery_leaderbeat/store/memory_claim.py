"""The slot scripts in Python, for the in-memory store: one call's rules under the state's
lock (``lead.lua``, whose items also carry ``backfill.lua``'s and ``define.lua``'s work,
``check.lua`` as a lead call with no items, ``rescue.lua`` and ``record.lua``, all over
``prelude.lua``'s generation check and fence, with the prelude pieces they call:
``prelude_events.lua``'s events, ``prelude_claims.lua``'s grants and recovers).

The scripts are the specification; each rule below is one of theirs. :func:`claim_call`
answers in their shape (``{1, now, marked, generation, r...}``), so the node-side half
of :class:`~celery_leaderbeat.store.ledger.Ledger` decodes it as it decodes a script's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import StoreRefused
from .memory_state import MemoryState, parts
from .types import ClaimItem, Code, Event

_STATES = {"claim": "c", "skip": "k", "rolled_back": "k", "anchor": "a", "reanchor": "a",
           "restore": "s", "recover": "c"}
#: what a rescue may ask for (``rescue.lua`` refuses the call otherwise)
_RESCUES = ("claim", "skip")

#: a claim item's answer when no rule refused it: granted (None answers "no state", as
#: the script's false reaches the client)
_GRANT: Any = object()


class _Call:
    """One slot call: its arguments (the mode first, see ``MemoryLedger._run``) and what it has
    read so far."""

    def __init__(self, state: MemoryState, args: list[Any]) -> None:
        (self.mode, self.token, ms, epoch, history_max, self.node, window, recover_age,
         _n, self.seen, self.lift_above) = args[:11]
        self.s = state
        self.ms = int(ms or 0)
        self.epoch = str(epoch)
        self.keep = int(history_max)
        self.window = None if window == "" else int(window)
        self.recover_age = None if recover_age == "" else int(recover_age)
        self.now_ms = 0
        self.suffix = ""
        self.leader_busy = False
        self.definitions_behind = False
        self._sent: set[str] | None = None
        self._whole_after: int | None = None
        self.oldest = 0  # the oldest slot the call backfills

    # -- the generation check and the events, before any claim ---------------------------

    def generation_check(self) -> list[Any] | tuple[int, bool]:
        """The loss answer ({2, ...}), or (the generation, whether this call resets)."""
        s = self.s
        generation = s.generation or 0
        seen = "" if self.seen in ("", None) else str(self.seen)
        reset = seen == "reset" and self.mode == "lead" and s.leader() == self.token
        if reset:
            generation = max(generation, int(self.lift_above), s.loss or 0) + 1
            s.generation, s.loss = generation, None
        elif seen == "reset" and generation < int(self.lift_above):
            pass  # not the leader (answered below): the counter is left as it is
        elif seen not in ("", "reset") and generation < int(seen):
            if int(seen) > (s.loss if s.loss is not None else -1):
                s.loss = int(seen)
            return [2, generation]
        elif s.loss is not None and self.mode != "record":
            return [2, generation, 1]
        else:
            generation += 1
            s.generation = generation
        return generation, reset

    def write_event(self, event: Event) -> int:
        """One event into the history; a ``sent`` or ``unsent`` one moves its slot's state
        (``write_events``, ``prelude_events.lua``)."""
        s, marked = self.s, 0
        slot = str(event.slot_ms)
        stored = s.slots.get(event.name)
        if event.event in ("sent", "unsent") and stored and stored.split("|", 1)[0] == slot:
            s_slot, s_epoch, state, who, at = parts(stored)
            rest = f"{s_slot}|{s_epoch}|"
            tail = "" if not who and at is None else f"|{who}" + ("" if at is None else f"|{at}")
            if event.event == "sent":
                s.slots[event.name] = rest + "s" + tail
                marked = 1
            elif state == "c" and (self.epoch != "0" or who == self.node):
                s.slots[event.name] = rest + "u" + tail
        if event.event == "sent":
            s.overtaken.pop(f"{event.name}|{slot}", None)
        s.add_history({"event": event.event, "entry": event.name, "slot": slot,
                       "node": self.node, "epoch": self.epoch, "detail": event.detail},
                      self.keep)
        return marked

    def fence(self, reset: bool) -> list[Any] | None:
        """Lead: the answer for a caller not holding the lease; else None (renewed)."""
        s = self.s
        current = s.leader()
        if current != self.token:
            return [0, current]
        s.keyed.expire("leader", self.ms)
        if reset:  # what was sent before the loss cannot be told: no backfill reaches it
            now = s.now_ms()
            floor = now + (self.window or 0)
            s.floor = max(s.floor or 0, floor)
            s.lost_at = now
        return None

    def prepare(self) -> None:
        s = self.s
        self.now_ms = s.now_ms()
        if self.mode != "rescue":
            return
        mark = s.defined_by
        self.definitions_behind = mark is not None and mark != (
            s.epoch_counter if s.epoch_counter is not None else mark)
        self.suffix = f"|{self.node}|{self.now_ms}"
        progress = s.keyed.get("progress")
        self.leader_busy = (progress is not None and self.window is not None
                            and self.now_ms - int(progress) < self.window
                            and s.leader() is not None)

    # -- each claim item ---------------------------------------------------------------

    def rescue_verdict(self, item: ClaimItem, stored: str | None) -> Any:
        if item.op not in ("claim", "skip") or not stored:
            return None
        if self.definitions_behind:
            return 0
        definition = self.s.definitions.get(item.name) if item.fingerprint else None
        if definition is not None and definition != item.fingerprint:
            return 3
        s_slot, s_epoch, s_state, s_node, _ = parts(stored)
        if (s_slot == item.slot_ms and s_epoch == "0" and s_state == _STATES[item.op]
                and s_node == self.node):
            return 1  # a retry of this rescuer's own claim
        if item.slot_ms <= s_slot or (item.prev_ms is not None and item.prev_ms != s_slot):
            return stored
        if self.now_ms < item.fire_ms + self.ms or self.leader_busy:
            return 0
        return _GRANT

    def recover_verdict(self, item: ClaimItem, stored: str | None) -> Any:
        """A leader's ``recover`` (``recover``, ``prelude_claims.lua``)."""
        field = f"{item.name}|{item.slot_ms}"
        over = self.s.overtaken.get(field)
        left = over
        if left is None and stored:
            s_slot, _, s_state, _, _ = parts(stored)
            if s_slot == item.slot_ms and s_state in ("c", "u"):
                left = stored
        if left is None:
            return stored or int(Code.UNKNOWN)
        _, o_epoch, _, o_node, o_at = parts(left)
        if o_epoch == self.epoch and o_node == "":
            return 1  # this leader's own claim (a retry)
        if o_at is not None and self.now_ms < o_at + (self.recover_age or 0):
            return 0  # a standby's claim, young enough that it may still publish it
        if over is not None:
            del self.s.overtaken[field]
            return 1  # the newer stored slot stays as it is
        return _GRANT

    def lead_verdict(self, item: ClaimItem, stored: str | None) -> tuple[Any, int]:
        """(the answer or _GRANT, the slot to store)."""
        slot = item.slot_ms
        if item.op == "define":
            if item.name:
                self.s.definitions[item.name] = item.fingerprint
            self.s.defined_by = int(self.epoch)
            return 1, slot
        if item.op == "backfill":
            why = self.backfill_refusal(item, stored)
            if why is None:
                self.s.backfilled[f"{item.name}|{slot}"] = item.fingerprint
                return 1, slot
            return why, slot
        if item.op == "claim" and item.fire_ms > self.now_ms + (self.window or 0):
            return 0, slot
        if item.op == "anchor":
            return (stored if stored else _GRANT), slot
        if item.op == "reanchor":
            if self.s.definitions.get(item.name) == item.fingerprint:
                return stored, slot
            if stored and parts(stored)[0] > slot:
                return _GRANT, parts(stored)[0]
            return _GRANT, slot
        if item.op == "recover":
            return self.recover_verdict(item, stored), slot
        return self.stored_verdict(item, stored), slot

    def stored_verdict(self, item: ClaimItem, stored: str | None) -> Any:
        if not stored:
            return _GRANT
        s_slot, s_epoch, s_state, s_node, _ = parts(stored)
        own = s_slot == item.slot_ms and s_epoch == self.epoch and s_node == ""
        if own and item.op == "claim" and s_state == "s":
            return 4  # asked again: recorded sent by an earlier attempt
        if own and item.op == "claim" and s_state == "c":
            return _GRANT  # asked again, not sent yet: granted again
        if own and s_state == _STATES.get(item.op):
            return 1  # a retry of this leader's own claim
        if item.slot_ms <= s_slot:
            return stored
        return _GRANT

    def grant(self, item: ClaimItem, stored: str | None, slot: int) -> int:
        """Store a granted item (``skip_paused``, ``store_slot``: ``prelude_claims.lua``)."""
        s = self.s
        if item.op == "claim" and item.name in s.paused:
            s.slots[item.name] = f"{slot}|{self.epoch}|k{self.suffix}"
            return 2
        if stored:
            s_slot, s_epoch, s_state, s_node, _ = parts(stored)
            own = ((self.mode == "lead" and s_epoch == self.epoch and s_node == "")
                   or (self.mode == "rescue" and s_epoch == "0" and s_node == self.node))
            if item.op != "recover" and s_state in ("c", "u") and s_slot != slot and not own:
                s.overtaken[f"{item.name}|{s_slot}"] = stored
        s.slots[item.name] = f"{slot}|{self.epoch}|{_STATES[item.op]}{self.suffix}"
        return 1

    def one(self, item: ClaimItem) -> Any:
        stored = self.s.slots.get(item.name)
        slot = item.slot_ms
        if self.mode == "rescue":
            result = self.rescue_verdict(item, stored)
        else:
            result, slot = self.lead_verdict(item, stored)
        if result is _GRANT and item.op not in ("backfill", "define"):
            result = self.grant(item, stored, slot)
            if self.mode == "lead" and item.fingerprint:
                self.s.definitions[item.name] = item.fingerprint
        return result

    # -- backfill ----------------------------------------------------------------------

    def backfill_refusal(self, item: ClaimItem, stored: str | None) -> str | None:
        s, slot = self.s, item.slot_ms
        if not stored or slot >= parts(stored)[0]:
            return "later"
        by = s.backfilled.get(f"{item.name}|{slot}")
        if by == item.fingerprint:
            return None  # this request's own grant, asked again (the first reply was lost)
        if by is not None:
            return "backfilled"
        if f"{item.name}|{slot}" in s.overtaken:
            return "unconfirmed"
        if slot < (s.floor or 0):
            return "lost"
        ahead = self.window or 0
        sent = self._sent_in_history()
        if f"{item.name}|{slot}" in sent:
            return "sent"
        if self._whole_after is None or self._whole_after >= slot - ahead:
            return "horizon"  # a 'sent' event of the slot may have been trimmed
        return None

    def _sent_in_history(self) -> set[str]:
        """The 'sent' events of the history from the oldest slot the call backfills, less
        the ahead allowance, read once per call; and how far back the history is whole."""
        if self._sent is None:
            history = self.s.history
            self._whole_after = self.s.trimmed_ms if history else None
            self._sent = {f"{f.get('entry')}|{f.get('slot')}" for at, f in history
                          if at[0] >= max(0, self.oldest - (self.window or 0))
                          and f.get("event") == "sent" and "entry" in f and "slot" in f}
        return self._sent


def claim_call(state: MemoryState, args: list[Any], events: Sequence[Event],
               items: Sequence[ClaimItem]) -> list[Any]:
    """One slot call, in the scripts' shape: {1, now, marked, generation, r...}."""
    call = _Call(state, args)
    if call.mode == "rescue":
        for item in items:
            if item.op not in _RESCUES:
                raise StoreRefused(f"rescue.lua: op {item.op} is not a rescue")
    checked = call.generation_check()
    if isinstance(checked, list):
        return checked
    generation, reset = checked
    marked = sum(call.write_event(event) for event in events)
    if call.mode == "lead":
        refused = call.fence(reset)
        if refused is not None:
            return refused + [marked]
    elif call.mode != "rescue" and items:
        raise ValueError(f"claim: mode {call.mode} takes no claims")
    call.prepare()
    backfills = [item.slot_ms for item in items if item.op == "backfill"]
    call.oldest = min(backfills) if backfills else 0
    out: list[Any] = [1, call.now_ms, marked, generation]
    progressed = False
    for item in items:
        if call.mode == "lead" and item.op == "claim" and not progressed:
            state.keyed.set("progress", call.now_ms, call.ms)
            progressed = True
        out.append(call.one(item))
    return out

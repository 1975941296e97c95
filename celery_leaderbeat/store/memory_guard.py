"""The in-memory store's worker guard: ``guard.lua`` in Python, under the state's lock.

The script is the specification: a start is atomic, a run's token fences its renew
and finish, the overlap policies decide as it does and are counted the same way.
"""

from __future__ import annotations

from typing import Any

from ..config import Config
from .memory_state import MemoryState
from .records import GuardDecision, GuardRun, RunRecord, guard_decision


class _GuardCall:
    """One call about one run: its keys (as tuples) and the history it writes."""

    def __init__(self, state: MemoryState, config: Config, run: GuardRun) -> None:
        self.s = state
        self.run = run
        self.task = run.task_id
        self.entry = run.entry
        self.record_ttl = int(config.guard_expires * 1000)
        self.lease = int(config.lease_ttl * 1000)
        self.keep = config.history_length
        self.policy = "allow_all" if run.overlap == "allow" else run.overlap
        self.record_key = ("run", run.run_id)
        self.alive_key = ("alive", run.run_id)
        self.lock_key = ("overlap", run.entry)
        self.held_key = ("held", run.entry)

    def history(self, event: str, detail: str, slot: Any = None) -> None:
        run = self.run
        self.s.add_history({"event": event, "entry": run.entry,
                            "slot": run.slot_ms if slot is None else slot, "node": run.worker,
                            "epoch": run.epoch, "detail": detail}, self.keep)

    def count(self, decision: str) -> None:
        field = f"{self.entry}|{self.policy}|{decision}"
        self.s.decisions[field] = self.s.decisions.get(field, 0) + 1

    def holder(self) -> tuple[str, str, str] | None:
        """The run that holds the slot: state, token, worker."""
        record = self.s.keyed.get(self.record_key)
        if record is not None:
            state, token, worker = str(record).split("|", 2)
            return state, token, worker
        alive = self.s.keyed.get(self.alive_key)  # the record expired while the run goes on
        if alive is not None:
            token, _, worker = str(alive).partition("|")
            return "s", token, worker
        return None

    def lock(self) -> str | None:
        held = self.s.keyed.get(self.lock_key)
        return None if held is None else str(held)

    def waiting(self) -> dict[str, int]:
        return self.s.waiting.get(self.entry, {})

    def first_waiting(self) -> str | None:
        waiting = self.waiting()
        return min(waiting, key=lambda task: (waiting[task], task)) if waiting else None

    def cancelled_said(self, outcome: str) -> str:
        """The outcome of a run that ends, said 'cancelled' when a newer slot replaced it."""
        if self.lock() != self.task:
            return outcome
        held = str(self.s.keyed.get(self.held_key) or "")
        if not held.endswith("|cancelled") or outcome.startswith("cancelled:"):
            return outcome
        return f"cancelled: replaced ({outcome})"

    def hand_on(self) -> str:
        """The run holding the lock ended: free it and hand it on; the message, or ''."""
        if self.lock() != self.task:
            return ""
        self.s.keyed.delete(self.lock_key)
        self.s.keyed.delete(self.held_key)
        return promote(self.s, self.entry, self.lease) or ""

    # -- start ---------------------------------------------------------------------------

    def wait_here(self, lock: str | None) -> list[str]:
        s = self.s
        waiting = s.waiting.setdefault(self.entry, {})
        added = self.task not in waiting
        waiting.setdefault(self.task, self.run.slot_ms)
        s.messages.setdefault(self.entry, {})[self.task] = self.run.message
        s.waiting_entries.add(self.entry)
        if added:
            self.history("buffered", f"waits for {lock or 'the slots before it'}")
            self.count("buffered")
        return ["wait", lock or ""]

    def skipped(self, why: str, holder_task: str | None) -> list[str]:
        self.history("skipped", f"overlap: {why}")
        self.count("skipped")
        return ["overlap", holder_task or ""]

    def overlap_check(self) -> list[str] | None:
        """None: this slot may start; else the answer that says why not."""
        lock = self.lock()
        if lock == self.task:
            return None  # handed the lock: its turn came
        if self.task in self.waiting():  # waits already: a message delivered again
            if not lock and self.first_waiting() == self.task:
                return None
            return ["wait", lock or ""]
        if self.run.handed_over:
            return self.skipped("no longer waits", lock)
        first = self.first_waiting()
        if not lock and not first:
            return None
        if self.policy == "skip":
            return self.skipped(f"{lock or first} still runs", lock or first)
        if self.policy == "buffer_all":
            return self.wait_here(lock)
        if first:  # buffer_one, cancel_other: one slot waits already and is kept
            return self.skipped(f"{first} waits already", lock or first)
        return self.wait_or_cancel(lock)

    def wait_or_cancel(self, lock: str | None) -> list[str]:
        held = str(self.s.keyed.get(self.held_key) or "")
        slot = held.split("|", 1)[0] if held[:1].isdigit() else "0"
        if self.policy == "cancel_other" and lock and int(slot) > self.run.slot_ms:
            return self.skipped(f"older than the running slot ({lock})", lock)  # delivered late
        reply = self.wait_here(lock)
        if self.policy == "cancel_other" and lock:  # no slot waits: the lock's holder runs
            self.history("cancelled", f"replaced by slot {self.run.slot_text or self.run.slot_ms}",
                         slot)
            self.count("cancelled")
            self.s.keyed.set(self.held_key, f"{held}|cancelled", keep_ttl=True)
            reply[0] = "cancel"
        return reply

    def take_turn(self) -> bool:
        """The lock is this slot's now; whether it had waited."""
        s = self.s
        s.keyed.set(self.lock_key, self.task, self.lease)
        s.keyed.set(self.held_key, f"{self.run.slot_ms}|{self.run.worker}", self.lease)
        waited = s.waiting.get(self.entry, {}).pop(self.task, None) is not None
        s.messages.get(self.entry, {}).pop(self.task, None)
        if not s.waiting.get(self.entry):
            s.waiting.pop(self.entry, None)
            s.messages.pop(self.entry, None)
            s.waiting_entries.discard(self.entry)
        self.count("started_after_wait" if waited else "started")
        return waited

    def start(self, will_ask_again: bool) -> list[str]:
        held = self.holder()
        worker = held[2] if held else ""
        if held and held[0] == "f":
            self.history("skipped", f"duplicate: already ran on {worker}")
            return ["duplicate", f"finished on {worker}"]
        if held and self.s.keyed.get(self.alive_key) is not None:
            if not will_ask_again:
                self.history("skipped", f"duplicate: running on {worker}")
            return ["duplicate", f"running on {worker}"]
        waited = False
        if self.policy != "allow_all" and self.run.retry == 0:
            refused = self.overlap_check()
            if refused:
                return refused
            waited = self.take_turn()
        return self.record_start(held is not None, waited)

    def record_start(self, rerun: bool, waited: bool) -> list[str]:
        s = self.s
        s.fence = max(s.fence + 1, s.now_us())
        token = str(s.fence)
        s.keyed.set(self.record_key, f"s|{token}|{self.run.worker}", self.record_ttl)
        s.keyed.set(self.alive_key, f"{token}|{self.run.worker}", self.lease)
        detail = ""
        if self.run.retry > 0:
            detail = f"retry {self.run.retry}"
        elif waited:
            detail = "after wait"
        if rerun:
            detail = (detail + "; " if detail else "") + "rerun: the first run was lost with its worker"
            self.history("started", detail)
            return ["run", "rerun", token]
        self.history("started", detail)
        return ["run", "", token]

    # -- renew, finish, release ----------------------------------------------------------

    def renew_or_finish(self, mode: str, token: int, detail: str) -> list[str]:
        s = self.s
        held = self.holder()
        if held and held[1] != str(token):
            if mode == "finish":
                self.history("finished", f"{detail}; superseded: the slot ran again on {held[2]}")
            return ["superseded", held[2]]
        worker = self.run.worker
        if mode == "renew":
            s.keyed.set(self.alive_key, f"{token}|{worker}", self.lease)
            if not held or held[0] != "f":
                s.keyed.set(self.record_key, f"s|{token}|{worker}", self.record_ttl)
            if self.lock() == self.task:
                s.keyed.expire(self.lock_key, self.lease)
                s.keyed.expire(self.held_key, self.lease)
            return ["ok"]
        s.keyed.set(self.record_key, f"f|{token}|{worker}", self.record_ttl)
        s.keyed.delete(self.alive_key)
        self.history("finished", self.cancelled_said(detail))
        return ["ok", self.hand_on()]

    def release(self, detail: str) -> list[str]:
        held = self.holder()
        if self.lock() != self.task or not held or held[0] != "s":
            return ["ok", ""]
        self.s.keyed.set(self.record_key, f"f|{held[1]}|{held[2]}", self.record_ttl)
        self.s.keyed.delete(self.alive_key)
        self.history("finished", detail)
        return ["ok", self.hand_on()]


def promote(state: MemoryState, entry: str, lease_ms: int) -> str | None:
    """Hand the entry's lock to its first waiting slot; that slot's message, or None."""
    waiting = state.waiting.get(entry, {})
    messages = state.messages.get(entry, {})
    while waiting:
        head = min(waiting, key=lambda task: (waiting[task], task))
        if head in messages:
            state.keyed.set(("overlap", entry), head, 2 * lease_ms)
            state.keyed.delete(("held", entry))
            return messages[head]
        del waiting[head]  # its message is gone: nothing to send
    return None


class MemoryGuard:
    """The worker guard's records of one in-memory store."""

    def __init__(self, state: MemoryState, config: Config) -> None:
        self.state = state
        self.config = config

    def _call(self, run: GuardRun) -> _GuardCall:
        return _GuardCall(self.state, self.config, run)

    def start(self, run: GuardRun, *, will_ask_again: bool = False) -> GuardDecision:
        with self.state.lock:
            reply = self._call(run).start(will_ask_again)
        return guard_decision(reply[0], reply[1], int(reply[2]) if len(reply) > 2 else 0)

    def renew(self, run: GuardRun, token: int) -> bool:
        with self.state.lock:
            return self._call(run).renew_or_finish("renew", token, "")[0] == "ok"

    def finish(self, run: GuardRun, token: int, detail: str) -> bool:
        return self.end(run, token, detail)[0]

    def end(self, run: GuardRun, token: int, detail: str) -> tuple[bool, str]:
        with self.state.lock:
            reply = self._call(run).renew_or_finish("finish", token, detail)
        return reply[0] == "ok", (reply[1] if reply[0] == "ok" else "")

    def release(self, run: GuardRun, detail: str) -> str:
        with self.state.lock:
            return self._call(run).release(detail)[1]

    def decisions(self) -> dict[tuple[str, str, str], int]:
        with self.state.lock:
            out = {}
            for field, value in self.state.decisions.items():
                entry, policy, decision = field.rsplit("|", 2)
                out[(entry, policy, decision)] = value
            return out

    def sweep(self) -> list[str]:
        s = self.state
        lease_ms = int(self.config.lease_ttl * 1000)
        out = []
        with s.lock:
            for entry in list(s.waiting_entries)[:100]:
                if not s.waiting.get(entry):
                    s.waiting_entries.discard(entry)
                elif s.keyed.get(("overlap", entry)) is None:
                    message = promote(s, entry, lease_ms)
                    if message is not None:
                        out.append(message)
        return out

    def runs(self, task_ids: list[str]) -> dict[str, RunRecord]:
        out = {}
        with self.state.lock:
            for task_id in task_ids:
                record = self.state.keyed.get(("run", task_id))
                if record is None:
                    continue
                state, _, worker = str(record).split("|", 2)
                alive = self.state.keyed.get(("alive", task_id)) is not None
                out[task_id] = RunRecord("finished" if state == "f" else "started", worker, alive)
        return out

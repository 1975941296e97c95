"""The worker guard's records in Redis: which run of a slot started, is alive, or finished.

One script per call (``lua/guard_*.lua``) does each change, so a start is atomic: two
workers handed the same run cannot both be told to run it. A run is a slot's
first delivery that does the work, or one of its retries (``run_id``: the
slot's task id, ``~<k>`` added for retry k). Per run: ``{p}:run:<run id>``
``<state>|<token>|<worker>`` kept ``guard_expires``; ``{p}:alive:<run id>``,
set while the run goes on and renewed by its worker; with every overlap policy
but ``allow_all``, ``{p}:overlap:<entry>`` holds the task id of the entry's run
still going on (or of the waiting slot handed the turn), ``{p}:waiting:<entry>``
and ``{p}:waiting-msg:<entry>`` the slots waiting for it and their messages.
``{p}:guard:fence`` is the last run token handed out: every start gets a
higher one, and only the run holding the record's token may renew or finish it.
"""

from __future__ import annotations

from typing import Any

from .records import GuardDecision, GuardRun, RunRecord, guard_decision
from .scripts import RedisPart, text


class RedisRuns(RedisPart):
    """The guard's records of one key prefix."""

    def _call(self, script: Any, run: GuardRun, detail: str = "", token: int = 0) -> list[str]:
        keys, config = self.keys, self.config
        reply = script(
            keys=[keys.run(run.run_id), keys.alive(run.run_id), keys.overlap(run.entry),
                  keys.history, keys.guard_fence, keys.waiting(run.entry),
                  keys.waiting_messages(run.entry), keys.waiting_entries,
                  keys.overlap_held(run.entry), keys.overlap_decisions],
            args=[run.task_id, run.worker, int(config.guard_expires * 1000),
                  int(config.lease_ttl * 1000), run.overlap, config.history_length,
                  run.entry, run.slot_ms, run.epoch, detail, token, run.retry, run.message,
                  "1" if run.handed_over else "0", run.slot_text or str(run.slot_ms)])
        return [text(part) for part in reply]

    def start(self, run: GuardRun, *, will_ask_again: bool = False) -> GuardDecision:
        reply = self._call(self.scripts.guard_start, run, "wait" if will_ask_again else "")
        return guard_decision(reply[0], reply[1], int(reply[2]) if len(reply) > 2 else 0)

    def renew(self, run: GuardRun, token: int) -> bool:
        return self._call(self.scripts.guard_renew, run, token=token)[0] == "ok"

    def finish(self, run: GuardRun, token: int, detail: str) -> bool:
        return self.end(run, token, detail)[0]

    def end(self, run: GuardRun, token: int, detail: str) -> tuple[bool, str]:
        reply = self._call(self.scripts.guard_finish, run, detail, token)
        return reply[0] == "ok", (reply[1] if reply[0] == "ok" and len(reply) > 1 else "")

    def release(self, run: GuardRun, detail: str) -> str:
        reply = self._call(self.scripts.guard_release, run, detail)
        return reply[1] if len(reply) > 1 else ""

    def decisions(self) -> dict[tuple[str, str, str], int]:
        out = {}
        for field, value in self.client.hgetall(self.keys.overlap_decisions).items():
            entry, policy, decision = text(field).rsplit("|", 2)
            out[(entry, policy, decision)] = int(value)
        return out

    def sweep(self) -> list[str]:
        keys = self.keys
        reply = self.scripts.guard_sweep(
            keys=[keys.waiting_entries],
            args=[keys.overlap(""), keys.waiting(""), keys.waiting_messages(""),
                  keys.overlap_held(""), int(self.config.lease_ttl * 1000)])
        return [text(part) for part in reply]

    def runs(self, task_ids: list[str]) -> dict[str, RunRecord]:
        if not task_ids:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.get(self.keys.run(task_id))
            pipe.exists(self.keys.alive(task_id))
        replies = pipe.execute()
        out = {}
        for task_id, record, alive in zip(task_ids, replies[0::2], replies[1::2]):
            if record:
                state, _, rest = text(record).partition("|")
                held, _, worker = rest.partition("|")
                if not held.isdigit():  # a record written without a token
                    worker = rest
                out[task_id] = RunRecord("finished" if state == "f" else "started", worker,
                                         bool(alive))
        return out

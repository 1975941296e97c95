"""The worker guard's records in Redis: which run of a slot started, is alive, or finished.

One script (``lua/guard.lua``) does every change, so a start is atomic: two
workers handed the same run cannot both be told to run it. A run is a slot's
first delivery that does the work, or one of its retries (``run_id``: the
slot's task id, ``~<k>`` added for retry k). Per run: ``{p}:run:<run id>``
``<state>|<token>|<worker>`` kept ``guard_expires``; ``{p}:alive:<run id>``,
set while the run goes on and renewed by its worker; with overlap ``skip``,
``{p}:overlap:<entry>`` holds the task id of the entry's run still going on.
``{p}:guard:fence`` is the last run token handed out: every start gets a
higher one, and only the run holding the record's token may renew or finish it.
"""

from __future__ import annotations

from .base import GuardDecision, GuardRun, RunRecord
from .scripts import RedisPart, text


class RedisRuns(RedisPart):
    """The guard's records of one key prefix."""

    def _call(self, run: GuardRun, mode: str, detail: str = "", token: int = 0) -> list[str]:
        keys, config = self.keys, self.config
        reply = self.scripts.guard(
            keys=[keys.run(run.run_id), keys.alive(run.run_id), keys.overlap(run.entry),
                  keys.history, keys.guard_fence],
            args=[mode, run.task_id, run.worker, int(config.guard_expires * 1000),
                  int(config.lease_ttl * 1000), run.overlap, config.history_length,
                  run.entry, run.slot_ms, run.epoch, detail, token, run.retry])
        return [text(part) for part in reply]

    def start(self, run: GuardRun, *, will_ask_again: bool = False) -> GuardDecision:
        reply = self._call(run, "start", "wait" if will_ask_again else "")
        return GuardDecision(reply[0], reply[1], int(reply[2]) if len(reply) > 2 else 0)

    def renew(self, run: GuardRun, token: int) -> bool:
        return self._call(run, "renew", token=token)[0] == "ok"

    def finish(self, run: GuardRun, token: int, detail: str) -> bool:
        return self._call(run, "finish", detail, token)[0] == "ok"

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

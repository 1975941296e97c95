"""The worker guard's records in Redis: which slot's run started, is alive, or finished.

One script (``lua/guard.lua``) does every change, so a start is atomic: two
workers handed the same slot cannot both be told to run it. Per run (keyed by
the slot's task id): ``{p}:run:<task id>`` ``<state>|<worker>`` kept
``guard_expires``; ``{p}:alive:<task id>``, set while the run goes on and
renewed by its worker; with overlap ``skip``, ``{p}:overlap:<entry>`` holds the
task id of the entry's run still going on.
"""

from __future__ import annotations

from .base import GuardRun, RunRecord
from .scripts import RedisPart, text


class RedisRuns(RedisPart):
    """The guard's records of one key prefix."""

    def _call(self, run: GuardRun, mode: str, detail: str = "") -> list[str]:
        keys, config = self.keys, self.config
        reply = self.scripts.guard(
            keys=[keys.run(run.task_id), keys.alive(run.task_id), keys.overlap(run.entry),
                  keys.history],
            args=[mode, run.task_id, run.worker, int(config.guard_expires * 1000),
                  int(config.lease_ttl * 1000), run.overlap, config.history_length,
                  run.entry, run.slot_ms, run.epoch, detail])
        return [text(part) for part in reply]

    def start(self, run: GuardRun, *, will_ask_again: bool = False) -> tuple[str, str]:
        decision, why = self._call(run, "start", "wait" if will_ask_again else "")
        return decision, why

    def renew(self, run: GuardRun) -> None:
        self._call(run, "renew")

    def finish(self, run: GuardRun, detail: str) -> None:
        self._call(run, "finish", detail)

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
                state, _, worker = text(record).partition("|")
                out[task_id] = RunRecord("finished" if state == "f" else "started", worker,
                                         bool(alive))
        return out

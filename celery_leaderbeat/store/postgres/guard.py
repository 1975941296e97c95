"""The worker guard's records on PostgreSQL: the seam's :class:`GuardStore` over
:mod:`.guard_sql` (``guard_*.lua``'s rules, one transaction per call, each a
:class:`~.guard_call.Call` on its locked rows)."""

from __future__ import annotations

from ...config import Config
from ..base import GuardDecision, GuardRun, RunRecord
from ..records import guard_decision
from . import guard_sql
from .guard_call import Ttls
from .place import Place


class PostgresGuard:
    """The guard's records of one app: each slot's run starts at most once."""

    def __init__(self, place: Place, config: Config) -> None:
        self.place = place
        self.ttls = Ttls(int(config.guard_expires * 1000), int(config.lease_ttl * 1000))

    def start(self, run: GuardRun, *, will_ask_again: bool = False) -> GuardDecision:
        decision, why, token = self.place.run(guard_sql.start_run, run, self.ttls,
                                              will_ask_again)
        return guard_decision(decision, why, token)

    def renew(self, run: GuardRun, token: int) -> bool:
        ours, _ = self.place.run(guard_sql.renew_run, run, self.ttls, token)
        return bool(ours)

    def finish(self, run: GuardRun, token: int, detail: str) -> bool:
        return self.end(run, token, detail)[0]

    def end(self, run: GuardRun, token: int, detail: str) -> tuple[bool, str]:
        ours, handed = self.place.run(guard_sql.finish_run, run, self.ttls, token, detail)
        return bool(ours), (handed if ours else "")

    def release(self, run: GuardRun, detail: str) -> str:
        return str(self.place.run(guard_sql.release_run, run, self.ttls, detail))

    def runs(self, task_ids: list[str]) -> dict[str, RunRecord]:
        if not task_ids:
            return {}
        rows = self.place.run(guard_sql.read_runs, task_ids)
        return {run_id: RunRecord("finished" if state == "f" else "started", worker,
                                  bool(alive))
                for run_id, state, worker, alive in rows}

    def decisions(self) -> dict[tuple[str, str, str], int]:
        rows = self.place.run(guard_sql.read_decisions)
        return {(entry, policy, decision): int(n) for entry, policy, decision, n in rows}

    def sweep(self) -> list[str]:
        return list(self.place.run(guard_sql.sweep_waiting, self.ttls.lease_ms))

"""The seam's slot store over :mod:`.claims_sql` and :mod:`.state_sql`: claims, rescues,
the history, definitions, nodes, and the generation that tells older state."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from ...config import Config
from ...errors import LeaseLostError, RolledBackError
from ..ledger import LOST_KEPT_TTLS
from ..types import (
    BackfillReason,
    BackfillRefused,
    Claimed,
    ClaimItem,
    ClaimResult,
    Event,
    Op,
    Refused,
    SlotState,
)
from . import claims_sql, lease_sql, rules, state_sql
from .place import Place, wait_ms
from .pool import ERRORS

#: ms a leader's claimed slot may lie ahead of the server's clock beyond max_clock_skew
_AHEAD_GRACE_MS = 1000
#: a rescue waits while the lease holder claimed something this recently (ms)
_BUSY_LEADER_MS = 1000
#: the history is pruned to its bounds every this many writes of it (by :meth:`tidy`,
#: between send passes)
PRUNE_EVERY = 200
#: writes after which a write prunes at once, if nobody called :meth:`tidy` meanwhile
PRUNE_OVERDUE = 5 * PRUNE_EVERY
#: history rows older than this many seconds go at the latest
KEEP_SECONDS = 7 * 24 * 3600.0
#: grants are kept this many seconds, or the catch-up window when longer: a burst of
#: 2,000 entries every 5 s keeps about 1.4 million rows
GRANTS_KEEP_SECONDS = 3600.0


def _events(events: Iterable[Event]) -> claims_sql.Events:
    out = claims_sql.Events([], [], [], [])
    for ev in events:
        out.names.append(ev.name)
        out.slots.append(ev.slot_ms)
        out.events.append(ev.event)
        out.details.append(ev.detail)
    return out


def _state(row: rules.Row) -> SlotState:
    return SlotState(row.slot_ms, row.epoch, row.state, row.node or None, row.claimed_ms)


def _result(item: ClaimItem, answer: rules.Answer) -> ClaimResult:
    """The seam's result for one item, as :func:`~..ledger.decode` answers the Redis
    store's: a code, the stored slot that refused it, or a backfill's reason."""
    if isinstance(answer, rules.Row):
        return Refused.by(_state(answer), item.slot_ms)
    if isinstance(answer, BackfillReason):
        return BackfillRefused(answer)
    return answer


def _results(items: Sequence[ClaimItem], got: claims_sql.Answer) -> list[ClaimResult]:
    return [_result(item, answer) for item, answer in zip(items, got.answers, strict=True)]


class PostgresLedger:
    """The slots, the history, definitions and nodes (the seam's slot store)."""

    def __init__(self, place: Place, config: Config) -> None:
        self.place, self.config = place, config
        #: the highest generation of the app's state this node has seen
        self.generation = 0
        #: the database answered a lower generation than this node has seen (it lost
        #: writes): set until the node reported what it knew settled
        self.loss_seen = False
        self.loss_reported = False
        self._loss_below: int | None = None
        #: the epoch of a leader starting again past a loss of writes: its calls lift the
        #: generation until one is answered (see reset_generation)
        self._reset_epoch: int | None = None
        self._writes = 0
        self._tidied = 0  # self._writes at the last prune

    @property
    def _grants_keep_s(self) -> float:
        return max(GRANTS_KEEP_SECONDS, self.config.catchup_window or 0.0)

    @property
    def _wait_ms(self) -> int:
        """How long a claim waits for a lock or idles mid-transaction: a call's timeout."""
        return wait_ms(self.config)

    def observe_generation(self, generation: int | None) -> None:
        """Note a generation seen elsewhere (an acquire attempt's answer); a lower one than
        this node has seen means the database lost writes (:attr:`loss_seen`)."""
        if generation is None:
            return
        if generation >= self.generation:
            self.generation = generation
            self._loss_below = None
        else:
            if self._loss_below is None or generation < self._loss_below:
                self.loss_seen = True
            self._loss_below = generation

    @property
    def below(self) -> bool:
        """The generation was last seen below the highest this node saw."""
        return self._loss_below is not None

    def reset_generation(self, epoch: int) -> None:
        """The next claim of the leader of ``epoch`` re-anchors after a loss of writes: it
        lifts the generation. Kept until a call of that term is answered (a call that
        failed may be retried); a call of another epoch drops it: that term is over."""
        self._reset_epoch = epoch

    def _older_state(self, older: claims_sql.OlderState) -> RolledBackError:
        """What a call refused for older state raises; a loss this node saw first is made
        known to every node (as far as the database answers)."""
        self.observe_generation(older.generation)
        self.loss_reported = older.reported
        if not older.reported:
            try:
                self.place.run(state_sql.mark_loss, older.seen)
            except ERRORS:
                pass  # the next call that sees the loss marks it
        error = RolledBackError(f"{older} (a replica promoted that lacked commits, or a "
                                f"backup restored){self._identity_text()}")
        error.generation = older.generation
        return error

    def _identity_text(self) -> str:
        """Which server answered the older state: its system identifier and timeline (above
        1: a replica was promoted), for the message; empty when it does not answer."""
        try:
            system, timeline = self.place.run(lease_sql.identity)
        except ERRORS:
            return ""
        return f"; the server answering is system {system} on timeline {timeline}"

    def report_lost(self, settled: dict[str, int]) -> None:
        """This node saw the database lose writes: say so (the leader then starts again,
        even one that is a new process), and keep for a while the newest slot of each
        entry it knew settled (clears :attr:`loss_seen`)."""
        keep_ms = int(LOST_KEPT_TTLS * self.config.lease_ttl * 1000)
        self.place.run(state_sql.report_lost, self.config.node_id, keep_ms, self.generation,
                       settled)
        self.loss_seen = False

    def lost_reports(self) -> dict[str, int]:
        """Per entry, the newest slot any node reported settled before a loss."""
        return self.place.run(state_sql.lost_reports)  # type: ignore[no-any-return]

    def claim(self, token: str, epoch: int, items: Sequence[ClaimItem],
              events: Sequence[Event] = ()) -> list[ClaimResult]:
        """Leader: write ``events``, then claim ``items`` in order, fenced by ``token``."""
        return _results(items, self._lead(token, epoch, events, items))

    def check_generation(self, token: str, epoch: int) -> None:
        """Leader: raise when the database lost writes this node saw (RolledBackError) or
        ``token`` no longer leads (LeaseLostError). Renews the lease; writes nothing else."""
        self._lead(token, epoch, (), ())

    def mark_definitions(self, token: str, epoch: int) -> None:
        """Leader: mark the stored definitions as what this leader plans (its epoch),
        fenced; until the newest leader did, no standby rescues."""
        self._lead(token, epoch, (), (ClaimItem("", 0, Op.DEFINE),))

    def _lead(self, token: str, epoch: int, events: Sequence[Event],
              items: Sequence[ClaimItem]) -> claims_sql.Answer:
        """A fenced call: the transaction's answer, or LeaseLostError."""
        holder = token.rpartition("|")[0]
        limits = claims_sql.Limits(
            ahead_ms=int(self.config.max_clock_skew * 1000) + _AHEAD_GRACE_MS,
            recover_age_ms=int(self.config.lease_ttl * 1000), wait_ms=self._wait_ms)
        if self._reset_epoch != epoch:
            self._reset_epoch = None
        lift = self.generation if self._reset_epoch is not None else None
        fence = claims_sql.Fence(holder, epoch, int(self.config.lease_ttl * 1000),
                                 self.generation, lift)
        got = self._claim(fence, limits, events, items)
        self._reset_epoch = None  # answered: lifted, or this term is over
        if got.lost:
            lost = LeaseLostError(f"claim refused: lease {token} lost; held by "
                                  f"{got.holder or 'nobody'}")
            lost.holder, lost.answered = got.holder, True
            raise lost
        return got

    def backfill(self, token: str, epoch: int, name: str, slots: Sequence[int],
                 request_id: str) -> list[ClaimResult]:
        """Leader: grant a backfill of each slot (:attr:`Code.GRANTED`) or say why not
        (:class:`BackfillRefused`), decided from what the database holds at this moment."""
        items = [ClaimItem(name, slot_ms, Op.BACKFILL, slot_ms, fingerprint=request_id)
                 for slot_ms in slots]
        return self.claim(token, epoch, items)

    def lost_at(self) -> int | None:
        """The server's time (ms) when a leader last started again after a loss of writes."""
        return self.place.run(state_sql.lost_at)  # type: ignore[no-any-return]

    def rescue(self, items: Sequence[ClaimItem], events: Sequence[Event] = ()) -> Claimed:
        """Standby: claim slots nobody claimed ``rescue_after`` past their fire time."""
        limits = claims_sql.Limits(rescue_after_ms=int(self.config.rescue_after * 1000),
                                   busy_ms=_BUSY_LEADER_MS, wait_ms=self._wait_ms)
        got = self._claim(claims_sql.Fence(None, 0, 0, self.generation), limits, events, items)
        return Claimed(_results(items, got), got.now_ms)

    def record(self, epoch: int, events: Iterable[Event]) -> int:
        """Write events to the history; ``sent`` events mark their slot sent."""
        columns = _events(events)
        if not columns.names:
            return 0
        try:
            marked, generation = self.place.run(claims_sql.record, self.config.node_id, epoch,
                                                columns, self.generation, self._wait_ms)
        except claims_sql.OlderState as older:
            raise self._older_state(older) from None
        self.observe_generation(generation)
        self._wrote()
        return int(marked)

    def _claim(self, fence: claims_sql.Fence, limits: claims_sql.Limits,
               events: Sequence[Event], items: Sequence[ClaimItem]) -> claims_sql.Answer:
        try:
            got = self.place.run(claims_sql.claim, self.config.node_id, fence, limits,
                                 _events(events), items)
        except claims_sql.OlderState as older:
            raise self._older_state(older) from None
        self.observe_generation(got.generation)
        if events:
            self._wrote()
        return got  # type: ignore[no-any-return]

    def _wrote(self) -> None:
        self._writes += 1
        if self._writes - self._tidied >= PRUNE_OVERDUE:  # nobody tidies: this caller does
            self.tidy()

    def tidy(self) -> None:
        """Prune the history and the grants once :data:`PRUNE_EVERY` writes were made
        since the last prune. A prune takes 20-50 ms at 2,000 entries: inside a claim
        call it set the claim's p99, and held up the next chunk of a burst."""
        if self._writes - self._tidied < PRUNE_EVERY:
            return
        self.place.run(state_sql.prune_history, keep=self.config.history_length,
                       max_age_s=KEEP_SECONDS, grants_keep_s=self._grants_keep_s)
        self._tidied = self._writes

    def load(self, names: Sequence[str] | None = None) -> dict[str, SlotState]:
        return {n: _state(r) for n, r in self.place.run(state_sql.load, names).items()}

    def load_with_definitions(self, names: Sequence[str] | None = None
                              ) -> tuple[dict[str, SlotState], dict[str, str]]:
        return self.load(names), self.place.run(state_sql.definitions, names)

    def write_definitions(self, fingerprints: dict[str, str]) -> None:
        self.place.run(state_sql.write_definitions, fingerprints)

    def prune(self, scheduled: Iterable[str], *, keep_ms: int,
              node_keep_s: float) -> list[int]:
        """Forget entries no longer scheduled (after ``keep_ms``) and long-gone nodes; the
        history to its bounds too."""
        gone = self.place.run(state_sql.prune, list(scheduled), keep_ms=keep_ms,
                              node_keep_s=node_keep_s)
        self.place.run(state_sql.prune_history, keep=self.config.history_length,
                       max_age_s=KEEP_SECONDS, grants_keep_s=self._grants_keep_s)
        return gone  # type: ignore[no-any-return]

    def overtaken(self) -> dict[tuple[str, int], SlotState]:
        return {k: _state(r) for k, r in self.place.run(state_sql.overtaken).items()}

    def forget_overtaken(self, fields: Sequence[tuple[str, int]]) -> None:
        self.place.run(state_sql.forget_overtaken, list(fields))

    def history(self, count: int = 50) -> list[dict[str, str]]:
        return self.place.run(state_sql.history, count)  # type: ignore[no-any-return]

    def register_node(self, role: str, info: dict[str, Any]) -> dict[str, Any] | None:
        record = dict(info, role=role, last_seen=time.time())
        return self.place.run(  # type: ignore[no-any-return]
            state_sql.register_node, self.config.node_id, record)

    def unregister_node(self) -> None:
        self.place.run(state_sql.unregister_node, self.config.node_id)

    def nodes(self) -> dict[str, dict[str, Any]]:
        return self.place.run(state_sql.nodes)  # type: ignore[no-any-return]

"""The schedule's shared state in Redis: slot claims, last slots, history, nodes.

It knows nothing of leadership beyond the token it is handed: every claim
goes through ``claim.lua``, which grants a slot only while the leader key
holds that token (fencing) and only when the slot is newer than the entry's
last one (monotonic claims), so no slot is ever granted twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .config import Config
from .errors import LeaseLostError, NotReplicatedError
from .keys import Keys
from .scripts import Scripts, status, text

#: states of an entry's last slot, as stored in the slots hash
CLAIMED, SENT, SKIPPED, ANCHOR, UNSENT = "c", "s", "k", "a", "u"
STATE_NAMES = {CLAIMED: "claimed", SENT: "sent", SKIPPED: "skipped", ANCHOR: "anchor",
               UNSENT: "unsent (reported)"}

#: what a claim asks for, per item
CLAIM, SKIP = CLAIMED, SKIPPED

#: history entries written per call at most (claims of thousands of slots are chunked)
_CHUNK = 2000


@dataclass(frozen=True)
class SlotState:
    """An entry's last slot as recorded in Redis."""

    slot_ms: int
    epoch: int
    state: str

    @classmethod
    def parse(cls, raw: Any) -> SlotState:
        slot, epoch, state = text(raw).split("|")
        return cls(int(slot), int(epoch), state)


@dataclass(frozen=True)
class ClaimItem:
    name: str
    slot_ms: int
    op: str  # CLAIM, SKIP or ANCHOR


@dataclass(frozen=True)
class Event:
    """A history event about one slot (``sent``, ``unsent``, ``missed``, ``skipped`` ...)."""

    name: str
    slot_ms: int
    event: str
    detail: str = ""


class Ledger:
    """Reads and writes the shared schedule state under one key prefix."""

    def __init__(self, client: Any, scripts: Scripts, keys: Keys, config: Config) -> None:
        self.client = client
        self.scripts = scripts
        self.keys = keys
        self.config = config

    def claim(self, token: str, epoch: int, items: Sequence[ClaimItem]) -> list[SlotState | None]:
        """Claim slots in order; ``None`` per granted item, else the state that refused it.

        Raises LeaseLostError (and grants nothing) when ``token`` no longer leads.
        """
        results: list[SlotState | None] = []
        ttl_ms = int(self.config.lease_ttl * 1000)
        for start in range(0, len(items), _CHUNK):
            args: list[Any] = [token, ttl_ms, epoch]
            for item in items[start:start + _CHUNK]:
                args += [item.name, item.slot_ms, item.op]
            reply = self.scripts.claim(keys=[self.keys.leader, self.keys.slots], args=args)
            if status(reply, "claim") == 0:
                holder = text(reply[1]) if len(reply) > 1 and reply[1] else "nobody"
                raise LeaseLostError(f"claim refused: lease {token} lost; held by {holder}")
            results += [None if r == 1 else SlotState.parse(r) for r in reply[1:]]
            if self.config.min_replicas:
                self._wait_for_replicas()
        return results

    def _wait_for_replicas(self) -> None:
        """Block until ``min_replicas`` replicas have the claims, or raise NotReplicatedError."""
        timeout_ms = int(self.config.renew_interval * 500)
        acked = int(self.client.execute_command("WAIT", self.config.min_replicas, timeout_ms))
        if acked < self.config.min_replicas:
            raise NotReplicatedError(
                f"claims reached {acked} replica(s) within {timeout_ms} ms; "
                f"leaderbeat_min_replicas={self.config.min_replicas}")

    def record(self, epoch: int, events: Iterable[Event]) -> int:
        """Write events to the history; ``sent`` events also mark their slot sent."""
        events = list(events)
        marked = 0
        for start in range(0, len(events), _CHUNK):
            args: list[Any] = [self.config.history_length, self.config.node_id, epoch]
            for ev in events[start:start + _CHUNK]:
                args += [ev.name, ev.slot_ms, ev.event, ev.detail]
            marked += int(self.scripts.record(keys=[self.keys.slots, self.keys.history], args=args))
        return marked

    def load(self) -> dict[str, SlotState]:
        """Every entry's last slot."""
        return {text(k): SlotState.parse(v) for k, v in self.client.hgetall(self.keys.slots).items()}

    def history(self, count: int = 50) -> list[dict[str, str]]:
        """The newest ``count`` history events, oldest first."""
        rows = self.client.xrevrange(self.keys.history, count=count)
        out = []
        for event_id, fields in reversed(rows):
            row = {text(k): text(v) for k, v in fields.items()}
            row["id"] = text(event_id)
            out.append(row)
        return out

    def register_node(self, role: str, info: dict[str, Any]) -> None:
        """Publish this node's role and details in the node registry."""
        record = dict(info, role=role, last_seen=time.time())
        self.client.hset(self.keys.nodes, self.config.node_id, json.dumps(record))

    def unregister_node(self) -> None:
        self.client.hdel(self.keys.nodes, self.config.node_id)

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {text(k): json.loads(text(v)) for k, v in self.client.hgetall(self.keys.nodes).items()}

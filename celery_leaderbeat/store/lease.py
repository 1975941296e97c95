"""The leader lease in Redis: one key holding ``<node_id>|<epoch>`` with a PX ttl.

Acquire, renew and release are Lua calls (``acquire.lua``, ``renew.lua``,
``release.lua``); renew and release are compare-and-set on the exact token, so only
the holder can extend or delete it. What the answers mean for a node (its deadline,
self-fencing, the heartbeat) is the roles' side: :mod:`celery_leaderbeat.roles.lease`.
"""

from __future__ import annotations

from typing import Any

from ..config import Config
from .keys import Keys
from .records import Acquired, Renewed
from .scripts import Scripts, status, text


class Lease:
    """The lease in Redis: ``acquire.lua``, ``renew.lua``, ``release.lua`` on one client."""

    def __init__(self, client: Any, scripts: Scripts, keys: Keys, config: Config) -> None:
        self.client = client
        self.scripts = scripts
        self.keys = keys
        self.config = config
        self.ttl_ms = int(config.lease_ttl * 1000)

    def acquire(self, seen_epoch: int, seen_generation: int = 0, *,
                despite_loss: bool = False) -> Acquired:
        reply = self.scripts.acquire(
            keys=[self.keys.leader, self.keys.epoch, self.keys.history, self.keys.generation],
            args=[self.config.node_id, self.ttl_ms, self.config.history_length,
                  seen_epoch, seen_generation, "1" if despite_loss else "0"])
        acquired = status(reply, "acquire") == 1
        now = int(reply[-2]) + int(reply[-1]) / 1e6
        if acquired:
            return Acquired(True, int(reply[1]), None, 0, int(reply[-3]), now)
        return Acquired(False, None, text(reply[1]) if reply[1] else None, int(reply[2]),
                        int(reply[-3]), now)

    def renew(self, token: str) -> Renewed:
        reply = self.scripts.renew(keys=[self.keys.leader], args=[token, self.ttl_ms])
        if status(reply, "renew") == 1:
            return Renewed(True, None, int(reply[1]) + int(reply[2]) / 1e6)
        return Renewed(False, text(reply[1]) if len(reply) > 1 and reply[1] else None, None)

    def release(self, token: str, reason: str) -> bool:
        return bool(self.scripts.release(
            keys=[self.keys.leader, self.keys.history],
            args=[token, self.config.history_length, self.keys.events, reason]))

    def holder(self) -> tuple[str | None, int]:
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.leader)
        pipe.pttl(self.keys.leader)
        token, pttl = pipe.execute()
        return (text(token) if token else None), int(pttl)

    def now(self) -> float:
        seconds, micros = self.client.time()
        return int(seconds) + int(micros) / 1e6

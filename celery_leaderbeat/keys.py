"""Every Redis key and channel name celery_leaderbeat uses, built in one place.

All keys share one hash tag, ``{<prefix>}``, so on Redis Cluster they live in
one slot and every Lua script can touch all of them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """The key names under one prefix (``leaderbeat_key_prefix``)."""

    prefix: str

    @property
    def tag(self) -> str:
        return "{" + self.prefix + "}"

    def _key(self, name: str) -> str:
        return f"{self.tag}:{name}"

    @property
    def leader(self) -> str:
        """String, PX ttl: ``<node_id>|<epoch>`` of the current leader."""
        return self._key("leader")

    @property
    def epoch(self) -> str:
        """Counter: the fencing epoch, INCR on every acquisition."""
        return self._key("epoch")

    @property
    def slots(self) -> str:
        """Hash: entry name -> ``<slot_ms>|<epoch>|<state>`` of its last slot."""
        return self._key("slots")

    @property
    def nodes(self) -> str:
        """Hash: node id -> JSON (host, pid, version, role, last seen)."""
        return self._key("nodes")

    @property
    def history(self) -> str:
        """Stream, capped: elected / lost / released / sent / skipped / missed / unsent."""
        return self._key("history")

    @property
    def events(self) -> str:
        """Pub/sub channel: ``released`` and ``step-down`` messages."""
        return self._key("events")

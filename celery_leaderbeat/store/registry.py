"""This process's record in the node registry, and the check that its node id is its own."""

from __future__ import annotations

import os
import socket
import time
import uuid
from typing import Any

from .._version import __version__
from ..errors import ConfigurationError
from .base import SlotStore


class Registration:
    """Writes this node's record about once per renew interval (``nodes``, ``health --node``).

    Each process writes a random ``instance`` with its record. A record of this node
    id rewritten by another instance since this one's last write means a second
    running beat uses the same ``leaderbeat_node_id``: the two would take each
    other's lease in turn, so it is a configuration error. A restarted beat is not
    taken for one: its dead predecessor writes no more. Nor is a record older than
    this instance's previous write: Redis went back to an older snapshot, which held
    the record of a predecessor.
    """

    def __init__(self) -> None:
        self.instance = uuid.uuid4().hex[:12]
        self._at = 0.0
        self._once = False
        self._written = 0.0  # wall time (s) of this instance's previous write

    def due(self, every: float) -> bool:
        return time.monotonic() - self._at >= every

    def write(self, ledger: SlotStore, node_id: str, role: str, epoch: int | None, *,
              clock_skew: float | None, following_since: float | None = None,
              send_path: str | None = None) -> None:
        """``following_since``: since when (epoch seconds) this node has followed the
        schedule without a break; a new leader treats slots due after the earliest such
        moment of any live node as on time (a standby could have rescued them).
        ``send_path``: how this node sends a chunk (``one_step``, ``single_write``, or ``plain: why``),
        None before its first chunk; shown by ``nodes`` and ``status``."""
        self._at = time.monotonic()
        previous, self._written = self._written, time.time()
        replaced = ledger.register_node(role, {
            "host": socket.gethostname(), "pid": os.getpid(), "version": __version__,
            "instance": self.instance, "epoch": epoch, "clock_skew": clock_skew,
            "following_since": following_since, "send_path": send_path})
        other = replaced.get("instance") if replaced else None
        rolled_back = replaced is not None and float(replaced.get("last_seen") or 0) < previous
        if replaced and self._once and other not in (None, self.instance) and not rolled_back:
            raise ConfigurationError(
                f"leaderbeat_node_id={node_id!r} is used by another running "
                f"beat too (host {replaced.get('host')}, pid {replaced.get('pid')}); every "
                "beat process needs its own node id: leave leaderbeat_node_id unset for a "
                "unique one")
        self._once = True

    def forget(self, ledger: SlotStore) -> None:
        ledger.unregister_node()


def earliest_follower(nodes: dict[str, dict[str, Any]], *, now: float, fresh: float) -> float | None:
    """The earliest ``following_since`` of a node seen within ``fresh`` seconds, if any."""
    times = [float(info["following_since"]) for info in nodes.values()
             if info.get("following_since") is not None
             and now - float(info.get("last_seen") or 0) <= fresh]
    return min(times) if times else None

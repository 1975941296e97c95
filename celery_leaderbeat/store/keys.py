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
    def overtaken(self) -> str:
        """Hash: ``<entry>|<slot_ms>`` -> a claimed, unconfirmed slot a newer claim replaced."""
        return self._key("overtaken")

    @property
    def definitions(self) -> str:
        """Hash: entry name -> fingerprint of the definition the leader plans (rescues check it)."""
        return self._key("definitions")

    @property
    def generation(self) -> str:
        """Counter: raised by every claim call; Redis going back to older state shows as a
        lower value than a node has seen."""
        return self._key("generation")

    @property
    def lost(self) -> str:
        """Hash, PX ttl: ``<entry>|<node>`` -> the newest slot of the entry that node knew
        settled before it saw Redis lose writes (the leader that anchors the entry afresh
        records the slots its margin skips from there)."""
        return self._key("lost")

    @property
    def progress(self) -> str:
        """String, PX ttl: Redis TIME (ms) of the leader's latest claim (rescues wait on it)."""
        return self._key("progress")

    @property
    def paused(self) -> str:
        """Hash: entry name -> JSON (note, when, who) of an entry paused from the CLI."""
        return self._key("paused")

    @property
    def requests(self) -> str:
        """List: JSON requests for the leader (trigger, backfill) from the CLI."""
        return self._key("requests")

    @property
    def backfilled(self) -> str:
        """Hash: ``<entry>|<slot_ms>`` -> the backfill request that sent it (never twice)."""
        return self._key("backfilled")

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
        """Pub/sub channel: ``released``, ``entries``, ``request`` (see :mod:`.events`)."""
        return self._key("events")

    @property
    def entries(self) -> str:
        """Hash: entry name -> a dynamic entry's header line and JSON definition."""
        return self._key("entries")

    @property
    def entries_meta(self) -> str:
        """Hash: ``version`` (bumped by every entry change), ``floor`` (older changes forgotten)."""
        return self._key("entries:meta")

    @property
    def entries_changed(self) -> str:
        """Sorted set: dynamic entry name -> the version of its last change."""
        return self._key("entries:changed")

    @property
    def entries_removed(self) -> str:
        """Sorted set, capped: removed dynamic entry name -> the version of its removal."""
        return self._key("entries:removed")

    def run(self, run_id: str) -> str:
        """String, PX ``guard_expires``: ``<state>|<token>|<worker>`` of a guarded run
        (``run_id``: the slot's task id, ``~<k>`` added for its k-th retry)."""
        return self._key(f"run:{run_id}")

    def alive(self, run_id: str) -> str:
        """String, PX lease: ``<token>|<worker>`` while a guarded run runs, renewed by its worker."""
        return self._key(f"alive:{run_id}")

    @property
    def guard_fence(self) -> str:
        """Counter: the last run token the worker guard handed out (fences a slot's runs)."""
        return self._key("guard:fence")

    def overlap(self, entry: str) -> str:
        """String, PX lease: the task id of the entry's run still running, or of the waiting
        slot published to run next (every overlap policy but ``allow_all``)."""
        return self._key(f"overlap:{entry}")

    def overlap_held(self, entry: str) -> str:
        """String, PX lease: ``<slot ms>|<worker>`` of the run holding :meth:`overlap`."""
        return self._key(f"overlap-held:{entry}")

    def waiting(self, entry: str) -> str:
        """Sorted set, PX ``guard_expires``: the task ids of the entry's slots waiting for
        its run to end (``buffer_one``, ``buffer_all``, ``cancel_other``), by slot ms."""
        return self._key(f"waiting:{entry}")

    def waiting_messages(self, entry: str) -> str:
        """Hash, PX ``guard_expires``: waiting task id -> the message that starts it (JSON)."""
        return self._key(f"waiting-msg:{entry}")

    @property
    def waiting_entries(self) -> str:
        """Set: the entries with slots waiting (each worker's sweep looks at these)."""
        return self._key("overlap-waiting")

    @property
    def overlap_decisions(self) -> str:
        """Hash: ``<entry>|<policy>|<decision>`` -> how many times the guard decided it."""
        return self._key("overlap-decisions")

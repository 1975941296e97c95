"""The Celery beat Scheduler: standbys try to lead; the leader claims, then sends.

Celery's own ``tick()`` sends one entry per call and compares every entry on
every call; ours takes every due entry in one pass, claims them all in one
Redis call, publishes the granted ones and marks them sent in one more. The
schedule definition is re-read only when it changes, not on every tick.

Lifecycle traps this class respects (see CELERY_NOTES.md): it is built twice
(once ``lazy`` for the banner: no network I/O then); ``beat_init`` swallows
exceptions (so nothing happens there); ``close()`` runs twice on SIGTERM; under
``worker -B`` beat runs in a forked child (clients are made per process).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import datetime, timezone
from typing import Any

import redis
from celery import beat

from . import __version__
from .agenda import Agenda, Tracked, Unsent, adopt_refused_anchors, load
from .batch import claim_and_send, report_unsent
from .config import Config
from .connection import describe, make_client, server_warnings
from .degraded import Outage
from .entries import EntryOptions, default_options, split_entries
from .errors import ConfigurationError, LeaseLostError, RedisAuthError
from .keys import Keys
from .lease import Lease
from .ledger import Ledger
from .publish import publish
from .scripts import Scripts
from .slots import Plan, clock_for, from_ms, to_ms

logger = logging.getLogger(__name__)

STANDBY, LEADER = "standby", "leader"

#: seconds by which the wall clock must move against the monotonic one to count as a
#: step (NTP slews smaller offsets; GC pauses and SIGSTOP move both clocks alike)
CLOCK_STEP = 2.0

#: cap, in seconds, of how far past "now" an entry with no stored state starts
UNKNOWN_STATE_MARGIN = 5.0


class Scheduler(beat.Scheduler):
    """Highly available beat scheduler: run it on any number of nodes."""

    def __init__(self, app: Any, *args: Any, lazy: bool = False, **kwargs: Any) -> None:
        self.lb_config = Config.from_app(app)
        self.keys = Keys(self.lb_config.key_prefix)
        self.role = STANDBY
        self._entry_options: dict[str, EntryOptions] = {}
        self._schedule_version = 0
        self._tracked_version = -1
        self._agenda = Agenda()
        self._pid: int | None = None
        self._client: Any = None
        self._pubsub: Any = None
        self._since = _utcnow()
        self._last_tick = time.monotonic()
        self._last_wall = (time.time(), time.monotonic())
        self._redis_failures = 0
        self._skew_refused = False
        self._closed = False
        self._registered_at = 0.0
        self._server_checked = False
        self._redis_back_at = 0.0
        self._capped: set[str] = set()  # entries whose catch-up hit max_catchup (logged)
        self._outage: Outage | None = None  # set while leading through a Redis outage
        self._unsent: list[Unsent] = []
        super().__init__(app, *args, lazy=lazy, **kwargs)

    # -- the schedule definition ------------------------------------------------

    def setup_schedule(self) -> None:
        """Read ``beat_schedule``; harmless on standbys (no I/O, nothing sent).

        Every entry's slot clock is built once here, so a schedule the leader could
        not follow stops start-up with the others, not a later election.
        """
        entries, options = split_entries(self.app.conf.beat_schedule or {}, self.lb_config)
        self._entry_options = options
        self.install_default_entries(self.data)
        self.merge_inplace(entries)
        problems = []
        for name, entry in self.schedule.items():
            opts = options.get(name) or default_options(self.lb_config)
            try:
                clock_for(entry.schedule, name=name, tz=opts.tz or self.app.timezone,
                          jitter=opts.jitter)
            except ConfigurationError as exc:
                problems += exc.problems
        if problems:
            raise ConfigurationError(problems)

    def merge_inplace(self, b: Any) -> None:
        super().merge_inplace(b)
        self._schedule_version += 1

    def update_from_dict(self, dict_: Any) -> None:
        super().update_from_dict(dict_)
        self._schedule_version += 1

    def add(self, **kwargs: Any) -> Any:
        entry = super().add(**kwargs)
        self._schedule_version += 1
        return entry

    @property
    def info(self) -> str:
        c = self.lb_config
        # The banner comes from a lazy instance whose generated node id is not the
        # running one's; the "elected" log line names the real id.
        node = c.node_id if self.app.conf.get("leaderbeat_node_id") else c.node_id.rsplit(":", 1)[0]
        return (f"    . leaderbeat -> {describe(c.redis_url)} prefix={c.key_prefix} "
                f"node={node} ttl={c.lease_ttl}s catchup={c.catchup} "
                f"redis_down_policy={c.redis_down_policy}")

    # -- Redis, per process ---------------------------------------------------------

    def _connect(self) -> None:
        """Make the Redis client in this process (after a ``worker -B`` fork too)."""
        if self._pid == os.getpid() and self._client is not None:
            return
        self._pid = os.getpid()
        self._client = make_client(self.lb_config.redis_url, self.lb_config.redis_options,
                                   self.lb_config.renew_interval)
        scripts = Scripts(self._client)
        self.lease = Lease(self._client, scripts, self.keys, self.lb_config)
        self.ledger = Ledger(self._client, scripts, self.keys, self.lb_config)
        self._pubsub = None

    # -- the tick --------------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass: a standby tries to lead; the leader sends every due slot."""
        self._last_tick = time.monotonic()
        try:
            self._connect()
            self._watch_wall_clock()
            if self._outage is not None:
                return self._lead_degraded(self._outage)
            delay = self._lead() if self.role == LEADER else self._stand_by()
            self._heartbeat_registry()
        except LeaseLostError as exc:
            self._step_down(f"{exc}")
            return 0.0
        except redis.AuthenticationError as exc:
            raise RedisAuthError(
                f"Redis at {describe(self.lb_config.redis_url)} refused the credentials "
                f"({exc}); check the password/username in leaderbeat_redis_url or "
                "leaderbeat_redis_options") from exc
        except redis.exceptions.NoPermissionError as exc:
            raise RedisAuthError(
                f"the Redis user of {describe(self.lb_config.redis_url)} lacks a permission "
                f"leaderbeat needs ({exc}); it needs the keys and channels '{{{self.keys.prefix}}}:*' "
                "and the script, string, hash, stream, pub/sub, TIME and PING commands") from exc
        except (redis.RedisError, OSError) as exc:
            return self._redis_trouble(exc)
        if self._redis_failures:
            logger.info("leaderbeat: Redis at %s answers again",
                        describe(self.lb_config.redis_url))
            self._redis_failures = 0
            self._redis_back_at = time.monotonic()
        return delay

    def _redis_trouble(self, exc: Exception) -> float:
        if not self._redis_failures:
            logger.warning("leaderbeat: Redis at %s unreachable (%s); %s, retrying with backoff",
                           describe(self.lb_config.redis_url), exc,
                           "leader stops sending until its lease is confirmed"
                           if self.role == LEADER else "standing by")
        self._redis_failures += 1
        self._pubsub = None
        if (self.role == LEADER and self.lb_config.redis_down_policy == "last-leader"
                and self._outage is None and not self.lease.lost):
            self._outage = Outage.begin(self.lb_config)
        elif self.role == LEADER and self._outage is None and not self.lease.is_held():
            self._step_down("lease could not be confirmed while Redis was unreachable",
                            release=False)
        return min(0.25 * 2 ** min(self._redis_failures - 1, 6),
                   max(2.0, self.lb_config.standby_poll))

    def _watch_wall_clock(self) -> None:
        """A forward wall-clock step makes the slots it jumped over 'missed' (catch-up policy)."""
        wall, mono = time.time(), time.monotonic()
        last_wall, last_mono = self._last_wall
        self._last_wall = (wall, mono)
        jump = (wall - last_wall) - (mono - last_mono)
        if abs(jump) > CLOCK_STEP:
            logger.warning("leaderbeat: the wall clock stepped %+.1f s; slots it skipped follow "
                           "the catch-up policy, claimed slots are never re-sent", jump)
            if jump > 0:
                self._since = _utcnow()

    # -- standby ---------------------------------------------------------------------

    def _stand_by(self) -> float:
        if not self._server_checked:
            for warning in server_warnings(self._client):
                logger.warning("leaderbeat: %s", warning)
            self._server_checked = True
        skew = self.lease.measure_skew()
        if abs(skew) > self.lb_config.max_clock_skew:
            if not self._skew_refused:
                logger.warning("leaderbeat: this node's clock is %+.3f s off Redis TIME, beyond "
                               "leaderbeat_max_clock_skew=%s; refusing to lead",
                               skew, self.lb_config.max_clock_skew)
            self._skew_refused = True
            return self.lb_config.standby_poll
        if self._skew_refused:
            logger.info("leaderbeat: clock skew %+.3f s is within limits again", skew)
            self._skew_refused = False
        if (self.lb_config.redis_down_policy == "last-leader" and self._redis_back_at
                and time.monotonic() - self._redis_back_at < self.lb_config.lease_ttl):
            # after an outage the previous leader goes first: it reconciles what it sent
            self._wait_for_release(self.lb_config.standby_poll)
            return 0.0
        if self.lease.try_acquire():
            self._become_leader()
            return 0.0
        self._wait_for_release(self.lb_config.standby_poll)
        return 0.0

    def _wait_for_release(self, timeout: float) -> None:
        """Sleep up to ``timeout``, waking at once when the leader publishes 'released'."""
        if self._pubsub is None:
            self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            self._pubsub.subscribe(self.keys.events)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            message = self._pubsub.get_message(timeout=left)
            if message and message.get("data") in (b"released", "released"):
                return

    def _become_leader(self) -> None:
        self.role = LEADER
        self._since = _utcnow()
        self._tracked_version = -1  # drop whatever this node knew: reload from Redis
        self.lease.start_heartbeat(lambda: self._last_tick)
        logger.info("leaderbeat: %s elected leader (epoch %s)",
                    self.lb_config.node_id, self.lease.epoch)
        self._register(LEADER)
        self._reload(report_unsent=True)

    def _step_down(self, why: str, release: bool = False) -> None:
        if self.role == LEADER:
            logger.warning("leaderbeat: %s steps down: %s", self.lb_config.node_id, why)
        self.role = STANDBY
        self.lease.stop_heartbeat()
        if release:
            self.lease.release("step-down")
        self.lease.mark_lost()
        self.lease.token = None
        self._agenda = Agenda()

    def _heartbeat_registry(self) -> None:
        """Refresh this node's entry in the node registry about once per renew interval."""
        if time.monotonic() - self._registered_at >= self.lb_config.renew_interval:
            self._register(self.role)

    def _register(self, role: str) -> None:
        self._registered_at = time.monotonic()
        self.ledger.register_node(role, {"host": socket.gethostname(), "pid": os.getpid(),
                                         "version": __version__,
                                         "epoch": self.lease.epoch if role == LEADER else None,
                                         "clock_skew": self.lease.clock_skew})

    # -- leader ----------------------------------------------------------------------

    @property
    def _tracked(self) -> dict[str, Tracked]:
        """The entries the leader tracks, by name (empty on a standby)."""
        return self._agenda.tracked

    def _reload(self, report_unsent: bool = False) -> None:
        """Rebuild what the leader tracks from the schedule and the state in Redis."""
        # An entry without stored state (new, or Redis lost its data) starts after
        # now + max_clock_skew (5 s at most): a slot an earlier leader sent just before
        # the data was lost cannot come round again on a node whose clock is behind.
        margin = min(self.lb_config.max_clock_skew, UNKNOWN_STATE_MARGIN)
        start = from_ms(to_ms(_utcnow()) + int(margin * 1000))
        loaded = load(self.schedule, self.ledger.load(), start=start,
                      tz=self.app.timezone, options=self._entry_options,
                      default=default_options(self.lb_config), epoch=self.lease.epoch)
        if report_unsent:
            self._unsent += loaded.unsent
        if loaded.anchors:
            adopt_refused_anchors(
                loaded, self.ledger.claim(*self.lease.credentials(), loaded.anchors))
            # One line per reload, not per entry: after a Redis restart that lost its data
            # this is the only trace. Unknown state is "start from now", never "never ran".
            logger.info("leaderbeat: %d of %d entries had no slot state in Redis (new entries, "
                        "or Redis lost its data); they start from now, without catch-up: %s",
                        len(loaded.anchors), len(loaded.tracked),
                        ", ".join(item.name for item in loaded.anchors[:10]))
        self._agenda = Agenda(loaded.tracked)
        self._tracked_version = self._schedule_version
        if self._unsent:
            self._report_unsent()

    def _report_unsent(self) -> None:
        unsent, self._unsent = self._unsent, []
        report_unsent(unsent, lease=self.lease, ledger=self.ledger, send=self._send_slot,
                      recover=self.lb_config.recover_unsent)

    def _lead(self) -> float:
        if not self.lease.is_held():
            if self.lb_config.redis_down_policy == "last-leader" and not self.lease.lost:
                self._client.ping()  # unreachable: the last leader goes on (degraded mode)
            self._step_down("lease not confirmed in time (self-fencing)")
            return 0.0
        stopped = self.lease.heartbeat_stopped()
        if stopped is not None:  # nothing renews the lease any more: let it go now
            self._step_down(f"the heartbeat thread stopped ({stopped})", release=True)
            return 0.0
        skew = self.lease.clock_skew
        if skew is not None and abs(skew) > self.lb_config.max_clock_skew:
            self._step_down(f"clock is {skew:+.3f} s off Redis TIME, beyond "
                            f"leaderbeat_max_clock_skew={self.lb_config.max_clock_skew}",
                            release=True)
            return 0.0
        if self._tracked_version != self._schedule_version:
            self._reload()
        now = _utcnow()
        now_ts = now.timestamp()
        earliest = self._agenda.earliest()
        if earliest is None:
            earliest = now_ts
        due = self._agenda.pop_due(now, self._since)
        if due:
            started = time.monotonic()
            try:
                sent = self._claim_and_send(due)
            finally:
                for tracked, _ in due:
                    self._agenda.push(tracked)
            if sent:
                logger.info("leaderbeat: sent %d slot(s) of %d due entries in %.0f ms, "
                            "%.0f ms after the earliest was due", sent, len(due),
                            (time.monotonic() - started) * 1000, (now_ts - earliest) * 1000)
        return self._delay()

    def _delay(self) -> float:
        return self._agenda.delay(time.time(), float(self.max_interval))

    def _lead_degraded(self, outage: Outage) -> float:
        """Redis is unreachable: send from the agenda alone; reconcile once Redis answers."""
        outage.send_due(self._agenda, _utcnow(), self._since, self._send_slot)
        try:
            self._client.ping()
        except (redis.RedisError, OSError):
            if outage.expired():
                self._outage = None
                self._step_down("Redis unreachable for longer than "
                                f"leaderbeat_degraded_max_seconds={self.lb_config.degraded_max_seconds}")
            return min(self._delay(), 1.0)
        reconciled = outage.reconcile(self.lease, self.ledger, lambda: self._last_tick)
        self._outage = None  # only now: a Redis error above leaves the outage in place
        self._redis_failures = 0
        if not reconciled:
            self._step_down("another node leads after the Redis outage")
        return 0.0

    def _claim_and_send(self, due: list[tuple[Tracked, Plan]]) -> int:
        return claim_and_send(due, lease=self.lease, ledger=self.ledger,
                              send=self._send_slot, capped=self._capped)

    def _send_slot(self, name: str, slot: datetime) -> bool:
        """Publish ``slot`` of the entry named ``name``, if it is still scheduled."""
        entry = self.schedule.get(name)
        return entry is not None and self._send(entry, slot)

    def _send(self, entry: Any, slot: datetime) -> bool:
        """Publish one slot; a failure is logged and reported, never swallowed."""
        try:
            publish(self, entry, slot, self.lease.epoch)
        except Exception:  # any publish failure: logged with its traceback, recorded unsent
            logger.exception("leaderbeat: could not send %s for slot %s",
                             entry.name, slot.isoformat())
            return False
        entry.last_run_at = slot
        entry.total_run_count += 1
        return True

    # -- shutdown ----------------------------------------------------------------------

    def sync(self) -> None:
        """Nothing to persist: the shared state already lives in Redis."""

    def close(self) -> None:
        """Release the lease (standbys take over at once) and close; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._client is not None and self._pid == os.getpid():
                self.lease.stop_heartbeat()
                if self.role == LEADER and self.lease.release("released"):
                    logger.info("leaderbeat: %s released the lease", self.lb_config.node_id)
                self.role = STANDBY
                self.ledger.unregister_node()
        except (redis.RedisError, OSError) as exc:
            logger.warning("leaderbeat: could not release the lease on close (%s); "
                           "standbys take over when it expires", exc)
        finally:
            # Dropped, not closed: on SIGTERM close() runs inside the signal handler, on
            # top of a standby blocked reading this very socket; closing it there makes
            # redis-py's unwinding fail. Its last reference goes with that frame.
            self._pubsub = None
            super().close()


def _utcnow() -> datetime:
    """Wall-clock now, read through ``time.time`` so a test can shift one process's clock."""
    return datetime.fromtimestamp(time.time(), timezone.utc)

"""The Celery beat Scheduler: the glue between Celery and the two rooms.

Celery calls :meth:`Scheduler.tick` in a loop and sleeps whatever it returns.
A standby (:mod:`standby`) tries to lead once per poll and rescues slots the
leader missed; the leader (:mod:`leader`) sends every due slot in chunks and
then sleeps until the next one, while its heartbeat renews the lease. This
module keeps only what Celery needs: building the schedule, the per-process
Redis client, dispatch, error handling, publishing, shutdown.

Lifecycle traps this class respects (docs/architecture.md, "Living inside Celery's beat"): it is built twice
(once ``lazy`` for the banner: no network I/O then); ``beat_init`` swallows
exceptions (so nothing happens there); ``close()`` runs twice on SIGTERM; under
``worker -B`` beat runs in a forked child (clients are made per process).
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import redis
from celery import beat

from .config import Config
from .entries import EntryOptions, split_entries
from .errors import ConfigurationError, LeaseLostError, NotReplicatedError, RedisAuthError
from .integrations.gate import GateMixin
from .integrations.schedule import CHANGE_LOG
from .ops.telemetry import Telemetry
from .roles.dynamic_schedule import DynamicSchedule
from .roles.enqueue import Enqueuer
from .roles.leader import Leader, Resign
from .roles.node import Node, utcnow
from .roles.publish import publish
from .roles.standby import Standby
from .store.connection import describe, make_client
from .store.entry_store import EntryStore
from .store.keys import Keys
from .store.lease import Lease
from .store.ledger import Event, Ledger
from .store.registry import Registration, earliest_follower
from .store.scripts import Scripts
from .timing.slots import clock_for, to_ms

logger = logging.getLogger(__name__)
#: one INFO line per send, in stock beat's words; a logger of its own so a busy
#: schedule can quiet it alone (``logging.getLogger("celery_leaderbeat.sends")``)
send_logger = logging.getLogger("celery_leaderbeat.sends")

STANDBY, LEADER = "standby", "leader"

#: seconds by which the wall clock must move against the monotonic one to count as a
#: step (NTP slews smaller offsets; GC pauses and SIGSTOP move both clocks alike)
CLOCK_STEP = 2.0


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector waits until the tick is over.

    A burst allocates tens of thousands of objects; the collections they set
    off scan every object of the process (Celery's, the schedule's) and cost
    a 10,000-slot burst about 0.5 of its 3.2 CPU seconds, 0.1 s of it before
    the first claim. A tick is bounded, and the objects it leaves in cycles
    are collected after it, as before.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class Scheduler(beat.Scheduler):
    """Highly available beat scheduler: run it on any number of nodes.

    With ``leaderbeat_base_scheduler`` set, constructing this class gives an
    instance of that scheduler class behind the gate (:mod:`celery_leaderbeat.integrations.gate`).
    """

    #: marks leaderbeat's own class, which no ``leaderbeat_base_scheduler`` may name
    leaderbeat_scheduler = True

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        made = cls
        if cls is Scheduler:
            app = kwargs.get("app", args[0] if args else None)
            base = Config.from_app(app).base_scheduler if app is not None else None
            if base is not None:
                made = gate_class(base)
        return super().__new__(made)

    def __init__(self, app: Any, *args: Any, lazy: bool = False, **kwargs: Any) -> None:
        self.lb_config = Config.from_app(app)
        self.keys = Keys(self.lb_config.key_prefix)
        self._entry_options: dict[str, EntryOptions] = {}
        self._schedule_version = 0
        self._pid: int | None = None
        self._node: Node | None = None
        self._enqueuer: Enqueuer | None = None
        self._leader: Leader | None = None
        self._standby: Standby | None = None
        self._dynamic: DynamicSchedule | None = None
        self._wake_by = time.monotonic()
        self._last_wall = (time.time(), time.monotonic())
        self._redis_failures = 0
        self._led_at_outage = False  # this node led when Redis stopped answering
        self._contact_since = time.time()  # Redis answered without a break since then
        self._labels_version = 0  # the schedule version the metric labels follow
        #: (schedule version, entry names it changed) for changes known name by name
        self._changes: list[tuple[int, frozenset[str]]] = []
        self._closed = False
        self._registration = Registration()
        self._telemetry = Telemetry(self, self.keys.prefix)
        super().__init__(app, *args, lazy=lazy, **kwargs)

    # -- the schedule definition ------------------------------------------------

    def setup_schedule(self) -> None:
        """Read ``beat_schedule``; harmless on standbys (no I/O, nothing sent).

        As in Celery's own schedulers, ``beat_schedule`` is merged first and the
        default entries (``celery.backend_cleanup``) are installed after: the merge
        drops every entry it does not name. Every entry's slot clock is built once
        here, so a schedule the leader could not follow stops start-up with the
        other problems, not a later election.
        """
        entries, options = split_entries(self.app.conf.beat_schedule or {}, self.lb_config)
        self._entry_options = options
        self.merge_inplace(entries)
        self.install_default_entries(self.data)
        problems = []
        for name, entry in self.schedule.items():
            opts = options.get(name) or EntryOptions.defaults(self.lb_config)
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

    def _changed_since(self, version: int) -> frozenset[str] | None:
        """The entry names changed after schedule ``version``, or None when some change
        since then is not known name by name (the whole schedule must be read again)."""
        if version >= self._schedule_version:
            return frozenset()
        known = [names for v, names in self._changes if v > version]
        if len(known) != self._schedule_version - version:
            return None
        return frozenset().union(*known)

    def _slot_entries(self) -> Any:
        """The entries slots are computed from: name -> an object with ``.schedule``."""
        return self.schedule

    @property
    def info(self) -> str:
        c = self.lb_config
        # The banner comes from a lazy instance whose generated node id is not the
        # running one's; the "elected" log line names the real id.
        node = c.node_id if self.app.conf.get("leaderbeat_node_id") else c.node_id.rsplit(":", 1)[0]
        return (f"    . leaderbeat -> {describe(c.redis_url)} prefix={c.key_prefix} "
                f"node={node} ttl={c.lease_ttl}s rescue_after={c.rescue_after}s "
                f"catchup={c.catchup} redis_down_policy={c.redis_down_policy}")

    # -- roles -------------------------------------------------------------------------

    @property
    def role(self) -> str:
        return LEADER if self._leader is not None else STANDBY

    @property
    def leading(self) -> Leader | None:
        """The leader room while this node leads, else None."""
        return self._leader

    @property
    def standing_by(self) -> Standby | None:
        """The standby room (it exists once the process has connected)."""
        return self._standby

    @property
    def lease(self) -> Lease:
        return self._connect().lease

    @property
    def ledger(self) -> Ledger:
        return self._connect().ledger

    def _connect(self) -> Node:
        """This process's Redis client and parts (made again after a ``worker -B`` fork)."""
        if self._pid == os.getpid() and self._node is not None:
            return self._node
        self._pid = os.getpid()
        config = self.lb_config
        client = make_client(config.redis_url, config.redis_options, config.socket_timeout)
        scripts = Scripts(client)
        if self._telemetry.serve(config.metrics_port):
            logger.info("leaderbeat: metrics on http://0.0.0.0:%d/metrics", config.metrics_port)
        lease = Lease(client, scripts, self.keys, config)
        lease.on_renew = lambda seconds: self._telemetry.metrics.renewed(seconds)
        self._node = Node(config=config, keys=self.keys, client=client,
                          lease=lease,
                          ledger=Ledger(client, scripts, self.keys, config),
                          send=self._send_slot, schedule=self._slot_entries,
                          options=lambda: self._entry_options, tz=self.app.timezone,
                          max_interval=lambda: float(self.max_interval),
                          wake_by=lambda: self._wake_by, observe=self._observe,
                          progress=self._progress, changed_since=self._changed_since,
                          # a gated base scheduler sends slot by slot, through its own
                          # entries and bookkeeping (``gate.py``)
                          sender=self._chunk_sender
                          if type(self)._send_slot is Scheduler._send_slot else None)
        self._enqueuer = None  # made again in this process, on the first batch
        self._dynamic = self._follow_dynamic(client)
        if self._dynamic is not None:
            self._node.anchors = lambda: self._dynamic.anchors if self._dynamic else {}
            self._node.exact = lambda: self._dynamic.exact if self._dynamic else ()
        self._leader = None
        self._standby = Standby(self._node)
        return self._node

    def _follow_dynamic(self, client: Any) -> DynamicSchedule | None:
        """Entries defined at run time (not behind a base scheduler: it has its own store)."""
        if self.lb_config.base_scheduler is not None:
            return None
        for name in list(self._dynamic.names if self._dynamic else ()):
            self.schedule.pop(name, None)  # a forked child reads them again
        return DynamicSchedule(EntryStore(client, self.keys), self.lb_config,
                               entries=self.schedule, options=self._entry_options,
                               make_entry=self._maybe_entry,
                               static=lambda: self.app.conf.beat_schedule or {})

    def _become_leader(self, node: Node, standby: Standby) -> Leader:
        leader = Leader(node, since=self._on_time_since(node, standby.since))
        self._leader = leader
        node.lease.start_heartbeat(lambda: self._wake_by)
        logger.info("leaderbeat: %s elected leader (epoch %s); slots due since %s are on "
                    "time, older ones missed", node.config.node_id, node.lease.epoch,
                    leader.since.isoformat())
        self._telemetry.elected(node.config.node_id, node.lease.epoch)
        self._register(LEADER)
        leader.elected(self._schedule_version)
        return leader

    def _on_time_since(self, node: Node, own: datetime) -> datetime:
        """Slots due since a live standby followed the schedule are on time, not missed:
        it was there to rescue them (the registry says since when each node follows)."""
        try:
            earliest = earliest_follower(node.ledger.nodes(), now=time.time(),
                                         fresh=3 * self.lb_config.renew_interval)
        except (redis.RedisError, OSError, ValueError, TypeError):
            return own
        if earliest is None:
            return own
        return min(own, datetime.fromtimestamp(earliest, timezone.utc))

    def _step_down(self, why: str, release: bool = False) -> None:
        if self._node is None:
            return
        lease = self._node.lease
        if self._leader is not None:
            logger.warning("leaderbeat: %s (epoch %s) steps down: %s", self.lb_config.node_id,
                           lease.epoch, why)
            self._lost(why)
        self._leader = None
        lease.stop_heartbeat()
        if release:
            try:
                lease.release("step-down")
            except (redis.RedisError, OSError) as exc:  # it expires on its own: ttl
                logger.warning("leaderbeat: could not release the lease on step-down (%s); "
                               "standbys take over when it expires", exc)
        lease.mark_lost()
        lease.token = None
        if self._standby is not None:
            self._standby.since = utcnow()

    def _lost(self, why: str) -> None:
        """This process stopped leading: its subscription goes, receivers are told."""
        assert self._node is not None
        if self._leader is not None:
            self._leader.close()
        self._telemetry.lost(self.lb_config.node_id, self._node.lease.epoch, why)

    def _progress(self) -> None:
        """A long batch moved on: the heartbeat gives the loop another ttl."""
        self._wake_by = time.monotonic()

    def _observe(self, events: Sequence[Event]) -> None:
        self._telemetry.slots(events, len(self.schedule),
                              lambda: self._node.lease.epoch if self._node else None)
        if self._labels_version != self._schedule_version:  # a removed entry's series go
            self._labels_version = self._schedule_version
            self._telemetry.metrics.keep_entries(self.schedule)

    # -- the tick --------------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass: a standby tries to lead and rescues; the leader sends every due slot."""
        started = self._wake_by = time.monotonic()  # working: the heartbeat allows one ttl
        with _collector_paused():
            delay = self._tick()
        self._wake_by = time.monotonic() + delay  # asleep as told until then
        self._telemetry.metrics.ticked(self._wake_by - delay - started)
        return delay

    def _tick(self) -> float:
        try:
            node = self._connect()
            if self._dynamic is not None:
                touched = self._dynamic.refresh()
                if touched:  # the roles update only what changed
                    self._schedule_version += 1
                    self._changes.append((self._schedule_version, frozenset(touched)))
                    del self._changes[:-CHANGE_LOG]
            self._watch_wall_clock()
            if self._leader is None:
                assert self._standby is not None
                if self._redis_failures:
                    # Redis answers again: the standby hears so before it tries for the lease
                    # (under last-leader, the previous leader goes first)
                    node.client.ping()
                    self._redis_back()
                if self._standby.tick(self._schedule_version):
                    self._become_leader(node, self._standby)
                delay = 0.0
            else:
                delay = self._leader.tick(self._schedule_version)
            self._refresh_registration()
        except Resign as exc:
            self._step_down(str(exc), release=exc.release)
            return 0.0
        except LeaseLostError as exc:
            self._step_down(str(exc))
            return 0.0
        except NotReplicatedError as exc:
            logger.warning("leaderbeat: %s; nothing unreplicated was sent", exc)
            return self.lb_config.standby_poll
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
        if self._redis_failures and (self._leader is None or self._leader.outage is None):
            self._redis_back()  # (a leader sending through an outage returns without Redis)
        return delay

    def _redis_trouble(self, exc: Exception) -> float:
        if not self._redis_failures:
            self._led_at_outage = self._leader is not None
            logger.warning("leaderbeat: Redis at %s unreachable (%s); %s, retrying with backoff",
                           describe(self.lb_config.redis_url), exc,
                           "leader stops sending until its lease is confirmed"
                           if self._leader is not None else "standing by")
        self._redis_failures += 1
        if self._standby is not None:
            self._standby.lost_connection()
        if self._leader is not None:
            self._leader.close()  # its subscription is made again once Redis answers
        if (self._leader is not None and not self._leader.redis_unreachable(exc)
                and (self._node is None or not self._node.lease.is_held())):
            self._step_down("lease could not be confirmed while Redis was unreachable")
        # capped at one standby poll (1 s): a leader that survived Redis restarting empty
        # is back within about a second of Redis answering, not a backoff step later
        return min(0.25 * 2 ** min(self._redis_failures - 1, 6),
                   max(0.25, self.lb_config.standby_poll))

    def _redis_back(self) -> None:
        logger.info("leaderbeat: Redis at %s answers again", describe(self.lb_config.redis_url))
        self._redis_failures = 0
        self._contact_since = time.time()
        config = self.lb_config
        if self._leader is not None and self._node is not None:
            # Is the lease still there? If Redis lost it while it was valid, this node (the
            # only one that can know nobody sent later slots) steps down now and takes the
            # lease again first, carrying on from what it sent.
            try:
                self._node.lease.renew()
            except LeaseLostError as exc:
                self._step_down(str(exc))
            except (redis.RedisError, OSError):
                pass  # the heartbeat and the next tick find out
        if self._standby is not None and self._leader is None:
            if config.redis_down_policy == "last-leader" and not self._led_at_outage:
                # the previous leader reconciles what it sent meanwhile first
                self._standby.restart(head_start=config.lease_ttl, shift_since=True)
            elif not self._led_at_outage:
                # the node that led goes first: it knows what it sent (Redis may not)
                self._standby.restart(head_start=min(config.lease_ttl,
                                                     2 * config.standby_poll))
            else:
                self._standby.restart()

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
                if self._leader is not None:
                    self._leader.since = utcnow()
                if self._standby is not None:
                    self._standby.restart()

    # -- the node registry ---------------------------------------------------------------

    def _refresh_registration(self) -> None:
        """Refresh this node's entry in the node registry about once per renew interval."""
        if self._registration.due(self.lb_config.renew_interval):
            self._register(self.role)

    def _register(self, role: str) -> None:
        node = self._connect()
        self._telemetry.metrics.clock_skew(node.lease.clock_skew)
        # A node follows the schedule only while Redis answers it: slots due while it could
        # not claim are not on time because of it (they follow the catch-up policy).
        room = self._leader if role == LEADER else self._standby
        since = max(room.since.timestamp(), self._contact_since) if room is not None else None
        self._registration.write(node.ledger, self.lb_config.node_id, role,
                                 node.lease.epoch if role == LEADER else None,
                                 clock_skew=node.lease.clock_skew, following_since=since)

    # -- sending -------------------------------------------------------------------------

    def _chunk_sender(self, epoch: int) -> Any:
        """A batch's sender: claim and enqueue in one step where exact, else kombu batches."""
        if self._enqueuer is None or not self._enqueuer.checked:
            said = self._enqueuer is not None  # an unreachable broker is said once
            self._enqueuer = Enqueuer(self, self._connect().client, quiet=said)
        return self._enqueuer.bind(epoch)

    def _send_slot(self, name: str, slot: datetime, epoch: int,
                   task_id: str | None = None) -> bool:
        """Publish ``slot`` of the entry named ``name``, if it is still scheduled."""
        entry = self.schedule.get(name)
        return entry is not None and self._send(entry, slot, epoch, task_id)

    def _send(self, entry: Any, slot: datetime, epoch: int, task_id: str | None = None) -> bool:
        """Publish one slot; a failure is logged and reported, never swallowed."""
        opts = self._entry_options.get(entry.name)
        overlap = opts.overlap if opts else self.lb_config.overlap
        self._say_sending(entry, slot, epoch, task_id)
        try:
            publish(self, entry, slot, epoch, overlap, task_id)
        except Exception:  # any publish failure: logged with its traceback, recorded unsent
            logger.exception("leaderbeat: could not send %s for slot %s",
                             entry.name, slot.isoformat())
            return False
        self._note_sent(entry, slot)
        return True

    def _say_sending(self, entry: Any, slot: datetime, epoch: int,
                     task_id: str | None = None) -> None:
        """Stock beat's INFO line for a send (a chunk sender says it for each slot too)."""
        if send_logger.isEnabledFor(logging.INFO):
            # epoch 0 is a standby's rescue; a task id of its own, a trigger or backfill
            how = (" (rescue: a standby sends a slot the leader had not claimed)" if epoch == 0
                   else f" (requested, task id {task_id})" if task_id else "")
            send_logger.info("Scheduler: Sending due task %s (%s) for slot %s%s",
                             entry.name, entry.task, slot.isoformat(), how)

    def _note_sent(self, entry: Any, slot: datetime) -> None:
        """What a sent slot changes in the entry (a chunk sender calls it for each slot too)."""
        entry.last_run_at = slot
        entry.total_run_count += 1
        if getattr(entry, "leaderbeat_once", False) and self._dynamic is not None:
            self._dynamic.ran(entry, to_ms(slot))

    # -- shutdown ----------------------------------------------------------------------

    def sync(self) -> None:
        """Nothing to persist: the shared state already lives in Redis."""

    def close(self) -> None:
        """Release the lease (standbys take over at once) and close; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._node is not None and self._pid == os.getpid():
                lease = self._node.lease
                lease.stop_heartbeat()
                if self._leader is not None and lease.release("released"):
                    logger.info("leaderbeat: %s (epoch %s) released the lease",
                                self.lb_config.node_id, lease.epoch)
                    self._lost("released on shutdown")
                self._registration.forget(self._node.ledger)
        except (redis.RedisError, OSError) as exc:
            logger.warning("leaderbeat: could not release the lease on close (%s); "
                           "standbys take over when it expires", exc)
        finally:
            if self._leader is not None:
                self._leader.close()
                self._leader = None
            if self._standby is not None:
                self._standby.close()
            if self._enqueuer is not None:
                self._enqueuer.close()
            super().close()


@functools.cache
def gate_class(base: type) -> type:
    """``LeaderbeatGate<Base>(GateMixin, Scheduler, Base)``, built once per base class."""
    name = f"LeaderbeatGate{base.__name__}"
    return type(name, (GateMixin, Scheduler, base), {"__module__": __name__, "__qualname__": name,
                                                     "gated": base})

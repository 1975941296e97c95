"""Claim and enqueue in one step when the broker is the Redis that holds leaderbeat's state.

Celery builds each message as it always does (``apply_async``: routes,
queues, priorities, ``global_keyprefix``, ``before_task_publish``), and kombu
routes it, but into a collector standing in for kombu's own publish batch
(``Producer.batch()``; the Redis transport hands a batch each message's final
commands through ``batch.add``). Those commands, ``LPUSH`` to the queue's
priority list and ``PEXPIRE`` where a queue expires, travel with the claim,
and the claim script runs them for exactly the slots it grants: a slot is
granted and enqueued, or neither. ``after_task_publish`` fires for each one
granted. A message that goes through an exchange is routed when it is sent
(:mod:`.routing`), as kombu routes each publish.

Where this cannot be exact the chunk goes out through kombu's batching after
the claim instead (said once at start-up, and :func:`one_step_fallback` says
why): a broker on another server or database, Redis Cluster or Sentinel, a
transport option this module does not know, a kombu outside
:data:`KOMBU_RANGE`, ``leaderbeat_min_replicas``, or
``leaderbeat_atomic_enqueue = False``. A chunk sent while a
``before_task_publish`` receiver is connected is claimed first and built after,
so the signal fires only for slots granted. A single message whose routing
gives other commands (fanout: ``PUBLISH``) is published after its claim was
granted, with the very commands kombu computed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import kombu
from celery import signals

from ..store.types import SlotStatus
from ..timing.slots import to_ms
from .messages import Captured, Messages
from .publish import DeclaringOnce, publish, send_many
from .routing import Routes

logger = logging.getLogger(__name__)

#: commands the claim script runs for a message (kombu's Redis transport, 5.7)
EXACT = frozenset({"lpush", "pexpire"})

#: the kombu releases whose Redis transport the one-step path knows (its batch's commands,
#: its routing): >=5.7,<5.8; outside it every chunk is sent after its claim
KOMBU_RANGE = ((5, 7), (5, 8))

#: broker transport options that change nothing in a message's final commands, or
#: that kombu applies while it computes them (priority steps, separator, key prefix)
KNOWN_OPTIONS = frozenset({
    "visibility_timeout", "global_keyprefix", "priority_steps", "sep", "queue_order_strategy",
    "fanout_prefix", "fanout_patterns", "socket_timeout", "socket_connect_timeout",
    "socket_keepalive", "socket_keepalive_options", "max_connections", "health_check_interval",
    "client_name", "polling_interval", "brpop_timeout", "unacked_key", "unacked_index_key",
    "unacked_mutex_key", "unacked_mutex_expire", "unacked_restore_limit", "max_retries",
    "interval_start", "interval_step", "interval_max", "retry_policy", "ssl",
})

#: one broker command: name ('lpush' / 'pexpire'), the final key, its argument
Command = tuple[str, str, Any]


class _Collector:
    """Stands in for kombu's ``PublishBatch``: keeps the commands, runs none."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.commands: list[tuple[str, tuple[Any, ...]]] = []

    def publish(self, message: Any, **kwargs: Any) -> Any:
        return self.channel.basic_publish(message, _publish_batch=self, **kwargs)

    def add(self, name: str, *args: Any) -> None:
        self.commands.append((name, args))

    def flush(self) -> None:
        """Nothing to flush: the claim script runs the commands."""

    def discard(self) -> None:
        self.commands.clear()

    def close(self) -> None:
        """Holds no connection."""


class _CaptureProducer(DeclaringOnce):
    """A producer whose every publish is routed into a :class:`_Collector`, then stopped.

    Raising after routing keeps Celery from firing ``after_task_publish`` and
    from sending a ``task-sent`` event for a message that is not enqueued yet.
    """

    def publish(self, body: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        if not self.supports_batch_publish:  # kombu would publish at once: never here
            raise RuntimeError("the broker channel no longer batches: cannot capture")
        collector = _Collector(self.channel)
        self.channel.create_publish_batch = lambda max_size: collector
        with self.batch():  # type: ignore[no-untyped-call]
            super().publish(body, **kwargs)  # type: ignore[no-untyped-call]
        raise Captured(body, kwargs, collector.commands)


class _CallCapture(DeclaringOnce):
    """A producer that keeps Celery's call to ``publish`` and stops it (any transport)."""

    def publish(self, body: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise Captured(body, kwargs)


def kombu_known() -> bool:
    """Whether the installed kombu is in :data:`KOMBU_RANGE`."""
    low, high = KOMBU_RANGE
    return low <= tuple(kombu.VERSION[:2]) < high


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(v) for v in version)


def one_step_fallback(scheduler: Any) -> str | None:
    """Why ``scheduler``'s chunks do not go out claimed and enqueued in one step, or None
    when they do (for ``status`` and a metric). Before its first send: "not checked yet"."""
    enqueuer = getattr(scheduler, "_enqueuer", None)
    if enqueuer is None:
        return "not checked yet (no chunk sent by this beat)"
    reason: str | None = enqueuer.fallback
    return reason


def routes_redis(conn: Any) -> bool:
    """Whether kombu 5.7's plain Redis transport routes ``conn``'s messages into batches."""
    from kombu.transport import redis as kombu_redis

    if not kombu_known() or type(conn.transport) is not kombu_redis.Transport:
        return False
    channel = conn.default_channel
    return type(channel) is kombu_redis.Channel and bool(channel.supports_batch_publish)


def fast_path_problem(app: Any, client: Any, min_replicas: int) -> str | None:
    """Why claim-and-enqueue cannot be exact with this broker; None when it can."""
    if not kombu_known():
        return (f"kombu {kombu.__version__} (the commands are known for kombu "
                f">={_dotted(KOMBU_RANGE[0])},<{_dotted(KOMBU_RANGE[1])})")
    if min_replicas:
        return "leaderbeat_min_replicas is set (a claim is confirmed after it ran)"
    pool = getattr(client, "connection_pool", None)
    if pool is None or not hasattr(pool, "connection_kwargs"):
        return "leaderbeat's Redis is a Cluster or has no single server"
    unknown = sorted(set(app.conf.broker_transport_options or {}) - KNOWN_OPTIONS)
    if unknown:
        return f"broker transport option(s) {', '.join(unknown)} not understood here"
    from kombu.transport import redis as kombu_redis

    with app.connection_for_write() as conn:
        if type(conn.transport) is not kombu_redis.Transport:  # known without connecting
            return f"the broker transport is {conn.transport_cls!r}, not plain Redis"
        channel = conn.default_channel
        if type(channel) is not kombu_redis.Channel:
            return f"the broker transport is {conn.transport_cls!r}, not plain Redis"
        if not channel.supports_batch_publish:
            return "the broker connection retries commands (retry_on_timeout)"
        broker = channel.client.connection_pool.connection_kwargs
    ours = pool.connection_kwargs
    where = ("host", "port", "path", "db")
    if [broker.get(k) for k in where] != [ours.get(k) for k in where]:
        return "the broker is another Redis server or database than leaderbeat's"
    return None


class Enqueuer:
    """Sends chunks for one scheduler: claim-and-enqueue where exact, else batched.

    Messages are built by :class:`~.messages.Messages`: Celery builds the first
    of each shape, the rest are it with what a slot changes. On kombu's Redis
    transport their final commands go with the claim (fast path) or through
    kombu's own client in one pipeline after it; on other transports through
    ``Producer.publish``, in kombu's batch where it has one.
    """

    def __init__(self, scheduler: Any, client: Any, *, quiet: bool = False) -> None:
        self.scheduler = scheduler
        config = scheduler.lb_config
        #: False while the broker could not be reached to check: checked again next batch
        self.checked = True
        #: kombu's Redis transport, batching: messages are known as their final commands
        self.redis = False
        try:
            problem = ("turned off by leaderbeat_atomic_enqueue=False"
                       if not config.atomic_enqueue else
                       fast_path_problem(scheduler.app, client, config.min_replicas))
            with scheduler.app.connection_for_write() as conn:
                self.redis = routes_redis(conn)
        except Exception as exc:  # noqa: BLE001 - broker down: this batch publishes (and fails) as before
            self.checked = False
            problem = f"the broker could not be reached to check ({exc})"
        self.fast = problem is None
        #: why chunks are not claimed and enqueued in one step (None: they are)
        self.problem = problem
        self._conn: Any = None
        self._producer: Any = None
        self._out: Any = None  # (connection, producer) of the batched path, made when first used
        channel = lambda: self._capturing().channel  # the capture channel, made on first use
        self.routes = Routes(channel)
        self.messages = Messages(scheduler, self.capture, channel, self.routes)
        #: slots whose commands went with the claim in flight: (name, slot, epoch, message);
        #: left here when its reply never came (see :meth:`settle`)
        self.unanswered: list[tuple[str, datetime, int, Captured | None]] = []
        if quiet:
            pass
        elif self.fast:
            logger.info("leaderbeat: claims and enqueues each slot in one step "
                        "(the broker is leaderbeat's Redis)")
        else:
            logger.info("leaderbeat: sends each chunk after its claim, batched by kombu "
                        "where it can (claim and enqueue in one step is off: %s)", problem)

    @property
    def fallback(self) -> str | None:
        """Why chunks go out after their claim instead of in one step, now; None: one step."""
        if self.problem is not None:
            return self.problem
        if signals.before_task_publish.receivers:
            return ("a before_task_publish receiver is connected (it fires only for slots "
                    "granted: each chunk is claimed first)")
        return None

    def bind(self, epoch: int) -> ChunkSender:
        """A batch's sender under ``epoch``; a standby's rescue (epoch 0) claims first.

        A rescue is mostly refused while a healthy leader works ("not late enough"):
        building every message before such a claim cost two standbys as much CPU as
        the leader's own burst, on the same cores. A rescue therefore publishes its
        granted slots after the claim, batched.
        """
        self.settle()
        self.routes.fresh()  # this batch's messages are routed on bindings read from now
        return ChunkSender(self, epoch, fast=self.fast and epoch != 0)

    def settle(self) -> None:
        """Say what a claim whose reply never came enqueued: its slots stored sent under its
        epoch reached the broker (the script ran), so ``after_task_publish`` fires and the
        send lines are said for them, once. Read from the slots each entry holds now (at
        the next batch, or idle-time preparation); when that read fails too, read again
        the next time. A slot a newer claim replaced
        meanwhile cannot be told from the stored state, and gets no signal."""
        if not self.unanswered:
            return
        s = self.scheduler
        try:
            stored = s.ledger.load(sorted({name for name, _, _, _ in self.unanswered}))
        except Exception as exc:  # noqa: BLE001 - kept: read again when the next chunk is sent
            logger.debug("leaderbeat: could not read what an unanswered claim enqueued: %r", exc)
            return
        doubt, self.unanswered = self.unanswered, []
        node = getattr(s, "_node", None)
        went = []
        for name, slot, epoch, captured in doubt:
            state = stored.get(name)
            if (state is not None and state.slot_ms == to_ms(slot) and state.epoch == epoch
                    and state.state == SlotStatus.SENT and state.node is None
                    and not (node is not None and node.sent.covers(name, state.slot_ms))):
                went.append((name, slot, captured))
                if node is not None:
                    node.sent.note(name, state.slot_ms)
        if went:
            ChunkSender(self, 0, fast=False).said_enqueued(went, epoch=doubt[0][2])

    def _capturing(self) -> Any:
        if self._producer is None:
            self._conn = self.scheduler.app.connection_for_write()
            # a broker that is down fails this build at once: kombu's retry loop would hold
            # the beat's main loop (and its heartbeat) for seconds at every message
            self._conn.ensure_connection(max_retries=0)
            cls = _CaptureProducer if self.redis else _CallCapture
            self._producer = cls(self._conn.channel(), auto_declare=False)
        return self._producer

    def capture(self, entry: Any, slot: datetime, epoch: int, overlap: str) -> Captured:
        """Build ``slot``'s message with Celery (and route it with kombu); nothing is sent."""
        try:
            publish(self.scheduler, entry, slot, epoch, overlap, producer=self._capturing())
        except Captured as captured:
            return captured
        except Exception:
            # kombu's retries may have closed the producer's channel (an error such as
            # WRONGTYPE on a queue key is taken for a lost connection): the next message
            # gets a new one, so this failure stays this message's
            self._drop_capturing()
            raise
        raise RuntimeError("kombu published without its batch: claim and enqueue is unsafe")

    def build(self, entry: Any, slot: datetime, epoch: int, overlap: str) -> Captured:
        """``slot``'s message, built from its shape where it can be; nothing is sent."""
        return self.messages.build(entry, slot, epoch, overlap)

    def publish_one(self, entry: Any, slot: datetime, epoch: int, overlap: str,
                    producer: Any) -> None:
        """Publish one slot through ``producer`` (a transport without known commands)."""
        if self.messages.usable():
            self.messages.publish(producer, self.build(entry, slot, epoch, overlap))
        else:  # a receiver may change each message: Celery sends it, signals and all
            publish(self.scheduler, entry, slot, epoch, overlap, producer=producer)

    def final(self, captured: Captured) -> tuple[Command, ...] | None:
        """The commands as Redis runs them (the broker's key prefix applied), or None."""
        if not captured.commands or any(name not in EXACT for name, _ in captured.commands):
            return None
        prefix = self._capturing().channel.global_keyprefix or ""
        return tuple((name, prefix + str(args[0]), args[1]) for name, args in captured.commands)

    def run(self, captured: Sequence[Captured]) -> list[Exception | None]:
        """Run captured commands through kombu's own client (its key prefix applies).

        Returns each message's error, None where all its commands ran: a command
        Redis refuses (WRONGTYPE on a queue key) fails its own message, not the
        others in the pipeline. Raises when the reply never came (which ran is unknown).
        """
        channel = self._capturing().channel
        with channel.conn_or_acquire() as client:
            pipe = client.pipeline(transaction=False)
            for c in captured:
                for name, args in c.commands or ():
                    getattr(pipe, name)(*args)
            replies = iter(pipe.execute(raise_on_error=False))
        out: list[Exception | None] = []
        for c in captured:
            errors = [r for r in [next(replies) for _ in c.commands or ()]
                      if isinstance(r, Exception)]
            out.append(errors[0] if errors else None)
        return out

    def producer(self) -> Any:
        """The batched path's producer: its own connection, each queue declared once."""
        if self._out is None:
            conn = self.scheduler.app.connection_for_write()
            self._out = (conn, DeclaringOnce(conn, auto_declare=False))  # type: ignore[no-untyped-call]
        return self._out[1]

    def _drop_capturing(self) -> None:
        conn, self._conn, self._producer = self._conn, None, None
        if conn is not None:
            try:
                conn.release()
            except Exception as exc:  # noqa: BLE001 - already broken: a new one is made when needed
                logger.debug("leaderbeat: could not release a failed capture connection: %r", exc)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.release()
            self._conn = self._producer = None
        if self._out is not None:
            self._out[0].release()
            self._out = None


class ChunkSender:
    """One batch's sender under one fencing epoch (0: a standby's rescue)."""

    def __init__(self, enqueuer: Enqueuer, epoch: int, *, fast: bool) -> None:
        self.enqueuer = enqueuer
        self.epoch = epoch
        self.fast = fast
        self._held: dict[tuple[str, datetime], Captured] = {}

    def _entry(self, name: str) -> tuple[Any, str] | None:
        s = self.enqueuer.scheduler
        entry = s.schedule.get(name)
        if entry is None:
            return None
        opts = s._entry_options.get(name)
        return entry, (opts.overlap if opts else s.lb_config.overlap)

    def _hold(self, slots: Sequence[tuple[str, datetime]]) -> list[Captured | None]:
        """Build each slot's message and hold it; None for an entry gone or a build that failed."""
        out: list[Captured | None] = []
        build = self.enqueuer.build
        for name, slot in slots:
            found = self._entry(name)
            captured = None
            if found is not None:
                try:
                    captured = build(found[0], slot, self.epoch, found[1])
                except Exception:  # noqa: BLE001 - built again, and its error logged, when sent
                    captured = None
                if captured is not None:
                    self._held[(name, slot)] = captured
            out.append(captured)
        return out

    def prepare(self, slots: Sequence[tuple[str, datetime]]) -> list[tuple[Command, ...] | None]:
        """Each slot's broker commands for the claim script to run, or None (sent after).

        With a ``before_task_publish`` receiver connected nothing is built before the
        claim: the receiver may change each message, so Celery builds it, and the signal
        would fire for slots the claim then refuses. The chunk is claimed first and its
        granted slots built and sent after, batched.
        """
        self._held.clear()
        enqueuer = self.enqueuer
        enqueuer.unanswered = []
        if not self.fast or signals.before_task_publish.receivers:
            return [None] * len(slots)
        final = enqueuer.final
        commands = [final(c) if c is not None else None for c in self._hold(slots)]
        enqueuer.unanswered = [(name, slot, self.epoch, self._held.get((name, slot)))
                               for (name, slot), cmds in zip(slots, commands) if cmds]
        return commands

    def enqueued(self, slots: Sequence[tuple[str, datetime]]) -> None:
        """The claim answered; it granted and enqueued these (in this call, or in an earlier
        attempt whose reply was lost): Celery's after_task_publish, once each."""
        self.enqueuer.unanswered = []
        self.said_enqueued([(name, slot, self._held.pop((name, slot), None))
                            for name, slot in slots], epoch=self.epoch)

    def said_enqueued(self, slots: Sequence[tuple[str, datetime, Captured | None]], *,
                      epoch: int) -> None:
        """Slots the claim script enqueued: what a sent slot changes in its entry, the send
        lines, and ``after_task_publish`` (a message not held is built again for it; not
        when a ``before_task_publish`` receiver would see that build)."""
        s = self.enqueuer.scheduler
        after = bool(signals.after_task_publish.receivers)
        said: list[tuple[Any, datetime]] = []
        for name, slot, captured in slots:
            found = self._entry(name)
            if found is None:
                continue
            said.append((found[0], slot))
            s._note_sent(found[0], slot)
            if after and captured is None and self.enqueuer.messages.usable():
                try:
                    captured = self.enqueuer.build(found[0], slot, epoch, found[1])
                except Exception:  # it was sent: only its signal is missing
                    logger.warning("leaderbeat: %s for slot %s was sent; its message could not "
                                   "be built again for after_task_publish", name,
                                   slot.isoformat(), exc_info=True)
            if captured is not None and after:
                signals.after_task_publish.send(sender=found[0].task, **captured.after)
        s._say_sending_chunk(said, epoch)

    def send_many(self, slots: Sequence[tuple[str, datetime]],
                  may_send: Callable[[], bool] = lambda: True) -> list[bool]:
        """Publish granted slots that the claim did not enqueue; True for each one sent.

        Shorter than ``slots`` when ``may_send`` said no before the rest reached the
        broker (the lease ran out): the answer covers only what was settled.
        """
        said: list[tuple[Any, datetime]] = []  # the chunk's send lines: one record, at the end
        try:
            return self._publish(slots, may_send, said)
        finally:
            self.enqueuer.scheduler._say_sending_chunk(said, self.epoch)

    def _publish(self, slots: Sequence[tuple[str, datetime]], may_send: Callable[[], bool],
                 said: list[tuple[Any, datetime]]) -> list[bool]:
        ok = [False] * len(slots)
        if self.enqueuer.redis:  # their final commands, in one pipeline after the claim
            self._hold([s for s in slots if s not in self._held])
        held = {i: self._held.pop(s) for i, s in enumerate(slots) if s in self._held}
        todo = [(i, found, slots[i][1]) for i in range(len(slots)) if i not in held
                for found in [self._entry(slots[i][0])] if found is not None]
        s = self.enqueuer.scheduler
        results = send_many(s, [(found[0], slot, found[1]) for _, found, slot in todo],
                            self.epoch, producer=self.enqueuer.producer, may_send=may_send,
                            say=lambda entry, slot: said.append((entry, slot)),
                            publish_one=self._publish_one) if todo else []
        for (i, found, slot), sent in zip(todo, results):
            ok[i] = sent
            if sent:
                s._note_sent(found[0], slot)
        if len(results) < len(todo):  # stopped: nothing from the first unsettled one on
            return ok[:todo[len(results)][0]]
        if held and may_send():
            self._run(held, slots, ok)
        elif held:
            return ok[:min(held)]
        after = bool(signals.after_task_publish.receivers)
        for i, captured in held.items():
            again = self._entry(slots[i][0])
            if ok[i] and again is not None:
                said.append((again[0], slots[i][1]))
                s._note_sent(again[0], slots[i][1])
                if after:
                    signals.after_task_publish.send(sender=again[0].task, **captured.after)
        return ok

    def _run(self, held: dict[int, Captured], slots: Sequence[tuple[str, datetime]],
             ok: list[bool]) -> None:
        """Run the held messages' commands in one pipeline; ``ok[i]`` for each one that ran."""
        try:
            errors = self.enqueuer.run(list(held.values()))
        except Exception:  # no reply: none is said sent (recorded unsent, "publish failed")
            logger.exception("leaderbeat: %d routed message(s) could not be sent", len(held))
            return
        for i, error in zip(held, errors):
            ok[i] = error is None
            if error is not None:
                logger.error("leaderbeat: could not send %s for slot %s", slots[i][0],
                             slots[i][1].isoformat(), exc_info=error)

    def _publish_one(self, entry: Any, slot: datetime, overlap: str, producer: Any) -> None:
        self.enqueuer.publish_one(entry, slot, self.epoch, overlap, producer)

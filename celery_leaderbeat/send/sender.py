"""A scheduler's chunk sender: the plain path, with its optimisations where they are exact.

:class:`Enqueuer` is what a scheduler keeps (one per process, checked at its
first chunk); :meth:`Enqueuer.bind` hands a batch a :class:`~.chunk.ChunkSender`, the
:class:`~.base.ChunkSend` of one fencing epoch. The reference is the plain
path (:mod:`.plain`: Celery builds each message, kombu's ``Producer.batch``
or one publish per message sends it). Behind the same interface:

- claim and enqueue in one step on the state's own Redis (:mod:`.one_step`);
- on py-amqp, a chunk's frames in one socket write (:mod:`.single_write`);
- messages built from kept shapes instead of ``apply_async`` (:mod:`.templates`).

Each is checked at start-up against what it was tested with and falls back to
the plain path, said once in the log and by :meth:`Enqueuer.path`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from celery import signals

from ..store.types import SlotStatus
from ..timing.slots import to_ms
from .ahead import Ahead
from .base import ONE_STEP, PLAIN, SINGLE_WRITE, SchedulerSide
from .chunk import ChunkSender
from .one_step import (
    EXACT,
    CallCapture,
    CaptureProducer,
    Command,
    fast_path_problem,
    kombu_known,
    routes_redis,
)
from .plain import DeclaringOnce, publish
from .routing import Routes
from .single_write import amqp_known, single_write_problem
from .templates import Captured, Messages

logger = logging.getLogger(__name__)

#: False: every chunk takes the plain path, the reference the optimisations are tested and
#: measured against (no one step, no single write, every message built by ``apply_async``)
OPTIMISED = True
#: why no optimisation applies while :data:`OPTIMISED` is False
OFF = "the optimisations are turned off (send.sender.OPTIMISED = False)"


class Memory(Protocol):
    """What this process published, as the roles remember it (``roles.memory.SentMemory``)."""

    def covers(self, name: str, slot_ms: int) -> bool: ...

    def note(self, name: str, slot_ms: int) -> None: ...


class Enqueuer:
    """Sends chunks for one scheduler, on the path :meth:`path` names.

    Messages are built by :class:`~.templates.Messages`: Celery builds the first
    of each shape, the rest are it with what a slot changes (on the plain path
    Celery builds every one). On kombu's Redis transport their final commands go
    with the claim (one step) or through kombu's own client in one pipeline after
    it; on other transports through ``Producer.publish``, in kombu's batch where
    it has one, or gathered into one socket write on py-amqp.
    """

    def __init__(self, scheduler: SchedulerSide, client: Any, *, quiet: bool = False,
                 memory: Memory | None = None) -> None:
        self.scheduler = scheduler
        #: what this process published (settling an unanswered claim consults and notes it)
        self.memory = memory
        config = scheduler.lb_config
        #: False while the broker could not be reached to check: checked again next batch
        self.checked = True
        #: kombu's Redis transport, batching: messages are known as their final commands
        self.redis = False
        #: kombu's py-amqp transport: a chunk's frames may go out in one write
        self.amqp = False
        try:
            with scheduler.app.connection_for_write() as conn:
                self.amqp = getattr(conn.transport, "driver_name", None) == "py-amqp"
                self.redis = routes_redis(conn)
            problem = (OFF if not OPTIMISED else
                       "turned off by leaderbeat_atomic_enqueue=False"
                       if not config.atomic_enqueue else
                       fast_path_problem(scheduler.app, client, config.min_replicas))
        except Exception as exc:  # noqa: BLE001 - broker down: this batch publishes (and fails) as before
            self.checked = False
            problem = f"the broker could not be reached to check ({exc})"
        self.fast = problem is None
        #: why chunks are not claimed and enqueued in one step (None: they are)
        self.problem = problem
        #: why a chunk's frames do not go out in one write on py-amqp (None: they do, or
        #: the broker is not py-amqp's)
        self.single_write_problem = ((single_write_problem(scheduler.app) if OPTIMISED else OFF)
                                     if self.amqp else None)
        self._conn: Any = None
        self._producer: Any = None
        self._out: Any = None  # (connection, producer) of the batched path, made when first used
        channel = lambda: self._capturing().channel  # the capture channel, made on first use
        self.routes = Routes(channel)
        self.messages = Messages(scheduler, self.capture, channel, self.routes,
                                 templates=OPTIMISED)
        #: messages framed ahead of their slots, for the single write (py-amqp)
        self.ahead = Ahead()
        #: slots whose commands went with the claim in flight: (name, slot, epoch, message);
        #: left here when its reply never came (see :meth:`settle`)
        self.unanswered: list[tuple[str, datetime, int, Captured | None]] = []
        #: such slots of earlier claims, kept until a read tells what became of them: the
        #: next chunk's claim replaces :attr:`unanswered`
        self._doubt: list[tuple[str, datetime, int, Captured | None]] = []
        if not quiet:
            self._say_path()

    def _say_path(self) -> None:
        """The path chunks take, said once at start-up; a warning where an optimisation that
        fits this broker is off because its library is outside the releases it knows."""
        path, why = self.path()
        if path == ONE_STEP:
            logger.info("leaderbeat: send path one_step: claims and enqueues each slot in one "
                        "step (the broker is leaderbeat's Redis)")
        elif path == SINGLE_WRITE:
            logger.info("leaderbeat: send path single_write: sends each chunk after its claim, "
                        "its messages in one socket write (py-amqp)")
        elif self.amqp:
            untested = not amqp_known()
            logger.log(logging.WARNING if untested else logging.INFO,
                       "leaderbeat: send path plain: sends each chunk after its claim, one "
                       "write a message (one socket write a chunk is off: %s)", why)
        else:
            untested = self.checked and not kombu_known() and _redis_broker(self.scheduler.app)
            logger.log(logging.WARNING if untested else logging.INFO,
                       "leaderbeat: send path plain: sends each chunk after its claim, batched "
                       "by kombu where it can (claim and enqueue in one step is off: %s)", why)

    def path(self) -> tuple[str, str]:
        """(path, why) chunks take now: ``one_step`` or ``single_write`` (why is empty), or
        ``plain`` and why no optimisation applies (``status``, ``nodes`` and the
        ``leaderbeat_send_path`` metric show it)."""
        reason = self.fallback
        if reason is None:
            return ONE_STEP, ""
        if self.amqp and self.checked:
            if self.single_write_problem is None:
                return SINGLE_WRITE, ""
            return PLAIN, self.single_write_problem
        return PLAIN, reason

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
        self._doubt += self.unanswered
        self.unanswered = []
        if not self._doubt:
            return
        s = self.scheduler
        try:
            stored = s.ledger.load(sorted({name for name, _, _, _ in self._doubt}))
        except Exception as exc:  # noqa: BLE001 - kept: read again when the next batch starts
            logger.debug("leaderbeat: could not read what an unanswered claim enqueued: %r", exc)
            return
        doubt, self._doubt = self._doubt, []
        memory = self.memory
        went: dict[int, list[tuple[str, datetime, Captured | None]]] = {}
        for name, slot, epoch, captured in doubt:
            state = stored.get(name)
            if (state is not None and state.slot_ms == to_ms(slot) and state.epoch == epoch
                    and state.state == SlotStatus.SENT and state.node is None
                    and not (memory is not None and memory.covers(name, state.slot_ms))):
                went.setdefault(epoch, []).append((name, slot, captured))
                if memory is not None:
                    memory.note(name, state.slot_ms)
        for epoch, slots in went.items():
            ChunkSender(self, 0, fast=False).said_enqueued(slots, epoch=epoch)

    def _capturing(self) -> Any:
        if self._producer is None:
            self._conn = self.scheduler.app.connection_for_write()
            # a broker that is down fails this build at once: kombu's retry loop would hold
            # the beat's main loop (and its heartbeat) for seconds at every message
            self._conn.ensure_connection(max_retries=0)
            cls = CaptureProducer if self.redis else CallCapture
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

    def connected_producer(self) -> Any:
        """:meth:`producer`, connected now: a broker that does not answer fails this at
        once (no retries: called from idle time, it must not hold the loop)."""
        producer = self.producer()
        conn = self._out[0]
        if not conn.connected:
            conn.ensure_connection(max_retries=0)
        return producer

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


def _redis_broker(app: Any) -> bool:
    """Whether ``app``'s broker is kombu's Redis transport (known without connecting)."""
    with app.connection_for_write() as conn:
        return getattr(conn.transport, "driver_type", None) == "redis"

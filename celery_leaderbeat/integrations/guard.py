"""The worker guard: each slot's message runs at most once, across every worker.

Beat can promise a slot is *enqueued* once; brokers still redeliver (``acks_late``
with a worker lost mid-task, a Redis visibility timeout) and a new leader may
re-send what a dead one claimed but never confirmed. Every leaderbeat message
carries its slot's deterministic task id and headers, so the workers can close
that gap: with ``leaderbeat_guard = True`` on the workers' app, a worker records
the slot as started in Redis, atomically (``guard_start.lua``), before the task body
runs; any later delivery of the same slot is acknowledged without running and
recorded ``skipped``/``duplicate``. Messages without leaderbeat headers run as
always. Each Celery retry of a slot is a run of its own (the run id is the task
id and the retry number): a duplicated retry message runs once, and the next
retry still runs. The rule for a redelivery after a crash: a run that
*finished*, or is *still alive* (its liveness, renewed every ttl/3 while it
runs, has not lapsed) is a duplicate; a run recorded started whose liveness
lapsed is taken for dead with its worker and runs again (``started``/``rerun``).
Redis cannot tell a dead worker from one cut off from Redis for longer than the
lease ttl: that run goes on while the slot runs again. Every start hands out a
fencing token higher than any before it; only the run holding the record's token
may renew or finish it, so the cut-off run, back in touch, changes nothing and
learns it was superseded (:func:`current_run` ``.still_ours()`` is False; its
``token`` lets a store refuse its writes). A body that ended in the instant
between its last line and the finish record can also run twice.

The hook: Celery signals cannot cancel a task (receivers' exceptions are logged
and swallowed), and ``before_start`` must be defined on the task's class before
the worker builds its tracers. The guard instead wraps each task's ``run`` on
the task instance while the worker is built, in the parent, before the pool
forks and the tracers are built, so it works for every task class, bound or
not, and raises :class:`celery.exceptions.Ignore` for a duplicate: the message
is acknowledged and no result is stored.

It is a worker bootstep, :class:`GuardStep`, Celery's own way to extend a
worker: it is part of every worker whose app lists it in ``app.steps["worker"]``
and switches itself on only when that app has ``leaderbeat_guard = True``. The
``celery`` command adds it to each app it finalizes (the ``celery leaderbeat``
plugin calls :func:`offer_step`), so ``celery worker`` and ``app.worker_main()``
need nothing more; a worker built in Python (``app.Worker(...).start()``,
``app.WorkController``) needs the one line
``app.steps["worker"].add("celery_leaderbeat.guard:GuardStep")`` in the app
module, which is harmless next to the automatic one. Importing the package
connects nothing: no signal receiver, no step.

Overlap (per entry, or ``leaderbeat_overlap``; the message header
``leaderbeat_overlap``): every policy but ``allow_all`` has the running task hold
the entry's lock, renewed with its liveness, so a worker that dies frees it after
the lease ttl. A slot due while it is held is, by policy: ``skip``, recorded
skipped; ``buffer_one``/``buffer_all``, recorded waiting in Redis (its message kept
there) and acknowledged, so no worker process is held while it waits;
``cancel_other``, the same, and the running task is revoked with ``terminate``.
The turn passes in ``guard_*.lua``, atomically: the run's end (this module's finish,
or the ``task_revoked`` signal in the worker that terminated it) hands the lock to
the first waiting slot and publishes its message again (header
``leaderbeat_handed_over``); each guarded worker's main process sweeps every
second for entries whose lock lapsed with waiting slots (a worker died, or a
hand-over was never published) and hands them on.

Records expire after ``leaderbeat_guard_expires`` (2 h by default): longer than
any redelivery window a broker uses by default (Redis transport visibility
timeout 1 h, RabbitMQ consumer timeout 30 min), short enough that a schedule of
thousands of entries does not fill Redis. The store unreachable at start: the task
runs (the guard fails open and says so, naming the store); beat sends nothing
meanwhile anyway.

Forks: the worker's main process forks the pool's children, at start and whenever
one is replaced. Its own store calls (the sweep, a release) go through a store with
no threads of its own (PostgreSQL on one connection, not a pool), each call holding
a gate a fork holds too: a child is not forked while a call of its parent is in
flight (a fork waits up to :data:`FORK_WAIT` for it), so it inherits no lock held
(libpq's, OpenSSL's, a pool's). Each child opens
a store of its own; the one it may have inherited is kept untouched, since closing
or finalizing it takes locks that were the parent's threads'.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from datetime import datetime
from typing import Any, TypeVar

from celery import bootsteps, signals
from celery._state import _get_active_apps, connect_on_app_finalize
from celery.exceptions import Ignore, Retry
from kombu.utils import json

from ..config import OVERLAP_RULE, Config, overlap_policy, store_name
from ..errors import ConfigurationError
from ..store.base import STORE_ERRORS, GuardRun, GuardStore, Store
from ..store.open import open_store
from ..timing.iso import from_iso
from ..timing.slots import from_ms, to_ms

logger = logging.getLogger(__name__)

_INSTALLED = "_leaderbeat_guard"

#: the policies whose slots wait for the running one: their messages are kept to start them
WAITING = ("buffer_one", "buffer_all", "cancel_other")
#: the header of a waiting slot's message, published again when its turn came
HANDED_OVER = "leaderbeat_handed_over"
#: the headers a waiting slot's message keeps
_HEADERS = ("leaderbeat_entry", "leaderbeat_slot", "leaderbeat_epoch", "leaderbeat_overlap",
            "celery_beat_task")
#: how often each guarded worker looks for entries whose run's lock lapsed with slots waiting
SWEEP_INTERVAL = 1.0

T = TypeVar("T")

#: held by each store call of a worker's main process and by each fork it makes
_FORK_GATE = threading.RLock()
#: how long a fork waits for a call in flight. Past it the fork goes on: a call that long
#: waits for a server that stopped answering, in a read on its own socket, which holds
#: none of the locks (libpq's, OpenSSL's, the resolver's) a child could need
FORK_WAIT = 5.0
_FORKING = threading.local()


def _before_fork() -> None:
    _FORKING.held = _FORK_GATE.acquire(timeout=FORK_WAIT)


def _after_fork_in_parent() -> None:
    if getattr(_FORKING, "held", False):
        _FORKING.held = False
        _FORK_GATE.release()


def _after_fork_in_child() -> None:
    global _FORK_GATE
    _FORK_GATE = threading.RLock()  # the inherited one is held by the forking thread
    _FORKING.held = False


_GATE_HOOKED = threading.Event()
_HOOKING = threading.Lock()


def _hook_fork_gate() -> None:
    """Make every fork of this process hold the gate (once; by the first main call, so
    importing the module changes nothing)."""
    with _HOOKING:
        if not _GATE_HOOKED.is_set():
            os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                                after_in_child=_after_fork_in_child)
            _GATE_HOOKED.set()


def header(request: Any, name: str) -> Any:
    """A message header as Celery hands it to the task (an attribute, or in ``headers``)."""
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value


class Guard:
    """Runs each guarded slot at most once; one per worker app."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.config = Config.from_app(app)
        self.store_name = store_name(self.config)
        self._pid: int | None = None
        self._store: Store | None = None
        self._main_pid: int | None = None
        self._main: Store | None = None
        #: stores this process inherited across a fork: never closed nor finalized here
        self._inherited: list[Store] = []

    def store(self) -> GuardStore:
        """This process's guard store for its tasks (a forked pool child opens its own)."""
        if self._pid != os.getpid() or self._store is None:
            self._keep(self._store)
            self._store = None
            self._pid = os.getpid()
            self._store = open_store(self.config)
        return self._store.guard

    def main_call(self, call: Callable[[GuardStore], T]) -> T:
        """``call`` on the store of the worker's main process (sweeps, releases).

        That process forks the pool's children: its store has no threads of its own,
        and the call holds the fork gate, so no child is forked while it is in flight.
        """
        _hook_fork_gate()
        with _FORK_GATE:
            if self._main_pid != os.getpid() or self._main is None:
                self._keep(self._main)
                self._main = None
                self._main_pid = os.getpid()
                self._main = open_store(self.config, threads=False)
            return call(self._main.guard)

    def _keep(self, store: Store | None) -> None:
        """Keep a store inherited across a fork referenced: dropped, it is finalized, and
        a pool's finalizer takes locks a thread of the parent may have held."""
        if store is not None:
            self._inherited.append(store)

    def wrap(self, task: Any) -> None:
        """Put the guard around ``task.run`` (once)."""
        original = task.run
        if getattr(original, "__leaderbeat_guard__", False):
            return

        def run(*args: Any, **kwargs: Any) -> Any:
            return self.call(task, original, args, kwargs)

        run.__leaderbeat_guard__ = True  # type: ignore[attr-defined]
        run.__wrapped__ = original  # type: ignore[attr-defined]
        task.run = run

    def call(self, task: Any, body: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """Run ``body`` unless this delivery repeats a run that ran, or overlaps one."""
        run = self._run_of(task.request)
        if run is None:
            return body(*args, **kwargs)  # not a leaderbeat message
        try:
            decision, why = run.decide()
        except STORE_ERRORS as exc:
            logger.warning("leaderbeat guard: %s unreachable (%s); running %s unguarded",
                           self.store_name, exc, run.what)
            return body(*args, **kwargs)
        if decision == "cancel":
            self.cancel(why, run)
        if decision != "run":
            logger.info("leaderbeat guard: not running %s (%s: %s)", run.what, decision, why)
            raise Ignore(f"leaderbeat: {decision} ({why})")
        keeper = _Keeper(run, self.config.lease_ttl / 3)
        keeper.start()
        detail = "ok"
        current = _CURRENT.set(run.public)
        try:
            return body(*args, **kwargs)
        except Retry:
            detail = "retrying"
            raise
        except BaseException as exc:
            detail = f"failed: {type(exc).__name__}"
            raise
        finally:
            _CURRENT.reset(current)
            keeper.stop()
            run.finish(detail)

    def cancel(self, task_id: str, run: _Run) -> None:
        """Revoke the entry's running task for ``run`` (cancel_other); it waits meanwhile."""
        logger.info("leaderbeat guard: %s replaces the running task %s (revoke, terminate)",
                    run.what, task_id)
        try:
            self.app.control.revoke(task_id, terminate=True)
        except Exception as exc:  # noqa: BLE001 - the broker: the slot still waits its turn
            logger.warning("leaderbeat guard: could not revoke %s (%s); %s starts when it "
                           "ends", task_id, exc, run.what)

    def publish(self, messages: list[str]) -> None:
        """Publish the messages of waiting slots handed the turn.

        Not sent (the broker failed): the hand-over lapses after two lease ttls and a
        sweep hands the turn to the same slot again.
        """
        for raw in messages:
            if not raw:
                continue
            try:
                message = json.loads(raw)
                options = _route(message)
                logger.info("leaderbeat guard: %s slot %s: its turn came, sent to start",
                            message["headers"].get("leaderbeat_entry"),
                            message["headers"].get("leaderbeat_slot"))
                self.app.send_task(message["task"], message["args"], message["kwargs"],
                                   task_id=message["id"],
                                   headers={**message["headers"], HANDED_OVER: 1}, **options)
            except Exception as exc:  # noqa: BLE001 - a sweep sends it again
                logger.warning("leaderbeat guard: could not publish a waiting slot's message "
                               "(%s); a sweep sends it again after two lease ttls", exc)

    def sweep(self) -> None:
        """Hand the turn on for entries whose run's lock lapsed; store errors propagate."""
        self.publish(self.main_call(lambda store: store.sweep()))

    def release(self, request: Any, detail: str) -> None:
        """This worker terminated the run of ``request``: once its process is gone, record
        it ended and hand the turn on. Redis errors propagate.

        Celery sends the signal, then says so at once; the run has stopped only when its
        process is gone. A run whose own end was recorded (the signal raised in the task
        and the guard's finish ran) is left alone; a process still there after a lease
        ttl (a task that caught the signal and goes on) keeps its turn: its own end
        hands it on.
        """
        run = self._run_of(request, keep_message=False)
        if run is None:
            return
        run_id = run.record.run_id
        record = self.main_call(lambda store: store.runs([run_id]).get(run_id))
        if record is None or record.state != "started":
            return
        host, _, pid = record.worker.rpartition(":")
        if host != socket.gethostname() or not pid.isdigit() \
                or not _gone(int(pid), self.config.lease_ttl):
            logger.info("leaderbeat guard: %s still runs after its termination; its own "
                        "end hands its entry's turn on", run.what)
            return
        self.publish([self.main_call(lambda store: store.release(run.record, detail))])

    def _run_of(self, request: Any, *, keep_message: bool = True) -> _Run | None:
        """The guarded run this delivery asks for; None for a message without our headers.

        Each retry is a run of its own (Celery's retry message keeps the slot's task id
        and headers): a duplicated delivery of retry k runs once, and retry k+1 still
        runs. A retry continues its slot's run, so it is never held back by overlap.
        """
        entry, slot = header(request, "leaderbeat_entry"), header(request, "leaderbeat_slot")
        if entry is None or slot is None:
            return None
        retry = int(getattr(request, "retries", 0) or 0)
        overlap = "allow_all" if retry else _policy(header(request, "leaderbeat_overlap"), entry)
        message = ""
        if keep_message and overlap in WAITING:
            message = _message(request)
            if not message:
                overlap = "skip"
        return _Run(self, GuardRun(str(request.id), str(entry), _slot_ms(str(slot)),
                                   _or_empty(header(request, "leaderbeat_epoch")), overlap,
                                   f"{socket.gethostname()}:{os.getpid()}", retry,
                                   message=message,
                                   handed_over=bool(header(request, HANDED_OVER)),
                                   slot_text=str(slot)))


class CurrentRun:
    """The guarded run the calling task is: what :func:`current_run` returns.

    ``token`` fences the slot's runs: each run the guard starts gets a higher one.
    A store the task writes to can refuse a write carrying a token lower than one it
    has seen, which stops a run that was taken for dead (its worker cut off from
    Redis for longer than the lease ttl) and whose slot started again elsewhere.
    """

    def __init__(self, run: _Run) -> None:
        self._run = run
        record = run.record
        self.task_id: str = record.task_id
        self.entry: str = record.entry
        self.slot: datetime = from_ms(record.slot_ms)
        self.retry: int = record.retry

    @property
    def token(self) -> int:
        """This run's fencing token (a positive integer, rising from run to run)."""
        return self._run.token

    def still_ours(self) -> bool:
        """Ask Redis whether the slot's run is still this one (one round trip).

        True: Redis holds this run's token, and its liveness was renewed by this call.
        False: the slot started again under a higher token (this run was taken for dead),
        or Redis did not answer, so this run cannot know; act as though superseded.
        """
        return self._run.confirm()

    def __repr__(self) -> str:
        return (f"<CurrentRun {self.entry} slot {self.slot.isoformat()} retry {self.retry} "
                f"token {self.token}>")


_CURRENT: ContextVar[CurrentRun | None] = ContextVar("leaderbeat_guard_run", default=None)


def current_run() -> CurrentRun | None:
    """The guarded run of the task calling it, or None when it runs unguarded.

    None: the guard is off in this worker, the message carries no leaderbeat
    headers, or Redis did not answer when the task started (the guard runs it then).
    """
    return _CURRENT.get()


class _Run:
    """One guarded run of one slot (its first delivery that works, or one retry)."""

    def __init__(self, guard: Guard, record: GuardRun) -> None:
        self.guard = guard
        self.record = record
        self.token = 0
        #: Redis said the slot started again under another token: never renewed again
        self.superseded = False
        self.public = CurrentRun(self)

    @property
    def what(self) -> str:
        retry = f" retry {self.record.retry}" if self.record.retry else ""
        return f"{self.record.entry} slot {from_ms(self.record.slot_ms).isoformat()}{retry}"

    def start(self, *, will_ask_again: bool = False) -> tuple[str, str]:
        decision, why, self.token = self.guard.store().start(self.record,
                                                             will_ask_again=will_ask_again)
        return decision, why

    def decide(self) -> tuple[str, str]:
        """Start, or say why not. A delivery that finds the slot "running" waits.

        A broker redelivers a lost worker's message at once (RabbitMQ) while the dead
        run's liveness has not lapsed yet: waiting up to one lease ttl tells a run that
        is really alive (it finishes, or keeps renewing: a duplicate) from one that died
        (its liveness lapses: this delivery runs it again).
        """
        waited = 0.0
        ttl = self.guard.config.lease_ttl
        while True:
            decision, why = self.start(will_ask_again=waited <= ttl)
            if decision != "duplicate" or not why.startswith("running"):
                return decision, why
            if waited > ttl:
                return decision, why
            time.sleep(1.0)
            waited += 1.0

    def renew(self) -> bool:
        """Renew the liveness; False once superseded. Redis errors propagate."""
        if self.superseded:
            return False
        if not self.guard.store().renew(self.record, self.token):
            self.superseded = True
            logger.warning("leaderbeat guard: %s started again elsewhere while this worker "
                           "could not reach %s for longer than the lease ttl; this run "
                           "goes on, superseded (current_run().still_ours() is False)",
                           self.what, self.guard.store_name)
        return not self.superseded

    def confirm(self) -> bool:
        """True when Redis confirms this run still holds its slot (and renews it)."""
        try:
            return self.renew()
        except STORE_ERRORS:
            return False

    def finish(self, detail: str) -> None:
        try:
            ours, handed = self.guard.store().end(self.record, self.token, detail)
        except STORE_ERRORS as exc:  # never mask the task's own outcome
            logger.warning("leaderbeat guard: could not record %s finished (%s); its "
                           "liveness lapses after the lease ttl", self.what, exc)
            return
        if not ours:
            logger.warning("leaderbeat guard: %s ended (%s) after it was superseded; "
                           "the run that started it again keeps the slot's record",
                           self.what, detail)
        self.guard.publish([handed])


class _Keeper(threading.Thread):
    """Renews a run's liveness (and overlap lock) while its task body runs.

    Stops once Redis says the run was superseded. Says once when the liveness may
    have lapsed (no renewal confirmed for a lease ttl): a redelivery can then start
    the slot again while this run goes on.
    """

    def __init__(self, run: _Run, interval: float) -> None:
        super().__init__(name=f"leaderbeat-guard-{run.record.task_id[:8]}", daemon=True)
        self.run_ = run
        self.interval = interval
        self._stop_event = threading.Event()

    def run(self) -> None:
        confirmed, warned = time.monotonic(), False
        ttl = self.run_.guard.config.lease_ttl
        while not self._stop_event.wait(self.interval):
            started = time.monotonic()
            try:
                if not self.run_.renew():
                    return
                confirmed, warned = started, False
            except STORE_ERRORS as exc:
                logger.warning("leaderbeat guard: could not renew the liveness of %s (%s)",
                               self.run_.what, exc)
                if not warned and time.monotonic() - confirmed > ttl:
                    warned = True
                    logger.warning("leaderbeat guard: the liveness of %s has lapsed (%s "
                                   "unreachable for more than the lease ttl, %.1f s): a "
                                   "redelivery may start the slot again while this run goes "
                                   "on", self.run_.what, self.run_.guard.store_name, ttl)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(2.0)


def install(app: Any) -> Guard:
    """Guard every task of ``app`` (idempotent). Called for you when the worker starts."""
    guard = getattr(app, _INSTALLED, None)
    if guard is None:
        guard = Guard(app)
        setattr(app, _INSTALLED, guard)
    for name, task in app.tasks.items():
        if not name.startswith("celery."):
            guard.wrap(task)
    return guard


class _Sweeper(threading.Thread):
    """Each guarded worker's main process: hands the turn on where a run's lock lapsed.

    A run whose worker died never ends in the guard's finish; its lock lapses after
    the lease ttl and the next sweep (every :data:`SWEEP_INTERVAL`) of any guarded
    worker starts the entry's first waiting slot.
    """

    def __init__(self, guard: Guard) -> None:
        super().__init__(name="leaderbeat-guard-sweep", daemon=True)
        self.guard = guard
        self._stop_event = threading.Event()

    def run(self) -> None:
        failing = False
        while not self._stop_event.wait(SWEEP_INTERVAL):
            try:
                self.guard.sweep()
                failing = False
            except STORE_ERRORS as exc:
                if not failing:  # said once per outage
                    logger.warning("leaderbeat guard: could not look for waiting slots "
                                   "(%s)", exc)
                failing = True

    def stop(self) -> None:
        self._stop_event.set()
        self.join(2.0)


class GuardStep(bootsteps.StartStopStep):
    """The worker guard as a worker bootstep: on when the app has ``leaderbeat_guard = True``.

    Created while the worker is built (before the pool forks and the tracers are
    built), it wraps every task of the worker's app; bad settings stop the worker
    with the reason, since a guard silently missing would break its promise.
    """

    label = "leaderbeat guard"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.guard: Guard | None = None
        self.sweeper: _Sweeper | None = None

    def include_if(self, parent: Any) -> bool:
        return bool(parent.app.conf.get("leaderbeat_guard"))

    def create(self, parent: Any) -> None:
        try:
            self.guard = install(parent.app)
        except ConfigurationError as exc:
            logger.critical("leaderbeat guard: %s", exc)
            raise SystemExit(f"leaderbeat_guard is on but the settings are invalid: {exc}") \
                from exc

    def start(self, parent: Any) -> None:
        if self.guard is None:
            return
        # said here: while the worker is built, logging is not set up
        logger.info("leaderbeat guard: on; each slot runs at most once (records under "
                    "prefix %s, kept %.0f s)", self.guard.config.key_prefix,
                    self.guard.config.guard_expires)
        signals.task_revoked.connect(self._revoked, weak=False)
        self.sweeper = _Sweeper(self.guard)
        self.sweeper.start()

    def stop(self, parent: Any) -> None:
        signals.task_revoked.disconnect(self._revoked)
        if self.sweeper is not None:
            self.sweeper.stop()
            self.sweeper = None

    def _revoked(self, sender: Any = None, request: Any = None, terminated: bool = False,
                 signum: Any = None, **_: Any) -> None:
        """A task this worker terminated (sent in its main process): it ran, and ends here.

        The pool child killed by the signal never reaches the guard's finish; this
        records the run finished (``cancelled``) and hands the entry's turn on at once
        instead of after the lease ttl. Redis unreachable: the sweep does it later.
        """
        if not terminated or self.guard is None or request is None:
            return
        # waits for the process to go: never on the thread that sent the signal
        threading.Thread(target=self._release, args=(self.guard, request, signum),
                         name="leaderbeat-guard-release", daemon=True).start()

    @staticmethod
    def _release(guard: Guard, request: Any, signum: Any) -> None:
        try:
            guard.release(request, f"cancelled: terminated (signal {signum})")
        except STORE_ERRORS as exc:
            logger.warning("leaderbeat guard: could not record %s terminated (%s); its "
                           "lock lapses after the lease ttl", getattr(request, "id", "?"), exc)


STEP_PATH = "celery_leaderbeat.guard:GuardStep"


def add_step(app: Any) -> None:
    """Make :class:`GuardStep` part of ``app``'s workers (it checks ``leaderbeat_guard`` itself)."""
    app.steps["worker"].add(STEP_PATH)


def offer_step() -> None:
    """Add :class:`GuardStep` to every app this process has or will finalize.

    Called by the ``celery`` command's plugin (``celery_leaderbeat.ops.cli``): the apps
    of ``celery worker`` and ``app.worker_main()`` get the step without a line of
    code. The step is inert in every other command (only a worker builds steps)
    and in a worker whose app does not set ``leaderbeat_guard = True``.
    """
    for app in list(_get_active_apps()):
        add_step(app)
    connect_on_app_finalize(add_step)


def _policy(value: Any, entry: Any) -> str:
    """The overlap policy a message names; none: ``allow_all``.

    A name this worker does not know (a header set by hand, a beat newer than this
    worker) is kept as ``skip``, the one policy that never starts two runs and never
    holds a message back.
    """
    if value is None:
        return "allow_all"
    policy = overlap_policy(value)
    if policy is None:
        logger.warning("leaderbeat guard: entry %r: leaderbeat_overlap=%r %s; kept as skip",
                       entry, value, OVERLAP_RULE)
        return "skip"
    return policy


def _message(request: Any) -> str:
    """What publishes ``request`` again: its task, arguments, leaderbeat headers, route."""
    delivery = getattr(request, "delivery_info", None) or {}
    headers = {name: header(request, name) for name in _HEADERS
               if header(request, name) is not None}
    try:
        text: str = json.dumps({"task": request.task, "id": request.id,
                                "args": list(request.args or ()),
                                "kwargs": dict(request.kwargs or {}), "headers": headers,
                                "exchange": delivery.get("exchange"),
                                "routing_key": delivery.get("routing_key"),
                                "priority": delivery.get("priority")})
        return text
    except (TypeError, ValueError) as exc:
        logger.warning("leaderbeat guard: the arguments of %s are not JSON (%s): it cannot "
                       "wait its turn, so its entry's overlap is kept as skip", request.id, exc)
        return ""


def _route(message: dict[str, Any]) -> dict[str, Any]:
    """Where a waiting slot's message goes again: where it was delivered from.

    No exchange (AMQP's default exchange): its routing key is the queue's name.
    """
    exchange, key = message.get("exchange"), message.get("routing_key")
    options: dict[str, Any] = {}
    if exchange:
        options.update(exchange=exchange, routing_key=key)
    elif key:
        options["queue"] = key
    if message.get("priority") is not None:
        options["priority"] = message["priority"]
    return options


def _gone(pid: int, timeout: float) -> bool:
    """True once process ``pid`` of this host has ended (or is a zombie), within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:  # not ours to signal: alive as far as this process can tell
            pass
        else:
            if _zombie(pid):
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _zombie(pid: int) -> bool:
    """Ended, not yet reaped by its parent (Linux; False where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _or_empty(epoch: Any) -> Any:
    return "" if epoch is None else epoch


def _slot_ms(slot: str) -> int:
    try:
        return to_ms(from_iso(slot))
    except ValueError:
        return 0

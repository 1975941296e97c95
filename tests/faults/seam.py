"""The fault seam: every Redis call a node makes passes one point the test controls.

A node's client is a :class:`FaultyRedis` (a ``redis.Redis`` subclass): plain
commands and Lua scripts (redis-py's ``Script`` calls ``evalsha``/``script_load``
on the client) go through :meth:`FaultyRedis.execute_command`; a pipeline's
``execute()`` is one call (:class:`FaultyPipeline`); a subscription's
``SUBSCRIBE`` and each ``get_message`` are calls too (:class:`FaultyPubSub`).
Each call gets the next index of the :class:`Seam` it belongs to and a label
naming its call site::

    EVALSHA[lead] ledger.claim<chunk.lead

(the command, the script's name for ``EVALSHA``, the store call's name and the
role's, both given in the code: :mod:`celery_leaderbeat.store.calls`), so a sweep
can count a scenario's calls and aim at every distinct call site, and a rename
does not move where a fault lands.

Fault kinds (see :data:`KINDS`), applied to the call at a planned index:

- ``before``: raise ``redis.ConnectionError`` without sending anything;
- ``after``: send it, let the server run it, then raise ``ConnectionError``:
  the reply is lost, the effect happened;
- ``delay``: the call hangs past the lease ttl: the node that made it is frozen
  while the virtual clock moves ``ttl + 1`` s on and the other nodes go on
  (:attr:`Seam.on_stall`), then the call reaches the server and answers;
- ``late``: the server runs the call at once, but its reply reaches the node
  ``ttl + 1`` s later (the node frozen meanwhile, as for ``delay``);
- ``drop``: every connection of the node's client (its pool and its
  subscriptions) is closed under it, then the call runs (redis-py reconnects;
  a subscription resubscribes, and what was published meanwhile is lost);
- ``repeat``: the client's own retry: the call runs, its reply is lost, and the
  client sends it again and returns the second reply.

Reading a subscription is made deterministic: :meth:`FaultyPubSub.get_message`
sends a ``PING`` on the subscription and reads up to its answer, so every
message published before the call (by another in-process node) is seen, and
none published after it.
"""

from __future__ import annotations

import hashlib
import itertools
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from time import monotonic as _real_monotonic
from typing import Any

import redis
from redis.client import Pipeline, PubSub

from celery_leaderbeat.store.calls import ROLE_SITE, STORE_SITE
from celery_leaderbeat.store.connection import client_defaults

BEFORE, AFTER, DELAY, LATE, DROP, REPEAT = "before", "after", "delay", "late", "drop", "repeat"
KINDS = (BEFORE, AFTER, DELAY, LATE, DROP, REPEAT)

def _script_names() -> dict[str, str]:
    """EVALSHA digest -> script name: every ``store/lua/*.lua`` of the package, as the
    loader sends it (a slot script with the code tables and the prelude before it)."""
    from importlib import resources

    from celery_leaderbeat.store.scripts import source

    names = {}
    for item in resources.files("celery_leaderbeat.store").joinpath("lua").iterdir():
        if item.name.endswith(".lua"):
            name = item.name[:-len(".lua")]
            names[hashlib.sha1(source(name).encode()).hexdigest()] = name
    return names


#: EVALSHA digest -> script name, for call-site labels
SCRIPT_NAMES = _script_names()

_PACKAGE = "celery_leaderbeat"


class InjectedFault(redis.ConnectionError):
    """The ConnectionError a planned fault raises (a subclass, so logs tell it apart)."""


@dataclass
class Call:
    """One call that passed the seam."""

    index: int
    node: str
    label: str
    fault: str | None = None


@dataclass
class Seam:
    """Counts and labels calls; applies the faults planned by index or by predicate."""

    #: index -> fault kind
    plan: dict[int, str] = field(default_factory=dict)
    #: [label substring, occurrence (1: the first matching call), kind, node id or None]: a
    #: fault aimed at a call site rather than an index (regression tests: indices move when the code changes)
    aims: list[list[Any]] = field(default_factory=list)
    #: a call is stalled by ``delay`` for this many virtual seconds (set to ttl + 1)
    stall_seconds: float = 11.0
    #: called as ``on_stall(node_id, seconds)`` for a ``delay``: move the clock, run the others
    on_stall: Callable[[str, float], None] = lambda node, seconds: None
    #: called as ``on_drop(node_id)`` for a ``drop``: close that node's connections
    on_drop: Callable[[str], None] = lambda node: None
    #: every call that passed, in order
    calls: list[Call] = field(default_factory=list)
    enabled: bool = True
    #: called with each call's label just before it runs and just after (the harness keeps
    #: values that hold a Redis TIME in step with the virtual clock around claims)
    around: Callable[[str], None] = lambda label: None
    _count: Iterable[int] = field(default_factory=itertools.count)

    def intercept(self, node: str, label: str, run: Callable[[], Any]) -> Any:
        self.around(label)
        try:
            return self._intercept(node, label, run)
        finally:
            self.around(label)

    def _intercept(self, node: str, label: str, run: Callable[[], Any]) -> Any:
        if not self.enabled:
            return run()
        index = next(self._count)  # type: ignore[call-overload]
        kind = self.plan.get(index)
        for aim in self.aims:
            if kind is None and aim[1] > 0 and aim[0] in label and aim[3] in (None, node):
                aim[1] -= 1
                if aim[1] == 0:
                    kind = aim[2]
        self.calls.append(Call(index, node, label, kind))
        if kind is None:
            return run()
        if kind == BEFORE:
            raise InjectedFault(f"injected: call #{index} {label} failed before it was sent")
        if kind == AFTER:
            run()
            raise InjectedFault(f"injected: call #{index} {label} ran, its reply was lost")
        if kind == DELAY:
            self.on_stall(node, self.stall_seconds)
            return run()
        if kind == LATE:
            reply = run()
            self.on_stall(node, self.stall_seconds)
            return reply
        if kind == DROP:
            self.on_drop(node)
            return run()
        if kind == REPEAT:
            run()
            return run()
        raise ValueError(f"unknown fault kind {kind!r}")

    @property
    def count(self) -> int:
        return len(self.calls)

    def sites(self) -> Counter[str]:
        """How many calls each distinct call site made."""
        return Counter(call.label for call in self.calls)

    def aim(self, label: str, kind: str, occurrence: int = 1, node: str | None = None) -> None:
        """Fault the ``occurrence``-th call whose label contains ``label`` (made by ``node``)."""
        self.aims.append([label, occurrence, kind, node])

    def injected(self) -> list[Call]:
        return [call for call in self.calls if call.fault is not None]


def _qualname(frame: Any) -> str:
    """The frame's function as ``Class.method``: ``co_qualname`` (Python 3.11+), or on 3.10
    the module's class that defines the method (the labels name the defining class)."""
    code = frame.f_code
    qualname = getattr(code, "co_qualname", None)
    if qualname:
        return str(qualname)
    for value in list(frame.f_globals.values()):
        attr = value.__dict__.get(code.co_name) if isinstance(value, type) else None
        function = getattr(attr, "fget", None) or getattr(attr, "__func__", None) or attr
        if getattr(function, "__code__", None) is code:
            return f"{value.__name__}.{code.co_name}"
    return str(code.co_name)


def call_site(command: str, args: tuple[Any, ...] = ()) -> str:
    """``COMMAND[script] store call<role call``: the names the code gives (see
    :mod:`celery_leaderbeat.store.calls`); the role's part, when the role named none, is
    the innermost package function outside the store. A call outside any store call (none
    is expected) is labelled by the three innermost package frames."""
    name = str(command).upper()
    if name == "EVALSHA" and args:
        name += f"[{SCRIPT_NAMES.get(str(args[0]), '?')}]"
    store = STORE_SITE.get()
    if store:
        return f"{name} {store}<{ROLE_SITE.get() or _caller_outside_the_store()}"
    frames = []
    frame = sys._getframe(1)
    while frame is not None and len(frames) < 3:
        module = frame.f_globals.get("__name__", "")
        if module.startswith(_PACKAGE) and module != f"{_PACKAGE}.store.scripts":
            short = module.rsplit(".", 1)[-1]  # module names are unique across the package
            frames.append(f"{short}.{_qualname(frame)}")
        frame = frame.f_back
    return f"{name} {'<'.join(frames) or '?'}"


def _caller_outside_the_store() -> str:
    """The innermost ``celery_leaderbeat`` function outside ``store/`` on the stack."""
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith(_PACKAGE) and not module.startswith(f"{_PACKAGE}.store."):
            return f"{module.rsplit('.', 1)[-1]}.{_qualname(frame)}"
        frame = frame.f_back
    return "?"


class FaultyRedis(redis.Redis):
    """A ``redis.Redis`` whose every call passes :attr:`seam` (set by :func:`faulty_client`)."""

    seam: Seam
    node_id: str

    def execute_command(self, *args: Any, **options: Any) -> Any:
        label = call_site(args[0], args[1:2])
        return self.seam.intercept(self.node_id, label,
                                   lambda: super(FaultyRedis, self).execute_command(*args,
                                                                                    **options))

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        pipe = FaultyPipeline(self.connection_pool, self.response_callbacks, transaction,
                              shard_hint)
        pipe.seam, pipe.node_id = self.seam, self.node_id
        return pipe

    def pubsub(self, **kwargs: Any) -> PubSub:
        sub = FaultyPubSub(self.connection_pool, **kwargs)
        sub.seam, sub.node_id = self.seam, self.node_id
        self.subscriptions.append(sub)
        return sub

    @property
    def subscriptions(self) -> list[PubSub]:
        subs = self.__dict__.setdefault("_subscriptions", [])
        return subs

    def drop_connections(self) -> None:
        """Close every connection this client holds (pool and subscriptions)."""
        self.connection_pool.disconnect()
        for sub in self.subscriptions:
            if sub.connection is not None:
                sub.connection.disconnect()


class FaultyPipeline(Pipeline):
    """A pipeline whose ``execute()`` is one call through the seam."""

    seam: Seam
    node_id: str

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        queued = list(self.command_stack)
        names = ",".join(str(args[0]) for args, _ in queued)
        label = call_site(f"PIPELINE({names})")

        def run() -> list[Any]:  # a repeat sends the same commands again (execute() resets)
            self.command_stack = list(queued)
            return super(FaultyPipeline, self).execute(raise_on_error)

        return self.seam.intercept(self.node_id, label, run)


class FaultyPubSub(PubSub):
    """``SUBSCRIBE`` and every ``get_message`` are calls through the seam; reads are synced."""

    seam: Seam
    node_id: str
    _sync = itertools.count()

    def execute_command(self, *args: Any) -> Any:
        label = call_site(args[0])
        return self.seam.intercept(self.node_id, label,
                                   lambda: super(FaultyPubSub, self).execute_command(*args))

    def get_message(self, ignore_subscribe_messages: bool = False,
                    timeout: float | None = 0.0) -> Any:
        label = call_site("PUBSUB.get_message")
        return self.seam.intercept(self.node_id, label,
                                   lambda: self._synced(ignore_subscribe_messages))

    def _synced(self, ignore_subscribe_messages: bool) -> Any:
        """The next message published before this call, or None (never waits for more).

        A PING whose socket died under it (the connection was dropped, redis-py
        reconnected and resubscribed while reading) never answers: after 50 ms of
        silence another PING is sent, for 5 s at most.
        """
        queue: list[Any] = self.__dict__.setdefault("_queue", [])
        if not queue and self.connection is not None and (self.channels or self.patterns):
            deadline = _real_monotonic() + 5.0
            token = self._ping()
            while True:
                response = self.parse_response(block=False, timeout=0.05)
                if response is None:
                    if _real_monotonic() > deadline:
                        raise redis.TimeoutError("no answer to the subscription's PING in 5 s")
                    token = self._ping()
                    continue
                answer = response[1] if (isinstance(response, list) and len(response) == 2
                                         and response[0] in (b"pong", "pong")) else response
                if answer == token:
                    break
                if isinstance(answer, bytes) and answer.startswith(b"lb-sync-"):
                    continue  # the answer to an earlier PING of this read
                message = self.handle_message(response, ignore_subscribe_messages)
                if message is not None:
                    queue.append(message)
        return queue.pop(0) if queue else None

    def _ping(self) -> bytes:
        token = f"lb-sync-{next(self._sync)}".encode()
        super().execute_command("PING", token)
        return token


def faulty_client(seam: Seam, node_id: str, url: str, options: Any = None,
                  timeout: float = 1.0) -> FaultyRedis:
    """A client built as ``connection.make_client`` builds one, whose calls pass ``seam``."""
    client = FaultyRedis.from_url(url, **{**client_defaults(timeout), **dict(options or {})})
    client.seam = seam
    client.node_id = node_id
    return client

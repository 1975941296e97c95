"""Messages as Celery builds them: built by Celery once per shape, then only what a slot changes.

Celery spends most of a beat's send in ``apply_async``: merging options,
routing, looking settings up, repeating the arguments, serialising them,
before kombu turns the result into broker commands. For a beat entry all of
that is the same on every slot except the task id, the slot and epoch headers
and kombu's delivery tag. So the first message of a *shape* (task, options,
overlap policy) is built the ordinary way, by ``apply_async`` and kombu,
and kept; a message of another slot or another entry of that shape is that
message with the task id (``id``, ``root_id``, ``correlation_id``), the
entry's arguments (body, ``argsrepr``, ``kwargsrepr``, serialised once per
entry), the ``leaderbeat_*`` headers and a fresh delivery tag put in.

Two forms: on kombu's Redis transport the final commands (``LPUSH`` of the
payload to the queue's priority list, ``PEXPIRE`` where a queue expires; for a
message through a direct or topic exchange, to the queues its bindings give when
it is sent, :mod:`.routing`), and
on any other transport the arguments Celery passes to ``Producer.publish``
(the body already serialised, so kombu does not serialise it again).

Exactness is checked, not assumed: the first time a shape is used for a second
entry, that message is built both ways and compared; a difference turns the
shape back to ``apply_async`` for good (said once). Whatever this module cannot
know to be constant goes through ``apply_async`` every time: a connected
``before_task_publish`` or ``task_sent`` receiver (it may change each message),
``task_send_sent_event``, task protocol 1, router functions (they see the
arguments), a task with its own ``apply_async``, ``shadow_name`` or pydantic
arguments, ``BeatLazyFunc`` arguments, an eta, countdown or expiry (computed
from the clock), compression, an unknown serialisation.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timezone
from json.encoder import encode_basestring_ascii
from typing import Any

from celery import signals
from celery.app.routes import MapRoute
from celery.app.task import Task
from celery.beat import BeatLazyFunc
from celery.utils.saferepr import saferepr
from kombu import serialization
from kombu.utils.json import dumps as kombu_dumps

from ..timing.slots import slot_id
from .base import SchedulerSide
from .routing import Route, Routes

logger = logging.getLogger(__name__)

#: headers a message of another slot or entry of the same shape changes
SLOT_HEADERS = ("id", "root_id", "argsrepr", "kwargsrepr",
                "leaderbeat_slot", "leaderbeat_epoch", "leaderbeat_entry")


class Captured(Exception):
    """Raised out of ``apply_async`` at ``Producer.publish``: Celery's call, kept.

    ``commands`` are kombu's final Redis commands when the producer routed the
    message into a collector (None on other transports); ``body`` and
    ``kwargs`` are what Celery passed to ``Producer.publish``.
    """

    def __init__(self, body: Any, kwargs: dict[str, Any] | None,
                 commands: list[tuple[str, tuple[Any, ...]]] | None = None,
                 data: tuple[Any, str, str] | None = None,
                 lazy: Callable[[], dict[str, Any]] | None = None):
        super().__init__("captured")
        self.body = body
        self._kwargs = kwargs
        self._lazy = lazy  # makes kwargs when first asked (a signal receiver, a check)
        self.commands = commands
        #: the body serialised (data, content type, encoding), for a publish through kombu
        self.data = data

    @property
    def kwargs(self) -> dict[str, Any]:
        if self._kwargs is None and self._lazy is not None:
            self._kwargs = self._lazy()
        return self._kwargs or {}

    @property
    def after(self) -> dict[str, Any]:
        """The arguments of Celery's ``after_task_publish`` for this message."""
        kw = self.kwargs
        return {"body": self.body, "headers": kw.get("headers"),
                "exchange": kw.get("exchange"), "routing_key": kw.get("routing_key")}


class _Shape:
    """One shape's first message as Celery and kombu built it."""

    __slots__ = (
        "body",
        "content",
        "envelope",
        "exact",
        "headers",
        "key",
        "kwargs",
        "names",
        "owner",
        "pieces",
        "rest",
        "route",
        "serializer",
    )

    def __init__(self, captured: Captured, owner: str) -> None:
        self.body = captured.body
        self.kwargs = dict(captured.kwargs)
        self.headers = dict(captured.kwargs.get("headers") or {})
        self.serializer = captured.kwargs.get("serializer")
        self.content: tuple[str, str] | None = None  # (content type, encoding) of the body
        self.envelope: dict[str, Any] | None = None
        self.key = ""
        self.rest: list[tuple[str, tuple[Any, ...]]] = []
        #: set when the message goes through an exchange: its queues are looked up at send
        self.route: Route | None = None
        if captured.commands is not None:
            (_, args), *rest = captured.commands
            self.key, self.envelope = args[0], json.loads(args[1])
            self.rest = rest
        self.owner = owner  # the entry whose message this is
        self.exact: bool | None = None  # None: not compared with a second entry's yet
        #: the payload's JSON around what a message changes (see _template)
        self.pieces: list[str] | None = None
        self.names: list[str] = []


_EMPTY: dict[str, Any] = {}  # shared by every entry without kwargs or options (never changed)


class _Part:
    """What one entry adds to its shape: its arguments' texts, once (kept small: one per entry)."""

    __slots__ = (
        "args",
        "argsrepr",
        "data",
        "jargs",
        "jbody",
        "jkwargs",
        "jname",
        "kwargs",
        "kwargsrepr",
        "options",
        "overlap",
        "ready",
        "shape_key",
        "task",
    )

    def __init__(self, entry: Any, overlap: str, keys: dict[Any, Any]) -> None:
        self.task = entry.task
        self.args = list(entry.args or ())
        self.kwargs = dict(entry.kwargs) if entry.kwargs else _EMPTY
        self.options = dict(entry.options) if entry.options else _EMPTY
        self.overlap = overlap
        key = (entry.task, overlap, repr(sorted(self.options.items())))
        self.shape_key = keys.setdefault(key, key)  # one tuple per shape, not per entry
        self.data: Any = None
        self.ready = False  # its shape's serialisation applied (see Messages._fill)
        self.argsrepr = self.kwargsrepr = ""
        self.jname = _json_str(entry.name)  # JSON of what it puts in a Redis payload
        self.jbody = self.jargs = self.jkwargs = ""

    @property
    def body(self) -> tuple[Any, Any]:
        """Celery's body without its embed: empty arguments are () and {} (as_task_v2)."""
        return (self.args or (), self.kwargs or {})

    def same(self, entry: Any, overlap: str) -> bool:
        return (entry.task == self.task and overlap == self.overlap
                and list(entry.args or ()) == self.args
                and (entry.kwargs or _EMPTY) == self.kwargs
                and (entry.options or _EMPTY) == self.options)


class Messages:
    """Builds a scheduler's messages from kept shapes; None where Celery must build them.

    ``capture(entry, slot, epoch, overlap)`` builds one message the ordinary way
    and returns it as :class:`Captured` (with kombu's commands on the Redis
    transport); ``channel()`` is the kombu channel those commands were made on.
    """

    def __init__(self, scheduler: SchedulerSide,
                 capture: Callable[[Any, datetime, int, str], Captured],
                 channel: Callable[[], Any], routes: Routes | None = None, *,
                 templates: bool = True) -> None:
        self.scheduler = scheduler
        self.app = scheduler.app
        self.capture = capture
        self.channel = channel
        #: looks up, at send, the queues of a message that goes through an exchange
        self.routes = routes if routes is not None else Routes(channel)
        self._shapes: dict[Any, _Shape | None] = {}
        self._parts: dict[str, _Part | None] = {}
        self._tasks: dict[str, Any] = {}
        self._keys: dict[Any, Any] = {}  # shape keys, one tuple each
        self._uses: dict[Any, int] = {}  # shape key -> how many parts have it
        self._empty_reprs: dict[Any, str] = {}
        amqp = self.app.amqp
        self._argsrepr_max = amqp.argsrepr_maxsize
        self._kwargsrepr_max = amqp.kwargsrepr_maxsize
        # the setting is newer than Celery 5.4, whose as_task_v2 leaves saferepr's default
        self._repr_levels: dict[str, Any] = {}
        try:
            self._repr_levels["maxlevels"] = self.app.conf.task_repr_maxlevels
        except AttributeError:
            pass
        self.problem = self._app_problem() if templates else "templates are turned off"
        if self.problem:
            logger.info("leaderbeat: every message is built by apply_async (%s)", self.problem)

    def _app_problem(self) -> str | None:
        conf = self.app.conf
        if int(conf.task_protocol or 2) != 2:
            return f"task_protocol is {conf.task_protocol}"
        if conf.task_send_sent_event:
            return "task_send_sent_event is on"
        routes = self.app.amqp.router.routes
        if any(not isinstance(r, MapRoute) for r in routes):
            return "task_routes has a router function (it sees each message's arguments)"
        return None

    # -- per message -----------------------------------------------------------------

    def usable(self) -> bool:
        """Whether messages may be built from shapes now (no receiver may change them)."""
        return (self.problem is None and not signals.before_task_publish.receivers
                and not signals.task_sent.receivers)

    def build(self, entry: Any, slot: datetime, epoch: int, overlap: str) -> Captured:
        """``slot``'s message as Celery builds it; kombu's commands when on Redis."""
        if self.usable():
            part = self._part(entry, overlap)
            shape = self._shapes.get(part.shape_key) if part is not None else None
            if part is not None and shape is not None and shape.exact is not False:
                if not part.ready:
                    self._fill(part, shape)
                built = self._from(shape, part, entry.name, slot, epoch)
                if shape.exact is None and entry.name != shape.owner:
                    real = self.capture(entry, slot, epoch, overlap)
                    shape.exact = self._same(real, built)
                    if not shape.exact:
                        logger.warning("leaderbeat: messages of task %s are built by "
                                       "apply_async every time (a message built from the "
                                       "first one differed)", entry.task)
                        return real
                return built
            captured = self.capture(entry, slot, epoch, overlap)
            if part is not None and part.shape_key not in self._shapes:
                self._shapes[part.shape_key] = self._shape(captured, entry)
            return captured
        return self.capture(entry, slot, epoch, overlap)

    def _from(self, shape: _Shape, part: _Part, name: str, slot: datetime,
              epoch: int) -> Captured:
        task_id = slot_id(self.scheduler.keys.prefix, name, slot)
        iso = slot.isoformat()

        def kwargs() -> dict[str, Any]:
            headers = dict(shape.headers)
            headers.update(id=task_id, root_id=task_id, argsrepr=part.argsrepr,
                           kwargsrepr=part.kwargsrepr, leaderbeat_slot=iso,
                           leaderbeat_epoch=epoch, leaderbeat_entry=name)
            out = dict(shape.kwargs)
            out.update(headers=headers, correlation_id=task_id)
            return out

        body = (*part.body, shape.body[2])
        if shape.pieces is None:
            return Captured(body, kwargs(), None, part.data)
        quoted = '"' + task_id + '"'  # hex digits and dashes: nothing for JSON to escape
        values = {"body": part.jbody, "argsrepr": part.jargs, "kwargsrepr": part.jkwargs,
                  "leaderbeat_entry": part.jname, "id": quoted, "root_id": quoted,
                  "correlation_id": quoted, "leaderbeat_slot": '"' + iso + '"',
                  "leaderbeat_epoch": str(epoch) if type(epoch) is int else json.dumps(epoch),
                  "delivery_tag": '"' + delivery_tag() + '"'}
        pieces = shape.pieces
        payload = pieces[0] + "".join(
            [values[n] + p for n, p in zip(shape.names, pieces[1:])])
        if shape.route is not None:  # routed now, as kombu routes each publish
            commands = self.routes.commands(shape.route, payload)
        else:  # to a queue by name: the same key every time
            commands = [("lpush", (shape.key, payload)), *shape.rest]
        return Captured(body, None, commands, None, lazy=kwargs)

    @staticmethod
    def _same(real: Captured, built: Captured) -> bool:
        if real.kwargs != built.kwargs or real.body != built.body:
            return False
        if real.commands is None or built.commands is None:
            return real.commands is built.commands
        if not real.commands or not built.commands:
            return real.commands == built.commands
        # an exchange's queues come in the order of a set: compared as sets of keys
        if _keys(real.commands) != _keys(built.commands):
            return False
        (_, (_, p1)), (_, (_, p2)) = real.commands[0], built.commands[0]
        a, b = json.loads(p1), json.loads(p2)
        for m in (a, b):
            m["properties"].pop("delivery_tag", None)
        return a == b and list(a) == list(b) and list(a["headers"]) == list(b["headers"])

    def warm(self, entries: Iterator[tuple[Any, str]], epoch: int, until: float,
             clock: Callable[[], float]) -> bool:
        """Prepare entries' messages ahead of their first send, until ``clock() >= until``.

        Each entry gets its serialised arguments, and each new shape its first
        message from ``apply_async`` (built for the present moment, never sent).
        The first burst after start-up or a takeover then costs what later ones
        do. True once ``entries`` is exhausted.
        """
        if not self.usable():
            return True
        now = datetime.now(timezone.utc)
        for entry, overlap in entries:
            part = self._part(entry, overlap)
            if part is not None:
                if part.shape_key not in self._shapes:
                    try:
                        captured = self.capture(entry, now, epoch, overlap)
                    except Exception:  # noqa: BLE001 - its first send builds it again, and says why
                        captured = None
                    if captured is not None:
                        self._shapes[part.shape_key] = self._shape(captured, entry)
                shape = self._shapes.get(part.shape_key)
                if shape is not None and not part.ready:
                    self._fill(part, shape)
            if clock() >= until:
                return False
        return True

    @staticmethod
    def publish(producer: Any, built: Captured, *, signal: bool = True) -> None:
        """Publish a built message through ``producer`` as Celery would, and its signal
        (``signal=False``: recorded ahead of its slot, the signal fires when it is sent)."""
        if built.data is None:  # built by apply_async: kombu serialises it
            producer.publish(built.body, **built.kwargs)
        else:  # serialised once for its entry: kombu takes it as it is
            data, content_type, encoding = built.data
            producer.publish(data, content_type=content_type, content_encoding=encoding,
                             **built.kwargs)
        if signal and signals.after_task_publish.receivers:
            signals.after_task_publish.send(sender=built.kwargs["headers"]["task"],
                                            **built.after)

    # -- shapes and parts --------------------------------------------------------------

    def _part(self, entry: Any, overlap: str) -> _Part | None:
        part = self._parts.get(entry.name)
        if part is not None and part.same(entry, overlap):
            return part
        part = self._new_part(entry, overlap)
        if part is not None:  # counted before the old part goes: it may share the shape
            self._uses[part.shape_key] = self._uses.get(part.shape_key, 0) + 1
        self._drop(entry.name)
        self._parts[entry.name] = part
        return part

    def _drop(self, name: str) -> None:
        """Forget entry ``name``'s part, and its shape if no other part has it."""
        part = self._parts.pop(name, None)
        if part is None:
            return
        key = part.shape_key
        left = self._uses[key] - 1
        if left:
            self._uses[key] = left
        else:
            del self._uses[key]
            self._shapes.pop(key, None)
            self._keys.pop(key, None)

    def keep(self, live: Mapping[str, Any], overlap: Callable[[str], str],
             names: Iterable[str] | None = None) -> None:
        """Keep what the entries scheduled now need: ``live`` (name -> entry).

        The part of an entry removed or defined anew goes, and with the last part
        of a shape, the shape: what is kept is bounded by the schedule, not by every
        entry it ever had. ``names``: the only entries that may have changed (None:
        any of them). ``overlap(name)`` is an entry's overlap policy.
        """
        for name in list(self._parts) if names is None else names:
            if name not in self._parts:
                continue
            part, entry = self._parts[name], live.get(name)
            if entry is None or part is None or not part.same(entry, overlap(name)):
                self._drop(name)
        if len(self._tasks) > 2 * len(self._parts) + 64:  # tasks no entry sends any more
            used = {p.task for p in self._parts.values() if p is not None}
            self._tasks = {t: v for t, v in self._tasks.items() if t in used}

    def _new_part(self, entry: Any, overlap: str) -> _Part | None:
        args, kwargs = entry.args or (), entry.kwargs or {}
        if any(isinstance(v, BeatLazyFunc) for v in (*args, *kwargs.values())):
            return None
        task = self._task(entry.task)
        if task is False:
            return None
        if task is not None and task.typing:
            try:
                task.__header__(*args, **kwargs)
            except Exception:  # noqa: BLE001 - apply_async raises it again, and it is logged
                return None
        part = _Part(entry, overlap, self._keys)
        # as Celery's as_task_v2: empty arguments are () and {} (argsrepr "()")
        part.argsrepr = self._saferepr(part.args or (), self._argsrepr_max)
        part.kwargsrepr = self._saferepr(part.kwargs or {}, self._kwargsrepr_max)
        shape = self._shapes.get(part.shape_key)
        if shape is not None:
            self._fill(part, shape)
        return part

    def _saferepr(self, value: Any, maxsize: int) -> str:
        if not value:  # () or {}: the same text for every entry
            key = (type(value), maxsize)
            if key not in self._empty_reprs:
                self._empty_reprs[key] = saferepr(value, maxsize, **self._repr_levels)
            return self._empty_reprs[key]
        text: str = saferepr(value, maxsize, **self._repr_levels)
        return text

    def _task(self, name: str) -> Any:
        """The registered task (None: sent by name), or False when Celery must build its messages."""
        if name not in self._tasks:
            task = self.app.tasks.get(name)
            if task is not None:
                cls = type(task)
                if (cls.apply_async is not Task.apply_async
                        or cls.shadow_name is not Task.shadow_name
                        or getattr(task, "_dump_pydantic_arguments", None) is not None):
                    task = False
            self._tasks[name] = task
        return self._tasks[name]

    def _fill(self, part: _Part, shape: _Shape) -> None:
        body = (*part.body, shape.body[2])
        content_type, encoding, data = serialization.dumps(body, serializer=shape.serializer)
        part.ready = True
        if shape.pieces is None:  # published through kombu: the serialised body is kept
            part.data = (data, content_type, encoding)
            return
        # the payload's pieces: only the JSON of what this entry puts in (less memory)
        assert shape.envelope is not None  # pieces are cut from a Redis payload
        encoded = self.channel().encode_body(data, shape.envelope["properties"].get(
            "body_encoding"))[0]
        part.jbody = _json_str(encoded)
        part.jargs, part.jkwargs = _json_str(part.argsrepr), _json_str(part.kwargsrepr)

    def _shape(self, captured: Captured, entry: Any) -> _Shape | None:
        """The shape of a message ``apply_async`` built, or None: its messages are built by
        ``apply_async`` every time (see the module's docstring for why)."""
        if not _repeatable(captured):
            return None
        if captured.commands is not None and not _one_payload(captured.commands):
            return None
        shape = _Shape(captured, entry.name)
        if shape.envelope is not None and not self._route(shape, captured.commands):
            return None
        try:
            content_type, encoding, _ = serialization.dumps(shape.body,
                                                            serializer=shape.serializer)
        except Exception:  # noqa: BLE001 - an unknown serialiser: apply_async each time
            return None
        shape.content = (content_type, encoding)
        if shape.envelope is not None and not _cut(shape):
            return None
        return shape

    def _route(self, shape: _Shape, commands: list[tuple[str, tuple[Any, ...]]] | None) -> bool:
        """Where a Redis message of ``shape`` goes: through an exchange (its queues looked up
        at each send) or to one queue by name; False for anything else."""
        assert shape.envelope is not None  # a Redis payload
        shape.route = self.routes.route(shape.envelope)
        if shape.route is None:
            return _one_queue(commands)
        shape.rest = []  # its commands are made at send (other queues' payloads too)
        return True


def _repeatable(captured: Captured) -> bool:
    """Whether every message of the captured one's shape is that message with a slot's
    values put in: not compressed, nothing computed from the clock (an eta, an expiry),
    Celery's body of three parts, every header a slot changes and no parent task."""
    kw = captured.kwargs
    headers = kw.get("headers") or {}
    if (kw.get("compression") or headers.get("eta") or headers.get("expires")
            or kw.get("expiration") is not None):
        return False
    body = captured.body
    if not isinstance(body, tuple) or len(body) != 3:
        return False
    return all(h in headers for h in SLOT_HEADERS) and headers.get("parent_id") is None


def _cut(shape: _Shape) -> bool:
    """Cut a Redis payload's shape into pieces (see :func:`_template`); False when the
    payload says another serialisation than the shape's body has, or cannot be cut."""
    assert shape.envelope is not None and shape.content is not None
    content_type, encoding = shape.content
    if (shape.envelope.get("content-type") != content_type
            or shape.envelope.get("content-encoding") != encoding):
        return False
    return _template(shape)


def _one_payload(commands: list[tuple[str, tuple[Any, ...]]]) -> bool:
    """kombu's commands of one message: LPUSHes of one payload (and PEXPIREs), the first an LPUSH."""
    return (bool(commands) and commands[0][0] == "lpush"
            and all(name == "pexpire" or (name == "lpush" and args[1] == commands[0][1][1])
                    for name, args in commands))


def _one_queue(commands: list[tuple[str, tuple[Any, ...]]] | None) -> bool:
    """One LPUSH, then PEXPIREs: a message sent to one queue by name."""
    return not commands or all(name == "pexpire" for name, _ in commands[1:])


def _keys(commands: list[tuple[str, tuple[Any, ...]]]) -> list[tuple[str, str, Any]]:
    """Each command's name, key and argument (payloads left out), sorted."""
    return sorted((name, str(args[0]), None if name == "lpush" else args[1])
                  for name, args in commands)


def delivery_tag() -> str:
    """A random uuid4 as text, as kombu's virtual transport tags each message it publishes."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40  # version 4
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _json_str(value: str) -> str:
    """A str as JSON, as ``json.dumps`` writes it by default (ASCII, escaped)."""
    return encode_basestring_ascii(value)


#: what a Redis payload's JSON changes from one message of a shape to the next
TEMPLATE_FIELDS = ("body", *SLOT_HEADERS, "correlation_id", "delivery_tag")
_MARK = re.compile(r'"\\u0000lb:(\w+)\\u0000"')


def _template(shape: _Shape) -> bool:
    """Cut the shape's payload JSON around the fields a message changes.

    The payload is dumped once more by kombu's own ``dumps`` with a marker in
    each such field; a message is then the pieces joined with its values
    encoded as JSON. False when a marker is not found exactly once.
    """
    assert shape.envelope is not None
    mark = {n: f"\x00lb:{n}\x00" for n in TEMPLATE_FIELDS}
    headers = dict(shape.headers)
    headers.update({h: mark[h] for h in SLOT_HEADERS})
    properties = dict(shape.envelope["properties"])
    properties.update(correlation_id=mark["correlation_id"], delivery_tag=mark["delivery_tag"])
    envelope = dict(shape.envelope, body=mark["body"], headers=headers, properties=properties)
    cut = _MARK.split(kombu_dumps(envelope))
    names = cut[1::2]
    if sorted(names) != sorted(TEMPLATE_FIELDS):
        return False
    shape.pieces, shape.names = cut[0::2], names
    return True

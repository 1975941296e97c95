"""On RabbitMQ (py-amqp), a chunk's messages reach the socket in one write.

py-amqp writes every message's frames with a ``sendall`` of its own: a system
call per message, about a fifth of a RabbitMQ send's CPU. While a chunk is
published, :class:`Gathered` puts a frame writer of its own on the
connection (``Connection.frame_writer`` is a settable property): one made by
py-amqp's own ``method_framing.frame_writer`` over a buffer, so the frames
are byte for byte py-amqp's. Only ``Basic.Publish`` frames are kept; any other
frame (a queue's first declaration, which then waits for its answer; a
heartbeat) first writes what was kept, so the order on the wire stays. What
was kept is written at the end in one ``transport.write``.

py-amqp also reads the socket before every publish (a read that waits for
nothing) in case RabbitMQ said ``connection.blocked``: a fifth of a gathered
chunk's publishing. Nothing of a gathered chunk is written before its end, so
that read is made once, as the chunk starts; RabbitMQ's notice is handled then
as py-amqp handles it (its ``on_blocked``), and the chunk's messages skip it.

A message may also come recorded (:class:`Recorder`: its frames made ahead of its
slot by the same py-amqp frame writer, kept, not written): the chunk adds those
bytes to what it keeps (:meth:`Gathered.add`), on the same connection and channel
only.

Nothing of a chunk counts as sent before that write returned: a failed write
raises (the whole chunk is recorded unsent, as a failed kombu batch is), and
an exception raised inside discards what was kept. Where anything is not as
expected (a client library other than py-amqp or a py-amqp outside
:data:`AMQP_RANGE`, no settable frame writer, publisher confirms, which wait
for each message's answer, a connection not made yet) messages are written one
by one, on the plain path; :func:`single_write_problem` says why at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

#: the py-amqp releases whose frame writer (``method_framing.frame_writer``, the settable
#: ``Connection.frame_writer``) this was tested with: >=5.4,<5.5; outside it one write a message
AMQP_RANGE = ((5, 4), (5, 5))


class _Kept:
    """Stands in for py-amqp's transport in a frame writer: keeps what it would write."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: Any) -> None:
        self.parts.append(bytes(data))  # a view of the writer's own buffer, reused: copied


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(v) for v in version)


def amqp_known() -> bool:
    """Whether the installed py-amqp is in :data:`AMQP_RANGE` (False: not installed)."""
    try:
        import amqp
    except ImportError:
        return False
    low, high = AMQP_RANGE
    return low <= tuple(amqp.version_info[:2]) < high


def single_write_problem(app: Any) -> str | None:
    """Why ``app``'s chunks cannot go out in one write on py-amqp; None when they can."""
    try:
        import amqp
    except ImportError:
        return "py-amqp is not installed"
    low, high = AMQP_RANGE
    if not amqp_known():
        return (f"py-amqp {amqp.__version__} (the frame writer is known for py-amqp "
                f">={_dotted(low)},<{_dotted(high)})")
    if (app.conf.broker_transport_options or {}).get("confirm_publish"):
        return "publisher confirms are on (each message waits for its answer)"
    return None


def gatherable(producer: Any) -> Any:
    """The py-amqp connection under ``producer`` when its frames can be gathered, else None."""
    try:
        import amqp
        from amqp import method_framing
    except ImportError:
        return None
    if not amqp_known():
        return None
    kombu_conn = getattr(producer, "__connection__", None)  # set by Producer.revive
    if kombu_conn is None or not kombu_conn.connected:  # never connect from here
        return None
    client = getattr(producer.channel, "connection", None)
    writer = getattr(type(client), "frame_writer", None)
    if (not isinstance(client, amqp.Connection) or not isinstance(writer, property)
            or writer.fset is None or getattr(client, "confirm_publish", True)
            or not callable(getattr(method_framing, "frame_writer", None))
            or not callable(getattr(client.transport, "write", None))):
        return None
    return client


def _keeping_publishes(client: Any, kept: _Kept,
                       before_other: Callable[[], None]) -> tuple[Any, Any]:
    """(py-amqp's frame writer of ``client``, one that keeps each ``Basic.Publish`` in
    ``kept``, framed by py-amqp's own ``frame_writer``, and calls ``before_other`` before
    writing any other frame at once)."""
    from amqp import method_framing, spec

    original = client.frame_writer
    keep = method_framing.frame_writer(client, kept)
    publish = spec.Basic.Publish

    def write_frame(type_: int, channel: int, method_sig: Any, args: Any,
                    content: Any) -> Any:
        if type_ == 1 and method_sig == publish:
            return keep(type_, channel, method_sig, args, content)
        before_other()
        return original(type_, channel, method_sig, args, content)

    return original, write_frame


def _skip_notice_reads(client: Any) -> None:
    """Make ``client``'s publishes skip their look for RabbitMQ's notices (the read with
    no wait py-amqp makes before each); ``del client.drain_events`` undoes it."""
    read = client.drain_events

    def drain_events(timeout: float | None = None) -> Any:
        if timeout == 0:  # a publish's look for notices: made elsewhere, or not needed
            raise TimeoutError
        return read(timeout)

    client.drain_events = drain_events


class Gathered:
    """Within ``with Gathered(producer) as gathered:``, publish frames go out in one write.

    ``gathered.active`` says whether frames are being kept; ``gathered.settled`` is
    how many of the chunk's slots were on the wire when kept frames had to go early
    (set ``gathered.at`` to a slot's index before publishing it).
    """

    def __init__(self, producer: Any, *, enabled: bool = True) -> None:
        self.producer = producer
        self.enabled = enabled
        self.client: Any = None
        self.active = False
        self.at = 0  # the index of the slot being published
        self.settled = 0  # slots before this index are written (kept frames went early)
        self._kept = _Kept()
        self._failed: BaseException | None = None
        self._reads_skipped = False

    def __enter__(self) -> Gathered:  # noqa: PYI034 - typing.Self is Python 3.11+
        client = gatherable(self.producer) if self.enabled else None
        if client is None:
            return self
        original, write_frame = _keeping_publishes(client, self._kept, self._before_other)
        self._read_notices_once(client)  # what RabbitMQ said so far, before a frame is kept
        self.client, self._original = client, original
        client.frame_writer = write_frame
        self.active = True
        return self

    def _before_other(self) -> None:
        self.settled = self.at  # what was kept must precede the frame written now
        self._write()

    @property
    def where(self) -> tuple[Any, int] | None:
        """(py-amqp connection, channel number) the kept frames go out on; None: not kept."""
        return (self.client, self.producer.channel.channel_id) if self.active else None

    def add(self, frames: bytes, where: tuple[Any, int]) -> bool:
        """Keep a message's frames recorded ahead (:class:`Recorder`) as if published now;
        False (nothing kept) unless they were made for this connection and channel."""
        here = self.where
        if here is None or here[0] is not where[0] or here[1] != where[1]:
            return False
        self._kept.parts.append(frames)
        return True

    def _read_notices_once(self, client: Any) -> None:
        """Read what RabbitMQ sent (``connection.blocked``) now, where py-amqp would
        before each publish, and let the chunk's publishes skip that read. A read that
        fails leaves them as they are: the first publish meets the error, as it would."""
        capabilities = (getattr(client, "client_properties", None) or {}).get("capabilities", {})
        if not capabilities.get("connection.blocked", False):
            return
        try:
            client.drain_events(timeout=0)
        except TimeoutError:
            pass
        except Exception:  # noqa: BLE001 - py-amqp's own read raises it at the first publish
            return
        _skip_notice_reads(client)  # made now, at the chunk's start
        self._reads_skipped = True

    def _write(self) -> None:
        parts, self._kept.parts = self._kept.parts, []
        if parts:
            try:
                self.client.transport.write(b"".join(parts))
            except BaseException as exc:
                self._failed = exc  # the chunk fails as a whole, even if kombu retries on
                raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.client is None:
            return
        self.client.frame_writer = self._original
        if self._reads_skipped:
            del self.client.drain_events  # py-amqp's own again
            self._reads_skipped = False
        self.active = False
        if exc_type is not None:
            self._kept.parts.clear()
            return
        if self._failed is not None:
            raise self._failed
        self._write()


class Recorder:
    """Within ``with Recorder(producer) as recorder:``, publishes are recorded, not sent.

    Each ``Basic.Publish`` is framed by py-amqp's own frame writer over a buffer, as
    :class:`Gathered` frames a chunk's; :meth:`take` hands out what the last publishes
    made, for a chunk to write later on the same connection and channel
    (:attr:`where`). Any other frame (a queue's first declaration) goes out at once,
    as it would have. The socket is not read for RabbitMQ's notices meanwhile: nothing
    is written that a ``connection.blocked`` could hold back. ``recorder.active`` is
    False where the frames cannot be gathered (:func:`gatherable`): record nothing then.
    """

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self.client: Any = None
        self.active = False
        self._kept = _Kept()

    @property
    def where(self) -> tuple[Any, int]:
        """(py-amqp connection, channel number) the recorded frames belong to."""
        return self.client, self.producer.channel.channel_id

    def __enter__(self) -> Recorder:  # noqa: PYI034 - typing.Self is Python 3.11+
        client = gatherable(self.producer)
        if client is None:
            return self
        # any other frame (a queue's first declaration) goes out at once, as it would have
        original, write_frame = _keeping_publishes(client, self._kept, lambda: None)
        self.client, self._original = client, original
        client.frame_writer = write_frame
        _skip_notice_reads(client)  # nothing is written now that a notice could hold back
        self.active = True
        return self

    def take(self) -> bytes:
        """The frames of what was published since the last take (b"": nothing)."""
        parts, self._kept.parts = self._kept.parts, []
        return b"".join(parts)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.client is None:
            return
        self.client.frame_writer = self._original
        del self.client.drain_events  # py-amqp's own again
        self.active = False
        self._kept.parts.clear()

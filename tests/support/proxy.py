"""A small threaded TCP proxy to cut or stall the link between one client and Redis.

    proxy = TcpProxy("127.0.0.1", server.port)
    url = proxy.url_for(0)           # give this URL to one beat
    proxy.set_mode("blackhole")      # the link stalls: nothing moves either way
    proxy.set_mode("drop")           # every connection is closed, new ones too
    proxy.delay(0.5)                 # forward again, 0.5 s later each way
    proxy.set_mode("forward")
    proxy.close()

Modes:

- ``forward``: bytes pass both ways.
- ``drop``: current connections are closed at once; new ones are accepted
  and closed immediately (the client sees a reset/EOF).
- ``blackhole``: connections are accepted and held open, but nothing is read
  or forwarded in either direction until the mode changes (a network stall;
  data queued meanwhile flows once forwarding resumes).
- ``delay``: forward, holding each chunk ``seconds`` before passing it on.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import Literal

from .closing import Closing

Mode = Literal["forward", "drop", "blackhole", "delay"]
MODES: tuple[str, ...] = ("forward", "drop", "blackhole", "delay")
POLL = 0.05  # how often an idle pump re-checks the mode and the closed flag


class TcpProxy(Closing):
    """Listens on 127.0.0.1:<free port> and relays to ``target_host:target_port``."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._mode: Mode = "forward"
        self._delay = 0.0
        self._changed = threading.Condition()
        self._closed = threading.Event()
        self._conns: set[_Link] = set()
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(POLL)
        self.port: int = int(self._listener.getsockname()[1])
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"proxy-{self.port}", daemon=True
        )
        self._acceptor.start()

    # -- public API -------------------------------------------------------

    @property
    def mode(self) -> Mode:
        """The current mode."""
        return self._mode

    @property
    def delay_seconds(self) -> float:
        """Latency added in ``delay`` mode."""
        return self._delay

    def url_for(self, db: int = 0) -> str:
        """``redis://127.0.0.1:<proxy port>/<db>``."""
        return f"redis://127.0.0.1:{self.port}/{db}"

    def set_mode(self, mode: Mode, seconds: float | None = None) -> None:
        """Switch mode; ``seconds`` is the added latency for ``delay``."""
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} must be one of {MODES}")
        if mode == "delay":
            if seconds is None or seconds < 0:
                raise ValueError(f"delay mode needs seconds >= 0, got {seconds!r}")
            self._delay = seconds
        with self._changed:
            self._mode = mode
            self._changed.notify_all()
        if mode == "drop":
            self.drop_connections()

    def delay(self, seconds: float) -> None:
        """Forward with ``seconds`` of added latency in each direction."""
        self.set_mode("delay", seconds)

    def drop_connections(self) -> None:
        """Close every current connection (the mode is unchanged)."""
        with self._lock:
            links = list(self._conns)
        for link in links:
            link.close()

    @property
    def connection_count(self) -> int:
        """Number of client connections currently held."""
        with self._lock:
            return len(self._conns)

    def close(self) -> None:
        """Stop listening and close every connection."""
        self._closed.set()
        with self._changed:
            self._changed.notify_all()
        self.drop_connections()
        self._acceptor.join(5)
        self._listener.close()

    def __repr__(self) -> str:
        return f"<TcpProxy :{self.port} -> {self.target[0]}:{self.target[1]} {self._mode}>"

    # -- internals --------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._mode == "drop":
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:
                _close(client)  # target down: the client sees the link close
                continue
            link = _Link(self, client, upstream)
            with self._lock:
                self._conns.add(link)
            link.start()

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._conns.discard(link)

    def _wait_while_blackholed(self) -> None:
        with self._changed:
            while self._mode == "blackhole" and not self._closed.is_set():
                self._changed.wait(POLL)


class _Link:
    """One client connection and its upstream, pumped by two threads."""

    def __init__(self, proxy: TcpProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.closed = threading.Event()

    def start(self) -> None:
        for src, dst, name in (
            (self.client, self.upstream, "up"),
            (self.upstream, self.client, "down"),
        ):
            threading.Thread(
                target=self._pump, args=(src, dst), name=f"proxy-{name}", daemon=True
            ).start()

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        _close(self.client)
        _close(self.upstream)
        self.proxy._forget(self)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        proxy = self.proxy
        try:
            while not self.closed.is_set() and not proxy._closed.is_set():
                if proxy.mode == "blackhole":
                    proxy._wait_while_blackholed()
                    continue
                readable, _, _ = select.select([src], [], [], POLL)
                if not readable or proxy.mode == "blackhole":
                    continue  # hold what arrived during a stall until forwarding resumes
                data = src.recv(65536)
                if not data:
                    break
                if proxy.mode == "delay" and proxy.delay_seconds:
                    time.sleep(proxy.delay_seconds)  # the injected latency itself
                if proxy.mode == "drop":
                    break
                dst.sendall(data)
        except (OSError, ValueError):
            pass  # a socket closed under us: the link is over
        finally:
            self.close()


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()

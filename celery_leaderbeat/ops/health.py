"""``/healthz`` and ``/readyz``: what a probe asks one beat process, on the metrics port.

Liveness (``/healthz``) says only "this process is stuck": beat's main loop is
more than ``leaderbeat_lease_ttl`` past the wake-up it planned (the end of the
sleep ``tick()`` asked for, or the start of the pass it is in). That is the
rule by which the heartbeat already lets go of the lease ("main loop
stalled"), and it never depends on Redis: a Redis outage of any length keeps
every beat live, so a restarted Redis finds the leader that remembers what it
sent (the recovery after an empty restart relies on that memory).

Readiness (``/readyz``) adds Redis: 503 while Redis does not answer this
process (its last lease renewal failed, or its ticks fail), and until it
first answered. Neither answer runs a Redis command: a probe costs an HTTP
request, not a ``celery -A`` process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

LIVE_PATH = "/healthz"
READY_PATH = "/readyz"

#: a WSGI application: (environ, start_response) -> body
App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class Health:
    """Liveness and readiness of one beat process, from what its threads report.

    ``wake_by()`` is the monotonic time by which the main loop said it would be
    back; ``stall_after`` the seconds past it that count as stuck (the lease
    ttl); ``ticks_failing()`` whether the scheduler's ticks find Redis
    unreachable. Lease renewals and successful ticks report through
    :meth:`answered` and :meth:`unanswered` (from the heartbeat thread too).
    """

    def __init__(self, wake_by: Callable[[], float], stall_after: float,
                 ticks_failing: Callable[[], bool] = lambda: False) -> None:
        self._wake_by = wake_by
        self.stall_after = stall_after
        self._ticks_failing = ticks_failing
        self._answered: float | None = None  # monotonic time Redis last answered
        self._unanswered: float | None = None  # monotonic time a renewal last failed

    def answered(self) -> None:
        self._answered = time.monotonic()

    def unanswered(self) -> None:
        self._unanswered = time.monotonic()

    def live(self) -> tuple[bool, str]:
        """(live, why): False once the main loop is ``stall_after`` past its wake-up."""
        overdue = time.monotonic() - self._wake_by()
        if overdue > self.stall_after:
            return False, (f"stuck: beat's main loop is {overdue:.1f} s past its planned "
                           f"wake-up (more than leaderbeat_lease_ttl, {self.stall_after:g} s)")
        return True, "live: beat's main loop is on time"

    def ready(self) -> tuple[bool, str]:
        """(ready, why): live, and Redis answers this process."""
        live, why = self.live()
        if not live:
            return False, why
        if self._ticks_failing():
            return False, "not ready: Redis does not answer this beat's ticks"
        answered, unanswered = self._answered, self._unanswered
        if answered is None:
            return False, "not ready: Redis has not answered this beat yet"
        if unanswered is not None and unanswered > answered:
            return False, "not ready: Redis did not answer this beat's last lease renewal"
        return True, "ready: Redis answers this beat"


def application(health: Health, metrics: App | None) -> App:
    """``/healthz`` and ``/readyz`` from ``health``; every other path from ``metrics``.

    Without ``metrics`` (no Prometheus registry), other paths answer 404.
    """

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == LIVE_PATH:
            ok, text = health.live()
        elif path == READY_PATH:
            ok, text = health.ready()
        elif metrics is not None:
            return metrics(environ, start_response)
        else:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"{path}: not here ({LIVE_PATH}, {READY_PATH})\n".encode()]
        status = "200 OK" if ok else "503 Service Unavailable"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [text.encode() + b"\n"]

    return app


class _Server(ThreadingMixIn, WSGIServer):
    """One thread per request: a slow scrape never holds a probe."""

    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    """No line on stderr per request (a probe every few seconds would flood beat's log)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(app: App, port: int, addr: str = "0.0.0.0") -> WSGIServer:
    """Serve ``app`` on ``addr:port`` from a daemon thread; the server, for shutting down."""
    server = make_server(addr, port, app, _Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="leaderbeat-http", daemon=True).start()
    return server

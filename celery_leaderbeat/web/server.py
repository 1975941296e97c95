"""Serve a WSGI app with the standard library: one thread per request, no extra package.

``wsgiref`` is no production server, and need not be here: a handful of operators poll
pages every second or two, and each request is a few store reads. Behind a reverse
proxy or inside another WSGI server, mount :func:`~celery_leaderbeat.web.make_wsgi_app`
instead.
"""

from __future__ import annotations

import logging
import socketserver
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

logger = logging.getLogger(__name__)


class ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    """A request per thread, so a slow page (or a step-down waiting for the next leader)
    holds up nobody else; the threads die with the process."""

    daemon_threads = True
    allow_reuse_address = True


class QuietHandler(WSGIRequestHandler):
    """Requests logged at DEBUG (a page polls every second), errors at WARNING."""

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)

    def log_error(self, format: str, *args: Any) -> None:
        logger.warning("%s " + format, self.address_string(), *args)


def make(wsgi_app: Any, host: str, port: int) -> ThreadingWSGIServer:
    """A server bound to ``host``:``port`` (0: any free port), not yet serving."""
    server = make_server(host, port, wsgi_app, server_class=ThreadingWSGIServer,
                         handler_class=QuietHandler)
    assert isinstance(server, ThreadingWSGIServer)
    return server

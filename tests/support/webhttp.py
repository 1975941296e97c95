"""HTTP helpers for the web view's tests: serve a WebApp on a free port, and ask it."""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from celery_leaderbeat.web import server
from celery_leaderbeat.web.wsgi import WebApp


@dataclass
class Reply:
    status: int
    headers: Any
    body: str

    def json(self) -> Any:
        return json.loads(self.body)

    def server_ms(self) -> float:
        """The app's own time for this request (its Server-Timing header)."""
        return float(self.headers["Server-Timing"].split("dur=")[1])


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def ask(url: str, *, method: str = "GET", auth: str | None = None,
        form: dict[str, str] | None = None, headers: dict[str, str] | None = None) -> Reply:
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if auth:
        request.add_header("Authorization", auth)
    try:
        with _opener.open(request, timeout=30) as response:
            return Reply(response.status, response.headers, response.read().decode())
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, exc.headers, exc.read().decode())


@contextmanager
def serving(app: WebApp) -> Iterator[str]:
    """``app`` on 127.0.0.1 and a free port, in a thread; yields its base URL."""
    httpd = server.make(app, "127.0.0.1", 0)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)

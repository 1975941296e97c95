"""The standalone view as a WSGI application: :func:`make_wsgi_app`.

    GET  /                     the cluster: leader, epoch, lease, nodes, store
    GET  /entries              the entries, a page at a time (?offset, limit, q, state)
    GET  /entries/NAME         one entry and its slots' history
    GET  /history              the newest history events (?count, entry)
    GET  /api/...              the same as JSON, in the CLI's --json shapes: cluster,
                               status, nodes, history, health, entries/NAME, csrf
    POST /actions/ACTION       a page's form (303 back to the page)
    POST /api/ACTION           the same, answering the CLI's --json (form or JSON body)

Any page with ``?_live=1`` answers only its live part (what the script polls).
Safe by default: read-only unless ``enable_actions``; actions need ``token`` (a
bearer token, or HTTP basic with any user name and the token as password, the user
name then recorded in the audit event) and a CSRF token (the form's hidden field, or
the ``X-CSRF-Token`` header, from ``GET /api/csrf``); a POST from another origin is
refused. Mount it anywhere: every link is built under ``SCRIPT_NAME``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import json
import secrets
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ..errors import ConfigurationError, EntryNotFound, LeaderbeatError
from ..ops.cluster import Cluster
from ..store.base import STORE_ERRORS
from . import assets, pages
from .actions import ACTIONS, ActionRefused, Operator, run
from .model import ClusterView, public

StartResponse = Callable[..., Any]

#: ms between two polls of a page's live part
POLL_MS = {"cluster": 1000, "entries": 2000, "entry": 2000, "history": 2000}
#: a request body larger than this is refused (a form has a name and a note)
BODY_MAX = 64 * 1024
#: a page shows at most this many entries
PAGE_MAX = 500
#: an operator's name (HTTP basic user) is cut to this many characters
NAME_MAX = 64
#: the environment variable ``leaderbeat web`` reads the token from
TOKEN_ENV = "LEADERBEAT_WEB_TOKEN"

_SECURITY_HEADERS = [
    ("Content-Security-Policy", ("default-src 'self'; frame-ancestors 'none'; "
                                "base-uri 'none'; form-action 'self'")),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
]


class HTTPError(Exception):
    """A refusal: its status and one line saying why."""

    def __init__(self, status: int, message: str, headers: Iterable[tuple[str, str]] = ()):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, list(headers)


class Request:
    """What one request asks: method, path under the mount, query, and its body's form."""

    def __init__(self, environ: dict[str, Any]) -> None:
        self.environ = environ
        self.method = environ.get("REQUEST_METHOD", "GET").upper()
        self.base = environ.get("SCRIPT_NAME", "").rstrip("/")
        self.path = environ.get("PATH_INFO", "") or "/"
        self.query = dict(parse_qsl(environ.get("QUERY_STRING", "")))

    def header(self, name: str) -> str:
        return str(self.environ.get("HTTP_" + name.upper().replace("-", "_"), ""))

    def form(self) -> dict[str, str]:
        """The body as fields: a urlencoded form, or a JSON object of strings."""
        try:
            length = int(self.environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise HTTPError(400, "Content-Length is not a number") from None
        if length > BODY_MAX:
            raise HTTPError(413, f"the body is {length} bytes: at most {BODY_MAX}")
        raw = self.environ["wsgi.input"].read(length) if length else b""
        if self.environ.get("CONTENT_TYPE", "").startswith("application/json"):
            try:
                data = json.loads(raw or b"{}")
            except ValueError:
                raise HTTPError(400, "the body is not JSON") from None
            if not isinstance(data, dict):
                raise HTTPError(400, "the body must be a JSON object of fields")
            return {str(k): str(v) for k, v in data.items()}
        return dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))


class Links:
    """The standalone app's URLs, under where it is mounted."""

    def __init__(self, base: str) -> None:
        self.base = base

    def cluster(self) -> str:
        return self.base + "/"

    def entries(self, **params: Any) -> str:
        return self.base + "/entries" + pages.query_string(**params)

    def entry(self, name: str) -> str:
        return f"{self.base}/entries/{pages.quoted(name)}"

    def history(self) -> str:
        return self.base + "/history"

    def action(self, action: str) -> str:
        return f"{self.base}/actions/{action}"


class WebApp:
    """The WSGI callable; see the module's docstring."""

    def __init__(self, cluster: Cluster, *, enable_actions: bool = False,
                 token: str | None = None) -> None:
        if enable_actions and not token:
            raise ConfigurationError(
                "enable_actions=True needs a token (--token or the environment variable "
                f"{TOKEN_ENV}): actions must be authenticated")
        self.view = ClusterView(cluster)
        self.enable_actions = enable_actions
        self.token = token
        self._secret = secrets.token_bytes(32)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse
                 ) -> list[bytes]:
        started = time.perf_counter()
        request = Request(environ)
        try:
            try:
                who = self._authenticate(request)
                status, content_type, body, headers = self._route(request, who)
            except STORE_ERRORS as exc:
                raise HTTPError(503, f"Redis unreachable: {exc}") from exc
            except LeaderbeatError as exc:
                raise HTTPError(500, f"{type(exc).__name__}: {exc}") from exc
        except HTTPError as exc:
            status, headers = exc.status, exc.headers
            content_type, body = self._error_body(request, exc.status, exc.message)
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body))),
                   *_SECURITY_HEADERS, *headers,
                   ("Server-Timing", f"app;dur={(time.perf_counter() - started) * 1000:.1f}")]
        start_response(_STATUS.get(status, f"{status} Error"), headers)
        return [body]

    # -- who is asking -------------------------------------------------------------------

    def _authenticate(self, request: Request) -> str:
        """The operator's name; 401 when a token is set and the request does not carry it.

        Without a token, only a request addressed to an IP address or localhost is
        answered: a page of another site that rebinds its own host name to 127.0.0.1
        cannot read this one."""
        if self.token is None:
            host = request.header("Host") or request.environ.get("SERVER_NAME", "")
            if not _addressed_by_ip(host):
                raise HTTPError(403, f"without a token this view answers only requests to an "
                                     f"IP address or localhost, not to {host!r}: open it by "
                                     "address, or start it with a token")
            return "anonymous"
        kind, _, credential = request.header("Authorization").partition(" ")
        if kind.lower() == "bearer" and _same(credential.strip(), self.token):
            return "bearer token"
        if kind.lower() == "basic":
            try:
                user, _, password = base64.b64decode(credential.strip()).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                user, password = "", ""
            if _same(password, self.token):
                return "".join(c for c in user if c.isprintable())[:NAME_MAX] or "operator"
        raise HTTPError(401, "this view needs the token: HTTP basic (any user name, the "
                             "token as password) or 'Authorization: Bearer <token>'",
                        [("WWW-Authenticate", 'Basic realm="leaderbeat", charset="UTF-8"')])

    def csrf_token(self, who: str) -> str:
        return hmac.new(self._secret, f"csrf|{who}".encode(), "sha256").hexdigest()[:32]

    def viewer(self, who: str) -> pages.Viewer:
        return pages.Viewer(self.enable_actions, "csrf",
                            self.csrf_token(who) if self.enable_actions else "",
                            "" if who == "anonymous" else who)

    # -- routing -------------------------------------------------------------------------

    def _route(self, request: Request, who: str) -> tuple[int, str, bytes, list[Any]]:
        path = request.path
        if request.method == "POST":
            return self._post(request, who)
        if request.method not in ("GET", "HEAD"):
            raise HTTPError(405, f"{request.method} is not allowed here: GET, or POST for "
                                 "an action", [("Allow", "GET, HEAD, POST")])
        if path.startswith("/static/"):
            return self._static(path)
        if path.startswith("/api/"):
            return 200, "application/json", _json(self._api_get(request, who)), []
        return 200, "text/html; charset=utf-8", self._page(request, who).encode(), []

    def _static(self, path: str) -> tuple[int, str, bytes, list[Any]]:
        if path == "/static/web.js":
            return 200, "text/javascript; charset=utf-8", assets.SCRIPT.encode(), []
        if path == "/static/web.css":
            return 200, "text/css; charset=utf-8", (assets.FRAME_STYLE + assets.STYLE).encode(), []
        raise HTTPError(404, f"no file {path}")

    def _api_get(self, request: Request, who: str) -> Any:
        view, path, query = self.view, request.path[len("/api"):], request.query
        if path == "/cluster":
            return self.view.overview()
        if path == "/status":
            return view.page(*_paging(query), query.get("q", ""), query.get("state", "")
                             ).as_json()
        if path == "/nodes":
            return view.nodes()
        if path == "/history":
            return view.cluster.history(_int(query, "count", 50, 1, 10_000),
                                        query.get("entry") or None)
        if path == "/health":
            leader = public(self.view.cluster.leader())
            return {"healthy": leader is not None, "leader": leader,
                    "reason": (f"{leader['node']} leads (epoch {leader['epoch']})" if leader
                               else "no beat holds the lease")}
        if path == "/csrf":
            if not self.enable_actions:
                raise HTTPError(403, "read-only: this view was started without actions")
            return {"csrf": self.csrf_token(who), "field": "csrf", "header": "X-CSRF-Token"}
        if path.startswith("/entries/"):
            return entry_or_404(self.view, unquote(path[len("/entries/"):]))
        raise HTTPError(404, f"no API {request.path}")

    def _page(self, request: Request, who: str) -> str:
        """A whole page, or with ``?_live=1`` only its live part."""
        path, query = request.path, request.query
        if path == "/":
            kind, name = "cluster", ""
        elif path in ("/entries", "/history"):
            kind, name = path[1:], ""
        elif path.startswith("/entries/"):
            kind, name = "entry", unquote(path[len("/entries/"):])
        else:
            raise HTTPError(404, f"no page {path}")
        viewer = self.viewer(who)
        title, content, above, below = parts(self.view, kind, name, query,
                                             Links(request.base), viewer)
        if query.get("_live"):
            return content
        live_url = request.base + path + pages.query_string(**{**query, "_live": "1"})
        body = pages.message(query.get("done", "")) + above + pages.live(content) + below
        return pages.document(title, body, base=request.base, live_url=live_url,
                              every_ms=POLL_MS[kind], viewer=viewer)

    # -- actions -------------------------------------------------------------------------

    def _post(self, request: Request, who: str) -> tuple[int, str, bytes, list[Any]]:
        if not self.enable_actions:
            raise HTTPError(403, "read-only: this view was started without --enable-actions")
        origin = request.header("Origin")
        if origin and origin != "null" and urlsplit(origin).netloc != request.header("Host"):
            raise HTTPError(403, f"a POST from another origin ({origin}) is refused")
        form = request.form()
        sent = form.pop("csrf", "") or request.header("X-CSRF-Token")
        if not _same(sent, self.csrf_token(who)):
            raise HTTPError(403, "the CSRF token is missing or wrong: reload the page "
                                 "(API: GET /api/csrf, then send it as X-CSRF-Token)")
        api, _, action = request.path.strip("/").partition("/")
        if api not in ("api", "actions") or action not in ACTIONS:
            raise HTTPError(404, f"no action {request.path}: one of {', '.join(ACTIONS)}")
        try:
            answer = run(self.view.cluster, Operator(who, "web"), action, form)
        except EntryNotFound as exc:
            raise HTTPError(404, str(exc)) from None
        except ActionRefused as exc:
            raise HTTPError(exc.status, str(exc)) from None
        if api == "api":
            return 200, "application/json", _json(answer), []
        links = Links(request.base)
        back = (links.cluster() if action == "step-down" else links.entry(form["name"]))
        return 303, "text/plain; charset=utf-8", b"done", [
            ("Location", back + pages.query_string(done=action))]

    def _error_body(self, request: Request, status: int, message: str) -> tuple[str, bytes]:
        if request.path.startswith("/api/"):
            return "application/json", _json({"error": {"status": status, "message": message}})
        page = (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
                f'<title>{status} · leaderbeat</title></head><body>'
                f'<p class="error" id="error">{pages.esc(message)}</p>'
                f'<p><a href="{pages.attr(request.base)}/">Back to the cluster</a></p>'
                "</body></html>")
        return "text/html; charset=utf-8", page.encode()


def make_wsgi_app(app: Any, *, enable_actions: bool = False, token: str | None = None,
                  cluster: Cluster | None = None) -> WebApp:
    """The view of ``app``'s cluster as a WSGI application (mount it anywhere).

    Read-only unless ``enable_actions``, which needs ``token``: see the module's
    docstring for how requests carry it."""
    return WebApp(cluster or Cluster(app), enable_actions=enable_actions, token=token)


def parts(view: ClusterView, kind: str, name: str, query: dict[str, str], links: Any,
          viewer: pages.Viewer) -> tuple[str, str, str, str]:
    """A page's title, its live part, and what goes above and below that (filters,
    forms); ``kind`` is cluster, entries, entry (``name``) or history."""
    if kind == "cluster":
        return ("Cluster", pages.cluster_live(view.overview()), "",
                pages.step_down_form(links, viewer))
    if kind == "entries":
        (offset, limit), q, state = _paging(query), query.get("q", ""), query.get("state", "")
        return ("Entries",
                pages.entries_live(view.page(offset, limit, q, state), links, q, state),
                pages.entries_filter(links, q, state, limit), "")
    if kind == "entry":
        return (name, pages.entry_live(entry_or_404(view, name)), "",
                pages.entry_forms(name, links, viewer))
    rows = view.cluster.history(_int(query, "count", 200, 1, 10_000),
                                query.get("entry") or None)
    return "History", pages.history_table(reversed(rows)), "", ""


def entry_or_404(view: ClusterView, name: str) -> dict[str, Any]:
    try:
        return view.entry(name)
    except EntryNotFound as exc:
        raise HTTPError(404, str(exc)) from None


def _addressed_by_ip(host: str) -> bool:
    """Is ``host`` (a Host header: name, IPv4 or [IPv6], maybe a port) an IP or localhost?"""
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    name = name.strip("[]").split("]")[0]
    if name.lower() in ("localhost", ""):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _int(query: dict[str, str], field: str, default: int, low: int, high: int) -> int:
    raw = query.get(field)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HTTPError(400, f"{field}={raw!r} is not a whole number") from None
    if not low <= value <= high:
        raise HTTPError(400, f"{field}={value} must be between {low} and {high}")
    return value


def _paging(query: dict[str, str]) -> tuple[int, int]:
    return _int(query, "offset", 0, 0, 10**9), _int(query, "limit", 50, 1, PAGE_MAX)


def _json(data: Any) -> bytes:
    return json.dumps(data, indent=2, default=str).encode()


_STATUS = {200: "200 OK", 303: "303 See Other", 400: "400 Bad Request",
           401: "401 Unauthorized", 403: "403 Forbidden", 404: "404 Not Found",
           405: "405 Method Not Allowed", 409: "409 Conflict",
           413: "413 Payload Too Large", 500: "500 Internal Server Error",
           503: "503 Service Unavailable"}

__all__ = ["TOKEN_ENV", "WebApp", "make_wsgi_app"]

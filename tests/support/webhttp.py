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
    except urllib.error.URLError as exc:
        return Reply(0, {}, str(exc.reason))


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


class Session:
    """A browser-like HTTP client for a Django site: cookies kept, CSRF token read from
    the cookie, redirects not followed."""

    def __init__(self, base: str) -> None:
        import http.cookiejar

        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar),
                                                  _NoRedirect)

    def csrf(self) -> str:
        return next((c.value for c in self.jar if c.name == "csrftoken"), "")

    def ask(self, path: str, form: dict[str, str] | None = None) -> Reply:
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        request = urllib.request.Request(self.base + path, data=data,
                                         headers={"Referer": self.base + path})
        try:
            with self.opener.open(request, timeout=30) as response:
                return Reply(response.status, response.headers, response.read().decode())
        except urllib.error.HTTPError as exc:
            return Reply(exc.code, exc.headers, exc.read().decode())

    def login(self, user: str, password: str) -> None:
        self.ask("/admin/login/")
        reply = self.ask("/admin/login/?next=/admin/", {
            "username": user, "password": password, "csrfmiddlewaretoken": self.csrf(),
            "next": "/admin/"})
        assert reply.status == 302, f"login of {user} failed: {reply.status} {reply.body[:300]}"


#: the users of the admin site: name -> the leaderbeat_admin permissions they hold
ADMIN_USERS = {"viewer": ["view_cluster"],
               "operator": ["view_cluster", "pause_entry", "resume_entry"],
               "root": None}  # a superuser
ADMIN_PASSWORD = "pw-for-tests"

_MAKE_USERS = """
import django, json, sys
django.setup()
from django.contrib.auth.models import Permission, User
for name, perms in json.loads(sys.argv[1]).items():
    if perms is None:
        User.objects.create_superuser(name, "", sys.argv[2])
        continue
    user = User.objects.create_user(name, "", sys.argv[2], is_staff=True)
    user.user_permissions.set(Permission.objects.filter(
        content_type__app_label="leaderbeat_admin", codename__in=perms))
"""


@contextmanager
def admin_site(directory: Any, redis_url: str, prefix: str) -> Iterator[str]:
    """The Django site of tests/test_web_admin_site.py, migrated, with
    :data:`ADMIN_USERS`, served by ``runserver`` on a free port; yields its base URL."""
    import os
    import socket
    import subprocess
    import sys
    import time

    from tests.support.beat import REPO_ROOT

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "LB_REDIS_URL": redis_url,
           "LB_PREFIX": prefix, "LB_SQLITE": str(directory / "admin.sqlite3"),
           "DJANGO_SETTINGS_MODULE": "tests.test_web_admin_site"}
    run: dict[str, Any] = {"cwd": REPO_ROOT, "env": env, "timeout": 120}
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v0"], check=True, **run)
    subprocess.run([sys.executable, "-c", _MAKE_USERS, json.dumps(ADMIN_USERS),
                    ADMIN_PASSWORD], check=True, **run)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = open(directory / "runserver.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen([sys.executable, "-m", "django", "runserver", "--noreload", "--insecure",
                               f"127.0.0.1:{port}"], cwd=REPO_ROOT, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while ask(base + "/admin/login/").status != 200:
            assert server.poll() is None and time.monotonic() < deadline, (
                (directory / "runserver.log").read_text())
            time.sleep(0.2)
        yield base
    finally:
        server.terminate()
        server.wait(10)
        log.close()

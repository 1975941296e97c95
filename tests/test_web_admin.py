"""The web view in Django's admin, served by ``runserver`` over a real Redis: Django's
sign-in, its CSRF check, and a permission per action.

The site is tests/test_web_admin_site.py (SQLite, django-celery-beat installed).
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("django_celery_beat", reason="needs the django extra")

from celery_leaderbeat.ops.cluster import Cluster
from tests.support.webhttp import ADMIN_PASSWORD, Session, admin_site
from tests.test_web_admin_site import celery_app

pytestmark = pytest.mark.slow

BASE = "/admin/leaderbeat_admin/cluster/"
ENTRY = BASE + "entries/nightly%20report/"


@pytest.fixture
def site(tmp_path, redis_server, key_prefix, monkeypatch):
    monkeypatch.setitem(celery_app.conf, "leaderbeat_redis_url", redis_server.url)
    monkeypatch.setitem(celery_app.conf, "leaderbeat_key_prefix", key_prefix)
    with admin_site(tmp_path, redis_server.url, key_prefix) as base:
        yield base, Cluster(celery_app)


def signed_in(base: str, user: str) -> Session:
    session = Session(base)
    session.login(user, ADMIN_PASSWORD)
    return session


def test_the_admin_pages_need_a_signed_in_user_with_the_view_permission(site):
    base, _ = site
    assert Session(base).ask(BASE).status == 302  # to the login page
    viewer = signed_in(base, "viewer")
    cluster = viewer.ask(BASE)
    assert cluster.status == 200 and "No leader" in cluster.body
    assert 'href="/admin/django_celery_beat/periodictask/"' in cluster.body
    entries = viewer.ask(BASE + "entries/")
    assert "Entries 1–1 of 1" in entries.body and f'href="{ENTRY}"' in entries.body
    entry = viewer.ask(ENTRY)
    assert entry.status == 200 and "<form method=\"post\"" not in entry.body
    assert viewer.ask(BASE + "entries/?_live=1").body.startswith('<p class="summary"')
    assert viewer.ask(BASE + "entries/no%20such/").status == 404
    index = viewer.ask("/admin/")
    assert "Leaderbeat" in index.body and BASE in index.body


def test_each_action_needs_its_permission_and_django_s_csrf_token(site):
    base, cluster = site
    viewer = signed_in(base, "viewer")
    viewer.ask(ENTRY)
    form = {"name": "nightly report", "note": "month end"}
    refused = viewer.ask(BASE + "actions/pause/", {**form, "csrfmiddlewaretoken": viewer.csrf()})
    assert refused.status == 403
    operator = signed_in(base, "operator")
    page = operator.ask(ENTRY)
    assert re.findall(r'class="action" id="(\w+)-form"', page.body) == ["pause", "resume"]
    assert operator.ask(BASE + "actions/pause/", form).status == 403  # no CSRF token
    assert cluster.paused() == {}
    done = operator.ask(BASE + "actions/pause/", {**form, "csrfmiddlewaretoken": operator.csrf()})
    assert done.status == 302 and done.headers["Location"] == ENTRY + "?done=pause"
    assert cluster.paused()["nightly report"]["note"] == "month end"
    assert "Paused: its slots are skipped" in operator.ask(ENTRY + "?done=pause").body
    no_trigger = operator.ask(BASE + "actions/trigger/",
                              {**form, "csrfmiddlewaretoken": operator.csrf()})
    assert no_trigger.status == 403 and cluster.store.requests.pop() == []
    root = signed_in(base, "root")
    root.ask(ENTRY)
    assert root.ask(BASE + "actions/resume/", {"name": "nightly report",
                                               "csrfmiddlewaretoken": root.csrf()}).status == 302
    assert cluster.paused() == {}
    audits = [(e["detail"], e["node"].split("@")[0]) for e in cluster.history(50)
              if e.get("event") == "audit"]
    assert audits == [("pause by operator via django-admin: month end",
                       "django-admin:operator"),
                      ("resume by root via django-admin", "django-admin:root")]

"""The web view over real HTTP on a real Redis, in this process: who may do what, what
every action writes, what the pages and the JSON API show, and paging.

The browser and the beats are in test_web_browser.py; the Django admin in
test_web_admin.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta

import pytest
from celery import Celery

from celery_leaderbeat.errors import ConfigurationError
from celery_leaderbeat.ops.cluster import Cluster
from celery_leaderbeat.store.dynamic import Entry
from celery_leaderbeat.web import make_wsgi_app
from celery_leaderbeat.web.model import ClusterView, slots_of
from tests.support.beat import NOOP, REPO_ROOT, beat_env
from tests.support.webhttp import ask, basic, serving

TOKEN = "correct horse battery staple"
ALICE = basic("alice", TOKEN)
XSS = "<script>alert(1)</script>"


def make_app(redis_url: str, prefix: str, n: int = 3, extra: dict | None = None) -> Celery:
    app = Celery("webtest")
    schedule = {f"job-{i:05d}": {"task": NOOP, "schedule": timedelta(seconds=60)}
                for i in range(n)}
    app.conf.update(broker_url="memory://", timezone="UTC", leaderbeat_redis_url=redis_url,
                    leaderbeat_key_prefix=prefix, beat_schedule={**schedule, **(extra or {})})
    return app


@pytest.fixture
def app(shared_redis, key_prefix):
    return make_app(shared_redis.url, key_prefix)


def csrf_of(page: str) -> str:
    return re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)


def audit_events(cluster: Cluster, entry: str = "") -> list[dict]:
    return [e for e in cluster.history(100) if e.get("event") == "audit"
            and e.get("entry", "") == entry]


def test_a_read_only_view_refuses_every_post_with_403_and_changes_nothing(app):
    cluster = Cluster(app)
    with serving(make_wsgi_app(app)) as url:
        page = ask(url + "/entries/job-00001")
        assert page.status == 200 and "<form method=\"post\"" not in page.body
        for path in ("/actions/pause", "/api/pause", "/actions/step-down", "/api/trigger"):
            forged = ask(url + path, method="POST", form={"name": "job-00001", "note": "x",
                                                          "csrf": "0" * 32})
            assert forged.status == 403, (path, forged.body)
            assert "read-only" in forged.body
        assert ask(url + "/api/csrf").status == 403
    assert cluster.paused() == {}
    assert cluster.store.requests.pop() == []
    assert audit_events(cluster, "job-00001") == []


def test_actions_need_the_token_and_the_csrf_token_of_the_page(app):
    cluster = Cluster(app)
    with serving(make_wsgi_app(app, enable_actions=True, token=TOKEN)) as url:
        anonymous = ask(url + "/")
        assert anonymous.status == 401
        assert anonymous.headers["WWW-Authenticate"].startswith("Basic")
        assert ask(url + "/", auth=basic("alice", "wrong")).status == 401
        assert ask(url + "/api/cluster", auth="Bearer " + TOKEN).status == 200
        page = ask(url + "/entries/job-00001", auth=ALICE)
        assert page.status == 200 and "signed in as alice" in page.body
        form = {"name": "job-00001", "note": "deploy freeze"}
        without = ask(url + "/actions/pause", method="POST", auth=ALICE, form=form)
        wrong = ask(url + "/actions/pause", method="POST", auth=ALICE,
                    form={**form, "csrf": "f" * 32})
        # bob's token is not alice's: the CSRF token is bound to who signs in
        bobs = csrf_of(ask(url + "/entries/job-00001", auth=basic("bob", TOKEN)).body)
        as_bob = ask(url + "/actions/pause", method="POST", auth=ALICE,
                     form={**form, "csrf": bobs})
        elsewhere = ask(url + "/actions/pause", method="POST", auth=ALICE,
                        form={**form, "csrf": csrf_of(page.body)},
                        headers={"Origin": "https://evil.example"})
        for refused in (without, wrong, as_bob, elsewhere):
            assert refused.status == 403, refused.body
        assert cluster.paused() == {}
        done = ask(url + "/actions/pause", method="POST", auth=ALICE,
                   form={**form, "csrf": csrf_of(page.body)})
        assert done.status == 303
        assert done.headers["Location"] == "/entries/job-00001?done=pause"
    assert cluster.paused()["job-00001"]["note"] == "deploy freeze"


def test_mounted_under_a_path_every_link_and_form_stays_under_it(app):
    view = make_wsgi_app(app, enable_actions=True, token=TOKEN)

    def mounted(environ, start_response):
        path = environ["PATH_INFO"]
        if not path.startswith("/ops/leaderbeat"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"the main application"]
        environ = {**environ, "SCRIPT_NAME": "/ops/leaderbeat",
                   "PATH_INFO": path[len("/ops/leaderbeat"):]}
        return view(environ, start_response)

    with serving(mounted) as url:
        page = ask(url + "/ops/leaderbeat/entries/job-00001", auth=ALICE).body
        links = re.findall(r'(?:href|action|src|data-live)="([^"]+)"', page)
        assert links and all(link.startswith("/ops/leaderbeat/") for link in links), links
        assert ask(url + "/ops/leaderbeat/static/web.js", auth=ALICE).status == 200
        done = ask(url + "/ops/leaderbeat/actions/resume", method="POST", auth=ALICE,
                   form={"name": "job-00001", "csrf": csrf_of(page)})
        assert done.headers["Location"] == "/ops/leaderbeat/entries/job-00001?done=resume"


def test_the_entries_show_each_schedule_as_people_read_it(shared_redis, key_prefix):
    from celery.schedules import crontab

    from celery_leaderbeat import cron

    app = make_app(shared_redis.url, key_prefix, n=1, extra={
        "cleanup": {"task": NOOP, "schedule": crontab(minute="*/5")},
        "report": {"task": NOOP, "schedule": cron("0 3 * * *")}})
    with serving(make_wsgi_app(app)) as url:
        rows = {r["entry"]: r["schedule"] for r in ask(url + "/api/status").json()["entries"]}
        page = ask(url + "/entries").body
        entry = ask(url + "/api/entries/report").json()
    assert rows == {"cleanup": "crontab: */5 * * * * (m/h/dM/MY/d)", "job-00000": "every 60 s",
                    "report": "cron: '0 3 * * *'"}
    assert "<td>every 60 s</td>" in page and entry["schedule"] == "cron: '0 3 * * *'"


def test_without_a_token_only_requests_to_an_address_are_answered(app):
    """A page of another site whose name it rebinds to 127.0.0.1 cannot read the view."""
    with serving(make_wsgi_app(app)) as url:
        port = url.rsplit(":", 1)[1]
        rebound = ask(url + "/api/status", headers={"Host": f"evil.example:{port}"})
        assert rebound.status == 403 and "start it with a token" in rebound.body
        assert ask(url + "/api/status", headers={"Host": f"localhost:{port}"}).status == 200
    with serving(make_wsgi_app(app, token=TOKEN)) as url:
        by_name = ask(url + "/api/status", auth=ALICE, headers={"Host": "beat-host:8400"})
        assert by_name.status == 200


def test_actions_without_a_token_cannot_be_enabled(app):
    with pytest.raises(ConfigurationError, match="needs a token"):
        make_wsgi_app(app, enable_actions=True)


def test_each_action_answers_as_the_cli_and_writes_who_asked_into_the_history(app):
    cluster = Cluster(app)
    with serving(make_wsgi_app(app, enable_actions=True, token=TOKEN)) as url:
        csrf = ask(url + "/api/csrf", auth=ALICE).json()["csrf"]

        def act(action: str, **form: str):
            return ask(f"{url}/api/{action}", method="POST", auth=ALICE,
                       form=form, headers={"X-CSRF-Token": csrf})

        paused = act("pause", name="job-00002", note="vendor outage")
        assert paused.json() == {"paused": "job-00002", "note": "vendor outage"}
        assert cluster.paused()["job-00002"]["note"] == "vendor outage"
        assert ask(url + "/api/status", auth=ALICE).json()["entries"][2]["paused"]["note"] == \
            "vendor outage"
        assert act("resume", name="job-00002").json() == {"resumed": "job-00002",
                                                           "was_paused": True}
        assert cluster.paused() == {}
        triggered = act("trigger", name="job-00002", note="rerun").json()
        assert triggered["triggered"] == "job-00002" and triggered["leader"] is None
        queued = [json.loads(r) for r in cluster.store.requests.pop()]
        assert [(r["op"], r["entry"], r["id"], r["note"]) for r in queued] == [
            ("trigger", "job-00002", triggered["request"], "rerun")]
        # no slot yet, so no phase to count the interval's slots from: refused as by the CLI
        backfill = act("backfill", name="job-00002", **{"from": "2020-01-01T00:00:00Z",
                                                         "to": "2020-01-01T01:00:00Z"})
        assert backfill.status == 409 and "phase of its interval is unknown" in backfill.body
        assert act("step-down").status == 409  # no leader: nothing to step down
    details = [e["detail"] for e in audit_events(cluster, "job-00002")]
    assert details == ["pause by alice via web: vendor outage", "resume by alice via web",
                       "trigger by alice via web: rerun"]
    assert all(e["node"].startswith("web:alice@") for e in audit_events(cluster, "job-00002"))


def test_no_action_runs_on_a_name_that_is_no_entry_nor_on_a_field_it_does_not_know(app):
    cluster = Cluster(app)
    with serving(make_wsgi_app(app, enable_actions=True, token=TOKEN)) as url:
        csrf = ask(url + "/api/csrf", auth=ALICE).json()["csrf"]
        headers = {"X-CSRF-Token": csrf}
        unknown = ask(url + "/api/trigger", method="POST", auth=ALICE, headers=headers,
                      form={"name": "job-0001", "note": ""})
        assert unknown.status == 404 and "job-00001" in unknown.json()["error"]["message"]
        assert ask(url + "/api/run-task", method="POST", auth=ALICE, headers=headers,
                   form={"name": "job-00001", "task": "os.system"}).status == 404
        long_note = ask(url + "/api/pause", method="POST", auth=ALICE, headers=headers,
                        form={"name": "job-00001", "note": "x" * 501})
        assert long_note.status == 400 and "at most 500" in long_note.body
        assert ask(url + "/entries/job-0001", auth=ALICE).status == 404
    assert cluster.store.requests.pop() == [] and cluster.paused() == {}


def test_every_name_and_note_on_a_page_is_html_escaped(shared_redis, key_prefix):
    app = make_app(shared_redis.url, key_prefix, extra={XSS: {"task": NOOP, "schedule": 60.0}})
    Cluster(app).pause(XSS, '<img src=x onerror="alert(2)">')
    with serving(make_wsgi_app(app)) as url:
        pages = [ask(url + path).body for path in (
            "/entries", "/entries?q=%3Cscript", "/entries/%3Cscript%3Ealert(1)%3C%2Fscript%3E",
            "/history", "/entries?q=%22%3E%3Cb%3E")]
    assert all("<script>alert" not in page and "<img src=x" not in page for page in pages)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[0]
    assert "&lt;img src=x onerror=&quot;alert(2)&quot;&gt;" in pages[2]
    assert 'value="&quot;&gt;&lt;b&gt;"' in pages[4]


def comparable(rows: list[dict]) -> list[dict]:
    """Rows with next_due within a second: an entry with no slot yet is next due an
    interval from now, and two reads are a few ms apart."""
    return [{**row, "next_due": row["next_due"] and Near(datetime.fromisoformat(row["next_due"]))}
            for row in rows]


class Near:
    def __init__(self, moment: datetime) -> None:
        self.moment = moment

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Near) and abs(self.moment - other.moment) < timedelta(seconds=1)

    def __repr__(self) -> str:
        return f"~{self.moment.isoformat()}"


def test_a_page_of_rows_is_what_status_shows_for_those_entries(app):
    Entry("runtime-one", NOOP, 30).save(app)
    cluster = Cluster(app)
    cluster.pause("job-00001", "why not")
    view = ClusterView(cluster)
    expected = comparable(cluster.entries())
    assert comparable(view.page(0, 50).entries) == expected
    assert [r["source"] for r in expected] == ["static", "static", "static", "dynamic"]
    assert comparable(view.page(1, 2).entries) == expected[1:3]
    assert comparable(view.page(0, 50, state="paused").entries) == [expected[1]]
    assert comparable(view.page(0, 50, query="RUNTIME").entries) == [expected[3]]


def test_each_slot_reads_as_its_last_event_with_who_sent_it_and_why():
    def event(n: int, kind: str, slot: str, detail: str = "", node: str = "a") -> dict:
        return {"id": f"{n}-0", "time": f"t{n}", "event": kind, "entry": "e", "slot": slot,
                "node": node, "epoch": "1", "detail": detail}

    history = [event(1, "sent", "s1"), event(2, "sent", "s2", "rescued", "b"),
               event(3, "missed", "s3", "outside the catch-up window (3600 s)"),
               event(4, "skipped", "s4", "paused"), event(5, "sent", "s4", "backfill r1"),
               event(6, "sent", "s5", "recovered"), event(7, "unsent", "s6", "lease expired"),
               {"id": "8-0", "time": "t8", "event": "audit", "entry": "e",
                "detail": "pause by alice via web"}]
    slots = {s["slot"]: (s["outcome"], s["detail"], s["node"]) for s in slots_of(history)}
    assert slots == {"s1": ("sent", "", "a"), "s2": ("rescued", "rescued", "b"),
                     "s3": ("missed", "outside the catch-up window (3600 s)", "a"),
                     "s4": ("backfilled", "backfill r1", "a"), "s5": ("recovered", "recovered", "a"),
                     "s6": ("unsent", "lease expired", "a")}
    assert [s["slot"] for s in slots_of(history)] == ["s6", "s5", "s4", "s3", "s2", "s1"]


def test_ten_thousand_entries_are_shown_a_page_at_a_time(shared_redis, key_prefix):
    app = make_app(shared_redis.url, key_prefix, n=10_000)
    with serving(make_wsgi_app(app)) as url:
        first = ask(url + "/entries")
        last = ask(url + "/entries?offset=9950&limit=50")
        found = ask(url + "/api/status?q=job-0999&limit=5").json()
    assert "Entries 1–50 of 10000" in first.body and 'rel="next"' in first.body
    assert first.body.count('<a href="/entries/job-') == 50
    assert "Entries 9951–10000 of 10000" in last.body and 'rel="next"' not in last.body
    assert (found["total"], [r["entry"] for r in found["entries"]]) == (
        10, [f"job-0999{i}" for i in range(5)])
    print(f"entries page at 10,000 entries: {first.server_ms():.1f} ms (first), "
          f"{last.server_ms():.1f} ms (last page)")


def test_the_web_command_serves_until_stopped_and_refuses_actions_without_a_token(
        tmp_path, shared_redis, key_prefix):
    env = {**os.environ, **beat_env(tmp_path, broker_url="memory://", redis_url=shared_redis.url,
                                    prefix=key_prefix, schedule={"tick": {"task": NOOP,
                                                                          "every": 5}}),
           "PYTHONPATH": str(REPO_ROOT)}
    env.pop("LEADERBEAT_WEB_TOKEN", None)
    command = [sys.executable, "-m", "celery", "-A", "tests.support.beatapp", "leaderbeat",
               "web"]
    refused = subprocess.run([*command, "--enable-actions"], cwd=REPO_ROOT, env=env,
                             capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 64 and "--enable-actions needs --token" in refused.stderr
    with subprocess.Popen([*command, "--port", "0"], cwd=REPO_ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as served:
        try:
            line = served.stdout.readline()
            assert "read-only" in line, line
            url = re.search(r"http://127\.0\.0\.1:\d+", line).group(0)
            status = ask(url + "/api/status").json()
            assert [row["entry"] for row in status["entries"]] == ["tick"]
            assert ask(url + "/api/pause", method="POST", form={"name": "tick"}).status == 403
        finally:
            served.terminate()
            served.wait(10)

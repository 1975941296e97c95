"""Catch-up policies with real beat processes: every beat down for a while, then one back.

Four cron entries with seconds, ``*/2 * * * * *``, one per catch-up policy, run on
one beat. It is SIGKILLed right after it sent one even second; a new beat starts once
the dead one's lease has lapsed. The even seconds between are slots nobody could
send (a standby would have rescued them: the policy is for when no node was up), and
each entry's policy decides what happens to them. Every message is read back from the
broker (a Redis of its own beside the Redis store; RabbitMQ beside the PostgreSQL
store, with no Redis anywhere); every decision not to send is read back from the
store's history. Leaderbeat's and Celery's defaults throughout (lease ttl 10 s).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from tests.support.beat import NOOP, BeatProcess, Recorder, beat_env, duplicates

pytestmark = pytest.mark.slow

STEP = timedelta(seconds=2)
WINDOW = 5  # catchup_window of the "window" entry, below the ~10-11 s outage
EVEN = "*/2 * * * * *"


class RedisView:
    """The lease and the history as the Redis store keeps them."""

    def __init__(self, client, prefix: str) -> None:
        self.client, self.prefix = client, prefix

    def token(self) -> str | None:
        raw = self.client.get("{" + self.prefix + "}:leader")
        return raw.decode() if raw else None

    def history(self) -> list[dict[str, str]]:
        """Every history event, oldest first, with its stream time as ``at_ms``."""
        rows = []
        for event_id, fields in self.client.xrange("{" + self.prefix + "}:history"):
            row = {k.decode(): v.decode() for k, v in fields.items()}
            row["at_ms"] = event_id.decode().split("-")[0]
            rows.append(row)
        return rows


class PostgresView:
    """The same, as the PostgreSQL store keeps them (the ``leaderbeat`` schema)."""

    def __init__(self, conninfo: str, prefix: str) -> None:
        self.conninfo, self.prefix = conninfo, prefix

    def token(self) -> str | None:
        from tests.support.pg_beats import holder

        held = holder(self.conninfo, self.prefix)
        return f"{held[0]}|{held[1]}" if held else None

    def history(self) -> list[dict[str, str]]:
        import psycopg

        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT event, coalesce(entry, ''), coalesce(slot_ms::text, ''),"
                " coalesce(epoch::text, ''), coalesce(detail, ''),"
                " ((extract(epoch FROM at) * 1000)::bigint)::text, node"
                " FROM leaderbeat.history WHERE app = %s ORDER BY id", (self.prefix,)).fetchall()
        keys = ("event", "entry", "slot", "epoch", "detail", "at_ms", "node")
        return [dict(zip(keys, row)) for row in rows]


def wait_for_leader(view, *, other_than: str | None = None, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        token = view.token()
        if token and (other_than is None or token.split("|")[0] != other_than.split("|")[0]):
            return token
        time.sleep(0.01)
    raise AssertionError(f"no new leader within {timeout}s (old: {other_than})")


def leader_pid(token: str) -> int:
    return int(token.split("|")[0].split(":")[-2])


@pytest.fixture(params=["redis", "postgres"])
def store(request, tmp_path, key_prefix):
    """``(view, recorder, beat_env keywords)`` of either store: Redis with a broker Redis
    of its own, or a PostgreSQL cluster of the test's own with RabbitMQ (no Redis)."""
    if request.param == "redis":
        make_redis_server = request.getfixturevalue("make_redis_server")
        state, broker = make_redis_server(), make_redis_server()
        yield (RedisView(state.client(), key_prefix), Recorder(broker.client()),
               {"broker_url": broker.url_for(0), "redis_url": state.url}, {})
        return
    from tests.support.pg_beats import store_url
    from tests.support.pg_cluster import pg_cluster

    amqp = request.getfixturevalue("amqp_recorder")
    with pg_cluster() as server:
        yield (PostgresView(server.conninfo, key_prefix), amqp, {"broker_url": amqp.url},
               {"leaderbeat_store_url": store_url(server.port),
                "task_default_queue": amqp.queue})


def from_ms(ms: int | str) -> datetime:
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=int(ms))


def slot_of(message) -> datetime:
    return datetime.fromisoformat(message.slot)


def wait_for_batches(recorder: Recorder, entries: int, batches: int, timeout: float) -> None:
    """Wait until ``batches`` more whole batches (one message per entry) have arrived."""
    recorder.drain()
    start = len(recorder.messages)
    recorder.wait_for(start + entries * batches, timeout=timeout)


def test_each_policy_handles_the_slots_missed_while_every_beat_was_down(
        tmp_path, store, key_prefix):
    view, recorder, urls, store_settings = store
    schedule = {
        "all": {"task": NOOP, "cron": EVEN, "leaderbeat": {"catchup": "all"}},
        "skip": {"task": NOOP, "cron": EVEN, "leaderbeat": {"catchup": "skip"}},
        # the other spelling: per-entry options inside the entry's "options"
        "latest": {"task": NOOP, "cron": EVEN, "options": {"leaderbeat": {"catchup": "latest"}}},
        "window": {"task": NOOP, "cron": EVEN,
                   "leaderbeat": {"catchup": "all", "catchup_window": WINDOW}},
    }
    n = len(schedule)
    env = beat_env(tmp_path, **urls, prefix=key_prefix, schedule=schedule,
                   # the global default is "skip": "latest" only works as an override
                   settings={"leaderbeat_catchup": "skip", **store_settings})
    with BeatProcess(env=env, log_path=tmp_path / "old.log") as old:
        token = wait_for_leader(view)
        wait_for_batches(recorder, n, 2, timeout=20)
        # Kill right after a whole batch went out (and was recorded sent): nothing is
        # claimed-but-unsent, so every gap below is the policy's doing.
        wait_for_batches(recorder, n, 1, timeout=5)
        time.sleep(0.15)
        old.kill()
    while view.token() is not None:  # its lease lapses: ttl 10 s
        time.sleep(0.05)
    with BeatProcess(env=env, log_path=tmp_path / "new.log") as new:
        new_token = wait_for_leader(view, other_than=token)
        since = datetime.fromisoformat(
            new.wait_for_log(r"elected leader \(epoch \d+\); slots due since (\S+) are on")
            .group(1))
        deadline = time.monotonic() + 10
        while {m.entry for m in recorder.drain_all() if slot_of(m) >= since} != set(schedule):
            assert time.monotonic() < deadline, "an entry sent no on-time slot after the outage"
            time.sleep(0.05)
        assert new.alive
        logs = old.log_text() + new.log_text()
    recorder.drain()
    messages = recorder.messages
    assert duplicates(messages) == [], logs

    old_epoch, new_epoch = int(token.split("|")[1]), int(new_token.split("|")[1])
    events = view.history()
    elected = next(e for e in events if e["event"] == "elected" and int(e["epoch"]) == new_epoch)
    election = from_ms(elected["at_ms"])
    sent = {name: sorted(slot_of(m) for m in messages if m.entry == name) for name in schedule}
    old_sent = {name: sorted(slot_of(m) for m in messages
                             if m.entry == name and int(m.epoch) == old_epoch)
                for name in schedule}
    missed = {name: {from_ms(e["slot"]): e["detail"] for e in events
                     if e["event"] == "missed" and e["entry"] == name
                     and int(e["epoch"]) == new_epoch}
              for name in schedule}
    assert not [e for e in events if e["event"] == "unsent"], events

    last_old = {old_sent[name][-1] for name in schedule}
    assert len(last_old) == 1, f"the old leader's last batch was cut: {old_sent}"
    last_old_slot = last_old.pop()
    window: list[datetime] = []
    s = last_old_slot + STEP
    while s < since:
        window.append(s)
        s += STEP
    first_on_time = s
    print(f"\noutage: last slot sent by the old beat {last_old_slot:%H:%M:%S}, the new one "
          f"follows the schedule from {since:%H:%M:%S.%f}, elected {election:%H:%M:%S.%f}; "
          f"missed slots: {[f'{w:%H:%M:%S}' for w in window]}")
    for name in schedule:
        print(f"  {name:7s} sent in window: {[f'{w:%S}' for w in window if w in sent[name]]}, "
              f"recorded missed: { {f'{k:%S}': v for k, v in sorted(missed[name].items())} }")
    assert len(window) >= 4, "the outage should hold at least four missed slots"

    for name in schedule:
        # Whatever the policy, the first on-time slot after the election is sent.
        assert first_on_time in sent[name], (name, first_on_time, sent[name])
        # Nothing outside the window is recorded missed.
        assert set(missed[name]) <= set(window), (name, missed[name])

    # all: each missed slot sent once, oldest first; no gap in the whole sequence.
    assert [w for w in window if w in sent["all"]] == window
    assert all(b - a == STEP for a, b in zip(sent["all"], sent["all"][1:])), sent["all"]
    assert missed["all"] == {}
    new_all = [slot_of(m) for m in messages if m.entry == "all" and int(m.epoch) == new_epoch]
    assert new_all == sorted(new_all), "missed slots are sent oldest first"

    # skip: none sent, each recorded missed/skip.
    assert not set(window) & set(sent["skip"])
    assert missed["skip"] == {w: "skip" for w in window}

    # latest: only the newest sent, the older ones recorded missed/latest; none sent when
    # the first on-time slot was due too at the new leader's first look (the election
    # can fall a few ms before an even second). The look is before the record of what it
    # passed over: a record before the on-time slot leaves only the first outcome.
    latest_sent = [w for w in window if w in sent["latest"]]
    recorded_at = min(from_ms(e["at_ms"]) for e in events if e["event"] == "missed"
                      and e["entry"] == "latest" and int(e["epoch"]) == new_epoch)
    if recorded_at < first_on_time or latest_sent:
        assert latest_sent == [window[-1]], (latest_sent, recorded_at)
        assert missed["latest"] == {w: "latest" for w in window[:-1]}
    else:
        print(f"  latest: the first look came after {first_on_time:%H:%M:%S}, due on time too")
        assert missed["latest"] == {w: "latest" for w in window}

    # catchup_window: "all", but missed slots older than the window are dropped.
    dropped = sorted(w for w, why in missed["window"].items() if why == "window")
    kept = [w for w in window if w in sent["window"]]
    assert dropped, "a window smaller than the failover window drops the oldest slots"
    assert missed["window"] == {w: "window" for w in dropped}
    assert dropped + kept == window, (dropped, kept)
    cutoff = election - timedelta(seconds=WINDOW)  # judged at the first tick as leader
    assert all(w >= cutoff for w in kept), (kept, cutoff)
    assert all(w < cutoff + timedelta(seconds=1) for w in dropped), (dropped, cutoff)


def test_per_entry_options_never_reach_the_broker_message(
        tmp_path, make_redis_server, key_prefix):
    state, broker = make_redis_server(), make_redis_server()
    options = {"catchup": "all", "catchup_window": 60, "max_catchup": 5, "jitter": 0.5,
               "tz": "Europe/Berlin"}
    schedule = {
        "top": {"task": NOOP, "cron": "* * * * * *", "kwargs": {"x": 1}, "args": [7],
                "leaderbeat": options},
        "nested": {"task": NOOP, "every": 1, "kwargs": {"y": 2},
                   "options": {"leaderbeat": options, "headers": {"mine": "kept"}}},
    }
    env = beat_env(tmp_path, broker_url=broker.url_for(0), redis_url=state.url,
                   prefix=key_prefix, schedule=schedule)
    recorder = Recorder(broker.client())
    with BeatProcess(env=env, log_path=tmp_path / "beat.log") as beat:
        recorder.wait_for(6, timeout=20)
        assert beat.alive
    recorder.drain()
    messages = recorder.messages
    assert {m.entry for m in messages} == {"top", "nested"}
    forbidden = {"leaderbeat", *options}
    for m in messages:
        for where in (m.headers, m.properties, m.properties.get("delivery_info") or {},
                      m.kwargs):
            assert not forbidden & set(where), (m.entry, where)
        assert "leaderbeat" not in repr((m.headers, m.properties, m.args, m.kwargs)).replace(
            "leaderbeat_slot", "").replace("leaderbeat_epoch", "").replace(
            "leaderbeat_entry", ""), m
        assert m.task == NOOP
    top = next(m for m in messages if m.entry == "top")
    nested = next(m for m in messages if m.entry == "nested")
    assert (top.args, top.kwargs) == ([7], {"x": 1})
    assert (nested.args, nested.kwargs) == ([], {"y": 2})
    assert nested.headers.get("mine") == "kept", "the entry's own headers still go through"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"task": NOOP, "cron": "*/2 61 * * *"},
         ["entry 'bad'", "'*/2 61 * * *'", "hour field '61'"]),
        ({"task": NOOP, "cron": "* * * *"},
         ["entry 'bad'", "'* * * *'", "has 4 fields"]),
        ({"task": NOOP, "cron": "*/2 * * * * *", "leaderbeat": {"catchup": "all", "cathcup": 1}},
         ["entry 'bad'", "option 'cathcup' is unknown"]),
        ({"task": NOOP, "cron": "*/2 * * * * *", "leaderbeat": {"catchup": "sometimes"}},
         ["entry 'bad'", "catchup='sometimes'"]),
        pytest.param(
            {"task": NOOP, "cron": "*/2 * * * * *", "leaderbeat": {"catchup_window": 0}},
            ["entry 'bad'", "catchup_window=0 must be a number of seconds > 0"]),
    ],
    ids=["cron-field", "cron-field-count", "unknown-option", "bad-policy", "zero-window"],
)
def test_a_bad_entry_stops_beat_at_start_up_naming_the_entry(
        tmp_path, make_redis_server, key_prefix, spec, expected):
    state = make_redis_server()
    env = beat_env(tmp_path, broker_url=state.url_for(1), redis_url=state.url,
                   prefix=key_prefix, schedule={"good": {"task": NOOP, "every": 1}, "bad": spec})
    with BeatProcess(env=env, log_path=tmp_path / "beat.log") as beat:
        code = beat.wait_exit(timeout=30)
        log = beat.log_text()
    assert code != 0, log
    critical = [line for line in log.splitlines() if "CRITICAL" in line]
    assert critical, log[-3000:]
    assert "ConfigurationError" in critical[0]
    for text in expected:
        assert text in critical[0], (text, critical[0])
    assert state.client().get("{" + key_prefix + "}:leader") is None, "it must not lead first"
    assert state.client(db=1).llen("celery") == 0, "nothing may be sent"

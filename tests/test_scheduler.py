"""The Scheduler in-process against real Redis: lifecycle traps, entries, claims, sends."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from celery import Celery

from celery_leaderbeat.errors import ConfigurationError
from celery_leaderbeat.roles.standby import CLAIMED_WITHIN
from celery_leaderbeat.scheduler import LEADER, STANDBY, Scheduler
from celery_leaderbeat.store.keys import Keys
from celery_leaderbeat.store.types import ClaimItem, Op
from celery_leaderbeat.timing.schedules import cron
from celery_leaderbeat.timing.slots import from_ms, slot_id, to_ms
from tests.support.beat import NOOP, BeatProcess, Recorder, beat_env, duplicates


def make_app(state_url: str, broker_url: str, prefix: str, schedule: dict, **settings) -> Celery:
    app = Celery("proj")
    app.conf.update(broker_url=broker_url, leaderbeat_redis_url=state_url,
                    leaderbeat_key_prefix=prefix, beat_schedule=schedule, timezone="UTC",
                    leaderbeat_lease_ttl=3, leaderbeat_renew_interval=1,
                    leaderbeat_standby_poll=0.2,
                    **{"leaderbeat_max_clock_skew": 0.5, **settings})
    return app


@pytest.fixture
def servers(make_redis_server):
    return make_redis_server(), make_redis_server()


def connections_received(server) -> int:
    return int(server.client().info("stats")["total_connections_received"])


@contextmanager
def ticking_in_a_thread(scheduler: Scheduler) -> Iterator[None]:
    """``scheduler`` ticks in a thread of its own, as its beat would, until the block ends
    (the test's own thread drives another node's ticks meanwhile)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            time.sleep(min(scheduler.tick(), 0.05))

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def tick_until(scheduler: Scheduler, condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        delay = scheduler.tick()
        if condition():
            return
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(min(delay, 0.2))


def test_building_the_scheduler_lazily_or_not_opens_no_redis_connection(servers, key_prefix):
    state, broker = servers
    app = make_app(state.url, broker.url, key_prefix, {"a": {"task": NOOP, "schedule": 1.0}})
    before = connections_received(state)
    Scheduler(app=app, lazy=True)
    scheduler = Scheduler(app=app)
    assert "a" in scheduler.schedule
    assert connections_received(state) - before == 1  # only our own INFO call above


def test_a_leader_sends_due_slots_with_deterministic_ids_and_headers(servers, key_prefix):
    state, broker = servers
    app = make_app(state.url, broker.url, key_prefix, {"a": {"task": NOOP, "schedule": 0.5}})
    scheduler = Scheduler(app=app)
    recorder = Recorder(broker.client())
    try:
        tick_until(scheduler, lambda: len(recorder.drain_all()) >= 2)
    finally:
        scheduler.close()
    first = recorder.messages[0]
    slot = first.slot
    assert scheduler.role == STANDBY  # close() steps down
    assert first.entry == "a" and first.task == NOOP
    assert first.id == slot_id(key_prefix, "a", __import__("datetime").datetime.fromisoformat(slot))
    assert first.headers["leaderbeat_epoch"] == 1
    assert first.headers["celery_beat_task"] is True
    assert duplicates(recorder.messages) == []


def test_close_twice_is_safe_and_releases_the_lease_at_once(servers, key_prefix):
    state, broker = servers
    app = make_app(state.url, broker.url, key_prefix, {"a": {"task": NOOP, "schedule": 60.0}})
    scheduler = Scheduler(app=app)
    tick_until(scheduler, lambda: scheduler.role == LEADER)
    assert state.client().get(Keys(key_prefix).leader) is not None
    scheduler.close()
    scheduler.close()
    assert state.client().get(Keys(key_prefix).leader) is None


def only_the_leader_sent(recorder: Recorder, leader: Scheduler, at_least: int = 1,
                         entries: set[str] | None = None) -> None:
    """At least ``at_least`` messages, and one of each of ``entries``, each sent once, all
    by ``leader`` (no rescue).

    The bounds count only slots due a ``rescue_after`` or more before the test ends: those
    a standby would have rescued had the leader not sent them (so a leader slowed by a
    loaded machine still meets them, and a test that met them had something to rescue).
    """
    messages = recorder.drain_all()
    by_epoch = Counter(m.epoch for m in messages)
    assert len(messages) >= at_least, f"{len(messages)} messages, by epoch {dict(by_epoch)}"
    assert set(by_epoch) == {leader.lease.epoch or 1}, \
        f"a standby sent a slot: messages by epoch {dict(by_epoch)}"
    if entries is not None:
        assert entries <= {m.entry for m in messages}, \
            f"never sent: {sorted(entries - {m.entry for m in messages})[:10]}"
    assert duplicates(messages) == []


def test_a_standby_beside_a_healthy_leader_sends_nothing_even_past_rescue_after(
        servers, key_prefix):
    state, broker = servers
    schedule = {"a": {"task": NOOP, "schedule": 0.3}}
    first = Scheduler(app=make_app(state.url, broker.url, key_prefix, schedule))
    second = Scheduler(app=make_app(state.url, broker.url, key_prefix, schedule))
    recorder = Recorder(broker.client())
    try:
        tick_until(first, lambda: first.role == LEADER)
        deadline = time.monotonic() + first.lb_config.rescue_after + 1.5
        while time.monotonic() < deadline:  # both keep ticking, as two beats would
            time.sleep(min(first.tick(), 0.05))
            second.tick()
        assert second.role == STANDBY
    finally:
        first.close()
        second.close()
    # 0.3 s slots over rescue_after + 1.5 s: those due in the first 1.5 s (4 after the first
    # slot) would have been the standby's to rescue
    only_the_leader_sent(recorder, first, at_least=4)


def test_a_standby_checks_entries_due_at_instants_of_their_own_together(servers, key_prefix):
    """200 entries, each at an instant of its own (jitter): a look at the leader's claims
    per instant would read their states dozens of times in 4 s. A look also reads the
    entries due more than ``CLAIMED_WITHIN`` ago, which a healthy leader has claimed, so
    the next look is ``rescue_after`` less that later: 2-3 reads in 4 s (at least one
    asked, since a loaded machine may push the second past the end), and the standby
    rescues nothing beside a healthy leader."""
    state, broker = servers
    schedule = {f"e{i}": {"task": NOOP, "schedule": 2.0,
                          "options": {"leaderbeat": {"jitter": 1.5}}} for i in range(200)}
    first = Scheduler(app=make_app(state.url, broker.url, key_prefix, schedule))
    second = Scheduler(app=make_app(state.url, broker.url, key_prefix, schedule))
    recorder = Recorder(broker.client())
    reads: list[float] = []
    real = second.ledger.load

    def counted(names=None):
        if names is not None:
            reads.append(time.monotonic())
        return real(names)

    try:
        tick_until(first, lambda: first.role == LEADER)
        with ticking_in_a_thread(first):
            started = time.monotonic()
            while time.monotonic() < started + first.lb_config.rescue_after + 1:
                second.tick()  # past rescue_after: the standby now checks what falls due
            second.ledger.load = counted  # type: ignore[method-assign]
            started = time.monotonic()
            while time.monotonic() < started + 4:
                second.tick()
        assert second.role == STANDBY
        apart = first.lb_config.rescue_after - CLAIMED_WITHIN
        assert 1 <= len(reads) <= 4 / apart + 1, f"{len(reads)} reads in 4 s"
    finally:
        first.close()
        second.close()
    # each entry's first slot falls due within 2 + 1.5 s of the anchor, 3.5 s or more before
    # the end: every one of them would have been the standby's to rescue
    only_the_leader_sent(recorder, first, entries=set(schedule))


def test_with_min_replicas_and_no_replica_beat_stays_up_and_says_no_replica_acknowledged(
        servers, key_prefix, caplog):
    state, broker = servers
    app = make_app(state.url, broker.url, key_prefix, {"a": {"task": NOOP, "schedule": 0.5}},
                   leaderbeat_min_replicas=1)
    scheduler = Scheduler(app=app)
    recorder = Recorder(broker.client())
    try:
        with caplog.at_level(logging.WARNING, logger="celery_leaderbeat"):
            tick_until(scheduler, lambda: scheduler.role == LEADER)
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:  # the anchors, then the claims: never raise
                time.sleep(min(scheduler.tick(), 0.1))
    finally:
        scheduler.close()
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "no replica acknowledged" in said
    assert "unreachable" not in said, "WAIT outlived the socket timeout"
    assert recorder.drain_all() == [], "an unreplicated claim was sent"


def test_two_beats_with_the_same_explicit_node_id_are_refused_naming_the_setting(
        servers, key_prefix):
    state, broker = servers
    schedule = {"a": {"task": NOOP, "schedule": 60.0}}
    apps = [make_app(state.url, broker.url, key_prefix, schedule, leaderbeat_node_id="web-1")
            for _ in range(2)]
    first, second = Scheduler(app=apps[0]), Scheduler(app=apps[1])
    try:
        with pytest.raises(ConfigurationError, match=r"leaderbeat_node_id='web-1' is used by "
                                                     r"another running beat"):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                first.tick()
                second.tick()
                time.sleep(0.1)
    finally:
        first.close()
        second.close()


def test_a_restarted_beat_with_the_same_node_id_is_not_taken_for_a_duplicate(
        servers, key_prefix):
    state, broker = servers
    schedule = {"a": {"task": NOOP, "schedule": 60.0}}
    app = make_app(state.url, broker.url, key_prefix, schedule, leaderbeat_node_id="web-1")
    crashed = Scheduler(app=app)
    tick_until(crashed, lambda: crashed.role == LEADER)  # then dies without a word
    restarted = Scheduler(app=app)
    try:
        deadline = time.monotonic() + 3 * restarted.lb_config.renew_interval
        while time.monotonic() < deadline:  # registers several times: no error
            time.sleep(min(restarted.tick(), 0.2))
        assert restarted.role == LEADER  # it re-took its own leftover lease, new epoch
        assert restarted.lease.epoch == 2
    finally:
        restarted.close()


def test_last_leader_with_an_expired_lease_does_not_send_through_an_outage(
        make_redis_server, key_prefix):
    state, broker = make_redis_server(), make_redis_server()
    app = make_app(state.url, broker.url, key_prefix, {"a": {"task": NOOP, "schedule": 0.3}},
                   leaderbeat_store_down_policy="last-leader")
    scheduler = Scheduler(app=app)
    recorder = Recorder(broker.client())
    try:
        tick_until(scheduler, lambda: scheduler.role == LEADER)
        scheduler.lease.stop_heartbeat()
        scheduler.lease.mark_lost()  # resumed from a long SIGSTOP: its deadline has passed
        scheduler.lease._lost.clear()  # ... but nobody told it the lease is gone
        state.kill()
        recorder.drain()
        for _ in range(5):
            time.sleep(min(scheduler.tick(), 0.3))
        assert scheduler.role == STANDBY
        assert scheduler.leading is None
        assert recorder.drain() == [], "it sent while another node may lead"
    finally:
        scheduler.close()


def test_degraded_max_seconds_is_a_hard_cap_even_when_redis_answers_ping(
        make_redis_server, key_prefix):
    from celery_leaderbeat.roles.degraded import Outage

    state, broker = make_redis_server(), make_redis_server()
    app = make_app(state.url, broker.url, key_prefix, {"a": {"task": NOOP, "schedule": 0.3}},
                   leaderbeat_store_down_policy="last-leader",
                   leaderbeat_degraded_max_seconds=1)
    scheduler = Scheduler(app=app)
    recorder = Recorder(broker.client())
    try:
        tick_until(scheduler, lambda: scheduler.role == LEADER)
        # in an outage for longer than the cap; PING answers but writes would fail
        scheduler.leading.outage = Outage(scheduler.lb_config, time.monotonic() - 5)
        recorder.drain()
        scheduler.tick()
        assert scheduler.role == STANDBY
        assert recorder.drain() == []
    finally:
        scheduler.close()


def test_string_schedules_become_cron_and_entry_options_never_reach_celery(servers, key_prefix):
    state, broker = servers
    schedule = {"c": {"task": NOOP, "schedule": "*/5 * * * *",
                      "leaderbeat": {"catchup": "all", "jitter": 3},
                      "options": {"queue": "q1", "leaderbeat": {"max_catchup": 5}}}}
    scheduler = Scheduler(app=make_app(state.url, broker.url, key_prefix, schedule))
    entry = scheduler.schedule["c"]
    assert isinstance(entry.schedule, cron)
    assert entry.options == {"queue": "q1"}
    options = scheduler._entry_options["c"]
    assert (options.policy.mode, options.policy.max_catchup, options.jitter) == ("all", 5, 3)


def test_every_bad_entry_is_reported_together_naming_entry_and_value(servers, key_prefix):
    state, broker = servers
    schedule = {
        "bad-cron": {"task": NOOP, "schedule": "61 * * * *"},
        "bad-option": {"task": NOOP, "schedule": 10.0, "leaderbeat": {"catchup_mode": "all"}},
        "bad-policy": {"task": NOOP, "schedule": 10.0, "leaderbeat": {"catchup": "never"}},
    }
    with pytest.raises(ConfigurationError) as info:
        Scheduler(app=make_app(state.url, broker.url, key_prefix, schedule))
    text = str(info.value)
    assert "3 problems" in text
    assert "'bad-cron'" in text and "61 * * * *" in text
    assert "'bad-option'" in text and "'catchup_mode' is unknown" in text
    assert "'bad-policy'" in text and "catchup='never'" in text


def test_a_slot_claimed_but_not_sent_by_an_earlier_leader_is_reported_and_recovered(
        servers, key_prefix):
    state, broker = servers
    schedule = {"a": {"task": NOOP, "schedule": 3600.0}}
    app = make_app(state.url, broker.url, key_prefix, schedule, leaderbeat_recover_unsent=True)
    # An earlier leader (epoch 1) claimed slot S of "a" and died before publishing it.
    earlier = Scheduler(app=app)
    tick_until(earlier, lambda: earlier.role == LEADER)
    slot = from_ms(to_ms(earlier.leading.tracked["a"].last) + 1000)
    earlier.ledger.claim(earlier.lease.token, earlier.lease.epoch, [ClaimItem("a", to_ms(slot), Op.CLAIM)])
    earlier.lease.stop_heartbeat()
    state.client().delete(Keys(key_prefix).leader)  # as if it was killed and its lease expired
    recorder = Recorder(broker.client())
    later = Scheduler(app=app)
    try:
        tick_until(later, lambda: later.role == LEADER)
    finally:
        later.close()
    recovered = recorder.drain()
    assert [(m.entry, m.slot) for m in recovered] == [("a", slot.isoformat())]
    assert recovered[0].id == slot_id(key_prefix, "a", slot)
    events = [(h["event"], h.get("detail")) for h in later.ledger.history(20)]
    assert ("unsent", "claimed by an earlier leader") in events
    assert ("sent", "recovered") in events


def test_a_failed_publish_is_recorded_as_unsent_not_swallowed(servers, key_prefix):
    state, _ = servers
    schedule = {"a": {"task": NOOP, "schedule": 0.3}}
    app = make_app(state.url, "redis://127.0.0.1:1/0", key_prefix, schedule,
                   broker_connection_max_retries=1, broker_connection_timeout=0.2,
                   task_publish_retry=False, broker_connection_retry=False)
    scheduler = Scheduler(app=app)
    try:
        tick_until(scheduler, lambda: any(h["event"] == "unsent"
                                          for h in scheduler.ledger.history(20)), timeout=20)
    finally:
        scheduler.close()
    unsent = [h for h in scheduler.ledger.history(20) if h["event"] == "unsent"]
    assert unsent[0]["entry"] == "a" and unsent[0]["detail"] == "publish failed"


@pytest.mark.slow
def test_a_beat_started_while_redis_is_down_stays_up_and_leads_once_redis_is_back(
        tmp_path, servers, key_prefix):
    state, broker = servers
    state.kill()
    env = beat_env(tmp_path, broker_url=broker.url, redis_url=state.url, prefix=key_prefix,
                   schedule={"a": {"task": NOOP, "every": 1}},
                   settings={"leaderbeat_lease_ttl": 3, "leaderbeat_renew_interval": 1})
    with BeatProcess(env=env, log_path=tmp_path / "beat.log") as beat:
        beat.wait_for_log(r"unreachable", timeout=15)
        time.sleep(1.5)
        assert beat.alive
        assert beat.log_text().count("unreachable") == 1, "one log line per state change"
        state.restart()
        beat.wait_for_log(r"answers again", timeout=15)
        Recorder(broker.client()).wait_for(2, timeout=15)
        assert beat.alive


@pytest.mark.slow
def test_a_bad_setting_stops_beat_at_start_up_with_every_problem_named(tmp_path, servers, key_prefix):
    state, broker = servers
    env = beat_env(tmp_path, broker_url=broker.url, redis_url=state.url, prefix=key_prefix,
                   schedule={"a": {"task": NOOP, "every": 1}},
                   settings={"leaderbeat_lease_ttl": 3, "leaderbeat_renew_interval": 2,
                             "leaderbeat_catchup": "sometimes"})
    with BeatProcess(env=env, log_path=tmp_path / "beat.log") as beat:
        assert beat.wait_exit(30) != 0
        log = beat.log_text()
    assert "leaderbeat_lease_ttl=3.0 must be more than 2 × leaderbeat_renew_interval (2.0)" in log
    assert "leaderbeat_catchup='sometimes' must be one of latest, skip, all" in log


def test_a_leader_whose_clock_drifts_past_the_limit_steps_down_and_releases(
        servers, key_prefix, monkeypatch):
    state, broker = servers
    app = make_app(state.url, broker.url, key_prefix, {"a": {"task": NOOP, "schedule": 60.0}},
                   leaderbeat_max_clock_skew=2)
    scheduler = Scheduler(app=app)
    try:
        tick_until(scheduler, lambda: scheduler.role == LEADER)
        nodes = scheduler.ledger.nodes()
        assert abs(nodes[scheduler.lb_config.node_id]["clock_skew"]) < 1.0  # exposed for status
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 10)  # the wall clock steps 10 s ahead
        scheduler.lease.renew()  # what the heartbeat does: measures skew against Redis TIME
        tick_until(scheduler, lambda: scheduler.role == STANDBY)
        assert state.client().get(Keys(key_prefix).leader) is None, "released for the others"
        for _ in range(3):
            scheduler.tick()
        assert scheduler.role == STANDBY, "it refuses to lead while skewed"
    finally:
        scheduler.close()


def test_a_schedule_the_leader_could_not_follow_stops_construction_not_a_later_election():
    app = Celery("proj")
    app.conf.update(broker_url="redis://127.0.0.1:1/0", beat_schedule={
        "tiny": {"task": NOOP, "schedule": 0.0005},
        "fine": {"task": NOOP, "schedule": 1.0}})
    with pytest.raises(ConfigurationError, match=r"entry 'tiny': interval 0.0005s must be a "
                                                 r"positive whole number of milliseconds"):
        Scheduler(app=app)


def test_a_leader_whose_heartbeat_thread_dies_steps_down_at_once(servers, key_prefix, monkeypatch):
    state, broker = servers
    app = make_app(state.url, broker.url, key_prefix, {"a": {"task": NOOP, "schedule": 60.0}})
    scheduler = Scheduler(app=app)
    try:
        tick_until(scheduler, lambda: scheduler.role == LEADER)

        def broken_renew() -> None:
            raise RuntimeError("bug in renewal")

        monkeypatch.setattr(scheduler.lease, "renew", broken_renew)  # fault in our code, not Redis
        deadline = time.monotonic() + 5
        while scheduler.lease.heartbeat_stopped() is None:
            assert time.monotonic() < deadline, "the heartbeat never noticed"
            time.sleep(0.05)
        assert scheduler.lease.is_held(), "the lease alone would still look fine"
        scheduler.tick()
        assert scheduler.role == STANDBY
        assert state.client().get(Keys(key_prefix).leader) is None, "released for the others"
    finally:
        scheduler.close()


def test_the_default_entries_are_installed_after_beat_schedule_as_stock_beat_does(
        servers, key_prefix):
    """Stock beat merges beat_schedule first, then adds celery.backend_cleanup (it once
    came first, and the merge dropped it)."""
    state, broker = servers
    app = make_app(state.url, broker.url, key_prefix, {"a": {"task": NOOP, "schedule": 60.0}})
    # no result backend: it cannot expire results itself, so stock beat adds the cleanup
    assert set(Scheduler(app=app).schedule) == {"a", "celery.backend_cleanup"}


def test_signals_tell_receivers_and_a_failing_receiver_never_breaks_the_tick(
        servers, key_prefix):
    from celery_leaderbeat import signals

    state, broker = servers
    scheduler = Scheduler(app=make_app(state.url, broker.url, key_prefix,
                                       {"a": {"task": NOOP, "schedule": 0.3}}))
    recorder = Recorder(broker.client())
    elected, sent, lost = [], [], []

    def on_elected(sender, node_id, epoch, **kwargs):
        elected.append((node_id, epoch))

    def on_sent(sender, entry, slot, task_id, epoch, rescued, **kwargs):
        sent.append((entry, task_id, rescued))
        raise RuntimeError("the alerting webhook is down")

    def on_lost(sender, node_id, epoch, reason, **kwargs):
        lost.append(reason)

    signals.leader_elected.connect(on_elected)
    signals.slot_sent.connect(on_sent)
    signals.leader_lost.connect(on_lost)
    try:
        tick_until(scheduler, lambda: len(recorder.drain_all()) >= 3)
    finally:
        scheduler.close()
        for signal, receiver in ((signals.leader_elected, on_elected),
                                 (signals.slot_sent, on_sent), (signals.leader_lost, on_lost)):
            signal.disconnect(receiver)
    assert elected == [(scheduler.lb_config.node_id, 1)]
    assert len(sent) >= 3 and {e for e, _, _ in sent} == {"a"}
    assert all(task_id == m.id for (_, task_id, _), m in zip(sent, recorder.messages))
    assert lost == ["released on shutdown"]


def test_a_batch_that_takes_longer_than_the_ttl_keeps_the_lease_while_it_makes_progress(
        servers, key_prefix, monkeypatch):
    """Each claimed chunk counts as progress; only a loop that stops moving lets go."""
    import celery_leaderbeat.integrations.sending as sending_module

    state, broker = servers
    schedule = {f"e{i}": {"task": NOOP, "schedule": 8.0} for i in range(400)}
    scheduler = Scheduler(app=make_app(state.url, broker.url, key_prefix, schedule))
    real_publish = sending_module.publish

    def slow_publish(*args, **kwargs):
        time.sleep(0.012)  # 400 sends: about 5 s, over the 3 s ttl
        return real_publish(*args, **kwargs)

    monkeypatch.setattr(sending_module, "publish", slow_publish)
    recorder = Recorder(broker.client())
    try:
        tick_until(scheduler, lambda: scheduler.role == LEADER)
        epoch = scheduler.lease.epoch
        tick_until(scheduler, lambda: len(recorder.drain_all()) >= 400, timeout=60)
        assert scheduler.role == LEADER and scheduler.lease.epoch == epoch
    finally:
        scheduler.close()
    assert duplicates(recorder.messages) == []

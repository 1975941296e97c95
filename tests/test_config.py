"""Settings: defaults, Django's namespace, and every bad value reported together."""

from __future__ import annotations

import sys
import types

import pytest
from celery import Celery

from celery_leaderbeat.config import Config
from celery_leaderbeat.errors import ConfigurationError


def app_with(**settings) -> Celery:
    app = Celery("proj")
    app.conf.update(broker_url="redis://127.0.0.1:1/0", **settings)
    return app


def test_defaults_follow_the_design():
    config = Config.from_app(app_with())
    assert config.redis_url == "redis://127.0.0.1:1/0"  # the broker, since it is Redis
    assert config.key_prefix == "leaderbeat:proj"
    assert config.lease_ttl == 10.0
    assert config.renew_interval == pytest.approx(10.0 / 3)
    assert config.standby_poll == 1.0
    assert config.catchup == "latest"
    assert config.redis_down_policy == "pause"


def test_the_default_node_id_names_host_and_pid_and_is_unique_per_instance():
    import os
    import socket

    first, second = Config.from_app(app_with()).node_id, Config.from_app(app_with()).node_id
    assert first != second
    host, pid, suffix = first.rsplit(":", 2)
    assert (host, int(pid), len(suffix)) == (socket.gethostname(), os.getpid(), 6)


def test_django_namespaced_settings_are_read(monkeypatch):
    settings = types.ModuleType("fake_django_settings")
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/3"
    settings.CELERY_LEADERBEAT_LEASE_TTL = 6
    settings.CELERY_LEADERBEAT_KEY_PREFIX = "site"
    monkeypatch.setitem(sys.modules, "fake_django_settings", settings)
    app = Celery("proj")
    app.config_from_object("fake_django_settings", namespace="CELERY")
    config = Config.from_app(app)
    assert (config.lease_ttl, config.key_prefix, config.redis_url) == (6.0, "site", "redis://127.0.0.1:1/3")


def test_an_unknown_leaderbeat_setting_is_an_error_even_under_a_namespace(monkeypatch):
    settings = types.ModuleType("fake_django_settings2")
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/3"
    settings.CELERY_LEADERBEAT_LEASE_TLL = 6
    monkeypatch.setitem(sys.modules, "fake_django_settings2", settings)
    app = Celery("proj")
    app.config_from_object("fake_django_settings2", namespace="CELERY")
    with pytest.raises(ConfigurationError, match="leaderbeat_lease_tll is not a setting"):
        Config.from_app(app)


def test_every_bad_value_is_reported_together_naming_setting_value_and_rule():
    app = app_with(leaderbeat_lease_ttl=3, leaderbeat_renew_interval=2.0,
                   leaderbeat_catchup="sometimes", leaderbeat_max_catchup=0,
                   leaderbeat_standby_poll="fast", leaderbeat_redis_down_policy="panic")
    with pytest.raises(ConfigurationError) as info:
        Config.from_app(app)
    problems = info.value.problems
    assert "leaderbeat_lease_ttl=3.0 must be more than 2 × leaderbeat_renew_interval (2.0)" in problems
    assert any(p.startswith("leaderbeat_catchup='sometimes' must be one of latest, skip, all")
               for p in problems)
    assert any(p.startswith("leaderbeat_max_catchup=0") for p in problems)
    assert any(p.startswith("leaderbeat_standby_poll='fast' must be a number") for p in problems)
    assert any(p.startswith("leaderbeat_redis_down_policy='panic'") for p in problems)
    assert len(problems) == 5


def test_a_non_redis_broker_without_a_redis_url_is_a_clear_error():
    app = Celery("proj")
    app.conf.broker_url = "amqp://guest@localhost//"
    with pytest.raises(ConfigurationError, match="leaderbeat_redis_url=None must be a redis://"):
        Config.from_app(app)


@pytest.mark.parametrize("url", ["redis://h:1/0", "rediss://h:1/0", "unix:///tmp/r.sock",
                                 "sentinel://h:26379;sentinel://h2:26379", "redis+cluster://h:7000"])
def test_supported_redis_urls_are_accepted(url):
    assert Config.from_app(app_with(leaderbeat_redis_url=url)).redis_url == url


def test_a_prefix_with_braces_is_refused_because_it_would_break_the_hash_tag():
    with pytest.raises(ConfigurationError, match="leaderbeat_key_prefix='a{b}'"):
        Config.from_app(app_with(leaderbeat_key_prefix="a{b}"))


def test_a_zero_catchup_window_is_refused_naming_the_setting():
    with pytest.raises(ConfigurationError, match=r"leaderbeat_catchup_window=0 must be a number of seconds > 0"):
        Config.from_app(app_with(leaderbeat_catchup_window=0))


def test_rescue_after_defaults_to_two_seconds_and_a_tiny_value_is_refused():
    assert Config.from_app(app_with()).rescue_after == 2.0
    with pytest.raises(ConfigurationError, match=r"leaderbeat_rescue_after=0.1 must be at least 0.5"):
        Config.from_app(app_with(leaderbeat_rescue_after=0.1))


def test_an_entry_and_the_settings_word_the_same_catchup_rule_alike():
    from celery_leaderbeat.entries import split_entries

    config = Config.from_app(app_with())
    with pytest.raises(ConfigurationError) as entry_error:
        split_entries({"e": {"task": "t", "schedule": 5.0,
                             "leaderbeat": {"max_catchup": 0}}}, config)
    with pytest.raises(ConfigurationError) as setting_error:
        Config.from_app(app_with(leaderbeat_max_catchup=0))
    rule = "max_catchup=0 must be an integer of at least 1"
    assert str(entry_error.value).endswith(rule) and str(setting_error.value).endswith(rule)

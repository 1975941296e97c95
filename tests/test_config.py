"""Settings: defaults, Django's namespace, and every bad value reported together."""

from __future__ import annotations

import sys
import types
import warnings

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
    assert config.store_down_policy == "pause"
    assert config.store_timeout == pytest.approx(10.0 / 6)  # half the renew interval


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
                   leaderbeat_standby_poll="fast", leaderbeat_store_down_policy="panic")
    with pytest.raises(ConfigurationError) as info:
        Config.from_app(app)
    problems = info.value.problems
    assert "leaderbeat_lease_ttl=3.0 must be more than 2 × leaderbeat_renew_interval (2.0)" in problems
    assert any(p.startswith("leaderbeat_catchup='sometimes' must be one of latest, skip, all")
               for p in problems)
    assert any(p.startswith("leaderbeat_max_catchup=0") for p in problems)
    assert any(p.startswith("leaderbeat_standby_poll='fast' must be a number") for p in problems)
    assert any(p.startswith("leaderbeat_store_down_policy='panic'") for p in problems)
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


# --- the store's settings: leaderbeat_store_down_policy, its old name, leaderbeat_store_timeout

def deprecations(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize("policy", ["pause", "last-leader"])
def test_store_down_policy_is_read_without_a_warning(policy):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = Config.from_app(app_with(leaderbeat_store_down_policy=policy))
    assert config.store_down_policy == policy
    assert deprecations(caught) == [] and config.notes == ()


def test_the_old_name_redis_down_policy_still_works_and_warns_once_naming_the_new_one():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = Config.from_app(app_with(leaderbeat_redis_down_policy="last-leader"))
    assert config.store_down_policy == "last-leader"
    [said] = deprecations(caught)
    assert said.startswith("leaderbeat_redis_down_policy is deprecated: it is now named "
                           "leaderbeat_store_down_policy")
    assert config.notes == (said,)  # logged at start-up too: Python hides the warning


def test_the_old_name_beside_the_new_one_with_the_same_value_is_accepted_with_the_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = Config.from_app(app_with(leaderbeat_redis_down_policy="last-leader",
                                          leaderbeat_store_down_policy="last-leader"))
    assert config.store_down_policy == "last-leader"
    assert len(deprecations(caught)) == 1


@pytest.mark.parametrize(("old", "new"), [("last-leader", "pause"), ("pause", "last-leader")])
def test_the_old_and_new_down_policy_names_disagreeing_is_an_error_naming_both(old, new):
    with pytest.raises(ConfigurationError) as info:
        Config.from_app(app_with(leaderbeat_redis_down_policy=old,
                                 leaderbeat_store_down_policy=new))
    assert info.value.problems == [
        (f"leaderbeat_redis_down_policy={old!r} must equal leaderbeat_store_down_policy "
         f"({new!r}) when both are set: it is that setting's old name; set only "
         "leaderbeat_store_down_policy")]


def test_a_bad_value_under_the_old_name_is_reported_under_the_old_name():
    with pytest.raises(ConfigurationError) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        Config.from_app(app_with(leaderbeat_redis_down_policy="panic"))
    assert info.value.problems == [
        "leaderbeat_redis_down_policy='panic' must be one of pause, last-leader"]


def django_app(monkeypatch, **settings) -> Celery:
    module = types.ModuleType("fake_django_store_settings")
    module.CELERY_BROKER_URL = "redis://127.0.0.1:1/3"
    for name, value in settings.items():
        setattr(module, name, value)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    app = Celery("proj")
    app.config_from_object(module.__name__, namespace="CELERY")
    return app


def test_django_reads_the_new_and_the_old_down_policy_names(monkeypatch):
    new = django_app(monkeypatch, CELERY_LEADERBEAT_STORE_DOWN_POLICY="last-leader",
                     CELERY_LEADERBEAT_STORE_TIMEOUT=0.75)
    config = Config.from_app(new)
    assert (config.store_down_policy, config.store_timeout) == ("last-leader", 0.75)
    old = django_app(monkeypatch, CELERY_LEADERBEAT_REDIS_DOWN_POLICY="last-leader")
    with pytest.warns(DeprecationWarning, match="CELERY_LEADERBEAT_STORE_DOWN_POLICY"):
        assert Config.from_app(old).store_down_policy == "last-leader"


def test_django_old_and_new_down_policy_names_disagreeing_is_an_error(monkeypatch):
    app = django_app(monkeypatch, CELERY_LEADERBEAT_REDIS_DOWN_POLICY="last-leader",
                     CELERY_LEADERBEAT_STORE_DOWN_POLICY="pause")
    with pytest.raises(ConfigurationError, match="leaderbeat_redis_down_policy='last-leader' "
                                                 "must equal leaderbeat_store_down_policy"):
        Config.from_app(app)


@pytest.mark.parametrize("value", [0, -1, "2", True, [1]])
def test_store_timeout_must_be_a_positive_number_of_seconds(value):
    with pytest.raises(ConfigurationError) as info:
        Config.from_app(app_with(leaderbeat_store_timeout=value))
    assert info.value.problems == [
        f"leaderbeat_store_timeout={value!r} must be a number of seconds > 0"]


@pytest.mark.parametrize("store_url", ["postgresql://h/db", "django", "redis://h/0"])
def test_store_timeout_wins_and_redis_options_socket_timeout_is_the_fallback(store_url):
    def timeout(**settings) -> float:
        return Config.from_values({"store_url": store_url, "key_prefix": "p", "node_id": "n",
                                   **settings}).store_timeout

    assert timeout() == pytest.approx(10.0 / 6)
    assert timeout(redis_options={"socket_timeout": 3}) == 3.0
    assert timeout(store_timeout=0.4, redis_options={"socket_timeout": 3}) == 0.4
    assert timeout(store_timeout=4) == 4.0


def test_the_default_store_timeout_is_half_the_renew_interval_within_half_a_second_and_two():
    def timeout(renew: float) -> float:
        return Config.from_values({"redis_url": "redis://h", "key_prefix": "p", "node_id": "n",
                                   "lease_ttl": 30, "renew_interval": renew}).store_timeout

    assert (timeout(0.5), timeout(3), timeout(10)) == (0.5, 1.5, 2.0)


def test_the_redis_client_gets_store_timeout_as_its_socket_timeout_unless_options_set_one():
    from celery_leaderbeat.store.redis_store import connect

    def client_timeouts(**settings) -> tuple[float, float]:
        config = Config.from_app(app_with(**settings))
        store = connect(config)  # no connection made yet
        return (store.client.connection_pool.connection_kwargs["socket_timeout"],
                config.redis_socket_timeout)

    assert client_timeouts(leaderbeat_store_timeout=0.4) == (0.4, 0.4)
    assert client_timeouts(leaderbeat_store_timeout=0.4,
                           leaderbeat_redis_options={"socket_timeout": 3}) == (3, 3.0)
    assert client_timeouts(leaderbeat_redis_options={"socket_timeout": 3}) == (3, 3.0)

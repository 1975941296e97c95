"""Prometheus metrics of one beat process, served on ``/metrics``.

Enabled by ``leaderbeat_metrics_port`` (or the environment variable
``LEADERBEAT_METRICS_PORT``, which wins: two beats on one host need two ports)
and ``pip install 'celery-leaderbeat[metrics]'`` (prometheus-client). Without
a port nothing is imported and :class:`NullMetrics` does nothing.

- ``leaderbeat_is_leader`` (gauge, 0/1), ``leaderbeat_epoch`` (gauge)
- ``leaderbeat_leadership_changes_total`` (counter: this process was elected or stepped down)
- ``leaderbeat_slots_total{state, entry}`` (counter; state sent, rescued, missed, skipped,
  unsent; ``entry`` is ``*`` when the schedule has more than :data:`ENTRY_LABEL_LIMIT`
  entries, to keep the cardinality bounded)
- ``leaderbeat_lease_renew_seconds`` (histogram), ``leaderbeat_lease_renew_failures_total``
- ``leaderbeat_clock_skew_seconds`` (gauge: this node's clock minus Redis TIME)
- ``leaderbeat_redis_last_answer_timestamp_seconds`` (gauge: Unix time Redis last answered
  this process: a lease renewal, or a tick whose Redis calls all succeeded; 0 until then)
- ``leaderbeat_tick_seconds`` (histogram: one scheduler tick)
- ``leaderbeat_send_path{path, reason}`` (gauge, 1 for the path in use: ``one_step``, claim
  and enqueue in one step, ``single_write``, a py-amqp chunk in one socket write, or
  ``plain``, sent after the claim through kombu, ``reason`` saying why; no
  series until this process first sends a chunk, nor behind ``leaderbeat_base_scheduler``)
- ``leaderbeat_overlap_decisions_total{entry, policy, decision}`` (counter: the worker
  guard's overlap decisions, started, started_after_wait, buffered, skipped, cancelled;
  the workers count them in Redis and every beat reports the cluster's totals, read at
  each scrape: aggregate with ``max``, not ``sum``)

The same port serves the probes ``/healthz`` (liveness) and ``/readyz`` (readiness) of
:mod:`celery_leaderbeat.ops.health`. They need no more than the standard library, but the
port itself needs prometheus-client: a port set without it is a configuration error at
start-up (config.py), so probes and metrics are installed together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from .health import Health, application
from .health import serve as serve_http

#: above this many entries the slot counters are not labelled per entry
ENTRY_LABEL_LIMIT = 1000

#: history event -> the slot state it counts as
_STATES = {"sent": "sent", "missed": "missed", "skipped": "skipped", "unsent": "unsent"}


class NullMetrics:
    """Metrics switched off: every call does nothing."""

    def leading(self, leader: bool, epoch: int | None) -> None: ...

    def leadership_changed(self) -> None: ...

    def slots(self, events: Iterable[Any], entries: int) -> None: ...

    def renewed(self, seconds: float | None) -> None: ...

    def clock_skew(self, seconds: float | None) -> None: ...

    def ticked(self, seconds: float) -> None: ...

    def keep_entries(self, names: Iterable[str]) -> None: ...

    def overlap_from(self, read: Callable[[], Mapping[tuple[str, str, str], int]]) -> None:
        ...


class _OverlapDecisions:
    """The guard's overlap decisions, read from the store at each scrape."""

    def __init__(self) -> None:
        self.read: Callable[[], Mapping[tuple[str, str, str], int]] | None = None

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily("leaderbeat_overlap_decisions",
                                     "the worker guard's overlap decisions (cluster totals)",
                                     labels=["entry", "policy", "decision"])
        try:
            counts = self.read() if self.read is not None else {}
        except Exception:  # noqa: BLE001 - Redis unreachable: this scrape has no samples
            counts = {}
        for labels, value in sorted(counts.items()):
            family.add_metric(list(labels), value)
        yield family


#: the chunk sender a scheduler uses (``send.sender.Enqueuer``), None before its first chunk
SendPath = Callable[[], Any]


def send_path_labels(enqueuer: Any) -> tuple[str, str] | None:
    """(path, reason) of ``enqueuer`` (``send.sender.Enqueuer``): ``one_step`` or
    ``single_write``, or ``plain`` and why; None before the scheduler has one."""
    if enqueuer is None:
        return None
    path, reason = enqueuer.path()
    return str(path), str(reason)


class _SendPathCollector:
    """``leaderbeat_send_path``, read from the scheduler at each scrape."""

    def __init__(self, enqueuer: SendPath) -> None:
        self._enqueuer = enqueuer

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(
            "leaderbeat_send_path", "how this process sends a chunk: one_step (claim and "
            "enqueue in one step), single_write (py-amqp, one socket write a chunk) or plain "
            "(after the claim, through kombu), and why", labels=["path", "reason"])
        labels = send_path_labels(self._enqueuer())
        if labels is not None:
            family.add_metric(list(labels), 1)
        yield family


class Metrics(NullMetrics):
    """The real thing, on a registry of its own (several schedulers in one test process)."""

    def __init__(self, send_path: SendPath | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self._is_leader = Gauge("leaderbeat_is_leader", "1 while this process leads", registry=r)
        self._epoch = Gauge("leaderbeat_epoch", "fencing epoch of this process's lease",
                            registry=r)
        self._changes = Counter("leaderbeat_leadership_changes",
                                "elections and step-downs of this process", registry=r)
        self._slots = Counter("leaderbeat_slots", "slots by what became of them",
                              ["state", "entry"], registry=r)
        self._renew = Histogram("leaderbeat_lease_renew_seconds", "one lease renewal",
                                buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                         0.5, 1, 2.5), registry=r)
        self._renew_failures = Counter("leaderbeat_lease_renew_failures",
                                       "lease renewals Redis did not answer", registry=r)
        self._skew = Gauge("leaderbeat_clock_skew_seconds", "local clock minus Redis TIME",
                           registry=r)
        self._tick = Histogram("leaderbeat_tick_seconds", "one scheduler tick", registry=r)
        self._redis_answered = Gauge("leaderbeat_redis_last_answer_timestamp_seconds",
                                     "Unix time Redis last answered this process", registry=r)
        if send_path is not None:
            r.register(_SendPathCollector(send_path))
        self._server: Any = None
        self.health: Health | None = None
        self._labelled: dict[str, set[str]] = {}  # entry -> states it has a series for
        self._overlap = _OverlapDecisions()
        r.register(self._overlap)

    def serve(self, port: int, health: Health | None = None) -> None:
        """``/metrics``, and ``/healthz`` and ``/readyz`` from ``health``, on ``port``."""
        from prometheus_client import make_wsgi_app

        self.health = health
        metrics = make_wsgi_app(self.registry)
        if health is None:
            self._server = serve_http(metrics, port)
        else:
            self._server = serve_http(application(health, metrics), port)

    def close(self) -> None:
        """Stop serving (tests: several schedulers in one process)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def leading(self, leader: bool, epoch: int | None) -> None:
        self._is_leader.set(1 if leader else 0)
        if epoch is not None:
            self._epoch.set(epoch)

    def leadership_changed(self) -> None:
        self._changes.inc()

    def slots(self, events: Iterable[Any], entries: int) -> None:
        for ev in events:
            state = "rescued" if ev.event == "sent" and ev.detail == "rescued" else \
                _STATES.get(ev.event)
            if state is not None:
                entry = ev.name if entries <= ENTRY_LABEL_LIMIT else "*"
                self._slots.labels(state, entry).inc()
                self._labelled.setdefault(entry, set()).add(state)

    def keep_entries(self, names: Iterable[str]) -> None:
        """Drop the series of entries no longer scheduled: labels never outgrow the schedule."""
        keep = set(names) | {"*"}
        for entry in [e for e in self._labelled if e not in keep]:
            for state in self._labelled.pop(entry):
                self._slots.remove(state, entry)

    def renewed(self, seconds: float | None) -> None:
        if seconds is None:
            self._renew_failures.inc()
            if self.health is not None:
                self.health.unanswered()
        else:
            self._renew.observe(seconds)
            self._redis_answered.set_to_current_time()
            if self.health is not None:
                self.health.answered()

    def clock_skew(self, seconds: float | None) -> None:
        # called once per renew interval after a tick whose Redis calls all succeeded (a
        # standby's too, which renews nothing): Redis answers this process
        self._redis_answered.set_to_current_time()
        if self.health is not None:
            self.health.answered()
        if seconds is not None:
            self._skew.set(seconds)

    def ticked(self, seconds: float) -> None:
        self._tick.observe(seconds)

    def overlap_from(self, read: Callable[[], Mapping[tuple[str, str, str], int]]) -> None:
        """Report the overlap decisions ``read`` returns (this process's store) at each scrape."""
        self._overlap.read = read


def start(port: int | None, health: Health | None = None,
          send_path: SendPath | None = None) -> NullMetrics:
    """Metrics (and the probes of ``health``) served on ``port``, or the null metrics when
    there is none."""
    if port is None:
        return NullMetrics()
    metrics = Metrics(send_path)
    metrics.serve(port, health)
    return metrics

"""The chaos soak on RabbitMQ and PostgreSQL: no Redis process anywhere.

    run = PgChaosRun(workdir, seed=1234, nodes=5, duration=1800, workers=2, broker="amqp",
                     guard=True, schedule=soak_schedule(), settings={}, kinds=PG_SOAK_KINDS)
    report = run.run()

What differs from :class:`~tests.chaos.harness.ChaosRun` (the rest is the same: the beats,
their proxies, the workers, RabbitMQ's recording queue, the fault bag, the verdict):

- the store is a PostgreSQL cluster of the run's own (``tests/support/pg_cluster.py``),
  which the faults stop, crash, freeze and whose sessions they end; every beat reaches it
  through a :class:`TcpProxy` of its own (``leaderbeat_store_url`` names the proxy), the
  workers (the guard) directly;
- the executions are recorded in a database of the run's own on the PostgreSQL at
  127.0.0.1:5432, which no fault touches (``LB_RECORD_PG``);
- :class:`PgMonitor` reads the lease row (a token ``holder|epoch`` while unexpired) and
  copies the ``history`` table, on a connection of its own straight to the cluster;
- the server's faults keep the data (nothing answered is lost), so no slot may go
  unrecorded: ``G3-UNRECORDED-MISS`` applies to all of them, and no entry re-anchors.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

import psycopg

from tests.support.beat import BeatProcess, beat_env
from tests.support.pg_cluster import Cluster, pg_cluster

from .harness import PG_SOAK_KINDS, ChaosRun, Observation, Spawned, Watching

SCHEMA = "leaderbeat"
RESULTS_HOST = "host=127.0.0.1 port=5432 user=postgres connect_timeout=5"
MONITOR_APP = "chaos-monitor"
#: five beats (a pool and a listening session each), two prefork workers' guards, the
#: monitor: more than the test clusters' 30 connections; fsync on, as a site runs it
SERVER_SETTINGS = {"max_connections": "200", "fsync": "on"}


class PgMonitor(Watching):
    """Polls the lease row and copies the history table."""

    copy_every = 4

    def __init__(self, conninfo: str, prefix: str, interval: float = 0.05) -> None:
        super().__init__("chaos-pg-monitor", interval)
        self.conninfo = f"{conninfo} application_name={MONITOR_APP}"
        self.prefix = prefix
        self.current: str | None = None
        self._last_id = 0
        self._conn: psycopg.Connection[Any] | None = None

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]] | None:
        """The rows, or None when the server did not answer (the next call reconnects)."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=2)
            return self._conn.execute(sql, params).fetchall()
        except psycopg.Error:
            if self._conn is not None:
                with contextlib.suppress(psycopg.Error):
                    self._conn.close()
            self._conn = None
            return None

    def _poll_leader(self) -> None:
        rows = self._query(f"SELECT holder, epoch, expires_at > clock_timestamp() "
                           f"FROM {SCHEMA}.lease WHERE app = %s", (self.prefix,))
        token = None
        if rows and rows[0][0] and rows[0][2]:
            token = f"{rows[0][0]}|{rows[0][1]}"
        obs = Observation(time.monotonic(), time.time(), token, rows is not None)
        with self.lock:
            self.current = token
            last = self.observations[-1] if self.observations else None
            if last is None or (last.token, last.ok) != (obs.token, obs.ok):
                self.observations.append(obs)

    def _copy_history(self) -> None:
        rows = self._query(f"SELECT id, event, entry, slot_ms, node, epoch, detail "
                           f"FROM {SCHEMA}.history WHERE app = %s AND id > %s "
                           f"ORDER BY id LIMIT 20000", (self.prefix, self._last_id))
        if not rows:
            return
        with self.lock:
            for event_id, event, entry, slot, node, epoch, detail in rows:
                row = {"id": str(event_id), "event": event, "entry": entry,
                       "slot": "" if slot is None else str(slot), "node": node,
                       "epoch": str(epoch), "detail": detail}
                self.history[(row["id"], event, entry, row["slot"], node)] = row
        self._last_id = int(rows[-1][0])

    def snapshot(self) -> tuple[list[Observation], list[dict[str, str]]]:
        with self.lock:
            return list(self.observations), list(self.history.values())


class PgChaosRun(ChaosRun):
    """:class:`ChaosRun` with a PostgreSQL store and its faults (:data:`PG_SOAK_KINDS`)."""

    def __init__(self, workdir: str | Path, **options: Any) -> None:
        options.setdefault("kinds", PG_SOAK_KINDS)
        if options.get("broker", "redis") != "amqp":
            raise ValueError(f"broker={options.get('broker', 'redis')!r}: the PostgreSQL "
                             "soak runs no Redis, so its broker is RabbitMQ ('amqp')")
        super().__init__(workdir, **options)
        self.report.mode["store"] = "postgres"
        self._stack = contextlib.ExitStack()
        self._paused: list[int] = []
        self.results_db = f"lb_soak_{self.tag.replace('-', '_')}"

    # -- the servers

    def _start_servers(self) -> None:
        # its own attribute: the base class's ``state`` is the Redis run's RedisServer
        self.cluster: Cluster = self._stack.enter_context(pg_cluster(settings=SERVER_SETTINGS))
        with psycopg.connect(f"{RESULTS_HOST} dbname=postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.results_db}"')
        with psycopg.connect(self._results_conninfo(), autocommit=True) as conn:
            conn.execute("CREATE TABLE executed (id bigserial PRIMARY KEY, row text NOT NULL)")
        broker_url = self._start_broker()
        self.env = beat_env(self.workdir, broker_url=broker_url, prefix=self.prefix,
                            schedule=self.schedule, settings=self._celery_settings())
        self.env["LB_STORE_URL"] = self._store_url(self.cluster.port)  # the workers: direct
        self.env["LB_RECORD_PG"] = self._results_conninfo()

    def _results_conninfo(self) -> str:
        return f"{RESULTS_HOST} dbname={self.results_db}"

    @staticmethod
    def _store_url(port: int) -> str:
        return f"postgresql://postgres@127.0.0.1:{port}/postgres?connect_timeout=3"

    def _make_monitor(self) -> PgMonitor:
        return PgMonitor(self.cluster.conninfo, self.prefix)

    def _state_port(self) -> int:
        return int(self.cluster.port)

    def _executed_rows(self) -> list[dict[str, Any]]:
        with psycopg.connect(self._results_conninfo(), autocommit=True) as conn:
            return [json.loads(raw) for (raw,) in
                    conn.execute("SELECT row FROM executed ORDER BY id").fetchall()]

    def _stop_state(self) -> None:
        if self._paused:  # a pause_pg interrupted mid-way must not leave it frozen
            self.cluster.resume(self._paused)
        with contextlib.suppress(OSError):
            shutil.copy(self.cluster.log, self.workdir / "postgres-server.log")
        self._stack.close()

    def _stop_results(self) -> None:
        try:
            with psycopg.connect(f"{RESULTS_HOST} dbname=postgres", autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.results_db}" WITH (FORCE)')
        except psycopg.Error as exc:
            self.report.info.append(f"results database not dropped: {exc}")

    def _spawn(self, index: int, proxy: Any, generation: int) -> BeatProcess:
        env = dict(self.env, LB_STORE_URL=self._store_url(proxy.port))
        proc = BeatProcess(env=env, log_path=self.workdir / f"beat-{index}-{generation}.log")
        self.spawned.append(Spawned(proc, f"beat-{index}-{generation}"))
        return proc

    def _read_leader(self) -> str | None:
        """The monitor's latest reading (never blocks, even with the server frozen)."""
        monitor = getattr(self, "monitor", None)
        return monitor.current if isinstance(monitor, PgMonitor) else None

    # -- the server's faults

    def _fault_restart_pg(self, u_leader: float, u_index: float, duration: float) -> None:
        """``pg_ctl stop -m fast`` (sessions ended cleanly), down 0.75 .. 2.5 s, started."""
        fault = self._begin("restart_pg", f"postgres :{self.cluster.port}", self._read_leader(),
                            False)
        self.cluster.stop("fast")
        time.sleep(duration / 2)
        self.cluster.start()
        self._end(fault, "(back with its data)")

    def _fault_crash_pg(self, u_leader: float, u_index: float, duration: float) -> None:
        """``pg_ctl stop -m immediate`` (a crash: no checkpoint), down 0.75 .. 2.5 s, started
        (recovery replays the WAL)."""
        fault = self._begin("crash_pg", f"postgres :{self.cluster.port}", self._read_leader(),
                            False)
        self.cluster.stop("immediate")
        time.sleep(duration / 2)
        self.cluster.start()
        self._end(fault, "(recovered from its WAL)")

    def _fault_terminate_pg(self, u_leader: float, u_index: float, duration: float) -> None:
        """``pg_terminate_backend`` of every client session but the monitor's."""
        fault = self._begin("terminate_pg", f"postgres :{self.cluster.port} sessions",
                            self._read_leader(), False)
        try:
            with psycopg.connect(self.cluster.conninfo, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() "
                    "AND application_name <> %s", (MONITOR_APP,)).fetchone()
            note = f"({row[0] if row else 0} sessions ended)"
        except psycopg.Error as exc:
            note = f"(not done: {exc})"
        self._end(fault, note)

    def _fault_pause_pg(self, u_leader: float, u_index: float, duration: float) -> None:
        """SIGSTOP every server process 1.5 .. 5 s, then SIGCONT."""
        fault = self._begin("pause_pg", f"postgres :{self.cluster.port}", self._read_leader(),
                            False)
        self._paused = self.cluster.pause()
        time.sleep(duration)
        self.cluster.resume(self._paused)
        self._paused = []
        self._end(fault)

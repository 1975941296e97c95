"""The demo on PostgreSQL (``--store postgres``): a throw-away cluster, a broker, the reads.

The server is a cluster of the demo's own, made by ``initdb`` and run by ``postgres``
from ``pg_config --bindir`` (else the newest ``/usr/lib/postgresql/*/bin``, else PATH),
on a free port, trust authentication on 127.0.0.1 only, inside the demo's temporary
directory, so it goes with it. Without those binaries the demo cannot run (exit 2,
saying what to install). No PostgreSQL the user already runs is touched.

The broker cannot be the demo's Redis, there being none: RabbitMQ when one answers
(``$LEADERBEAT_DEMO_BROKER``, else ``amqp://guest:guest@127.0.0.1:5672//``), on a queue
of the demo's own, deleted afterwards; else (or with ``LEADERBEAT_DEMO_BROKER=filesystem://``)
kombu's filesystem transport in the demo's directory: unlike an in-memory transport,
several processes on one machine share it; it polls every 0.1 s. Each message is written
whole before a worker can take it (:mod:`.fsbroker`; kombu's own transport lets a worker
take a message file still being written, and the worker exits on it).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import fsbroker
from .app import RUNS_TABLE
from .procs import DemoError, Proc, free_port
from .watch import Watcher

#: the OS user the cluster runs as when the demo runs as root (initdb refuses root)
SERVER_USER = "postgres"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
#: ``$LEADERBEAT_DEMO_BROKER`` naming the filesystem transport: no RabbitMQ is tried
FILESYSTEM = "filesystem://"
INSTALL = ("install the PostgreSQL server (Debian/Ubuntu: apt-get install postgresql; "
           "macOS: brew install postgresql) so that `pg_config --bindir` finds initdb, "
           "or set LEADERBEAT_PG_BINDIR to the directory holding initdb and postgres")


def find_bindir() -> Path:
    """Where ``initdb`` and ``postgres`` are; DemoError saying what to install."""
    candidates = []
    if os.environ.get("LEADERBEAT_PG_BINDIR"):
        candidates.append(os.environ["LEADERBEAT_PG_BINDIR"])
    else:
        pg_config = shutil.which("pg_config")
        if pg_config:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                candidates.append(subprocess.run([pg_config, "--bindir"], capture_output=True,
                                                 text=True, timeout=10, check=False
                                                 ).stdout.strip())
        candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                             key=lambda p: int(Path(p).parent.name)
                             if Path(p).parent.name.isdigit() else 0, reverse=True)
        if shutil.which("initdb"):
            candidates.append(str(Path(str(shutil.which("initdb"))).parent))
    for folder in candidates:
        if folder and all(os.access(Path(folder) / b, os.X_OK) for b in ("initdb", "postgres")):
            return Path(folder)
    raise DemoError(f"no PostgreSQL server binaries (initdb, postgres) found: {INSTALL}")


def _server_user() -> str | None:
    """The user to run the cluster as: none (this one) unless the demo runs as root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        raise DemoError(f"initdb refuses to run as root and there is no {SERVER_USER!r} "
                        "user to run the cluster as: run the demo as another user") from None
    return SERVER_USER


def start_postgres(directory: Path, bindir: Path) -> tuple[Proc, str]:
    """A new cluster under ``directory``, running and answering; returns it and its URL."""
    user = _server_user()
    data = directory / "pg"
    data.mkdir()
    if user is not None:  # the server's user must reach and own its directory
        entry = pwd.getpwnam(user)
        directory.chmod(0o711)
        os.chown(data, entry.pw_uid, entry.pw_gid)
    init = subprocess.run([str(bindir / "initdb"), "-D", str(data / "data"), "-U", "postgres",
                           "--auth=trust", "-E", "UTF8", "--no-sync"], capture_output=True,
                          text=True, timeout=120, user=user, check=False)
    if init.returncode != 0:
        raise DemoError(f"initdb failed ({init.returncode}): {init.stderr.strip()[-500:]}")
    port = free_port()
    server = Proc("postgres", [str(bindir / "postgres"), "-D", str(data / "data"), "-p",
                               str(port), "-k", str(data), "-c", "listen_addresses=127.0.0.1"],
                  directory, user=user, stop_signal=signal.SIGINT)  # SIGINT: a fast shutdown
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    _wait_ready(server, url)
    return server, url


def _wait_ready(server: Proc, url: str, timeout: float = 30.0) -> None:
    """Wait for the server to answer; then make the store's schema (as ``init-store``
    would: the demo reads its tables before any beat has started) and the runs table."""
    import psycopg

    from ..store.postgres.schema import DEFAULT_SCHEMA, ensure_schema

    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
                ensure_schema(conn, DEFAULT_SCHEMA)
                conn.execute(f"CREATE TABLE IF NOT EXISTS {RUNS_TABLE}"
                             " (id bigserial PRIMARY KEY, run jsonb NOT NULL)")
            return
        except psycopg.OperationalError as exc:
            if not server.alive or time.monotonic() > deadline:
                raise DemoError(f"postgres did not start ({exc}); its log ends:\n"
                                f"{server.log_text()[-500:]}") from exc
            time.sleep(0.1)


def choose_broker(directory: Path) -> tuple[dict[str, str], str, Any]:
    """The broker's environment for the demo's processes, a line saying which it is, and
    what to call at the end to remove the demo's queue (None: nothing to remove)."""
    url = os.environ.get("LEADERBEAT_DEMO_BROKER", AMQP_URL)
    queue = f"leaderbeat-demo-{secrets.token_hex(4)}"
    if url != FILESYSTEM and _answers(url):
        return ({"LBDEMO_BROKER_URL": url, "LBDEMO_QUEUE": queue},
                f"broker: RabbitMQ at {url.split('@')[-1]}, queue {queue}",
                lambda: _delete_queue(url, queue))
    folder = directory / "broker"
    folder.mkdir()
    why = "asked for" if url == FILESYSTEM else f"no RabbitMQ at {url.split('@')[-1]}"
    return ({"LBDEMO_BROKER_URL": f"{fsbroker.SCHEME}://", "LBDEMO_BROKER_DIR": str(folder)},
            f"broker: kombu's filesystem transport in {folder} ({why})", None)


def _answers(url: str) -> bool:
    from kombu import Connection  # type: ignore[attr-defined]  # kombu is untyped

    conn = Connection(url, connect_timeout=2)
    try:
        conn.ensure_connection(max_retries=1)
        return True
    except Exception:  # noqa: BLE001 - any failure to connect means: not this broker
        return False
    finally:
        conn.release()


def _delete_queue(url: str, queue: str) -> None:
    from kombu import Connection, Queue  # type: ignore[attr-defined]  # kombu is untyped

    with contextlib.suppress(Exception), Connection(url, connect_timeout=2) as conn:
        Queue(queue, channel=conn.default_channel).delete()


class PostgresWatcher(Watcher):
    """The same reads as :class:`Watcher`, from the store's tables (in the default schema,
    the demo's beats setting none) and the runs table: what any operator could select."""

    def __init__(self, url: str, app: str, beats: Sequence[Proc]) -> None:
        import psycopg

        super().__init__(None, None, None, beats)
        self.conn = psycopg.connect(url, autocommit=True)
        self.app = app
        self._last_row = 0

    def close(self) -> None:
        self.conn.close()

    def _rows(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        """``query``'s rows, ``{schema}`` in it naming the store's schema (quoted)."""
        from ..store.postgres.schema import DEFAULT_SCHEMA, qualified

        return self.conn.execute(qualified(query, DEFAULT_SCHEMA), params).fetchall()

    def _lease(self) -> str | None:
        rows = self._rows("SELECT holder, epoch FROM {schema}.lease WHERE app = %s AND holder"
                          " IS NOT NULL AND expires_at > clock_timestamp()", self.app)
        return f"{rows[0][0]}|{rows[0][1]}" if rows else None

    def _node_record(self, node: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT record FROM {schema}.nodes WHERE app = %s AND node = %s",
                          self.app, node)
        return dict(rows[0][0]) if rows else None

    def _history_since(self) -> list[dict[str, str]]:
        rows = self._rows(
            "SELECT id, (extract(epoch FROM at) * 1000)::bigint, event, entry, slot_ms, node,"
            " epoch, detail FROM {schema}.history WHERE app = %s AND id > %s ORDER BY id",
            self.app, self._last_row)
        out = []
        for row_id, at_ms, event, entry, slot, node, epoch, detail in rows:
            self._last_row = row_id
            out.append({"id": f"{at_ms}-{row_id}", "event": event, "entry": entry,
                        "slot": "" if slot is None else str(slot), "node": node,
                        "epoch": str(epoch), "detail": detail})
        return out

    def new_runs(self) -> list[dict[str, Any]]:
        rows = self._rows("SELECT run FROM " + RUNS_TABLE + " ORDER BY id OFFSET %s",
                          len(self.runs))
        new = [row[0] if isinstance(row[0], dict) else json.loads(row[0]) for row in rows]
        self.runs += new
        return new

    def slot_states(self) -> dict[str, tuple[int, str]]:
        rows = self._rows("SELECT entry, slot_ms, state FROM {schema}.slots WHERE app = %s",
                          self.app)
        return {entry: (int(slot), state) for entry, slot, state in rows}

    def pending(self) -> int:
        """Slots the history says were sent and no run recorded yet (the broker is not
        Redis: its queue is not read here)."""
        sent = {(h.get("entry"), h.get("slot")) for h in self.history if h.get("event") == "sent"}
        from .summary import slot_ms

        ran = {(r.get("entry"), str(slot_ms(r.get("slot")))) for r in self.runs}
        return len(sent - ran)

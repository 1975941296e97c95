"""One master, one replica and three Sentinels, all real processes on free ports.

Sentinels are told about the master only; they find the replica and each
other on their own. ``wait_settled()`` returns once every Sentinel knows the
replica and the two other Sentinels, so a failover can be ordered at once.
"""

from __future__ import annotations

import time
from pathlib import Path

import redis
from typing_extensions import Self

from tests.support.redis_server import RedisServer

MASTER = "mymaster"
DATA_ARGS = ["--repl-diskless-sync-delay", "0", "--repl-diskless-sync", "yes"]


class SentinelSet:
    def __init__(self, directory: Path, *, down_after_ms: int = 1000,
                 failover_timeout_ms: int = 3000, password: str | None = None,
                 sentinel_password: str | None = None) -> None:
        """``password``: the data nodes' (requirepass + masterauth); ``sentinel_password``:
        the Sentinels' own."""
        data_args = list(DATA_ARGS)
        if password:
            data_args += ["--requirepass", password, "--masterauth", password]
        sentinel_args = ["--requirepass", sentinel_password] if sentinel_password else []
        self.data: list[RedisServer] = []
        self.sentinels: list[RedisServer] = []
        try:
            # an empty config file each: Sentinel rewrites the roles into it (CONFIG REWRITE)
            master = RedisServer(data_args, config_text="", workdir=directory / "data-0")
            self.data.append(master)
            self.data.append(RedisServer(
                [*data_args, "--replicaof", "127.0.0.1", str(master.port)],
                config_text="", workdir=directory / "data-1"))
            conf = (f"sentinel monitor {MASTER} 127.0.0.1 {master.port} 2\n"
                    f"sentinel down-after-milliseconds {MASTER} {down_after_ms}\n"
                    f"sentinel failover-timeout {MASTER} {failover_timeout_ms}\n"
                    f"sentinel parallel-syncs {MASTER} 1\n")
            if password:
                conf += f"sentinel auth-pass {MASTER} {password}\n"
            for i in range(3):
                self.sentinels.append(RedisServer(sentinel_args, config_text=conf, sentinel=True,
                                                  workdir=directory / f"sentinel-{i}"))
            self.wait_settled()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        """The kombu-style URL naming every Sentinel."""
        return ";".join(f"sentinel://127.0.0.1:{s.port}" for s in self.sentinels)

    def sentinel_client(self, i: int = 0) -> redis.Redis:
        return self.sentinels[i].client(decode_responses=True)

    def master_port(self) -> int:
        """The master's port as the Sentinels report it."""
        _, port = self.sentinel_client().execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
        return int(port)

    def master(self) -> RedisServer:
        port = self.master_port()
        return next(s for s in self.data if s.port == port)

    def wait_settled(self, timeout: float = 20.0) -> None:
        """Every Sentinel sees the master, a replica and two peers; every replica is linked."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            try:
                ok, states = True, []
                for i in range(len(self.sentinels)):
                    c = self.sentinel_client(i)
                    peers = c.execute_command("SENTINEL", "SENTINELS", MASTER)
                    replicas = c.execute_command("SENTINEL", "REPLICAS", MASTER)
                    master = c.execute_command("SENTINEL", "MASTER", MASTER)
                    master = _pairs(master)
                    good = [r for r in (_pairs(r) for r in replicas)
                            if "s_down" not in r["flags"] and "disconnected" not in r["flags"]]
                    state = (f"sentinel {i}: peers={len(peers)} good replicas={len(good)} {[(r['flags'], r.get('master-link-status'), r['port']) for r in (_pairs(r) for r in replicas)]} "
                             f"master flags={master['flags']}")
                    this = len(peers) == 2 and len(good) >= 1 and master["flags"] == "master"
                    if not this:
                        states.append(state)
                    ok = ok and this
                for server in self.data:
                    if server.alive:
                        info = server.client().info("replication")
                        if info["role"] != "master" and info.get("master_link_status") != "up":
                            states.append(f"replica {server.port} link {info.get('master_link_status')}")
                            ok = False
                state = "; ".join(states)
                if ok:
                    return
            except redis.RedisError as exc:
                state = repr(exc)
            time.sleep(0.1)
        raise AssertionError(f"sentinel set not settled within {timeout}s: {state}")

    def wait_for_new_master(self, old_port: int, timeout: float = 20.0) -> int:
        """Poll until every Sentinel names a master other than ``old_port``; its port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ports = set()
            for i in range(len(self.sentinels)):
                try:
                    _, port = self.sentinel_client(i).execute_command(
                        "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
                    ports.add(int(port))
                except redis.RedisError:
                    ports.add(-1)
            if len(ports) == 1 and old_port not in ports and -1 not in ports:
                return ports.pop()
            time.sleep(0.05)
        raise AssertionError(f"no Sentinel-wide new master within {timeout}s")

    def close(self) -> None:
        for server in self.sentinels + self.data:
            server.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pairs(flat: list) -> dict:
    if isinstance(flat, dict):
        return flat
    return dict(zip(flat[0::2], flat[1::2]))

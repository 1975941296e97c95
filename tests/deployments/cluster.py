"""A three-master Redis Cluster of real ``redis-server`` processes, built by hand.

Slots are split evenly with ``CLUSTER ADDSLOTSRANGE``, the nodes are joined
with ``CLUSTER MEET``, and ``ready()`` returns once every node sees every slot
covered (``cluster_state:ok``) and knows all the masters.
"""

from __future__ import annotations

import time
from pathlib import Path

from typing_extensions import Self

from tests.support.redis_server import RedisServer, free_port

SLOTS = 16384


class RedisClusterSet:
    def __init__(self, directory: Path, masters: int = 3, binary: str | None = None) -> None:
        self.nodes: list[RedisServer] = []
        self.bus_ports: list[int] = []
        try:
            for i in range(masters):
                self.bus_ports.append(free_port())
                self.nodes.append(RedisServer(
                    ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-node-timeout", "2000",
                     # the default bus port (port + 10000) overflows for ports > 55535
                     "--cluster-port", str(self.bus_ports[-1])],
                    workdir=directory / f"cluster-{i}", binary=binary))
            self._assign_slots()
            self._meet()
            self.wait_ready()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def _assign_slots(self) -> None:
        n = len(self.nodes)
        for i, node in enumerate(self.nodes):
            first, last = i * SLOTS // n, (i + 1) * SLOTS // n - 1
            node.client().execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)

    def _meet(self) -> None:
        first = self.nodes[0].client()
        for node, bus in zip(self.nodes[1:], self.bus_ports[1:]):
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, bus)

    def wait_ready(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            states = []
            for node in self.nodes:
                info = node.client().execute_command("CLUSTER", "INFO").decode()
                fields = dict(line.split(":", 1) for line in info.split() if ":" in line)
                states.append(fields.get("cluster_state") == "ok"
                              and int(fields.get("cluster_known_nodes", 0)) == len(self.nodes))
            if all(states):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"cluster not ready within {timeout}s: {states}")
            time.sleep(0.05)

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

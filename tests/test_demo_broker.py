"""The demo's filesystem broker (``lbdemofs://``): a worker never takes half a message.

kombu's filesystem transport creates a message's file where consumers look and then
writes it; a worker that takes the file in between decodes an empty message and exits
(seen once in the PostgreSQL demo on a loaded machine). These tests stop the writer
inside its write and look at the folder as a consumer does at that moment.
"""

from __future__ import annotations

import builtins
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from kombu import Connection  # type: ignore[attr-defined]  # kombu is untyped
from kombu.transport import filesystem

from celery_leaderbeat.demo import fsbroker

QUEUE = "demo-q"


def channel(scheme: str, folder: Path) -> Any:
    opts = {"data_folder_in": str(folder), "data_folder_out": str(folder),
            "control_folder": str(folder / "control")}
    conn = Connection(f"{scheme}://", transport_options=opts)
    return conn, conn.default_channel


class LookDuringWrite:
    """``open`` for the writer's module: each file it writes, before the bytes go in, a
    consumer takes what it finds in the folder (``_get``) and says what it read."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.seen: list[str] = []  # per write: "nothing", "whole", or the decode error

    def __call__(self, path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = builtins.open(path, mode, *args, **kwargs)  # noqa: SIM115 - the writer closes it
        if "w" not in mode:
            return handle
        real_write, look = handle.write, self._look

        def write(data: bytes) -> int:
            look()
            return real_write(data)

        handle.write = write
        return handle

    def _look(self) -> None:
        try:
            self.consumer._get(QUEUE)
        except filesystem.Empty:
            self.seen.append("nothing")
        except ValueError as exc:  # json's decode error
            self.seen.append(f"undecodable: {exc}")
        else:
            self.seen.append("whole")


def test_a_consumer_looking_while_a_message_is_written_finds_no_message(tmp_path, monkeypatch):
    conn, producer = channel(fsbroker.SCHEME, tmp_path)
    reader, consumer = channel(fsbroker.SCHEME, tmp_path)
    spy = LookDuringWrite(consumer)
    monkeypatch.setattr(fsbroker, "open", spy, raising=False)
    try:
        producer._put(QUEUE, {"body": "x" * 4096})
        assert spy.seen == ["nothing"]  # the consumer looked while the bytes went in
        monkeypatch.undo()
        assert consumer._get(QUEUE) == {"body": "x" * 4096}  # then the whole message
        assert list((tmp_path / fsbroker.WRITING).iterdir()) == []  # nothing left behind
    finally:
        conn.release()
        reader.release()


def test_kombus_own_filesystem_transport_lets_a_consumer_take_a_message_being_written(
        tmp_path, monkeypatch):
    """Why the demo has a transport of its own: when kombu's own no longer shows this, the
    demo can use it again."""
    conn, producer = channel("filesystem", tmp_path)
    reader, consumer = channel("filesystem", tmp_path)
    spy = LookDuringWrite(consumer)
    monkeypatch.setattr(filesystem, "open", spy, raising=False)
    try:
        producer._put(QUEUE, {"body": "x" * 4096})
    finally:
        conn.release()
        reader.release()
    assert len(spy.seen) == 1 and spy.seen[0].startswith("undecodable"), spy.seen


CONSUMER = r"""
import json, sys
import celery_leaderbeat.demo.fsbroker  # registers lbdemofs://
from kombu import Connection
folder, count = sys.argv[1], int(sys.argv[2])
opts = {"data_folder_in": folder, "data_folder_out": folder, "polling_interval": 0.001,
        "control_folder": folder + "/control"}
got = []
with Connection("lbdemofs://", transport_options=opts) as conn:
    queue = conn.SimpleQueue("demo-q")
    while len(got) < count:
        message = queue.get(timeout=20)
        got.append(message.payload["i"])
        message.ack()
print(json.dumps(got))
"""


def test_another_process_takes_every_message_once_as_they_are_written(tmp_path):
    count = 500
    reader = subprocess.Popen([sys.executable, "-c", CONSUMER, str(tmp_path), str(count)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    opts = {"data_folder_in": str(tmp_path), "data_folder_out": str(tmp_path),
            "control_folder": str(tmp_path / "control")}
    try:
        with Connection(f"{fsbroker.SCHEME}://", transport_options=opts) as conn:
            queue = conn.SimpleQueue(QUEUE)
            for i in range(count):
                queue.put({"i": i, "pad": "x" * 2000})
        out, err = reader.communicate(timeout=60)
    finally:
        reader.kill()
    assert reader.returncode == 0, err[-2000:]
    got = json.loads(out)
    assert sorted(got) == list(range(count)), "a message lost or taken twice"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".msg")]


def test_the_scheme_is_known_to_kombu_once_the_module_is_imported():
    from kombu.transport import resolve_transport

    assert resolve_transport(fsbroker.SCHEME) is fsbroker.Transport

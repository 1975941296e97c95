"""kombu's filesystem transport with each message written whole before a worker can take it.

The demo's broker on a machine with neither Redis nor RabbitMQ. kombu's own transport
creates a message's file under its final name in the folder consumers list, then writes
it: a worker that lists the folder in between moves the still-empty file away, fails to
decode it, and exits. Here a message is written in a folder of its own inside the broker's
folder (so on the same filesystem) and renamed into place once written: a rename is atomic,
so a consumer sees either no file or the whole message.

Chosen by the URL ``lbdemofs://``, a scheme registered with kombu when this module is
imported (the demo's app imports it in every process it starts).
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from kombu import transport
from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps

#: the broker URL scheme of this transport
SCHEME = "lbdemofs"
#: the folder, inside the broker's, where a message is written before it is renamed into place
WRITING = ".writing"


class Channel(filesystem.Channel):
    """A filesystem channel whose messages appear whole."""

    # kombu names the message "payload" here and "message" in the base class: kept as here
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        # kombu's name: consumers take the oldest first and match the queue by the suffix
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        writing = os.path.join(self.data_folder_out, WRITING)
        os.makedirs(writing, exist_ok=True)
        staged = os.path.join(writing, name)
        try:
            with open(staged, "wb") as f:
                f.write(dumps(payload).encode())
            os.replace(staged, os.path.join(self.data_folder_out, name))
        except OSError as exc:
            raise ChannelError(
                f"Cannot add file {name!r} to directory {self.data_folder_out!r}") from exc


class Transport(filesystem.Transport):
    """kombu's filesystem transport with :class:`Channel`."""

    Channel = Channel


transport.TRANSPORT_ALIASES.setdefault(SCHEME, f"{__name__}:Transport")

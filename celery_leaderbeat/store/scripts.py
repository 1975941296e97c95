"""The Lua scripts, loaded from the package's ``lua/`` folder once per client.

redis-py's ``Script`` objects reload themselves when Redis answers NOSCRIPT
(after a restart or ``SCRIPT FLUSH``), so registering once is enough.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from ..config import Config
from ..errors import ScriptError
from .keys import Keys

NAMES = ("acquire", "renew", "release", "claim", "guard", "prune", "lost")


@cache
def source(name: str) -> str:
    """The text of ``lua/<name>.lua``."""
    return resources.files(__package__).joinpath("lua").joinpath(f"{name}.lua").read_text()


class Scripts:
    """Every script of the package, registered on one client."""

    def __init__(self, client: Any) -> None:
        for name in NAMES:
            setattr(self, name, client.register_script(source(name)))

    acquire: Any
    renew: Any
    release: Any
    claim: Any
    guard: Any
    prune: Any
    lost: Any


@dataclass
class RedisPart:
    """A part of the Redis store: its client, the scripts on it, the keys and the settings."""

    client: Any
    scripts: Scripts
    keys: Keys
    config: Config


def status(reply: Any, script: str) -> int:
    """The leading status code of a script's reply, checked against what it may answer."""
    if isinstance(reply, list) and reply and reply[0] in (0, 1):
        return int(reply[0])
    raise ScriptError(f"{script}.lua answered {reply!r}, which this version does not understand")


def text(value: Any) -> str:
    """A reply value as ``str`` whether the client decodes responses or not."""
    return value.decode() if isinstance(value, bytes) else str(value)

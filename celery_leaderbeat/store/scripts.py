"""The Lua scripts, loaded from the package's ``lua/`` folder once per client.

redis-py's ``Script`` objects reload themselves when Redis answers NOSCRIPT
(after a restart or ``SCRIPT FLUSH``), so registering once is enough. The slot
scripts (one per operation) each get the code tables written from
:mod:`.types`, the helpers of ``prelude.lua`` and those of the ``prelude_*.lua``
pieces they use (:data:`PIECES`) in front of them: one ``EVALSHA`` per
operation still, each script short enough to read in one sitting, and Python
and Lua read one vocabulary. The guard's scripts get the overlap lock's
hand-over (``guard_lock.lua``) in front of them, and those of one run the
helpers of ``guard_prelude.lua`` too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from ..config import Config
from ..errors import ScriptError
from .keys import Keys
from .types import BackfillReason, Code, SlotStatus

#: the scripts about slots, which share ``prelude.lua`` and the code tables
SLOT_SCRIPTS = ("lead", "rescue", "record", "backfill", "define", "check")
#: the prelude pieces a slot script gets after ``prelude.lua``: only those it calls, in
#: this order (a piece calls only what ``prelude.lua`` and the pieces before it define)
PIECES = {"lead": ("prelude_events", "prelude_claims", "prelude_enqueue"),
          "rescue": ("prelude_events", "prelude_claims"), "record": ("prelude_events",),
          "backfill": ("prelude_fence",), "define": ("prelude_fence",),
          "check": ("prelude_fence",)}
#: the worker guard's scripts of one run, which share ``guard_prelude.lua``
RUN_SCRIPTS = ("guard_start", "guard_renew", "guard_finish", "guard_release")
NAMES = ("acquire", "renew", "release", "prune", "lost", "states", *SLOT_SCRIPTS,
         *RUN_SCRIPTS, "guard_sweep")


@cache
def source(name: str) -> str:
    """The text Redis runs for script ``name``: ``lua/<name>.lua``, after the code tables,
    ``prelude.lua`` and its :data:`PIECES` for a slot script, after ``guard_lock.lua`` (and
    ``guard_prelude.lua`` for one run) for a guard script."""
    text = _read(name)
    if name in SLOT_SCRIPTS:
        parts = [code_tables(), *(_read(p) for p in ("prelude", *PIECES.get(name, ()))), text]
        text = "\n".join(parts)
    elif name in RUN_SCRIPTS:
        text = f"{_read('guard_lock')}\n{_read('guard_prelude')}\n{text}"
    elif name == "guard_sweep":
        text = f"{_read('guard_lock')}\n{text}"
    return text


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua").joinpath(f"{name}.lua").read_text()


def code_tables() -> str:
    """The Lua tables CODE, REASON and STATUS, written from the Python enums; reading a name
    that is not in one is an error in the script, not a silent nil."""
    def table(name: str, pairs: list[tuple[str, str]]) -> str:
        return f"local {name} = {{{', '.join(f'{k} = {v}' for k, v in pairs)}}}"

    return "\n".join([
        "-- written by store/scripts.py from store/types.py",
        table("CODE", [(c.name, str(c.value)) for c in Code]),
        table("REASON", [(r.name, f"'{r.value}'") for r in BackfillReason]),
        table("STATUS", [(s.name, f"'{s.value}'") for s in SlotStatus]),
        "for _, t in ipairs({CODE, REASON, STATUS}) do",
        "  setmetatable(t, {__index = function(_, k) error('no such code: ' .. tostring(k)) end})",
        "end",
    ])


class Scripts:
    """Every script of the package, registered on one client."""

    def __init__(self, client: Any) -> None:
        for name in NAMES:
            setattr(self, name, client.register_script(source(name)))

    acquire: Any
    renew: Any
    release: Any
    prune: Any
    lost: Any
    states: Any
    lead: Any
    rescue: Any
    record: Any
    backfill: Any
    define: Any
    check: Any
    guard_start: Any
    guard_renew: Any
    guard_finish: Any
    guard_release: Any
    guard_sweep: Any


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

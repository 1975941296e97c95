"""The catch-up policy (docs/architecture.md, "Catch-up") and its one validator.

The global settings (``leaderbeat_catchup``, ``leaderbeat_catchup_window``,
``leaderbeat_max_catchup``) and each entry's own ``leaderbeat`` options are
checked by :func:`catchup_problems`, so the rule and its wording live here once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

CATCHUP_MODES = ("latest", "skip", "all")


def catchup_problems(mode: Any, window: Any, max_catchup: Any, *,
                     named: Callable[[str], str] = lambda key: key) -> list[str]:
    """What is wrong with a catch-up policy; ``named(key)`` says where the value came from.

    ``window`` is seconds (a number or a timedelta) or None.
    """
    problems = []
    if mode not in CATCHUP_MODES:
        problems.append(f"{named('catchup')}={mode!r} must be one of {', '.join(CATCHUP_MODES)}")
    seconds = window.total_seconds() if isinstance(window, timedelta) else window
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                or seconds <= 0):
        problems.append(f"{named('catchup_window')}={window!r} must be a number of seconds > 0")
    if isinstance(max_catchup, bool) or not isinstance(max_catchup, int) or max_catchup < 1:
        problems.append(f"{named('max_catchup')}={max_catchup!r} must be an integer of at least 1")
    return problems


@dataclass(frozen=True)
class CatchupPolicy:
    """What to do with slots missed while no node could send them."""

    mode: str = "latest"
    window: timedelta | None = None
    max_catchup: int = 100
    #: the fields above as one tuple, made once: the shared plans' key takes it, hashed
    #: and compared in C where a look asks a thousand times (the dataclass's own
    #: ``__hash__`` and ``__eq__`` are Python)
    key: tuple[Any, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        from ..errors import ConfigurationError

        problems = catchup_problems(self.mode, self.window, self.max_catchup)
        if problems:
            raise ConfigurationError(problems)
        object.__setattr__(self, "key", tuple(getattr(self, f.name) for f in fields(self)
                                              if f.init))

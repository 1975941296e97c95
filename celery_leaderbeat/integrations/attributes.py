"""What the Scheduler's mixins share: the attributes ``celery_leaderbeat.Scheduler`` sets up.

:mod:`.schedule`, :mod:`.sending`, :mod:`.trouble` and :mod:`.lifecycle` each hold
some of the class's methods; the attributes are set in ``Scheduler.__init__`` and declared
here once, for the type checker and the reader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import Config
from ..entries import EntryOptions
from ..ops.telemetry import Telemetry
from ..roles.dynamic_schedule import DynamicSchedule
from ..roles.leader import Leader
from ..roles.shared import Shared
from ..roles.standby import Standby
from ..send.sender import Enqueuer
from ..store.keys import Keys
from ..store.registry import Registration

if TYPE_CHECKING:
    from celery.beat import Scheduler as _Beat
else:
    _Beat = object  # a mixin of celery_leaderbeat.Scheduler, before celery.beat.Scheduler


class Attributes(_Beat):
    """The Scheduler's attributes, as its mixins see them."""

    lb_config: Config
    keys: Keys
    _entry_options: dict[str, EntryOptions]
    _schedule_version: int
    #: (schedule version, entry names it changed) for changes known name by name
    _changes: list[tuple[int, frozenset[str]]]
    _dynamic: DynamicSchedule | None
    _pid: int | None  # the process that made the Redis client (a fork makes its own)
    _shared: Shared | None
    _leader: Leader | None
    _standby: Standby | None
    _enqueuer: Enqueuer | None
    _wake_by: float  # monotonic time by which the main loop will be back
    _last_wall: tuple[float, float]
    _store_failures: int
    _led_at_outage: bool
    _contact_since: float
    _labels_version: int  # the schedule version the metric labels follow
    _closed: bool
    _registration: Registration
    _telemetry: Telemetry

    if TYPE_CHECKING:
        def _connect(self) -> Shared: ...
        def _step_down(self, why: str, release: bool = False) -> None: ...
        def _follow_changes(self, *, force: bool = False) -> None: ...
        def changed_since(self, version: int) -> frozenset[str] | None: ...
        def overlap_of(self, name: str) -> str: ...

"""The schedule the Scheduler keeps: its version, and which entries each change touched."""

from __future__ import annotations

#: schedule versions whose changed names are kept (an older one means a full reload)
CHANGE_LOG = 64

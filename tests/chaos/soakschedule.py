"""The soak's schedule (about 219 entries) and the slot grid of each kind of entry.

Intervals of 1, 2 and 5 s and cron strings (every 2 s and 10 s with seconds, and every
minute: a burst of some 190 slots at once, bigger than one claim chunk). About 15
slots a second in all.
"""

from __future__ import annotations

from typing import Any

from .soaktask import TASK


def soak_schedule(task: str = TASK) -> dict[str, dict[str, Any]]:
    """Entry name -> spec for ``beat_env``: 5 x 1 s, 6 x 2 s, 10 x 5 s, 8 cron-seconds, 190 cron."""
    schedule: dict[str, dict[str, Any]] = {}
    for every, count in ((1, 5), (2, 6), (5, 10)):
        for i in range(count):
            schedule[f"every{every}s-{i}"] = {"task": task, "every": every}
    for step, count in ((2, 4), (10, 4)):
        for i in range(count):
            schedule[f"cron{step}s-{i}"] = {"task": task, "cron": f"*/{step} * * * * *"}
    for i in range(190):
        schedule[f"cron1m-{i:03d}"] = {"task": task, "cron": "* * * * *"}
    return schedule


def grid_of(spec: Any) -> tuple[str, int]:
    """("interval" | "cron", step in ms) of an entry spec; ValueError for other crons."""
    if "every" in spec:
        return "interval", round(float(spec["every"]) * 1000)
    fields = str(spec.get("cron", "")).split()
    if len(fields) == 6 and fields[1:] == ["*"] * 5 and fields[0].startswith("*/"):
        return "cron", int(fields[0][2:]) * 1000  # seconds first
    if len(fields) == 5 and fields[1:] == ["*"] * 4:
        if fields[0] == "*":
            return "cron", 60_000
        if fields[0].startswith("*/"):
            return "cron", int(fields[0][2:]) * 60_000
    raise ValueError(f"the verdict does not know the slots of {spec}")

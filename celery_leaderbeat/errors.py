"""The exceptions celery_leaderbeat raises: one small hierarchy."""

from __future__ import annotations


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


class LeaseLostError(LeaderbeatError):
    """The leader key no longer holds this node's token: another node leads now."""

    #: the token the leader key holds instead (None: it holds nothing at all)
    holder: str | None = None
    #: True when the store said so (``holder`` is its answer), not this node's own clock
    answered: bool = False


class NotReplicatedError(LeaderbeatError):
    """A claim was not acknowledged by ``leaderbeat_min_replicas`` replicas in time."""

    #: what the claim call answered per item (granted or why not), when it got that far
    results: list | None = None


class RedisAuthError(LeaderbeatError):
    """Redis refused the credentials; retrying cannot help."""


class ScriptError(LeaderbeatError):
    """A Lua script answered a code this version does not know."""


class RolledBackError(LeaderbeatError):
    """Redis holds older state than this node has seen (restored from an older snapshot,
    a lagging replica promoted): nothing was granted; the leader must re-anchor."""

    #: the generation Redis holds now
    generation: int = 0

"""The runtime's typed errors (`runtime`, `runtime_async`): a step the session is not at, a
blocked run, an open attempt, a run that is over, a model answer that is not JSON, a reconcile answer that is
none of the three."""

from __future__ import annotations

from .runtime_blocked import Blocked


class RuntimeStateError(RuntimeError):
    """The runtime was asked for a step the session is not at (e.g. an attempt while tools of
    the settled step have no result)."""


class RunBlockedError(RuntimeStateError):
    """A step asked of a blocked run; `blocked` (a `Blocked`) says why and the ways out."""

    def __init__(self, blocked: Blocked) -> None:
        self.blocked = blocked
        super().__init__(str(blocked))


class AttemptOpenError(RuntimeStateError):
    """`attempt()` while an attempt this session opened has neither an answer nor a failure:
    settle or fail it first (a second one would use up the retry)."""


class RunOverError(RuntimeStateError):
    """A step asked of a run that is over (finished, ended or restarted); `operation_id` names
    it, `how` says how it ended."""

    def __init__(self, operation_id: str, how: str) -> None:
        self.operation_id = operation_id
        self.how = how
        super().__init__(f"run {operation_id} is over: {how}")


class InvalidAnswerError(ValueError):
    """A model answer holding something that is not a JSON value; `path` names where (nothing
    was written)."""

    def __init__(self, path: str, what: str, *, message: str | None = None) -> None:
        self.path = path
        super().__init__(message or f"{path} is {what}, not a JSON value (nothing was written)")

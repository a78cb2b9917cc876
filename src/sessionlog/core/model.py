"""What the reducer remembers of a session beyond its transcript: entries, attempts and operations
(the objects later facts refer to by id)."""

from __future__ import annotations

from typing import Any


class Entry:
    """What later facts need to know of an entry fact."""

    __slots__ = (
        "attempt_id",
        "kind",
        "message",
        "messages_through",
        "operation_id",
        "order",
        "step_id",
        "stop_reason",
    )

    def __init__(
        self,
        kind: str,
        message: dict[str, Any] | None,
        order: int,
        messages_through: int,
        operation_id: str | None = None,
        step_id: str | None = None,
        attempt_id: str | None = None,
        stop_reason: str | None = None,
    ) -> None:
        self.kind = kind  # "message" or "compaction"
        self.message = message
        self.order = order  # position among all entries
        self.messages_through = messages_through  # message entries up to and including this one
        self.operation_id = operation_id
        self.step_id = step_id
        self.attempt_id = attempt_id
        self.stop_reason = stop_reason


class Attempt:
    """One model attempt (`stepAttempt`) and what became of it."""

    __slots__ = (
        "attempt_id",
        "closed",
        "context_id",
        "declared",
        "digest",
        "failed",
        "kind",
        "number",
        "operation_id",
        "settled_id",
        "snapshot",
        "step_id",
        "stop_reason",
    )

    def __init__(
        self,
        operation_id: str,
        step_id: str,
        attempt_id: str,
        number: int,
        kind: str,
        context_id: str,
        snapshot: dict[str, Any],
        digest: str,
        declared: frozenset[str],
    ) -> None:
        self.operation_id = operation_id
        self.step_id = step_id
        self.attempt_id = attempt_id
        self.number = number
        self.kind = kind
        self.context_id = context_id
        self.snapshot = snapshot
        self.digest = digest
        self.declared = declared  # the tool names of the snapshot
        self.closed = False
        self.failed = False
        self.settled_id: str | None = None
        self.stop_reason: str | None = None

    @property
    def status(self) -> str:
        if self.failed:
            return "failed"
        return "attempting" if self.settled_id is None else "settled"


class Operation:
    """A run or a compaction."""

    __slots__ = (
        "abort_requested",
        "finished",
        "id",
        "input_id",
        "kind",
        "latest_step_id",
        "pending",
        "result_id",
        "step",
        "tool_calls",
    )

    def __init__(self, kind: str, operation_id: str, input_id: str, result_id: str | None = None) -> None:
        self.kind = kind
        self.id = operation_id
        self.input_id = input_id  # inputEntryId of a run, inputThroughEntryId of a compaction
        self.result_id = result_id  # the reserved compaction entry id
        self.finished = False
        self.latest_step_id: str | None = None
        self.step: Attempt | None = None  # the latest attempt
        self.tool_calls: list[dict[str, Any]] = []  # tool intents, in the state's public form
        self.pending = 0  # how many of them have no result yet
        self.abort_requested = False

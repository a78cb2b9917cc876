"""SessionState: an immutable snapshot of the reduced session (contract section 10).

Taking a snapshot costs a bounded amount, whatever the session's or the run's length: the
transcript, the active context and the run's tool intents are append-only lists, so a snapshot
keeps a reference and a length. Of the tool intents only those that can still change (from the
earliest pending one on: the current step's) are copied; the others are settled for good.

Reading costs what is read: `transcript` and `active_context` are read-only `Messages` views,
whose items are copied as they are taken (so a caller never mutates the reducer's state).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, overload

from .reducer import Attempt, Operation, Reducer


class Usage(NamedTuple):
    input: int
    output: int
    cache_read: int
    cache_write: int

    def to_json(self) -> dict[str, int]:
        return {
            "input": self.input,
            "output": self.output,
            "cacheRead": self.cache_read,
            "cacheWrite": self.cache_write,
        }


def copy_json(value: Any) -> Any:
    """A fresh copy of a JSON value, so callers can never mutate the reducer's state."""
    kind = type(value)
    if kind is dict:
        return {key: copy_json(item) for key, item in value.items()}
    if kind is list:
        return [copy_json(item) for item in value]
    return value


def _step(attempt: Attempt) -> dict[str, Any]:
    step: dict[str, Any] = {
        "operationId": attempt.operation_id,
        "stepId": attempt.step_id,
        "attemptId": attempt.attempt_id,
        "attempt": attempt.number,
        "stepKind": attempt.kind,
        "status": attempt.status,
        "contextThroughEntryId": attempt.context_id,
        "configurationSnapshot": attempt.snapshot,
        "configurationDigest": attempt.digest,
    }
    if attempt.settled_id is not None:
        step["settledEntryId"] = attempt.settled_id
    if attempt.stop_reason is not None:
        step["stopReason"] = attempt.stop_reason
    return step


def _operation(operation: Operation | None) -> dict[str, Any]:
    """The public operation object; a run's `toolCalls` are filled in when read (`_ToolCalls`)."""
    if operation is None:
        return {"kind": "idle"}
    public: dict[str, Any] = {"kind": operation.kind, "operationId": operation.id}
    if operation.kind == "run":
        public["inputEntryId"] = operation.input_id
        public["toolCalls"] = None  # its place in the contract's key order
    else:
        public["inputThroughEntryId"] = operation.input_id
        public["resultEntryId"] = operation.result_id
    public["abortRequested"] = operation.abort_requested
    if operation.step is not None:
        public["step"] = _step(operation.step)
    return public


class _ToolCalls:
    """A run's tool intents at one moment: the settled ones by reference (they never change
    again), copies of those from the earliest pending one on (a result may still settle them)."""

    __slots__ = ("_calls", "_settled", "_tail")

    def __init__(self, operation: Operation) -> None:
        calls = operation.tool_calls
        settled = len(calls)
        pending = operation.pending
        while pending and settled:  # back to the earliest pending intent: the current step's
            settled -= 1
            pending -= calls[settled]["status"] == "pending"
        self._calls = calls
        self._settled = settled
        self._tail = [dict(tool) for tool in calls[settled:]]

    def public(self) -> list[dict[str, Any]]:
        return [*map(copy_json, self._calls[: self._settled]), *map(copy_json, self._tail)]


class Messages(Sequence[dict[str, Any]]):
    """A read-only view of the transcript or the active context at one moment. Its length costs
    nothing; each message is copied as it is taken (`view[i]`, iteration), so reading costs what
    is read. `list(view)` makes a list of copies, to send to a model or to change."""

    __slots__ = ("_items", "_length")

    def __init__(self, items: list[dict[str, Any]], length: int) -> None:
        self._items = items
        self._length = length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [copy_json(self._items[position]) for position in range(*index.indices(self._length))]
        position = range(self._length)[index]  # IndexError, negative indices
        return copy_json(self._items[position])  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        items = self._items
        for position in range(self._length):
            yield copy_json(items[position])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Messages):
            return self._length == other._length and all(
                self._items[index] == other._items[index] for index in range(self._length)
            )
        if isinstance(other, list | tuple):
            return self._length == len(other) and all(
                self._items[index] == item for index, item in enumerate(other)
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<Messages: {self._length} message{'' if self._length == 1 else 's'}>"

    def to_list(self) -> list[dict[str, Any]]:
        """Copies of every message, as a list."""
        return list(self)


class SessionState:
    """The reduced state of a session at one seq. Every accessor returns copies (the message
    views copy each message as it is read): nothing a caller does changes the session."""

    __slots__ = (
        "_active",
        "_active_length",
        "_boundary",
        "_calls",
        "_header",
        "_intents",
        "_last_finished",
        "_last_seq",
        "_operation",
        "_outcomes",
        "_repaired_length",
        "_settled_id",
        "_transcript",
        "_transcript_length",
        "_usage",
    )

    def __init__(self, reducer: Reducer, repaired_length: int) -> None:
        self._header = reducer.header
        self._transcript = reducer.transcript
        self._transcript_length = len(reducer.transcript)
        self._active = reducer.active_context
        self._active_length = len(reducer.active_context)
        self._usage = Usage(*reducer.usage)
        self._operation = _operation(reducer.current)
        current = reducer.current
        self._intents = _ToolCalls(current) if current is not None and current.kind == "run" else None
        self._last_finished = reducer.last_finished  # replaced, never changed in place
        self._repaired_length = repaired_length
        self._last_seq = reducer.next_seq - 1
        self._boundary = reducer.boundary
        # What the planner needs of the current run's settled assistant entry.
        self._settled_id: str | None = None
        self._calls: list[dict[str, Any]] = []
        self._outcomes: frozenset[int] = frozenset()
        step = current.step if current is not None else None
        if current is not None and current.kind == "run" and step is not None and step.settled_id:
            entry = reducer.entries[step.settled_id]
            self._settled_id = step.settled_id
            self._calls = (entry.message or {}).get("tool_calls", [])
            self._outcomes = frozenset(
                index for index in range(len(self._calls)) if (step.settled_id, index) in reducer.outcomes
            )

    # -- the contract's form -----------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """Exactly the `state` object of the contract's expected-state schema."""
        return {
            "header": dict(self._header),
            "transcript": self.transcript.to_list(),
            "activeContext": self.active_context.to_list(),
            "usage": self._usage.to_json(),
            "operation": self.operation,
            "repairedLength": self._repaired_length,
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SessionState):
            return NotImplemented
        return self._last_seq == other._last_seq and self.to_json() == other.to_json()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        kind = self._operation["kind"]
        return f"<SessionState {self._header['id']} seq={self._last_seq} operation={kind}>"

    # -- accessors a framework needs ---------------------------------------------------------

    @property
    def header(self) -> dict[str, Any]:
        return dict(self._header)

    @property
    def session_id(self) -> str:
        return str(self._header["id"])

    @property
    def transcript(self) -> Messages:
        """Every message of the session, as a read-only view (see `Messages`)."""
        return Messages(self._transcript, self._transcript_length)

    @property
    def active_context(self) -> Messages:
        """The messages to send to the model next, as a read-only view (`list(...)` to send)."""
        return Messages(self._active, self._active_length)

    @property
    def active_context_through(self) -> str | None:
        """The active-context boundary: the entry id a next attempt 1 names as its context."""
        return self._boundary

    @property
    def usage(self) -> Usage:
        return self._usage

    @property
    def last_seq(self) -> int:
        """The seq of the last committed fact (0 for a header-only session)."""
        return self._last_seq

    @property
    def repaired_length(self) -> int:
        """Bytes up to and including the last LF: everything after it is a torn tail."""
        return self._repaired_length

    @property
    def is_idle(self) -> bool:
        return bool(self._operation["kind"] == "idle")

    @property
    def operation(self) -> dict[str, Any]:
        """The contract's `operation` object: `{"kind": "idle"}` or the current run/compaction."""
        public: dict[str, Any] = copy_json(self._operation)
        if self._intents is not None:
            public["toolCalls"] = self._intents.public()
        return public

    @property
    def last_finished(self) -> dict[str, Any] | None:
        """How the last finished run or compaction ended: its `operationFinished` record (less
        `type`): `operationId`, `operationKind`, `outcome` (`completed`, `aborted`, `failed`) and
        `completion`, `finalEntryId` or `error` as recorded. None before any finished."""
        return None if self._last_finished is None else copy_json(self._last_finished)

    @property
    def current_operation(self) -> dict[str, Any] | None:
        return None if self.is_idle else self.operation

    @property
    def step(self) -> dict[str, Any] | None:
        """The current operation's latest step, whatever its status."""
        step = self._operation.get("step")
        return None if step is None else copy_json(step)

    @property
    def open_attempt(self) -> dict[str, Any] | None:
        """The current step when a model request may be in flight (status `attempting`)."""
        step = self.step
        return step if step is not None and step["status"] == "attempting" else None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """Every tool intent of the current run, pending or completed."""
        return [] if self._intents is None else self._intents.public()

    @property
    def pending_tools(self) -> list[dict[str, Any]]:
        """Tool intents without a result: their effect may have happened."""
        return [tool for tool in self.tool_calls if tool["status"] == "pending"]

    @property
    def settled_entry_id(self) -> str | None:
        """The assistant entry that settled the current run's latest step, if any."""
        return self._settled_id

    @property
    def settled_calls(self) -> list[dict[str, Any]]:
        """The tool calls of that assistant entry."""
        return copy_json(self._calls)  # type: ignore[no-any-return]

    def has_outcome(self, tool_index: int) -> bool:
        """Whether call `tool_index` of the settled assistant entry was started or settled."""
        return tool_index in self._outcomes

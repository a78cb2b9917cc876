"""The reducer: header and transactions to session state (contract sections 2-8).

Incremental: applying a transaction costs time proportional to that transaction. Nothing is
copied per transaction and the transcript is never rescanned; legality (section 8) is kept as the
set of tool-call ids that are open after the last committed message.

Atomic: when a store validates a commit (`begin` ... `commit` / `rollback`), every mutation is
journalled and a failing transaction is undone in reverse order. A bulk load needs no journal: a
failing transaction ends the load.

Checks run in the contract's order so that `{code, line, seq}` matches the other ports; where the
ports disagree with each other, this module follows the contract text (see the README's
compatibility notes).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from .canonical import MAX_SAFE_INTEGER, canonical, digest, source_digest
from .errors import ContractError, shown

_UUID7 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}").fullmatch
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}").fullmatch

# ECMAScript's WhiteSpace and LineTerminator: "non-blank" means what String.prototype.trim keeps.
_BLANK = "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"  # noqa: E501

SYNTHETIC_CONTENT = {
    "invalidArguments": "Error: Tool arguments were invalid; the tool was not executed.",
    "unknownTool": "Error: Unknown tool; the tool was not executed.",
    "truncated": "Error: Tool call arguments were truncated by the model token limit; the tool was not executed.",  # noqa: E501
    "aborted": "Operation aborted before execution.",
    "interrupted": "Operation interrupted after execution status became unknown; the tool was not replayed.",
}
PRE_EXECUTION_REASONS = frozenset(("invalidArguments", "unknownTool", "truncated", "aborted"))

HEADER_KEYS = frozenset(
    ("kind", "version", "id", "createdAt", "cwd", "provider", "model", "environmentIdentity")
)
_ENTRY_FACT = frozenset(("kind", "seq", "id", "timestamp", "entry"))
_RECORD_FACT = frozenset(("kind", "seq", "id", "timestamp", "record"))
_USAGE_FACT = frozenset(
    ("kind", "seq", "id", "timestamp", "operationId", "attemptId", "toolStartedId", "usage")
)
_USER_ENTRY = frozenset(("type", "message"))
_ASSISTANT_ENTRY = frozenset(("type", "stepId", "attemptId", "stopReason", "message"))
_STARTED_RESULT_ENTRY = frozenset(("type", "stepId", "message", "toolName", "toolStartedId", "result"))
_PRE_EXECUTION_ENTRY = frozenset(
    ("type", "stepId", "assistantEntryId", "toolIndex", "message", "toolName", "result")
)
_COMPACTION_ENTRY = frozenset(("type", "operationId", "summary", "compactedThroughEntryId", "retainedTail"))
_RESULT = frozenset(("type", "reason"))
_RETAINED = frozenset(("sourceEntryId", "message"))
_USER_MESSAGE = frozenset(("role", "content"))
_ASSISTANT_MESSAGE = frozenset(("role", "content", "tool_calls"))
_TOOL_MESSAGE = frozenset(("role", "content", "tool_call_id"))
_TOOL_CALL = frozenset(("id", "type", "function"))
_FUNCTION = frozenset(("name", "arguments"))
_SNAPSHOT = frozenset(
    ("model", "systemPromptDigest", "tools", "adapterIdentity", "routingIdentity", "outputOptionsDigest")
)
_SNAPSHOT_TOOL = frozenset(("name", "definitionDigest"))
_ERROR = frozenset(("code", "message"))
_USAGE = ("input", "output", "cacheRead", "cacheWrite")
_USAGE_KEYS = frozenset(_USAGE)
_RECORD_KEYS = {
    "runStarted": frozenset(("type", "operationId", "operationKind", "inputEntryId")),
    "compactionStarted": frozenset(
        (
            "type",
            "operationId",
            "operationKind",
            "inputThroughEntryId",
            "resultEntryId",
            "compactedEntryIds",
            "retainedEntryIds",
            "sourceDigest",
        )
    ),
    "stepAttempt": frozenset(
        (
            "type",
            "operationId",
            "stepId",
            "attemptId",
            "stepKind",
            "attempt",
            "contextThroughEntryId",
            "configurationSnapshot",
            "configurationDigest",
        )
    ),
    "stepFailed": frozenset(("type", "operationId", "stepId", "attemptId", "error")),
    "toolStarted": frozenset(
        (
            "type",
            "operationId",
            "stepId",
            "assistantEntryId",
            "toolIndex",
            "toolCallId",
            "toolName",
            "arguments",
            "replay",
            "replayKey",
            "environmentIdentity",
            "resultEntryId",
        )
    ),
    "abortRequested": frozenset(("type", "operationId", "operationKind", "phase", "toolCallId", "reason")),
    "operationFinished": frozenset(
        ("type", "operationId", "operationKind", "outcome", "completion", "finalEntryId", "error")
    ),
}

# A validated configuration snapshot: (its digest, its normal form, the tool names it declares).
Snapshot = tuple[str, dict[str, Any], frozenset[str]]
_SNAPSHOT_CACHE = 256  # distinct snapshot encodings remembered per session

# Reservation kinds: what a reserved id may later become.
_IDENTITY, _TOOL_RESULT, _COMPACTION_RESULT = "identity", "toolResult", "compactionResult"


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


def _fail(code: str, line: int, seq: int | None, detail: str) -> ContractError:
    return ContractError(code, line, seq, detail)


def _key_names(keys: Iterable[str]) -> str:
    """Unknown keys for a message: at most five, each cut short (a key may be a megabyte long)."""
    names = sorted(keys)
    shown_names = ", ".join(shown(name) for name in names[:5])
    return f"[{shown_names}{f' and {len(names) - 5} more' if len(names) > 5 else ''}]"


def is_uuid7(value: Any) -> bool:
    return type(value) is str and _UUID7(value) is not None


def validate_header(value: Any, line: int = 1) -> dict[str, Any]:
    """The header line to the state's `header` object (contract section 2)."""
    if type(value) is not dict:
        raise _fail("INVALID_HEADER", line, None, "the header is not an object")
    if not value.keys() <= HEADER_KEYS:
        raise _fail(
            "INVALID_HEADER", line, None, f"unknown header keys {_key_names(value.keys() - HEADER_KEYS)}"
        )
    if value.get("kind") != "header":
        raise _fail("INVALID_HEADER", line, None, 'header kind is not "header"')
    version = value.get("version")
    if type(version) is not int or version != 2:
        raise _fail("UNSUPPORTED_VERSION", line, None, f"version {shown(version)} is not 2")
    if not is_uuid7(value.get("id")):
        raise _fail("INVALID_HEADER", line, None, "header id is not a UUIDv7")
    created = value.get("createdAt")
    if type(created) is not int or not 0 <= created <= MAX_SAFE_INTEGER:
        raise _fail("INVALID_HEADER", line, None, "createdAt is not a safe integer")
    header = {"id": value["id"], "createdAt": created}
    for key in ("cwd", "provider", "model", "environmentIdentity"):
        text = value.get(key)
        if type(text) is not str or not text:
            raise _fail("INVALID_HEADER", line, None, f"{key} is not a non-empty string")
        header[key] = text
    return header


class Reducer:
    """Live session state, advanced one transaction at a time."""

    def __init__(self, header: dict[str, Any]) -> None:
        self.header = header
        self.next_seq = 1
        self.ids: set[str] = set()
        self.reserved: dict[str, str] = {}
        self.entries: dict[str, Entry] = {}
        self.message_ids: list[str] = []  # message entries, in order
        self.transcript: list[dict[str, Any]] = []
        self.active_context: list[dict[str, Any]] = []
        self.boundary: str | None = None  # the active-context boundary entry id
        self.open_calls: set[str] = set()  # tool-call ids opened and not yet closed (section 8)
        self.usage = [0, 0, 0, 0]
        self.operations: dict[str, Operation] = {}
        self.attempts: dict[str, Attempt] = {}
        self.steps: dict[str, list[Attempt]] = {}
        self.tools: dict[str, dict[str, Any]] = {}  # toolStarted id -> tool state
        self.outcomes: set[tuple[str, int]] = set()  # (assistant entry id, toolIndex) with an outcome
        self.current: Operation | None = None
        self.last_timestamp = 0  # the largest fact timestamp so far
        self._digests: dict[tuple[Any, ...], Snapshot] = {}
        self._snapshots: dict[bytes, Snapshot] = {}
        self._undo: list[Callable[[], object]] | None = None
        # The compaction source digest, kept running: sha256 of the canonical array of
        # {sourceEntryId, message} over message_ids[:count], without its closing bracket.
        self._source_hash = hashlib.sha256(b"[")
        self._source_count = 0

    # -- transactions ------------------------------------------------------------------------

    def begin(self) -> int:
        """Start journalling one transaction; return its mark for `rollback`. Marks nest: a
        store may have several transactions in flight, each undoable back to its own mark."""
        if self._undo is None:
            self._undo = []
        mark = len(self._undo)
        saved = (
            self.next_seq,
            self.last_timestamp,
            self.boundary,
            self.current,
            self.active_context,
            len(self.active_context),
            len(self.transcript),
            len(self.message_ids),
            self.usage,
            set(self.open_calls),
        )
        self._undo.append(lambda: self._restore_saved(saved))
        return mark

    def _restore_saved(self, saved: tuple[Any, ...]) -> None:
        (
            self.next_seq,
            self.last_timestamp,
            self.boundary,
            self.current,
            active,
            active_length,
            transcript_length,
            messages_length,
            self.usage,
            self.open_calls,
        ) = saved
        del active[active_length:]
        self.active_context = active
        del self.transcript[transcript_length:]
        del self.message_ids[messages_length:]

    def release(self) -> None:
        """Every journalled transaction is durable: forget how to undo them."""
        self._undo = None

    def rollback(self, mark: int = 0) -> None:
        """Undo every transaction from `mark` on, newest first."""
        undo = self._undo
        if undo is None or mark > len(undo):
            raise RuntimeError("rollback without a matching begin")
        while len(undo) > mark:
            undo.pop()()
        if not undo:
            self._undo = None

    def apply(self, value: Any, line: int) -> None:
        """Apply one transaction line's value (a fact or an array of facts)."""
        transaction = value if type(value) is list else [value]
        if not transaction:
            raise _fail("EMPTY_TRANSACTION", line, None, "the transaction array is empty")
        first_message = len(self.transcript)
        for fact in transaction:
            self._apply_fact(fact, line)
        if len(self.transcript) != first_message:
            self._check_transcript(first_message, line)

    def _check_transcript(self, first: int, line: int) -> None:
        open_calls = self.open_calls
        for message in self.transcript[first:]:
            role = message["role"]
            if role == "tool":
                call_id = message["tool_call_id"]
                if call_id not in open_calls:
                    raise _fail(
                        "INVALID_TRANSCRIPT",
                        line,
                        self.next_seq - 1,
                        f"tool message answers {shown(call_id)}, which no open tool call has",
                    )
                open_calls.remove(call_id)
            elif open_calls:
                raise _fail(
                    "INVALID_TRANSCRIPT",
                    line,
                    self.next_seq - 1,
                    f"{role} message while tool calls {sorted(open_calls)} are unanswered",
                )
            elif role == "assistant" and "tool_calls" in message:
                open_calls.update(call["id"] for call in message["tool_calls"])

    # -- journalled mutations ----------------------------------------------------------------

    def _restore(self, target: object, *names: str) -> None:
        """Journal the current values of `names` on `target` (call only while journalling)."""
        assert self._undo is not None
        for name in names:
            self._undo.append(functools.partial(setattr, target, name, getattr(target, name)))

    # -- per fact ----------------------------------------------------------------------------

    def _apply_fact(self, fact: Any, line: int) -> None:
        if type(fact) is not dict:
            raise _fail("INVALID_FACT", line, None, "a fact is not an object")
        seq = fact.get("seq")
        if type(seq) is not int or not 1 <= seq <= MAX_SAFE_INTEGER:
            raise _fail("INVALID_FACT", line, None, "seq is not a safe integer >= 1")
        if seq != self.next_seq:
            raise _fail("SEQ_MISMATCH", line, seq, f"expected seq {self.next_seq}")
        fact_id = fact.get("id")
        if type(fact_id) is not str or _UUID7(fact_id) is None:
            raise _fail("INVALID_FACT", line, seq, "id is not a UUIDv7")
        timestamp = fact.get("timestamp")
        if type(timestamp) is not int or not 0 <= timestamp <= MAX_SAFE_INTEGER:
            raise _fail("INVALID_FACT", line, seq, "timestamp is not a safe integer")
        if fact_id in self.ids:
            raise _fail("DUPLICATE_ID", line, seq, f"id {fact_id} is already used by a fact")
        kind = fact.get("kind")
        if kind == "entry":
            self._apply_entry(fact, fact_id, line, seq)
        elif kind == "record":
            self._apply_record(fact, fact_id, line, seq)
        elif kind == "usage":
            self._apply_usage(fact, line, seq)
        else:
            raise _fail("INVALID_FACT", line, seq, f"kind {shown(kind)} is not entry, record or usage")
        if fact_id in self.reserved:
            raise _fail("DUPLICATE_ID", line, seq, f"id {fact_id} is reserved for another fact")
        self.ids.add(fact_id)
        if self._undo is not None:
            self._undo.append(functools.partial(self.ids.discard, fact_id))
        self.next_seq = seq + 1
        if timestamp > self.last_timestamp:
            self.last_timestamp = timestamp

    # -- field checks ------------------------------------------------------------------------

    @staticmethod
    def _keys(value: dict[str, Any], allowed: frozenset[str], what: str, line: int, seq: int) -> None:
        if not allowed.issuperset(value):
            raise _fail(
                "INVALID_FACT", line, seq, f"{what} has unknown keys {_key_names(value.keys() - allowed)}"
            )

    @staticmethod
    def _uuid(value: Any, what: str, line: int, seq: int) -> str:
        if type(value) is not str or _UUID7(value) is None:
            raise _fail("INVALID_FACT", line, seq, f"{what} is not a UUIDv7")
        return value

    @staticmethod
    def _text(value: Any, what: str, line: int, seq: int) -> str:
        if type(value) is not str or not value:
            raise _fail("INVALID_FACT", line, seq, f"{what} is not a non-empty string")
        return value

    @staticmethod
    def _safe_int(value: Any, what: str, line: int, seq: int, minimum: int = 0) -> int:
        if type(value) is not int or not minimum <= value <= MAX_SAFE_INTEGER:
            raise _fail("INVALID_FACT", line, seq, f"{what} is not a safe integer >= {minimum}")
        return value

    @staticmethod
    def _object(value: Any, what: str, line: int, seq: int) -> dict[str, Any]:
        if type(value) is not dict:
            raise _fail("INVALID_FACT", line, seq, f"{what} is not an object")
        return value

    def _reserve(self, value: Any, what: str, line: int, seq: int, kind: str = _IDENTITY) -> str:
        if type(value) is not str or _UUID7(value) is None:
            raise _fail("INVALID_FACT", line, seq, f"{what} is not a UUIDv7")
        if value in self.ids or value in self.reserved:
            raise _fail("DUPLICATE_ID", line, seq, f"{what} {value} is already a fact id or reserved")
        self.reserved[value] = kind
        if self._undo is not None:
            self._undo.append(functools.partial(self.reserved.pop, value))
        return value

    def _release(self, key: str) -> None:
        kind = self.reserved.pop(key)
        if self._undo is not None:
            self._undo.append(functools.partial(self.reserved.__setitem__, key, kind))

    def _running(self, value: Any, what: str, line: int, seq: int) -> Operation:
        # Only valid ids are keys, so a hit needs no UUID check; a miss decides the code.
        found = self.operations.get(value) if type(value) is str else None
        if found is None:
            self._uuid(value, what, line, seq)
            raise _fail("INVALID_REFERENCE", line, seq, f"{what} {value} is not a known operation")
        if found.finished:
            raise _fail("INVALID_TRANSITION", line, seq, f"operation {value} is already finished")
        return found

    def _known(self, table: dict[str, Any], value: Any, what: str, line: int, seq: int) -> Any:
        """`table[value]`, or None when a valid id is missing; INVALID_FACT when not a UUIDv7."""
        found = table.get(value) if type(value) is str else None
        if found is None:
            self._uuid(value, what, line, seq)
        return found

    def _message(self, value: Any, line: int, seq: int) -> Any:
        """Validate a message and return it as it is: its key set is then exactly the contract's
        (no unknown keys, every required one present), so it equals the normal form."""
        if type(value) is not dict:
            raise _fail("INVALID_FACT", line, seq, "message is not an object")
        role = value.get("role")
        content = value.get("content")
        if role == "user":
            if not _USER_MESSAGE.issuperset(value):
                self._keys(value, _USER_MESSAGE, "user message", line, seq)
            if type(content) is not str or not content:
                raise _fail("INVALID_FACT", line, seq, "user content is not a non-empty string")
            return value
        if role == "tool":
            if not _TOOL_MESSAGE.issuperset(value):
                self._keys(value, _TOOL_MESSAGE, "tool message", line, seq)
            if type(content) is not str:
                raise _fail("INVALID_FACT", line, seq, "tool content is not a string")
            call_id = value.get("tool_call_id")
            if type(call_id) is not str or not call_id:
                raise _fail("INVALID_FACT", line, seq, "tool_call_id is not a non-empty string")
            return value
        if role != "assistant":
            raise _fail(
                "INVALID_FACT", line, seq, f"message role {shown(role)} is not user, assistant or tool"
            )
        if not _ASSISTANT_MESSAGE.issuperset(value):
            self._keys(value, _ASSISTANT_MESSAGE, "assistant message", line, seq)
        if content is not None and type(content) is not str:
            raise _fail("INVALID_FACT", line, seq, "assistant content is not a string or null")
        if "content" not in value:  # the ports read a missing content as null
            value = {"role": role, "content": None, **value}
        if "tool_calls" not in value:
            return value
        raw_calls = value["tool_calls"]
        if type(raw_calls) is not list or not raw_calls:
            raise _fail("INVALID_FACT", line, seq, "tool_calls is not a non-empty array")
        ids = set()
        for raw in raw_calls:
            if type(raw) is not dict:
                raise _fail("INVALID_FACT", line, seq, "a tool call is not an object")
            if not _TOOL_CALL.issuperset(raw):
                self._keys(raw, _TOOL_CALL, "tool call", line, seq)
            if raw.get("type") != "function":
                raise _fail("INVALID_FACT", line, seq, 'tool call type is not "function"')
            function = raw.get("function")
            if type(function) is not dict:
                raise _fail("INVALID_FACT", line, seq, "tool call function is not an object")
            if not _FUNCTION.issuperset(function):
                self._keys(function, _FUNCTION, "tool call function", line, seq)
            arguments = function.get("arguments")
            if type(arguments) is not str:
                raise _fail("INVALID_FACT", line, seq, "tool call arguments is not a string")
            call_id = raw.get("id")
            name = function.get("name")
            if type(call_id) is not str or not call_id or type(name) is not str or not name:
                raise _fail("INVALID_FACT", line, seq, "tool call id or name is not a non-empty string")
            ids.add(call_id)
        if len(ids) != len(raw_calls):
            raise _fail("INVALID_TRANSCRIPT", line, seq, "two tool calls of one message share an id")
        return value

    # -- entries -----------------------------------------------------------------------------

    def _apply_entry(self, fact: dict[str, Any], fact_id: str, line: int, seq: int) -> None:
        if not _ENTRY_FACT.issuperset(fact):
            self._keys(fact, _ENTRY_FACT, "entry fact", line, seq)
        entry = fact.get("entry")
        if type(entry) is not dict:
            raise _fail("INVALID_FACT", line, seq, "entry is not an object")
        entry_type = entry.get("type")
        if entry_type == "message":
            self._apply_message(entry, fact_id, line, seq)
        elif entry_type == "compaction":
            self._apply_compaction(entry, fact_id, line, seq)
        else:
            raise _fail(
                "INVALID_FACT", line, seq, f"entry type {shown(entry_type)} is not message or compaction"
            )

    def _apply_message(self, entry: dict[str, Any], fact_id: str, line: int, seq: int) -> None:
        message = self._message(entry.get("message"), line, seq)
        role = message["role"]
        order = len(self.entries)
        through = len(self.message_ids) + 1
        if role == "user":
            if fact_id in self.reserved:
                raise _fail("DUPLICATE_ID", line, seq, f"user entry id {fact_id} is reserved")
            if not _USER_ENTRY.issuperset(entry):
                self._keys(entry, _USER_ENTRY, "user entry", line, seq)
            info = Entry("message", message, order, through)
        elif role == "assistant":
            info = self._settle_attempt(entry, message, fact_id, line, seq)
        else:
            info = self._tool_result(entry, message, fact_id, line, seq)
        self.transcript.append(message)
        self.active_context.append(message)
        self.boundary = fact_id
        self.message_ids.append(fact_id)
        self.entries[fact_id] = info
        if self._undo is not None:
            self._undo.append(functools.partial(self.entries.pop, fact_id))

    def _settle_attempt(
        self, entry: dict[str, Any], message: dict[str, Any], fact_id: str, line: int, seq: int
    ) -> Entry:
        if fact_id in self.reserved:
            raise _fail("DUPLICATE_ID", line, seq, f"assistant entry id {fact_id} is reserved")
        if not _ASSISTANT_ENTRY.issuperset(entry):
            self._keys(entry, _ASSISTANT_ENTRY, "assistant entry", line, seq)
        step_id = entry.get("stepId")
        attempt_id = entry.get("attemptId")
        attempt = self.attempts.get(attempt_id) if type(attempt_id) is str else None
        if attempt is None or attempt.step_id != step_id:  # a hit proves both are valid ids
            if type(step_id) is not str or _UUID7(step_id) is None:
                raise _fail("INVALID_FACT", line, seq, "stepId is not a UUIDv7")
            if type(attempt_id) is not str or _UUID7(attempt_id) is None:
                raise _fail("INVALID_FACT", line, seq, "attemptId is not a UUIDv7")
        stop = entry.get("stopReason")
        if stop not in ("stop", "toolUse", "length"):
            raise _fail("INVALID_FACT", line, seq, f"stopReason {shown(stop)} is not stop, toolUse or length")
        if attempt is None or attempt.step_id != step_id or attempt.closed or attempt.kind != "assistant":
            raise _fail(
                "INVALID_REFERENCE",
                line,
                seq,
                f"attempt {attempt_id} is not an open assistant attempt of step {step_id}",
            )
        current = self.current
        if current is None or current.kind != "run" or current.id != attempt.operation_id:
            raise _fail("INVALID_TRANSITION", line, seq, "the attempt's run is not the current operation")
        if stop == "toolUse" and "tool_calls" not in message:
            raise _fail("INVALID_TRANSCRIPT", line, seq, "stopReason toolUse without tool calls")
        if stop == "stop" and "tool_calls" in message:
            raise _fail("INVALID_TRANSCRIPT", line, seq, "stopReason stop with tool calls")
        if self._undo is not None:
            self._restore(attempt, "closed", "settled_id", "stop_reason")
        attempt.closed = True
        attempt.settled_id = fact_id
        attempt.stop_reason = stop
        return Entry(
            "message",
            message,
            len(self.entries),
            len(self.message_ids) + 1,
            attempt.operation_id,
            step_id,
            attempt_id,
            stop,
        )

    def _tool_result(
        self, entry: dict[str, Any], message: dict[str, Any], fact_id: str, line: int, seq: int
    ) -> Entry:
        pre_execution = "assistantEntryId" in entry or "toolIndex" in entry
        if pre_execution:
            if not _PRE_EXECUTION_ENTRY.issuperset(entry):
                self._keys(entry, _PRE_EXECUTION_ENTRY, "pre-execution result entry", line, seq)
        else:
            if not _STARTED_RESULT_ENTRY.issuperset(entry):
                self._keys(entry, _STARTED_RESULT_ENTRY, "tool result entry", line, seq)
        step_id = entry.get("stepId")
        started_id = entry.get("toolStartedId")
        started = None if pre_execution or type(started_id) is not str else self.tools.get(started_id)
        if (started is None or started["stepId"] != step_id) and (
            type(step_id) is not str or _UUID7(step_id) is None
        ):
            raise _fail("INVALID_FACT", line, seq, "stepId is not a UUIDv7")
        result = entry.get("result")
        if type(result) is not dict:
            raise _fail("INVALID_FACT", line, seq, "result is not an object")
        if not _RESULT.issuperset(result):
            self._keys(result, _RESULT, "result", line, seq)
        tool_name = entry.get("toolName")
        if type(tool_name) is not str or not tool_name:
            raise _fail("INVALID_FACT", line, seq, "toolName is not a non-empty string")
        order = len(self.entries)
        through = len(self.message_ids) + 1
        if pre_execution:
            reason = result.get("reason")
            if (
                result.get("type") != "synthetic"
                or type(reason) is not str
                or reason not in PRE_EXECUTION_REASONS
            ):
                raise _fail("INVALID_FACT", line, seq, "result is not a pre-execution synthetic result")
            assistant_id = entry.get("assistantEntryId")
            if type(assistant_id) is not str or _UUID7(assistant_id) is None:
                raise _fail("INVALID_FACT", line, seq, "assistantEntryId is not a UUIDv7")
            index = entry.get("toolIndex")
            if type(index) is not int or not 0 <= index <= MAX_SAFE_INTEGER:
                raise _fail("INVALID_FACT", line, seq, "toolIndex is not a safe integer")
            assistant = self.entries.get(assistant_id)
            current = self.current
            if (
                assistant is None
                or assistant.kind != "message"
                or assistant.step_id != step_id
                or current is None
                or current.kind != "run"
                or assistant.operation_id != current.id
            ):
                raise _fail(
                    "INVALID_REFERENCE",
                    line,
                    seq,
                    f"{assistant_id} is not an assistant entry of step {step_id} in the current run",
                )
            self._call_at(assistant, index, message["tool_call_id"], tool_name, line, seq)
            pair = (assistant_id, index)
            if pair in self.outcomes:
                raise _fail("INVALID_TRANSITION", line, seq, f"tool call {index} already has an outcome")
            if message["content"] != SYNTHETIC_CONTENT[reason]:
                raise _fail("INVALID_TRANSCRIPT", line, seq, f"content is not the fixed {reason} text")
            self.outcomes.add(pair)
            if self._undo is not None:
                self._undo.append(functools.partial(self.outcomes.discard, pair))
            return Entry("message", message, order, through, assistant.operation_id, step_id)
        if self.reserved.get(fact_id) != _TOOL_RESULT:
            raise _fail("INVALID_REFERENCE", line, seq, f"{fact_id} is not a reserved tool-result id")
        result_type = result.get("type")
        if result_type not in ("success", "error", "synthetic"):
            raise _fail(
                "INVALID_FACT",
                line,
                seq,
                f"result type {shown(result_type)} is not success, error or synthetic",
            )
        if result_type == "synthetic":
            if result.get("reason") != "interrupted":
                raise _fail("INVALID_FACT", line, seq, "a started tool's synthetic result is not interrupted")
            if message["content"] != SYNTHETIC_CONTENT["interrupted"]:
                raise _fail("INVALID_TRANSCRIPT", line, seq, "content is not the fixed interrupted text")
        elif "reason" in result:
            raise _fail("INVALID_FACT", line, seq, f"a {result_type} result has a reason")
        if started is None and (type(started_id) is not str or _UUID7(started_id) is None):
            raise _fail("INVALID_FACT", line, seq, "toolStartedId is not a UUIDv7")
        if (
            started is None
            or started["stepId"] != step_id
            or started["resultEntryId"] != fact_id
            or started["toolCallId"] != message["tool_call_id"]
            or started["toolName"] != tool_name
            or started["status"] != "pending"
        ):
            raise _fail(
                "INVALID_REFERENCE", line, seq, f"{started_id} is not a pending tool intent for this result"
            )
        started["status"] = "completed"
        owner = self.operations[started["operationId"]]
        if self._undo is not None:
            self._undo.append(functools.partial(started.__setitem__, "status", "pending"))
            self._restore(owner, "pending")
        owner.pending -= 1
        self._release(fact_id)
        return Entry("message", message, order, through, started["operationId"], started["stepId"])

    def _call_at(self, assistant: Entry, index: int, call_id: Any, name: Any, line: int, seq: int) -> None:
        calls = assistant.message.get("tool_calls", ()) if assistant.message else ()
        call = calls[index] if index < len(calls) else None
        if call is None or call["id"] != call_id or call["function"]["name"] != name:
            raise _fail(
                "INVALID_REFERENCE",
                line,
                seq,
                f"tool call {index} of the assistant entry is not {shown(call_id)} calling {shown(name)}",
            )

    def _apply_compaction(self, entry: dict[str, Any], fact_id: str, line: int, seq: int) -> None:
        if self.reserved.get(fact_id) != _COMPACTION_RESULT:
            raise _fail("INVALID_REFERENCE", line, seq, f"{fact_id} is not a reserved compaction result id")
        if not _COMPACTION_ENTRY.issuperset(entry):
            self._keys(entry, _COMPACTION_ENTRY, "compaction entry", line, seq)
        found = self._running(entry.get("operationId"), "operationId", line, seq)
        current = self.current
        if found.kind != "compaction" or current is not found:
            raise _fail("INVALID_TRANSITION", line, seq, "operationId is not the current compaction")
        if found.result_id != fact_id:
            raise _fail("INVALID_REFERENCE", line, seq, "the compaction reserved another result id")
        through_id = entry.get("compactedThroughEntryId")
        if type(through_id) is not str or _UUID7(through_id) is None:
            raise _fail("INVALID_FACT", line, seq, "compactedThroughEntryId is not a UUIDv7")
        through = self.entries.get(through_id)
        if through is None:
            raise _fail(
                "INVALID_REFERENCE", line, seq, f"compactedThroughEntryId {through_id} is not an entry"
            )
        summary = entry.get("summary")
        tail = entry.get("retainedTail")
        if type(summary) is not str or type(tail) is not list:
            raise _fail("INVALID_FACT", line, seq, "summary is not a string or retainedTail not an array")
        source = self.entries[found.input_id]
        if source.order < through.order:
            raise _fail("INVALID_REFERENCE", line, seq, "compactedThroughEntryId is after the input boundary")
        first = through.messages_through
        expected = source.messages_through - first
        retained = []
        for index, raw in enumerate(tail):
            item = raw
            if type(item) is not dict:
                raise _fail("INVALID_FACT", line, seq, "a retained message is not an object")
            if not _RETAINED.issuperset(item):
                self._keys(item, _RETAINED, "retained message", line, seq)
            source_id = item.get("sourceEntryId")
            if type(source_id) is not str or _UUID7(source_id) is None:
                raise _fail("INVALID_FACT", line, seq, "sourceEntryId is not a UUIDv7")
            message = self._message(item.get("message"), line, seq)
            kept = self.entries.get(source_id)
            if (
                index >= expected
                or source_id != self.message_ids[first + index]
                or kept is None
                or kept.message != message
            ):
                raise _fail(
                    "INVALID_REFERENCE",
                    line,
                    seq,
                    f"retainedTail[{index}] is not the message entry after the compacted part",
                )
            retained.append(message)
        if len(tail) != expected:
            raise _fail(
                "INVALID_REFERENCE",
                line,
                seq,
                f"retainedTail holds {len(tail)} messages, the input boundary needs {expected}",
            )
        self._check_messages(retained, line, seq)
        attempt = found.step
        if attempt is None or attempt.closed or attempt.kind != "compaction":
            raise _fail("INVALID_TRANSITION", line, seq, "the compaction has no open compaction attempt")
        self.active_context = [{"role": "user", "content": "[Compacted history]\n" + summary}, *retained]
        self.boundary = found.input_id
        if self._undo is not None:
            self._restore(attempt, "closed", "settled_id")
        attempt.closed = True
        attempt.settled_id = fact_id
        self._release(fact_id)
        self.entries[fact_id] = Entry(
            "compaction",
            None,
            len(self.entries),
            len(self.message_ids),
            found.id,
            attempt.step_id,
            attempt.attempt_id,
        )
        if self._undo is not None:
            self._undo.append(functools.partial(self.entries.pop, fact_id))

    @staticmethod
    def _check_messages(messages: list[dict[str, Any]], line: int, seq: int) -> None:
        """Section 8 legality of a standalone message list (a compaction's retained tail)."""
        open_calls: set[str] = set()
        for message in messages:
            role = message["role"]
            if role == "tool":
                if message["tool_call_id"] not in open_calls:
                    raise _fail("INVALID_TRANSCRIPT", line, seq, "retained tool message answers no open call")
                open_calls.remove(message["tool_call_id"])
            elif open_calls:
                raise _fail("INVALID_TRANSCRIPT", line, seq, "retained tail has unanswered tool calls")
            elif role == "assistant" and "tool_calls" in message:
                open_calls.update(call["id"] for call in message["tool_calls"])

    # -- records -----------------------------------------------------------------------------

    def _apply_record(self, fact: dict[str, Any], fact_id: str, line: int, seq: int) -> None:
        if not _RECORD_FACT.issuperset(fact):
            self._keys(fact, _RECORD_FACT, "record fact", line, seq)
        record = fact.get("record")
        if type(record) is not dict:
            raise _fail("INVALID_FACT", line, seq, "record is not an object")
        kind = record.get("type")
        allowed = _RECORD_KEYS.get(kind) if type(kind) is str else None
        if allowed is None or type(kind) is not str:
            raise _fail("INVALID_FACT", line, seq, f"record type {shown(kind)} is unknown")
        if not allowed.issuperset(record):
            self._keys(record, allowed, kind, line, seq)
        if kind == "stepAttempt":
            self._step_attempt(record, line, seq)
        elif kind == "toolStarted":
            self._tool_started(record, fact_id, line, seq)
        elif kind == "runStarted":
            self._run_started(record, line, seq)
        elif kind == "operationFinished":
            self._operation_finished(record, line, seq)
        elif kind == "stepFailed":
            self._step_failed(record, line, seq)
        elif kind == "abortRequested":
            self._abort_requested(record, line, seq)
        else:
            self._compaction_started(record, line, seq)

    def _start(self, operation: Operation) -> None:
        self.operations[operation.id] = operation
        if self._undo is not None:
            self._undo.append(functools.partial(self.operations.pop, operation.id))
        self.current = operation

    def _run_started(self, record: dict[str, Any], line: int, seq: int) -> None:
        if record.get("operationKind") != "run" or self.current is not None:
            raise _fail(
                "INVALID_TRANSITION", line, seq, "runStarted needs operationKind run and an idle session"
            )
        operation_id = self._reserve(record.get("operationId"), "operationId", line, seq)
        input_id = record.get("inputEntryId")
        if type(input_id) is not str or _UUID7(input_id) is None:
            raise _fail("INVALID_FACT", line, seq, "inputEntryId is not a UUIDv7")
        source = self.entries.get(input_id)
        if source is None or source.message is None or source.message["role"] != "user":
            raise _fail(
                "INVALID_REFERENCE", line, seq, f"inputEntryId {input_id} is not a user message entry"
            )
        self._start(Operation("run", operation_id, input_id))

    def _compaction_started(self, record: dict[str, Any], line: int, seq: int) -> None:
        if record.get("operationKind") != "compaction" or self.current is not None:
            raise _fail(
                "INVALID_TRANSITION",
                line,
                seq,
                "compactionStarted needs operationKind compaction and an idle session",
            )
        operation_id = self._reserve(record.get("operationId"), "operationId", line, seq)
        input_id = record.get("inputThroughEntryId")
        if type(input_id) is not str or _UUID7(input_id) is None:
            raise _fail("INVALID_FACT", line, seq, "inputThroughEntryId is not a UUIDv7")
        result_id = self._reserve(record.get("resultEntryId"), "resultEntryId", line, seq, _COMPACTION_RESULT)
        source = self.entries.get(input_id)
        if source is None:
            raise _fail("INVALID_REFERENCE", line, seq, f"inputThroughEntryId {input_id} is not an entry")
        compacted = record.get("compactedEntryIds")
        kept = record.get("retainedEntryIds")
        if type(compacted) is not list or not compacted or type(kept) is not list:
            raise _fail("INVALID_FACT", line, seq, "compactedEntryIds / retainedEntryIds are not id arrays")
        partition = compacted + kept
        # The usual case first, at C speed: the partition is exactly the known message ids, all
        # proven UUIDv7 when they were added. Otherwise check each id, in the contract's order.
        ids = self.message_ids
        exact = (count := source.messages_through) == len(partition) and partition == ids[:count]
        if not exact:
            for value in partition:
                self._uuid(value, "a partition id", line, seq)
        if source.message is None:
            raise _fail("INVALID_REFERENCE", line, seq, "inputThroughEntryId is not a message entry")
        if not exact:
            raise _fail(
                "INVALID_REFERENCE",
                line,
                seq,
                "compacted + retained ids are not every message entry through the input",
            )
        claimed = record.get("sourceDigest")
        if type(claimed) is not str or _DIGEST(claimed) is None:
            raise _fail("INVALID_FACT", line, seq, "sourceDigest is not sha256:<64 hex>")
        actual = self._source_digest(count)
        if actual != claimed:
            raise _fail(
                "INVALID_REFERENCE", line, seq, f"sourceDigest is not the digest {actual} of the source"
            )
        self._start(Operation("compaction", operation_id, input_id, result_id))

    def _source_digest(self, count: int) -> str:
        """The compaction `sourceDigest` of the first `count` messages. Messages never change once
        appended, so the hash runs on from the last compaction: each message is encoded and
        hashed once per session, not once per compaction."""
        if count < self._source_count:  # an earlier boundary than the last one hashed: from scratch
            entries = self.entries
            return source_digest((mid, entries[mid].message or {}) for mid in self.message_ids[:count])
        if self._undo is not None:  # a rolled-back transaction may remove messages hashed here
            self._undo.append(
                functools.partial(self._set_source, self._source_hash.copy(), self._source_count)
            )
        running, entries, ids = self._source_hash, self.entries, self.message_ids
        for index in range(self._source_count, count):
            mid = ids[index]
            item = {"sourceEntryId": mid, "message": entries[mid].message or {}}
            running.update(b"," + canonical(item) if index else canonical(item))
        self._source_count = count
        final = running.copy()
        final.update(b"]")
        return "sha256:" + final.hexdigest()

    def _set_source(self, running: Any, count: int) -> None:
        self._source_hash, self._source_count = running, count

    def _snapshot(self, value: Any, line: int, seq: int) -> Snapshot:
        """A configuration snapshot to (digest, normal form); equal snapshots share one object.

        Sessions repeat one snapshot in every attempt: its encoding, once validated, is a cache
        key that skips validation and hashing next time."""
        encoded = b""
        if type(value) is dict:
            with contextlib.suppress(TypeError):  # an integer beyond 64 bits: validate, don't cache
                encoded = orjson.dumps(value)
            cached = self._snapshots.get(encoded)
            if cached is not None:
                return cached
        known = self._validate_snapshot(value, line, seq)
        if encoded and len(self._snapshots) < _SNAPSHOT_CACHE:
            self._snapshots[encoded] = known
        return known

    def _validate_snapshot(self, snapshot: Any, line: int, seq: int) -> Snapshot:
        if type(snapshot) is not dict:
            raise _fail("INVALID_FACT", line, seq, "configurationSnapshot is not an object")
        if not _SNAPSHOT.issuperset(snapshot):
            self._keys(snapshot, _SNAPSHOT, "configurationSnapshot", line, seq)
        model = snapshot.get("model")
        if type(model) is not str or not model:
            raise _fail("INVALID_FACT", line, seq, "snapshot model is not a non-empty string")
        prompt = snapshot.get("systemPromptDigest")
        adapter = snapshot.get("adapterIdentity")
        if type(adapter) is not str or not adapter:
            raise _fail("INVALID_FACT", line, seq, "adapterIdentity is not a non-empty string")
        routing = snapshot.get("routingIdentity")
        if type(routing) is not str or not routing:
            raise _fail("INVALID_FACT", line, seq, "routingIdentity is not a non-empty string")
        output = snapshot.get("outputOptionsDigest")
        raw_tools = snapshot.get("tools")
        if (
            type(prompt) is not str
            or _DIGEST(prompt) is None
            or type(output) is not str
            or _DIGEST(output) is None
            or type(raw_tools) is not list
        ):
            raise _fail("INVALID_FACT", line, seq, "snapshot digests or tools are malformed")
        tools = []
        names = set()
        for tool in raw_tools:
            if type(tool) is not dict:
                raise _fail("INVALID_FACT", line, seq, "a snapshot tool is not an object")
            if not _SNAPSHOT_TOOL.issuperset(tool):
                self._keys(tool, _SNAPSHOT_TOOL, "snapshot tool", line, seq)
            name = tool.get("name")
            if type(name) is not str or not name:
                raise _fail("INVALID_FACT", line, seq, "tool name is not a non-empty string")
            definition = tool.get("definitionDigest")
            if name in names or type(definition) is not str or _DIGEST(definition) is None:
                raise _fail(
                    "INVALID_FACT", line, seq, f"snapshot tool {shown(name)} is repeated or malformed"
                )
            names.add(name)
            tools.append((name, definition))
        key = (model, prompt, tuple(tools), adapter, routing, output)
        known = self._digests.get(key)
        if known is None:
            normal = {
                "model": model,
                "systemPromptDigest": prompt,
                "tools": [{"name": name, "definitionDigest": definition} for name, definition in tools],
                "adapterIdentity": adapter,
                "routingIdentity": routing,
                "outputOptionsDigest": output,
            }
            known = self._digests[key] = (
                digest(canonical(normal, strings_only=True)),
                normal,
                frozenset(names),
            )
        return known

    def _step_attempt(self, record: dict[str, Any], line: int, seq: int) -> None:
        found = self._running(record.get("operationId"), "operationId", line, seq)
        number = self._safe_int(record.get("attempt"), "attempt", line, seq, 1)
        step_id: str = record.get("stepId")  # type: ignore[assignment]
        if number == 1:
            self._reserve(step_id, "stepId", line, seq)
        elif type(step_id) is not str or _UUID7(step_id) is None:
            raise _fail("INVALID_FACT", line, seq, "stepId is not a UUIDv7")
        attempt_id = self._reserve(record.get("attemptId"), "attemptId", line, seq)
        kind = record.get("stepKind")
        if number > 2 or kind not in ("assistant", "compaction"):
            raise _fail("INVALID_FACT", line, seq, "attempt is not 1 or 2, or stepKind is unknown")
        if kind != ("assistant" if found.kind == "run" else "compaction"):
            raise _fail("INVALID_TRANSITION", line, seq, f"a {found.kind} cannot take a {kind} step")
        context_id = record.get("contextThroughEntryId")
        if type(context_id) is not str or context_id not in self.entries:
            if type(context_id) is not str or _UUID7(context_id) is None:
                raise _fail("INVALID_FACT", line, seq, "contextThroughEntryId is not a UUIDv7")
            raise _fail("INVALID_REFERENCE", line, seq, f"contextThroughEntryId {context_id} is not an entry")
        if number == 1 and context_id != self.boundary:
            raise _fail(
                "INVALID_TRANSITION", line, seq, "attempt 1 context is not the active-context boundary"
            )
        configuration_digest, snapshot, declared = self._snapshot(
            record.get("configurationSnapshot"), line, seq
        )
        claimed = record.get("configurationDigest")
        if type(claimed) is not str or claimed != configuration_digest:
            raise _fail(
                "INVALID_FACT",
                line,
                seq,
                f"configurationDigest is not the snapshot's digest {configuration_digest}",
            )
        prior = self.steps.get(step_id)
        active = found.step
        if number == 1:
            if prior is not None or (active is not None and active.status != "settled"):
                raise _fail("INVALID_TRANSITION", line, seq, "the current step is still open or failed")
            if active is not None:
                self._check_tools_settled(found, active, line, seq)
        else:
            first = prior[0] if prior else None
            if (
                first is None
                or len(prior or ()) != 1
                or first.number != 1
                or first.closed
                or first.failed
                or first.kind != kind
                or first.operation_id != found.id
                or first.context_id != context_id
                or first.digest != claimed
            ):
                raise _fail(
                    "INVALID_TRANSITION",
                    line,
                    seq,
                    "attempt 2 needs an open attempt 1 of the same step, context and digest",
                )
            if self._undo is not None:
                self._restore(first, "closed")
            first.closed = True
        attempt = Attempt(
            found.id, step_id, attempt_id, number, kind, context_id, snapshot, claimed, declared
        )
        self.attempts[attempt_id] = attempt
        if self._undo is not None:
            self._undo.append(functools.partial(self.attempts.pop, attempt_id))
        if prior is None:
            self.steps[step_id] = [attempt]
            if self._undo is not None:
                self._undo.append(functools.partial(self.steps.pop, step_id))
        else:
            prior.append(attempt)
            if self._undo is not None:
                self._undo.append(prior.pop)
        if self._undo is not None:
            self._restore(found, "latest_step_id", "step")
        found.latest_step_id = step_id
        found.step = attempt

    def _check_tools_settled(self, run: Operation, previous: Attempt, line: int, seq: int) -> None:
        """A later step of a run needs a toolUse assistant entry whose calls all have results."""
        settled = self.entries.get(previous.settled_id or "")
        if run.kind != "run" or settled is None or settled.stop_reason != "toolUse":
            raise _fail(
                "INVALID_TRANSITION", line, seq, "a later step needs a toolUse assistant entry before it"
            )
        if run.pending:
            raise _fail("INVALID_TRANSITION", line, seq, "a tool intent is still pending")
        assert settled.message is not None
        calls = settled.message.get("tool_calls", ())
        entry_id = previous.settled_id or ""
        for index in range(len(calls)):
            if (entry_id, index) not in self.outcomes:
                raise _fail("INVALID_TRANSITION", line, seq, f"tool call {index} has no result yet")

    def _step_failed(self, record: dict[str, Any], line: int, seq: int) -> None:
        found = self._running(record.get("operationId"), "operationId", line, seq)
        attempt_id = record.get("attemptId")
        if type(attempt_id) is not str or _UUID7(attempt_id) is None:
            raise _fail("INVALID_FACT", line, seq, "attemptId is not a UUIDv7")
        attempt = self.attempts.get(attempt_id)
        self._error(record.get("error"), line, seq)
        if (
            attempt is None
            or attempt.operation_id != found.id
            or attempt.step_id != record.get("stepId")
            or attempt.closed
        ):
            raise _fail("INVALID_REFERENCE", line, seq, f"{attempt_id} is not an open attempt of that step")
        if self._undo is not None:
            self._restore(attempt, "closed", "failed")
        attempt.closed = True
        attempt.failed = True

    def _error(self, value: Any, line: int, seq: int) -> None:
        error = value
        if type(error) is not dict:
            raise _fail("INVALID_FACT", line, seq, "error is not an object")
        if not _ERROR.issuperset(error):
            self._keys(error, _ERROR, "error", line, seq)
        self._text(error.get("code"), "error code", line, seq)
        self._text(error.get("message"), "error message", line, seq)

    def _tool_started(self, record: dict[str, Any], fact_id: str, line: int, seq: int) -> None:
        found = self._running(record.get("operationId"), "operationId", line, seq)
        if found.kind != "run" or self.current is not found:
            raise _fail("INVALID_TRANSITION", line, seq, "toolStarted names no current run")
        assistant_id: str = record.get("assistantEntryId")  # type: ignore[assignment]
        assistant = self.entries.get(assistant_id) if type(assistant_id) is str else None
        if assistant is None and (type(assistant_id) is not str or _UUID7(assistant_id) is None):
            raise _fail("INVALID_FACT", line, seq, "assistantEntryId is not a UUIDv7")
        if assistant is None or assistant.stop_reason != "toolUse" or assistant.operation_id != found.id:
            raise _fail(
                "INVALID_REFERENCE", line, seq, f"{assistant_id} is not a toolUse assistant entry of this run"
            )
        index = record.get("toolIndex")
        if type(index) is not int or not 0 <= index <= MAX_SAFE_INTEGER:
            raise _fail("INVALID_FACT", line, seq, "toolIndex is not a safe integer")
        call_id = record.get("toolCallId")
        if type(call_id) is not str or not call_id:
            raise _fail("INVALID_FACT", line, seq, "toolCallId is not a non-empty string")
        name = record.get("toolName")
        if type(name) is not str or not name:
            raise _fail("INVALID_FACT", line, seq, "toolName is not a non-empty string")
        self._call_at(assistant, index, call_id, name, line, seq)
        step_id = record.get("stepId")
        if assistant.step_id != step_id:
            raise _fail("INVALID_REFERENCE", line, seq, "stepId is not the assistant entry's step")
        pair = (assistant_id, index)
        if pair in self.outcomes:
            raise _fail("INVALID_TRANSITION", line, seq, f"tool call {index} already has an outcome")
        arguments = record.get("arguments")
        if type(arguments) is not dict:
            raise _fail("INVALID_FACT", line, seq, "arguments is not an object")
        replay = record.get("replay")
        if replay not in ("safe", "never"):
            raise _fail("INVALID_FACT", line, seq, f"replay {shown(replay)} is not safe or never")
        replay_key = record.get("replayKey")
        if type(replay_key) is not str or not replay_key:
            raise _fail("INVALID_FACT", line, seq, "replayKey is not a non-empty string")
        environment = record.get("environmentIdentity")
        if type(environment) is not str or not environment:
            raise _fail("INVALID_FACT", line, seq, "environmentIdentity is not a non-empty string")
        attempt = self.attempts.get(assistant.attempt_id or "")
        if attempt is None or name not in attempt.declared:
            raise _fail(
                "INVALID_TRANSITION",
                line,
                seq,
                f"tool {shown(name)} is not declared in the attempt's snapshot",
            )
        result_id = self._reserve(record.get("resultEntryId"), "resultEntryId", line, seq, _TOOL_RESULT)
        tool = {
            "operationId": found.id,
            "toolStartedId": fact_id,
            "stepId": step_id,
            "assistantEntryId": assistant_id,
            "toolIndex": index,
            "toolCallId": call_id,
            "toolName": name,
            "arguments": arguments,
            "replay": replay,
            "replayKey": replay_key,
            "environmentIdentity": environment,
            "resultEntryId": result_id,
            "status": "pending",
        }
        self.tools[fact_id] = tool
        if self._undo is not None:
            self._undo.append(functools.partial(self.tools.pop, fact_id))
        self.outcomes.add(pair)
        if self._undo is not None:
            self._undo.append(functools.partial(self.outcomes.discard, pair))
        found.tool_calls.append(tool)
        if self._undo is not None:
            self._restore(found, "pending")
        found.pending += 1
        if self._undo is not None:
            self._undo.append(found.tool_calls.pop)

    def _abort_requested(self, record: dict[str, Any], line: int, seq: int) -> None:
        found = self._running(record.get("operationId"), "operationId", line, seq)
        if record.get("operationKind") != found.kind or record.get("reason") != "escape":
            raise _fail("INVALID_TRANSITION", line, seq, "operationKind differs or reason is not escape")
        phase = record.get("phase")
        if phase not in ("model", "tool", "compact"):
            raise _fail("INVALID_FACT", line, seq, f"phase {shown(phase)} is not model, tool or compact")
        if (phase == "tool") != (type(record.get("toolCallId")) is str):
            raise _fail("INVALID_FACT", line, seq, "toolCallId must be a string exactly when phase is tool")
        if self.current is not found or found.abort_requested:
            raise _fail(
                "INVALID_TRANSITION", line, seq, "not the current operation, or abort already requested"
            )
        if self._undo is not None:
            self._restore(found, "abort_requested")
        found.abort_requested = True

    def _operation_finished(self, record: dict[str, Any], line: int, seq: int) -> None:
        found = self._running(record.get("operationId"), "operationId", line, seq)
        outcome = record.get("outcome")
        if record.get("operationKind") != found.kind or outcome not in ("completed", "aborted", "failed"):
            raise _fail("INVALID_TRANSITION", line, seq, "operationKind differs or outcome is unknown")
        if self.current is not found:
            raise _fail("INVALID_TRANSITION", line, seq, "not the current operation")
        if outcome == "completed":
            self._check_completion(record, found, line, seq)
        elif "finalEntryId" in record:
            raise _fail("INVALID_FACT", line, seq, "finalEntryId is only for a completed operation")
        if outcome == "aborted":
            pending = found.pending > 0
            attempting = found.step is not None and found.step.status == "attempting"
            if not found.abort_requested or pending or attempting:
                raise _fail(
                    "INVALID_TRANSITION",
                    line,
                    seq,
                    "aborted needs an abort request, no pending tool and no open attempt",
                )
        if outcome != "completed" and "completion" in record:
            raise _fail("INVALID_FACT", line, seq, "completion is only for a completed operation")
        if outcome == "failed":
            self._error(record.get("error"), line, seq)
        elif "error" in record:
            raise _fail("INVALID_FACT", line, seq, "error is only for a failed operation")
        if self._undo is not None:
            self._restore(found, "finished")
        found.finished = True
        self.current = None

    def _check_completion(self, record: dict[str, Any], found: Operation, line: int, seq: int) -> None:
        completion = record.get("completion")
        if found.kind == "run" and completion not in ("normal", "truncated"):
            raise _fail("INVALID_FACT", line, seq, "a completed run needs completion normal or truncated")
        if found.kind == "compaction" and "completion" in record:
            raise _fail("INVALID_FACT", line, seq, "a completed compaction has no completion")
        final_id = record.get("finalEntryId")
        if type(final_id) is not str or _UUID7(final_id) is None:
            raise _fail("INVALID_FACT", line, seq, "finalEntryId is not a UUIDv7")
        info = self.entries.get(final_id)
        if info is None or info.operation_id != found.id:
            raise _fail(
                "INVALID_REFERENCE", line, seq, f"finalEntryId {final_id} is no entry of this operation"
            )
        attempt = self.attempts.get(info.attempt_id or "")
        if found.kind == "compaction":
            if info.kind != "compaction" or found.result_id != final_id:
                raise _fail("INVALID_REFERENCE", line, seq, "finalEntryId is not the compaction entry")
            if attempt is None or attempt.step_id != found.latest_step_id or attempt.settled_id != final_id:
                raise _fail(
                    "INVALID_REFERENCE", line, seq, "the compaction entry did not settle the latest step"
                )
            return
        wanted = "stop" if completion == "normal" else "length"
        if info.kind != "message" or info.stop_reason != wanted:
            raise _fail("INVALID_REFERENCE", line, seq, f"finalEntryId did not stop with {wanted}")
        if (
            attempt is None
            or not attempt.closed
            or attempt.failed
            or attempt.step_id != found.latest_step_id
            or attempt.settled_id != final_id
        ):
            raise _fail("INVALID_REFERENCE", line, seq, "finalEntryId did not settle the latest step")
        message = info.message or {}
        if completion == "normal" and not (message.get("content") or "").strip(_BLANK):
            raise _fail("INVALID_TRANSCRIPT", line, seq, "a normal completion needs non-blank content")
        if completion == "truncated" and "tool_calls" not in message:
            raise _fail("INVALID_TRANSCRIPT", line, seq, "a truncated completion needs tool calls")
        if found.pending:
            raise _fail("INVALID_TRANSCRIPT", line, seq, "a tool intent is still pending")

    # -- usage -------------------------------------------------------------------------------

    def _apply_usage(self, fact: dict[str, Any], line: int, seq: int) -> None:
        if not _USAGE_FACT.issuperset(fact):
            self._keys(fact, _USAGE_FACT, "usage fact", line, seq)
        operation_id = fact.get("operationId")
        if (type(operation_id) is not str or operation_id not in self.operations) and (
            self._known(self.operations, operation_id, "operationId", line, seq) is None
        ):
            raise _fail("INVALID_REFERENCE", line, seq, f"operationId {operation_id} is not an operation")
        has_attempt = "attemptId" in fact
        if has_attempt == ("toolStartedId" in fact):
            raise _fail("INVALID_FACT", line, seq, "usage names exactly one of attemptId and toolStartedId")
        if has_attempt:
            attempt_id = fact["attemptId"]
            attempt = self.attempts.get(attempt_id) if type(attempt_id) is str else None
            if attempt is None:
                self._known(self.attempts, attempt_id, "attemptId", line, seq)
            if attempt is None or attempt.operation_id != operation_id:
                raise _fail("INVALID_REFERENCE", line, seq, "attemptId is not an attempt of that operation")
        else:
            tool = self._known(self.tools, fact["toolStartedId"], "toolStartedId", line, seq)
            if tool is None or tool["operationId"] != operation_id:
                raise _fail(
                    "INVALID_REFERENCE", line, seq, "toolStartedId is not a tool intent of that operation"
                )
        usage = fact.get("usage")
        if type(usage) is not dict:
            raise _fail("INVALID_FACT", line, seq, "usage is not an object")
        if not _USAGE_KEYS.issuperset(usage):
            self._keys(usage, _USAGE_KEYS, "usage", line, seq)
        totals = self.usage
        added = [0, 0, 0, 0]
        for index, key in enumerate(_USAGE):
            amount = usage.get(key)
            if type(amount) is not int or not 0 <= amount <= MAX_SAFE_INTEGER:
                raise _fail("INVALID_FACT", line, seq, f"usage.{key} is not a safe integer")
            total = totals[index] + amount
            if total > MAX_SAFE_INTEGER:
                raise _fail("INVALID_FACT", line, seq, f"usage total {key} would exceed 2^53-1")
            added[index] = total
        self.usage = added

"""The reducer: header and transactions to session state (contract sections 2-8).

Incremental: applying a transaction costs time proportional to that transaction. Nothing is
copied per transaction and the transcript is never rescanned; legality (section 8) is kept as the
set of tool-call ids that are open after the last committed message.

Atomic: when a store validates a commit (`begin` ... `commit` / `rollback`), every mutation is
journalled and a failing transaction is undone in reverse order. A bulk load needs no journal: a
failing transaction ends the load.

Where things are: `shapes` (the keys each fact, entry and record may have; the header),
`model` (entries, attempts, operations: what later facts refer to), `journal` (the undo
journal), `entries` and `records` (the rules of each fact type), and this module (transactions,
the per-fact checks, usage).

Checks run in the contract's order so that `{code, line, seq}` matches the other ports; where the
ports disagree with each other, this module follows the contract text (see the README's
compatibility notes).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any

from . import entries, records
from .canonical import MAX_SAFE_INTEGER
from .errors import shown
from .journal import Journal
from .model import Attempt, Entry, Operation
from .shapes import (
    IDENTITY,
    PRE_EXECUTION_REASONS,
    SYNTHETIC_CONTENT,
    USAGE,
    USAGE_FACT,
    USAGE_KEYS,
    UUID7,
    Snapshot,
    fail,
    is_uuid7,
    key_names,
    validate_header,
)

__all__ = [  # with what other modules import from here
    "PRE_EXECUTION_REASONS",
    "SYNTHETIC_CONTENT",
    "Attempt",
    "Entry",
    "Operation",
    "Reducer",
    "is_uuid7",
    "validate_header",
]


class Reducer(Journal):
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
        self.last_finished: dict[str, Any] | None = None  # the operationFinished record, less its type
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

    def apply(self, value: Any, line: int) -> None:
        """Apply one transaction line's value (a fact or an array of facts)."""
        transaction = value if type(value) is list else [value]
        if not transaction:
            raise fail("EMPTY_TRANSACTION", line, None, "the transaction array is empty")
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
                    raise fail(
                        "INVALID_TRANSCRIPT",
                        line,
                        self.next_seq - 1,
                        f"tool message answers {shown(call_id)}, which no open tool call has",
                    )
                open_calls.remove(call_id)
            elif open_calls:
                raise fail(
                    "INVALID_TRANSCRIPT",
                    line,
                    self.next_seq - 1,
                    f"{role} message while tool calls {sorted(open_calls)} are unanswered",
                )
            elif role == "assistant" and "tool_calls" in message:
                open_calls.update(call["id"] for call in message["tool_calls"])

    # -- journalled mutations ----------------------------------------------------------------

    # -- per fact ----------------------------------------------------------------------------

    def _apply_fact(self, fact: Any, line: int) -> None:
        if type(fact) is not dict:
            raise fail("INVALID_FACT", line, None, "a fact is not an object")
        seq = fact.get("seq")
        if type(seq) is not int or not 1 <= seq <= MAX_SAFE_INTEGER:
            raise fail("INVALID_FACT", line, None, "seq is not a safe integer >= 1")
        if seq != self.next_seq:
            raise fail("SEQ_MISMATCH", line, seq, f"expected seq {self.next_seq}")
        fact_id = fact.get("id")
        if type(fact_id) is not str or UUID7(fact_id) is None:
            raise fail("INVALID_FACT", line, seq, "id is not a UUIDv7")
        timestamp = fact.get("timestamp")
        if type(timestamp) is not int or not 0 <= timestamp <= MAX_SAFE_INTEGER:
            raise fail("INVALID_FACT", line, seq, "timestamp is not a safe integer")
        if fact_id in self.ids:
            raise fail("DUPLICATE_ID", line, seq, f"id {fact_id} is already used by a fact")
        kind = fact.get("kind")
        if kind == "entry":
            entries.apply_entry(self, fact, fact_id, line, seq)
        elif kind == "record":
            records.apply_record(self, fact, fact_id, line, seq)
        elif kind == "usage":
            self._apply_usage(fact, line, seq)
        else:
            raise fail("INVALID_FACT", line, seq, f"kind {shown(kind)} is not entry, record or usage")
        if fact_id in self.reserved:
            raise fail("DUPLICATE_ID", line, seq, f"id {fact_id} is reserved for another fact")
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
            raise fail(
                "INVALID_FACT", line, seq, f"{what} has unknown keys {key_names(value.keys() - allowed)}"
            )

    @staticmethod
    def _uuid(value: Any, what: str, line: int, seq: int) -> str:
        if type(value) is not str or UUID7(value) is None:
            raise fail("INVALID_FACT", line, seq, f"{what} is not a UUIDv7")
        return value

    @staticmethod
    def _text(value: Any, what: str, line: int, seq: int) -> str:
        if type(value) is not str or not value:
            raise fail("INVALID_FACT", line, seq, f"{what} is not a non-empty string")
        return value

    @staticmethod
    def _safe_int(value: Any, what: str, line: int, seq: int, minimum: int = 0) -> int:
        if type(value) is not int or not minimum <= value <= MAX_SAFE_INTEGER:
            raise fail("INVALID_FACT", line, seq, f"{what} is not a safe integer >= {minimum}")
        return value

    @staticmethod
    def _object(value: Any, what: str, line: int, seq: int) -> dict[str, Any]:
        if type(value) is not dict:
            raise fail("INVALID_FACT", line, seq, f"{what} is not an object")
        return value

    def _reserve(self, value: Any, what: str, line: int, seq: int, kind: str = IDENTITY) -> str:
        if type(value) is not str or UUID7(value) is None:
            raise fail("INVALID_FACT", line, seq, f"{what} is not a UUIDv7")
        if value in self.ids or value in self.reserved:
            raise fail("DUPLICATE_ID", line, seq, f"{what} {value} is already a fact id or reserved")
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
            raise fail("INVALID_REFERENCE", line, seq, f"{what} {value} is not a known operation")
        if found.finished:
            raise fail("INVALID_TRANSITION", line, seq, f"operation {value} is already finished")
        return found

    def _known(self, table: dict[str, Any], value: Any, what: str, line: int, seq: int) -> Any:
        """`table[value]`, or None when a valid id is missing; INVALID_FACT when not a UUIDv7."""
        found = table.get(value) if type(value) is str else None
        if found is None:
            self._uuid(value, what, line, seq)
        return found

    # -- entries -----------------------------------------------------------------------------

    # -- records -----------------------------------------------------------------------------

    # -- usage -------------------------------------------------------------------------------

    def _apply_usage(self, fact: dict[str, Any], line: int, seq: int) -> None:
        if not USAGE_FACT.issuperset(fact):
            self._keys(fact, USAGE_FACT, "usage fact", line, seq)
        operation_id = fact.get("operationId")
        if (type(operation_id) is not str or operation_id not in self.operations) and (
            self._known(self.operations, operation_id, "operationId", line, seq) is None
        ):
            raise fail("INVALID_REFERENCE", line, seq, f"operationId {operation_id} is not an operation")
        has_attempt = "attemptId" in fact
        if has_attempt == ("toolStartedId" in fact):
            raise fail("INVALID_FACT", line, seq, "usage names exactly one of attemptId and toolStartedId")
        if has_attempt:
            attempt_id = fact["attemptId"]
            attempt = self.attempts.get(attempt_id) if type(attempt_id) is str else None
            if attempt is None:
                self._known(self.attempts, attempt_id, "attemptId", line, seq)
            if attempt is None or attempt.operation_id != operation_id:
                raise fail("INVALID_REFERENCE", line, seq, "attemptId is not an attempt of that operation")
        else:
            tool = self._known(self.tools, fact["toolStartedId"], "toolStartedId", line, seq)
            if tool is None or tool["operationId"] != operation_id:
                raise fail(
                    "INVALID_REFERENCE", line, seq, "toolStartedId is not a tool intent of that operation"
                )
        usage = fact.get("usage")
        if type(usage) is not dict:
            raise fail("INVALID_FACT", line, seq, "usage is not an object")
        if not USAGE_KEYS.issuperset(usage):
            self._keys(usage, USAGE_KEYS, "usage", line, seq)
        totals = self.usage
        added = [0, 0, 0, 0]
        for index, key in enumerate(USAGE):
            amount = usage.get(key)
            if type(amount) is not int or not 0 <= amount <= MAX_SAFE_INTEGER:
                raise fail("INVALID_FACT", line, seq, f"usage.{key} is not a safe integer")
            total = totals[index] + amount
            if total > MAX_SAFE_INTEGER:
                raise fail("INVALID_FACT", line, seq, f"usage total {key} would exceed 2^53-1")
            added[index] = total
        self.usage = added

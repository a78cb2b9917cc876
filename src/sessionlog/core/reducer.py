"""The reducer: header and transactions to session state (contract sections 2-8).

Incremental: applying a transaction costs time proportional to that transaction. Nothing is
copied per transaction and the transcript is never rescanned; legality (section 8) is kept as the
set of tool-call ids that are open after the last committed message.

Atomic: when a store validates a commit (`begin` ... `commit` / `rollback`), every mutation is
journalled and a failing transaction is undone in reverse order. A bulk load needs no journal: a
failing transaction ends the load.

Where things are: `shapes` (the keys each fact, entry and record may have; the header),
`model` (entries, attempts, operations: what later facts refer to), `journal` (the undo
journal), `reducer_state` (the tables and the checks the rules share), `entries` and `records`
(the rules of each fact type), and this module (transactions, the per-fact checks, usage).

Checks run in the contract's order so that `{code, line, seq}` matches the other ports; where the
ports disagree with each other, this module follows the contract text (see the compatibility
notes in docs/contract.md).
"""

from __future__ import annotations

import functools
from typing import Any

from . import entries, records
from .canonical import MAX_SAFE_INTEGER
from .errors import shown
from .model import Attempt, Entry, Operation
from .reducer_state import ReducerState
from .shapes import (
    PRE_EXECUTION_REASONS,
    SYNTHETIC_CONTENT,
    USAGE,
    USAGE_FACT,
    USAGE_KEYS,
    UUID7,
    fail,
    is_uuid7,
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


class Reducer(ReducerState):
    """Live session state, advanced one transaction at a time: `ReducerState`'s tables, and the
    transactions and per-fact checks that change them."""

    # -- transactions ------------------------------------------------------------------------

    def begin(self) -> int:
        """Start journalling one transaction; return its mark for `rollback`. Marks nest: a
        store may have several transactions in flight, each undoable back to its own mark."""
        if self.undo is None:
            self.undo = []
        mark = len(self.undo)
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
        self.undo.append(lambda: self._restore_saved(saved))
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
        if self.undo is not None:
            self.undo.append(functools.partial(self.ids.discard, fact_id))
        self.next_seq = seq + 1
        if timestamp > self.last_timestamp:
            self.last_timestamp = timestamp

    # -- usage -------------------------------------------------------------------------------

    def _apply_usage(self, fact: dict[str, Any], line: int, seq: int) -> None:
        if not USAGE_FACT.issuperset(fact):
            self.check_keys(fact, USAGE_FACT, "usage fact", line, seq)
        operation_id = fact.get("operationId")
        if (type(operation_id) is not str or operation_id not in self.operations) and (
            self.known(self.operations, operation_id, "operationId", line, seq) is None
        ):
            raise fail("INVALID_REFERENCE", line, seq, f"operationId {operation_id} is not an operation")
        has_attempt = "attemptId" in fact
        if has_attempt == ("toolStartedId" in fact):
            raise fail("INVALID_FACT", line, seq, "usage names exactly one of attemptId and toolStartedId")
        if has_attempt:
            attempt_id = fact["attemptId"]
            attempt = self.attempts.get(attempt_id) if type(attempt_id) is str else None
            if attempt is None:
                self.known(self.attempts, attempt_id, "attemptId", line, seq)
            if attempt is None or attempt.operation_id != operation_id:
                raise fail("INVALID_REFERENCE", line, seq, "attemptId is not an attempt of that operation")
        else:
            tool = self.known(self.tools, fact["toolStartedId"], "toolStartedId", line, seq)
            if tool is None or tool["operationId"] != operation_id:
                raise fail(
                    "INVALID_REFERENCE", line, seq, "toolStartedId is not a tool intent of that operation"
                )
        usage = fact.get("usage")
        if type(usage) is not dict:
            raise fail("INVALID_FACT", line, seq, "usage is not an object")
        if not USAGE_KEYS.issuperset(usage):
            self.check_keys(usage, USAGE_KEYS, "usage", line, seq)
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

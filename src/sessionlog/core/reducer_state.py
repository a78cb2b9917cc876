"""What a reducer knows of a session (its tables: facts, entries, operations, attempts, tool
intents, reserved ids, the transcript and the active context) and the checks and journalled
mutations its rules share. The rules (`entries`, `records`) take a `ReducerState` and change it;
`reducer.Reducer` adds the transactions and the per-fact checks. Split out so that the rules need
no import of the reducer, and the reducer none of theirs beyond calling them."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any

from .canonical import MAX_SAFE_INTEGER
from .journal import Journal
from .model import Attempt, Entry, Operation
from .shapes import IDENTITY, UUID7, Snapshot, fail, key_names


class ReducerState(Journal):
    """The tables a reduction fills in, and the checks every rule uses."""

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
        self.snapshots_by_digest: dict[tuple[Any, ...], Snapshot] = {}
        self.snapshots_by_bytes: dict[bytes, Snapshot] = {}
        self.undo: list[Callable[[], object]] | None = None
        # The compaction source digest, kept running: sha256 of the canonical array of
        # {sourceEntryId, message} over message_ids[:count], without its closing bracket.
        self.source_hash = hashlib.sha256(b"[")
        self.source_count = 0

    # -- field checks ------------------------------------------------------------------------

    @staticmethod
    def check_keys(value: dict[str, Any], allowed: frozenset[str], what: str, line: int, seq: int) -> None:
        if not allowed.issuperset(value):
            raise fail(
                "INVALID_FACT", line, seq, f"{what} has unknown keys {key_names(value.keys() - allowed)}"
            )

    @staticmethod
    def check_uuid(value: Any, what: str, line: int, seq: int) -> str:
        if type(value) is not str or UUID7(value) is None:
            raise fail("INVALID_FACT", line, seq, f"{what} is not a UUIDv7")
        return value

    @staticmethod
    def check_text(value: Any, what: str, line: int, seq: int) -> str:
        if type(value) is not str or not value:
            raise fail("INVALID_FACT", line, seq, f"{what} is not a non-empty string")
        return value

    @staticmethod
    def check_safe_int(value: Any, what: str, line: int, seq: int, minimum: int = 0) -> int:
        if type(value) is not int or not minimum <= value <= MAX_SAFE_INTEGER:
            raise fail("INVALID_FACT", line, seq, f"{what} is not a safe integer >= {minimum}")
        return value

    @staticmethod
    def check_object(value: Any, what: str, line: int, seq: int) -> dict[str, Any]:
        if type(value) is not dict:
            raise fail("INVALID_FACT", line, seq, f"{what} is not an object")
        return value

    def reserve(self, value: Any, what: str, line: int, seq: int, kind: str = IDENTITY) -> str:
        if type(value) is not str or UUID7(value) is None:
            raise fail("INVALID_FACT", line, seq, f"{what} is not a UUIDv7")
        if value in self.ids or value in self.reserved:
            raise fail("DUPLICATE_ID", line, seq, f"{what} {value} is already a fact id or reserved")
        self.reserved[value] = kind
        if self.undo is not None:
            self.undo.append(functools.partial(self.reserved.pop, value))
        return value

    def unreserve(self, key: str) -> None:
        kind = self.reserved.pop(key)
        if self.undo is not None:
            self.undo.append(functools.partial(self.reserved.__setitem__, key, kind))

    def running(self, value: Any, what: str, line: int, seq: int) -> Operation:
        # Only valid ids are keys, so a hit needs no UUID check; a miss decides the code.
        found = self.operations.get(value) if type(value) is str else None
        if found is None:
            self.check_uuid(value, what, line, seq)
            raise fail("INVALID_REFERENCE", line, seq, f"{what} {value} is not a known operation")
        if found.finished:
            raise fail("INVALID_TRANSITION", line, seq, f"operation {value} is already finished")
        return found

    def known(self, table: dict[str, Any], value: Any, what: str, line: int, seq: int) -> Any:
        """`table[value]`, or None when a valid id is missing; INVALID_FACT when not a UUIDv7."""
        found = table.get(value) if type(value) is str else None
        if found is None:
            self.check_uuid(value, what, line, seq)
        return found

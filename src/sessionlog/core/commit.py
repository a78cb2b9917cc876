"""The one commit pipeline every backend shares.

prepare: assign seq, ids (unless the fact brings its own) and a timestamp (ms, never decreasing
within the session); encode the transaction as one compact line (one fact bare, several as an
array); validate the decoded line on the live reducer, journalled. A rejected transaction raises
ValidationError and leaves state, next seq and bytes exactly as before.

The backend then stores the line. `acknowledge` makes it part of the acknowledged state;
`abandon` (the write failed) undoes it and everything prepared after it.
"""

from __future__ import annotations

import marshal
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from . import shapes
from .errors import ContractError, ValidationError, shown
from .framing import DEFAULT_MAX_LINE_BYTES
from .ids import new_id
from .reducer import Reducer
from .state import SessionState


@dataclass(eq=False, slots=True)
class Prepared:
    """A validated transaction, not yet acknowledged by its backend."""

    facts: list[dict[str, Any]]
    line: bytes
    mark: int
    state_before: SessionState | None = field(default=None, repr=False)


def encode_header(
    *,
    session_id: str | None = None,
    created_at: int | None = None,
    cwd: str,
    provider: str,
    model: str,
    environment_identity: str,
) -> bytes:
    """The header line of a new session."""
    header = {
        "kind": "header",
        "version": 2,
        "id": session_id or new_id(),
        "createdAt": time.time_ns() // 1_000_000 if created_at is None else created_at,
        "cwd": cwd,
        "provider": provider,
        "model": model,
        "environmentIdentity": environment_identity,
    }
    return orjson.dumps(header) + b"\n"


# orjson hands these to no default (so they raise) instead of converting them silently.
_JSON_ONLY = (
    orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS
)
_MAX_INT = 1 << 63


def not_json(value: Any, line: int, first_seq: int, error: Exception | None = None) -> ValidationError:
    """The refusal of a transaction holding something that is not a JSON value, naming where."""
    found = _first_non_json(value)
    if found is None:  # plain JSON types throughout: orjson's own limit (nesting depth)
        return ValidationError("INVALID_FACT", line, None, f"not encodable as JSON: {error}")
    path, what = found
    index = path[1:].split("]", 1)[0] if path.startswith("[") else ""
    seq = first_seq + int(index) if index.isdigit() else first_seq
    return ValidationError("INVALID_FACT", line, seq, f"{path} is {what}, not a JSON value")


# The keys a path names as they are: the contract's own (every other key, a tool argument's say,
# may hold a secret or a megabyte, and is shown bounded by `shown`).
CONTRACT_KEYS = frozenset(
    key
    for value in (*vars(shapes).values(), *shapes.RECORD_KEYS.values())
    if isinstance(value, frozenset | tuple)
    for key in value
    if isinstance(key, str)
)


def _first_non_json(value: Any) -> tuple[str, str] | None:
    """The path (`[0].entry.message.content`) of the first value that is not plain JSON: a dict
    with str keys, list, str, int, finite float, bool or None, exactly those types."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        kind = type(item)
        if kind is dict:
            for key in reversed(list(item)):
                if type(key) is not str:
                    return path or "the fact", f"an object with a key of type {type(key).__name__}"
                step = key if key in CONTRACT_KEYS else f"[{shown(key)}]"
                stack.append((f"{path}.{step}" if path and step[0] != "[" else f"{path}{step}", item[key]))
        elif kind is list:
            stack.extend((f"{path}[{index}]", child) for index, child in reversed(list(enumerate(item))))
        elif kind is float:
            if not math.isfinite(item):
                return path, f"the float {item}"
        elif kind is int:
            if not -_MAX_INT <= item < 1 << 64:
                return path, "an integer beyond 64 bits"
        elif kind not in (str, bool) and item is not None:
            return (
                path,
                f"of type {kind.__module__}.{kind.__qualname__}"
                if kind.__module__ != "builtins"
                else (f"of type {kind.__qualname__}"),
            )
    return None


class CommitPipeline:
    """Owns the reducer of an open store and the order of its transactions."""

    def __init__(
        self, reducer: Reducer, length: int, lines: int, *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    ) -> None:
        self.reducer = reducer
        self.max_line_bytes = max_line_bytes  # a longer line would not read back: refuse to write it
        self.length = length  # acknowledged bytes
        self.lines = lines  # acknowledged lines, the header included
        self._pending: deque[Prepared] = deque()
        self._pending_bytes = 0  # bytes of the pending lines: an async store may queue thousands
        # False: forget how to undo a transaction as soon as it validated, so `abandon` is
        # impossible. For a store that never uses the pipeline again after a failed write (the
        # async store): the undo journal is most of what a queued transaction keeps alive, and
        # the cyclic GC would scan it again and again while the queue waits for its write.
        self.undoable = True

    @property
    def pending(self) -> int:
        return len(self._pending)

    def prepare(
        self, facts: Iterable[Mapping[str, Any]], *, keep_state: bool | Callable[[int], bool] = False
    ) -> Prepared:
        """`keep_state`: snapshot the state before this transaction, for `state()` while it is in
        flight; a callable decides from the encoded line's length (a store that writes batches
        needs the snapshot only where a batch begins)."""
        if type(facts) is not list and isinstance(facts, Mapping):
            raise TypeError("commit takes a list of facts (one transaction), not a single fact")
        reducer = self.reducer
        line_number = self.lines + len(self._pending) + 1
        first_seq = reducer.next_seq
        now = time.time_ns() // 1_000_000
        timestamp = now if now > reducer.last_timestamp else reducer.last_timestamp
        committed: list[dict[str, Any]] = []
        for index, fact in enumerate(facts):
            seq = first_seq + index
            if type(fact) is not dict and not isinstance(fact, Mapping):
                raise ValidationError("INVALID_FACT", line_number, None, f"fact {index} is not a mapping")
            if "seq" in fact or "timestamp" in fact:
                key = "seq" if "seq" in fact else "timestamp"
                raise ValidationError("INVALID_FACT", line_number, seq, f"{key} is assigned by the store")
            # The store's fields first, then the caller's in their order (kind and id keep their
            # places); a missing id is made here, a supplied one is checked like any other.
            out = {"kind": fact.get("kind"), "seq": seq, "id": None, "timestamp": timestamp}
            out.update(fact)
            if "id" not in fact:
                out["id"] = new_id()
            committed.append(out)
        if not committed:
            raise ValidationError(
                "EMPTY_TRANSACTION", line_number, None, "a transaction needs at least one fact"
            )
        value = committed[0] if len(committed) == 1 else committed
        try:
            line = orjson.dumps(value, option=_JSON_ONLY) + b"\n"
            marshal.dumps(value)  # C-speed proof that every object is of a builtin type, no subclass
        except (TypeError, ValueError) as error:
            raise not_json(value, line_number, first_seq, error) from None
        if len(line) - 1 > self.max_line_bytes:
            raise ValidationError(
                "MALFORMED_JSON",
                line_number,
                None,
                f"the line would be {len(line) - 1} bytes, above the maximum of {self.max_line_bytes}",
            )
        if not isinstance(keep_state, bool):
            keep_state = keep_state(len(line))
        state_before = SessionState(reducer, self.length + self._pending_bytes) if keep_state else None
        decoded = orjson.loads(line)  # exactly what will be stored: objects the caller cannot mutate
        if decoded != value:  # NaN or infinity became null, a tuple a list
            raise not_json(value, line_number, first_seq)
        mark = reducer.begin()
        try:
            reducer.apply(decoded, line_number)
        except ContractError as error:
            reducer.rollback(mark)
            raise ValidationError(error.code, line_number, error.seq, error.detail) from None
        except BaseException:
            reducer.rollback(mark)
            raise
        if not self.undoable:
            reducer.release()
            mark = -1
        prepared = Prepared(committed, line, mark, state_before)
        self._pending.append(prepared)
        self._pending_bytes += len(line)
        return prepared

    def acknowledge(self, *batch: Prepared) -> None:
        """The backend stored `batch` (the oldest pending transactions, in order)."""
        pending = self._pending
        size = 0
        for prepared in batch:
            if not pending or pending[0] is not prepared:
                raise RuntimeError("transactions are acknowledged in the order they were prepared")
            pending.popleft()
            size += len(prepared.line)
        self._pending_bytes -= size
        self.length += size
        self.lines += len(batch)
        if not pending:
            self.reducer.release()

    def abandon(self, prepared: Prepared) -> list[Prepared]:
        """Undo `prepared` and every transaction prepared after it; return them, oldest first."""
        if prepared.mark < 0:
            raise RuntimeError("this pipeline keeps no undo journal (undoable=False)")
        index = self._pending.index(prepared)
        dropped = list(self._pending)[index:]
        for dropped_one in dropped:
            self._pending.pop()
            self._pending_bytes -= len(dropped_one.line)
        self.reducer.rollback(prepared.mark)
        return dropped

    def state(self) -> SessionState:
        """The acknowledged state: what the backend has stored, nothing still in flight."""
        if self._pending:
            first = self._pending[0].state_before
            if first is None:
                raise RuntimeError(
                    "prepare(keep_state=True) is needed to read state while writes are in flight"
                )
            return first
        return SessionState(self.reducer, self.length)

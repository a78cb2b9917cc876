"""The one commit pipeline every backend shares.

prepare: assign seq, ids (unless the fact brings its own) and a timestamp (ms, never decreasing
within the session); copy the facts in one walk that refuses every value which is not plain JSON
(`_copied`); encode the copy as one compact line (one fact bare, several as an array); validate
the copy on the live reducer, journalled. The reducer keeps the copy, so a caller's later
mutation of what it passed changes neither the state nor what a backend still has to write. A
rejected transaction raises ValidationError and leaves state, next seq and bytes exactly as
before.

The backend then stores the line. `acknowledge` makes it part of the acknowledged state;
`abandon` (the write failed) undoes it and everything prepared after it.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from . import shapes
from .errors import ContractError, ValidationError, shown, type_named
from .framing import DEFAULT_MAX_LINE_BYTES, MAX_NESTING_DEPTH
from .ids import new_id
from .reducer import Reducer
from .state import SessionState


class Line(bytes):
    """A transaction's line that also carries the facts it encodes (`facts`: the validated
    copies, never to be mutated), so that a backend deriving something from a commit (the SQL
    repositories' summary row) need not parse the line it was handed. Made only for a backend
    that says it wants them (`line_facts = True`): every other one is handed exact bytes (orjson,
    for one, refuses to parse a bytes subclass)."""

    facts: list[dict[str, Any]]


@dataclass(eq=False, slots=True)
class Prepared:
    """A validated transaction, not yet acknowledged by its backend."""

    facts: list[dict[str, Any]]
    line: bytes  # a Line when the pipeline's `line_facts` is set
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
    found = first_non_json(value)
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


def first_non_json(value: Any) -> tuple[str, str] | None:
    """The path (`[0].entry.message.content`) of the first value that is not plain JSON: a dict
    with str keys, list, str, int, finite float, bool or None, exactly those types. The walk
    ends (None) at the first value nested deeper than MAX_NESTING_DEPTH, as orjson's encoding
    does: a value that holds itself is refused for its depth, not walked for ever."""
    stack: list[tuple[str, Any, int]] = [("", value, 1)]
    while stack:
        path, item, depth = stack.pop()
        kind = type(item)
        if depth > MAX_NESTING_DEPTH and (kind is dict or kind is list):  # `is`: a metaclass's == may raise
            return None
        if kind is dict:
            for key in reversed(list(item)):
                if type(key) is not str:
                    return path or "the fact", f"an object with a key of type {type_named(key)}"
                step = key if key in CONTRACT_KEYS else f"[{shown(key)}]"
                where = f"{path}.{step}" if path and step[0] != "[" else f"{path}{step}"
                stack.append((where, item[key], depth + 1))
        elif kind is list:
            stack.extend(
                (f"{path}[{index}]", child, depth + 1) for index, child in reversed(list(enumerate(item)))
            )
        elif kind is float:
            if not math.isfinite(item):
                return path, f"the float {item}"
        elif kind is int:
            if not -_MAX_INT <= item < 1 << 64:
                return path, "an integer beyond 64 bits"
        elif kind is not str and kind is not bool and item is not None:
            return path, f"of type {type_named(item, qualified=True)}"
    return None


# The value types a copy takes as they are. An int's range (64 bits) and a key's type (exactly
# str) are orjson's checks as it encodes the copy, as are lone surrogates and nesting depth.
_PLAIN = frozenset({str, int, bool, type(None)})


class _NotPlain(Exception):
    """The copy met a value that is not plain JSON; the refusal is worded from the caller's
    value apart (`_refusal`), off the hot path."""


def _copied(item: dict[str, Any], depth: int) -> dict[str, Any]:
    """A copy of `item` (exactly a dict, at nesting `depth`) and of every dict and list in it:
    what the reducer keeps and the line encodes. Refuses (`_NotPlain`) a value of any type but
    dict, list, str, int, bool, None and finite float, exactly those (no subclass: an IntEnum
    or a str subclass is refused, not converted), and nesting deeper than MAX_NESTING_DEPTH
    (a value that holds itself included)."""
    out = item.copy()
    for key, child in out.items():
        kind = type(child)
        if kind in _PLAIN:
            continue
        if kind is dict:
            if depth >= MAX_NESTING_DEPTH:
                raise _NotPlain
            out[key] = _copied(child, depth + 1)
        elif kind is list:
            if depth >= MAX_NESTING_DEPTH:
                raise _NotPlain
            out[key] = _copied_list(child, depth + 1)
        elif kind is not float or child - child != 0.0:  # NaN and the infinities: x - x is NaN
            raise _NotPlain
    return out


def _copied_list(item: list[Any], depth: int) -> list[Any]:
    """`_copied` for a list."""
    out = item.copy()
    for index, child in enumerate(out):
        kind = type(child)
        if kind in _PLAIN:
            continue
        if kind is dict:
            if depth >= MAX_NESTING_DEPTH:
                raise _NotPlain
            out[index] = _copied(child, depth + 1)
        elif kind is list:
            if depth >= MAX_NESTING_DEPTH:
                raise _NotPlain
            out[index] = _copied_list(child, depth + 1)
        elif kind is not float or child - child != 0.0:
            raise _NotPlain
    return out


def _copied_slowly(value: Any) -> Any:
    """The copy without recursion, for a caller whose own stack left `_copied` too little of
    Python's recursion limit: checked by the iterative walk, copied by encoding and parsing."""
    if first_non_json(value) is not None:
        raise _NotPlain
    try:
        return orjson.loads(orjson.dumps(value, option=_JSON_ONLY))
    except orjson.JSONEncodeError:
        raise _NotPlain from None


def _refusal(value: Any, line: int, first_seq: int) -> ValidationError:
    """The refusal of a transaction the copy refused, worded as `not_json` words it."""
    try:
        orjson.dumps(value, option=_JSON_ONLY)
    except (TypeError, ValueError) as error:  # nested too deep, a lone surrogate: orjson's words
        return not_json(value, line, first_seq, error)
    return not_json(value, line, first_seq)


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
        # True: each line is a `Line` carrying its facts (the store sets it from its backend).
        self.line_facts = False
        # The sha256 of the bytes this pipeline knows the log holds (read at open, then every line
        # acknowledged), for a store that writes snapshots (`core.store.snapshot_of`); else None.
        self.known: Any = None

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
        copies: list[dict[str, Any]] = []
        plain = True
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
            if plain:  # the refusal waits for the checks of every fact, in the order they had
                try:  # (several facts are one level deeper, in their array: orjson counts that)
                    copies.append(_copied(out, 1))
                except _NotPlain:
                    plain = False
                except RecursionError:  # the caller's stack, not the value: copied without recursion
                    try:
                        copies.append(_copied_slowly(out))
                    except _NotPlain:
                        plain = False
        if not committed:
            raise ValidationError(
                "EMPTY_TRANSACTION", line_number, None, "a transaction needs at least one fact"
            )
        value = committed[0] if len(committed) == 1 else committed
        if not plain:
            raise _refusal(value, line_number, first_seq) from None
        checked = copies[0] if len(copies) == 1 else copies
        try:
            line = orjson.dumps(checked, option=_JSON_ONLY | orjson.OPT_APPEND_NEWLINE)
        except (TypeError, ValueError) as error:  # a lone surrogate, a key not a str, an int beyond 64 bits
            raise not_json(value, line_number, first_seq, error) from None
        if self.line_facts:
            line = Line(line)
            line.facts = copies
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
        mark = reducer.begin()
        try:
            reducer.apply(checked, line_number)
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
        pending, known = self._pending, self.known
        size = 0
        for prepared in batch:
            if not pending or pending[0] is not prepared:
                raise RuntimeError("transactions are acknowledged in the order they were prepared")
            pending.popleft()
            size += len(prepared.line)
            if known is not None:
                known.update(prepared.line)
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

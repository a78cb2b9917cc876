"""Verified snapshots: the reducer's own state, serialized beside the log, so that a resume
reduces only what was committed since (issue #25 item 1; docs/snapshots.md argues each choice).

* **The reducer stays the one definition.** A snapshot is the `Reducer`'s tables exactly as a
  full reduction left them (ids, reserved ids, operations, attempts, tool intents, the transcript
  and active context, seq, timestamps, usage), pickled with every shared reference kept (a tool
  intent is one dict in `tools` and in its run's `tool_calls`; a message one dict in the
  transcript, the active context and its entry). Nothing is derived differently: restored, the
  reducer validates the next commit exactly as the one that wrote it. The one thing not kept is
  the running hash of compaction sources (a `hashlib` object has no serialized form): it restarts
  from the first message, which gives the same digest.
* **Trusted only when this user signed it** (`snapshot_key`, issue #38): an HMAC-SHA256 with a
  key of the user's, not of the session, covers the meta line and the body, and is checked
  before a byte of the body is unpickled. A snapshot that came with a folder handed over, a
  backup or another user is ignored, as is one edited since.
* **Trusted only for exactly the bytes it covers.** The file says what it covers: the length of
  the committed prefix and its sha256 (4 ms for 5.5 MB here, C speed, no cheaper check is equally
  strong against a log rewritten to the same length), the session id, the format number, the
  library and Python versions. A load trusts it only when all of them match the log in hand and
  the restored state ends where the covered part does (the last covered line's seq and id: no
  snapshot, even a signed one of a bug's, makes a commit write a wrong seq); anything else
  (another version, a garbled or cut file, a log shorter than the prefix or not the same bytes:
  repaired, rewritten, another session) and the full reduction runs. Never an error for the
  user; `restore` returns None.
* **The tail is reduced by the same code as a full load** (`loading.reduce_lines`), after the
  same whole-prefix checks of the tail (`framing.check_committed` from the covered length); when
  any of it fails, the full reduction runs again and raises its own error, so a corrupt log
  reports the same code, line and offset with or without a snapshot.
* **Unpickling is restricted** to the two rebuilders of model objects below (`find_class`), so a
  snapshot file cannot name any other callable, signed or not.
* **When written** (`worth_writing`): on close, when at least `MIN_LINES` lines and an eighth of
  the session are not covered; never on the commit path, which stays as it was. So a resume
  reduces at most an eighth of its session (or `MIN_LINES` lines) after the restore.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import io
import pickle
import sys
from importlib import metadata
from typing import Any

import orjson

from .errors import CorruptionError
from .framing import DEFAULT_MAX_LINE_BYTES, check_committed, lines
from .loading import committed_end, gc_paused, load, reduce_lines
from .model import Attempt, Entry, Operation
from .reducer import Reducer
from .snapshot_key import make_key, read_key

FORMAT = 2
MAGIC = b"sessionlog-snapshot\n"
MIN_LINES = 1000  # below this a full reduction costs a few milliseconds: no snapshot pays
SHARE = 8  # written when more than 1/SHARE of the session is not covered
# Not kept: the undo journal (a snapshot is taken between transactions) and the running
# compaction-source hash (restarted; the same digest comes out).
_NOT_KEPT = frozenset({"undo", "source_hash", "source_count"})


@functools.cache
def versions() -> dict[str, Any]:
    """What a snapshot must have been written by to be read: this format, this library, this
    Python (pickled objects follow their classes, which may change with either)."""
    try:
        library = metadata.version("sessionlog")
    except metadata.PackageNotFoundError:  # a source checkout that was never installed
        library = "unknown"
    return {"format": FORMAT, "library": library, "python": f"{sys.version_info[0]}.{sys.version_info[1]}"}


def worth_writing(lines_total: int, lines_covered: int) -> bool:
    """Whether a snapshot pays at close: enough lines not covered by the one loaded."""
    uncovered = lines_total - lines_covered
    return uncovered >= MIN_LINES and uncovered * SHARE >= lines_total


# -- writing ----------------------------------------------------------------------------------


# The entries table, the largest, goes as columns in `Entry`'s argument order: rebuilt by one
# `map(Entry, ...)`, half the time of one pickled constructor call an entry. (An entry is
# referred to only from that table, so no reference is lost.)
_ENTRY_COLUMNS = (
    "kind",
    "message",
    "order",
    "messages_through",
    "operation_id",
    "step_id",
    "attempt_id",
    "stop_reason",
)


def _entry_columns(entries: dict[str, Entry]) -> tuple[list[Any], ...]:
    values = entries.values()
    return (list(entries), *([getattr(entry, name) for entry in values] for name in _ENTRY_COLUMNS))


def _entries(columns: Any) -> dict[str, Entry] | None:
    if type(columns) is not tuple or len(columns) != 1 + len(_ENTRY_COLUMNS):
        return None
    if any(type(column) is not list or len(column) != len(columns[0]) for column in columns):
        return None
    return dict(zip(columns[0], map(Entry, *columns[1:]), strict=True))


def _attempt(attempt: Attempt) -> tuple[Any, ...]:
    return (restored_attempt, tuple(getattr(attempt, name) for name in Attempt.__slots__))


def _operation(operation: Operation) -> tuple[Any, ...]:
    return (restored_operation, tuple(getattr(operation, name) for name in Operation.__slots__))


def restored_attempt(*values: Any) -> Attempt:
    attempt = Attempt.__new__(Attempt)
    for name, value in zip(Attempt.__slots__, values, strict=True):
        setattr(attempt, name, value)
    return attempt


def restored_operation(*values: Any) -> Operation:
    operation = Operation.__new__(Operation)
    for name, value in zip(Operation.__slots__, values, strict=True):
        setattr(operation, name, value)
    return operation


def encode(
    reducer: Reducer,
    data: bytes,
    length: int,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    *,
    key: bytes | None = None,
    prefix: str | None = None,
) -> bytes:
    """The snapshot of `reducer`, the state of exactly `data[:length]` (the committed prefix),
    every line of which is at most `max_line_bytes` (the store's limit: it read or wrote them),
    signed with `key` (this user's, made if need be: `snapshot_key`; SnapshotKeyError when it
    cannot be); `prefix`: the sha256 of `data[:length]` in hex, when the caller hashed it already."""
    if reducer.undo is not None:
        raise RuntimeError("a snapshot is taken between transactions, not while one is validated")
    if len(data) < length or data[length - 1 : length] != b"\n":
        raise ValueError("the covered prefix must be committed bytes ending with a line")
    fields = {name: value for name, value in vars(reducer).items() if name not in _NOT_KEPT}
    fields["entries"] = _entry_columns(reducer.entries)
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=5)
    pickler.dispatch_table = {Attempt: _attempt, Operation: _operation}
    # What the load must know besides the tables is in the body too, under its hash.
    pickler.dump((fields, length, data.count(b"\n", 0, length), max_line_bytes))
    body = buffer.getvalue()
    meta = {
        **versions(),
        "session": reducer.header.get("id"),
        "covered": length,
        "prefix": prefix or hashlib.sha256(memoryview(data)[:length]).hexdigest(),
        "bodyLength": len(body),
    }
    signed = orjson.dumps(meta) + b"\n" + body
    return MAGIC + _mac(make_key() if key is None else key, signed).encode() + b"\n" + signed


def _mac(key: bytes, signed: bytes | memoryview) -> str:
    """The HMAC-SHA256 of everything after the MAC line: the meta line and the body."""
    return hmac.new(key, signed, hashlib.sha256).hexdigest()


# -- reading ----------------------------------------------------------------------------------

_ALLOWED = {
    (__name__, "restored_attempt"): restored_attempt,
    (__name__, "restored_operation"): restored_operation,
}


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"a snapshot names {module}.{name}, which it may not")
        return found


def restore(
    blob: bytes,
    data: bytes,
    end: int,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    *,
    key: bytes | None = None,
) -> tuple[Reducer, int, int, Any] | None:
    """(The reducer `blob` holds, the length and the lines it covers, the sha256 object of those
    bytes, to be extended), if it is a snapshot of
    this library signed with `key` (this user's: `snapshot_key`) of a prefix of `data[:end]`
    (the committed part of the log in hand), that prefix is exactly the bytes it covered, its
    lines are within `max_line_bytes`, and the restored state ends where the covered part does
    (its next seq follows the last covered line's, whose id it holds); otherwise None. Never
    raises for what the blob holds."""
    try:
        key = read_key() if key is None else key
        if key is None:  # no key: no snapshot can be trusted
            return None
        restored = _restore(blob, data, end, max_line_bytes, key)
        if restored is None or not _ends_where_covered(restored[0], data, restored[1]):
            return None
        return restored
    except Exception:  # a snapshot that does not read is no snapshot: the full reduction runs
        return None


def _ends_where_covered(reducer: Reducer, data: bytes, covered: int) -> bool:
    """Whether the restored state is that of the last covered line: its seq is the one before
    `next_seq` and its last fact's id is known (the header alone: no seq yet). A check no
    snapshot, signed or not, can pass with a state that would make a commit write a wrong seq."""
    start = data.rfind(b"\n", 0, covered - 1) + 1
    last = orjson.loads(data[start:covered])
    if start == 0:  # the header
        return reducer.next_seq == 1
    fact = last[-1] if type(last) is list and last else last  # a transaction, or one fact
    return type(fact) is dict and fact.get("seq") == reducer.next_seq - 1 and fact.get("id") in reducer.ids


def _restore(
    blob: bytes, data: bytes, end: int, max_line_bytes: int, key: bytes
) -> tuple[Reducer, int, int, Any] | None:
    if not blob.startswith(MAGIC):
        return None
    signed_at = blob.find(b"\n", len(MAGIC)) + 1
    split = blob.find(b"\n", signed_at)
    if signed_at <= 0 or split < 0:
        return None
    signed = memoryview(blob)[signed_at:]
    if not hmac.compare_digest(blob[len(MAGIC) : signed_at - 1], _mac(key, signed).encode()):
        return None  # made with another key, or changed since: checked before anything is read
    meta = orjson.loads(blob[signed_at:split])
    if type(meta) is not dict or any(meta.get(key) != value for key, value in versions().items()):
        return None
    covered, body_length = meta.get("covered"), meta.get("bodyLength")
    if type(covered) is not int or type(body_length) is not int or not 0 < covered <= end:
        return None
    body = memoryview(blob)[split + 1 :]
    if len(body) != body_length or data[covered - 1] != 0x0A:
        return None
    prefix = hashlib.sha256(memoryview(data)[:covered])
    if prefix.hexdigest() != meta.get("prefix"):
        return None
    fields, length, covered_lines, longest = _Restricted(io.BytesIO(body)).load()
    if type(fields) is not dict or length != covered or type(covered_lines) is not int:
        return None
    if type(longest) is not int or longest > max_line_bytes:  # a line there may be too long now
        return None
    header = fields.get("header")
    if type(header) is not dict or header.get("id") != meta.get("session"):
        return None
    reducer = Reducer(header)
    if set(fields) != set(vars(reducer)) - _NOT_KEPT:
        return None
    entries = _entries(fields["entries"])
    if entries is None:
        return None
    fields["entries"] = entries
    reducer.__dict__.update(fields)
    return reducer, covered, covered_lines, prefix


def load_with_snapshot(
    data: bytes,
    blob: bytes | None,
    *,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    nul_tail: bool = False,
    nul_window: int = 0,
    path: Any = None,
    known: bool = False,
) -> tuple[Reducer, int, int, int, Any]:
    """`loading.load`, from the snapshot `blob` when it belongs to `data`: (the reducer, the
    committed length, the lines and the bytes the snapshot covered: 0 when none was used, and
    with `known` the sha256 object of the committed bytes, else None). The result is the full
    reduction's, whatever `blob` holds; so is the error of a log that does not reduce. The hash
    is what a writer knows the log holds, extended with every line it appends and checked before
    a snapshot of its state is written (`core.store.snapshot_of`); made from the snapshot's own
    check of the bytes it covers when one is used, so only the tail is hashed again."""
    if blob:
        end = committed_end(data, nul_tail=nul_tail, nul_window=nul_window)
        with gc_paused():  # many small containers, all kept: as `loading` does
            restored = restore(blob, data, end, max_line_bytes) if end else None
        if restored is not None:
            reducer, covered, covered_lines, prefix = restored
            try:
                check_committed(data, end, covered)
                reduce_lines(
                    reducer,
                    lines(data, end, max_line_bytes, start=covered, number=covered_lines + 1),
                    max_line_bytes,
                )
            except CorruptionError:
                pass  # the full reduction below raises the error with its place, as always
            else:
                if known:
                    prefix.update(memoryview(data)[covered:end])
                return reducer, end, covered_lines, covered, prefix if known else None
    reducer, end = load(
        data, path=path, max_line_bytes=max_line_bytes, nul_tail=nul_tail, nul_window=nul_window
    )
    return reducer, end, 0, 0, hashlib.sha256(memoryview(data)[:end]) if known else None

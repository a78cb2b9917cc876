"""Store contracts: what a framework opens, commits to and closes; what a backend implements.

A backend only moves bytes (read the log, drop a torn tail, append lines, close). Everything the
contract demands happens here and in `commit.py`, once for every backend.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol, Self

from .commit import CommitPipeline
from .errors import (
    ReentrantCallError,
    SessionChangedError,
    StoreClosedError,
    StoreForkedError,
    StorePoisonedError,
    shown,
)
from .framing import DEFAULT_MAX_LINE_BYTES, NUL_WINDOW
from .loading import check_torn_tail
from .snapshot import encode, load_with_snapshot, worth_writing
from .snapshot_key import SnapshotKeyError, make_key, warn_once
from .state import SessionState

_log = logging.getLogger("sessionlog.snapshot")

Durability = Literal["process", "power", "replicated"]
Api = Literal["sync", "async"]


@dataclass(frozen=True)
class BackendInfo:
    """What a backend promises. `durability`: process = an acknowledged commit survives kill -9;
    power = it also survives power loss, assuming the drive honours flushes; replicated = it
    also survives the loss of the database host (a synchronous standby has it)."""

    name: str
    durability: Durability
    api: Api
    description: str
    group_commit: bool = False  # one write (and sync) holds several lines, at most NUL_WINDOW bytes
    plain_file: bool = False  # the session is the JSONL file at its path, byte for byte
    opens_read_only: bool = False  # the factory takes read_only=True: read without the writer's hold
    syncs_filesystem: bool = False  # a syncfs of the whole filesystem makes a commit durable
    single_file: bool = False  # the session's database is the one regular file at its path (SQLite)

    def nul_rule(self) -> dict[str, Any]:
        """How this backend's log reads after a power loss (`core.loading`): in the power class the
        last write may come back with holes of NUL bytes, and is then torn rather than corrupt."""
        power = self.durability == "power"
        return {"nul_tail": power, "nul_window": NUL_WINDOW if power and self.group_commit else 0}


class SyncBackend(Protocol):
    """One storage medium, synchronous. It never validates; it raises OSError when I/O fails.

    The snapshot seam (`core.snapshot`), optional: a backend that keeps snapshots beside its log
    also has `read_snapshot() -> bytes | None` (the stored snapshot, None when there is none or
    it does not read), `write_snapshot(blob)` (replace it, never touching the log) and
    `read_prefix(length) -> bytes` (the log's first `length` bytes, read without changing what
    the writer believes of its file). The core decides what they hold and whether to trust it."""

    def read(self) -> bytes:
        """Every stored byte of the log."""
        ...

    def truncate(self, length: int) -> None:
        """Drop a torn tail: keep the first `length` bytes (called only after they reduced)."""
        ...

    def append(self, line: bytes) -> None:
        """Store one transaction line whole; durable per the backend's class when it returns."""
        ...

    def close(self) -> None: ...


class AsyncBackend(Protocol):
    """One storage medium, asynchronous. `append_batch` stores many lines with one write (and,
    in the power class, one sync) so that concurrent commits share the cost of a thread hop."""

    async def read(self) -> bytes: ...

    async def truncate(self, length: int) -> None: ...

    async def append_batch(self, lines: list[bytes]) -> None: ...

    async def close(self) -> None: ...


# A factory opens (`create=None`) or atomically creates (`create=<header line>`) the session at
# `path`; backend-specific options arrive as keywords (`lock=True`, ...).
SyncFactory = Callable[..., SyncBackend]
AsyncFactory = Callable[..., Awaitable[AsyncBackend]]


def check_max_line_bytes(value: object) -> int:
    if type(value) is not int or value < 1:
        raise ValueError(f"max_line_bytes must be a positive integer, not {shown(value)}")
    return value


def reduce_stored(
    data: bytes,
    path: Path,
    *,
    nul_tail: bool = False,
    nul_window: int = 0,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> tuple[CommitPipeline, int]:
    """The stored bytes of a backend to a pipeline; returns it and the committed length.
    `nul_tail` only for the power class (`core.loading`); the pipeline refuses to write a line
    longer than `max_line_bytes`, which the same store could not read back."""
    pipeline, end, _ = reduce_stored_from(
        data, None, path, nul_tail=nul_tail, nul_window=nul_window, max_line_bytes=max_line_bytes
    )
    return pipeline, end


def reduce_stored_from(
    data: bytes,
    snapshot: bytes | None,
    path: Path,
    *,
    nul_tail: bool = False,
    nul_window: int = 0,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    known: bool = False,
) -> tuple[CommitPipeline, int, int]:
    """`reduce_stored`, from `snapshot` when it belongs to `data` (`core.snapshot`: the result
    is the same either way); also returns the lines the snapshot covered (0: none used).
    `known`: the pipeline keeps the sha256 of the bytes it knows the log holds (a store that
    writes snapshots: `snapshot_of`)."""
    reducer, end, covered, covered_bytes, digest = load_with_snapshot(
        data,
        snapshot,
        path=path,
        max_line_bytes=max_line_bytes,
        nul_tail=nul_tail,
        nul_window=nul_window,
        known=known,
    )
    check_torn_tail(data, end, reducer.next_seq, path=path)
    lines = covered + data.count(b"\n", covered_bytes, end)
    pipeline = CommitPipeline(reducer, end, lines, max_line_bytes=max_line_bytes)
    pipeline.known = digest
    return pipeline, end, covered


def log_snapshot_failure(path: Path, what: str, error: BaseException) -> None:
    """A snapshot that could not be read or written: logged, never raised (it is a cache). A
    problem of the user's key (`snapshot_key`) is the same for every session: said once."""
    if isinstance(error, SnapshotKeyError):
        warn_once(str(error))
        return
    _log.warning("%s: the snapshot could not be %s (%r); the log is untouched", path, what, error)


def read_snapshot_quietly(read: Callable[[], bytes | None] | None, path: Path) -> bytes | None:
    """A backend's stored snapshot, or None: a snapshot that cannot be read is no snapshot."""
    if read is None:
        return None
    try:
        return read()
    except Exception as error:  # a cache: never the user's error
        log_snapshot_failure(path, "read", error)
        return None


def snapshot_of(pipeline: CommitPipeline, prefix: bytes) -> bytes | None:
    """The snapshot of an idle pipeline's state, given the log's first `pipeline.length` bytes
    as read back now (`read_prefix`); None when the bytes are not that long (something else
    changed the file) or a transaction is in flight. SessionChangedError when they are not the
    bytes the writer knows (`pipeline.known`: read at open, then appended): a log edited in
    place under its writer (the same length, which its appends cannot notice) never gets a
    signed claim that it holds what the writer remembers. SnapshotKeyError first, before any
    work, when no key can sign it."""
    if pipeline.pending or len(prefix) != pipeline.length:
        return None
    key = make_key()
    digest = hashlib.sha256(prefix).hexdigest()
    if pipeline.known is None or digest != pipeline.known.hexdigest():
        raise SessionChangedError(
            f"the log changed under its writer: its first {pipeline.length:,} bytes are not those the "
            "writer read and wrote (edited in place?); no snapshot of its state is written"
        )
    return encode(pipeline.reducer, prefix, pipeline.length, pipeline.max_line_bytes, key=key, prefix=digest)


class StoreStatus:
    """What every store, sync or async, knows of itself: its path, its backend, whether it was
    closed or poisoned, and the error each of those means for the next call."""

    def __init__(self, path: Path, info: BackendInfo, torn_bytes: int = 0) -> None:
        self.path = path
        self.info = info
        self.torn_bytes = torn_bytes  # what opening cut: a torn tail (and NUL holes, power class)
        self.snapshot_lines = 0  # the lines the snapshot loaded (or last written) covers
        self.snapshot_failures = 0  # snapshot writes that failed (ignored: the log is untouched)
        self._closed = False
        self._poisoned: BaseException | None = None
        self._pid = os.getpid()  # a store is used by the process that opened it, never a fork

    @property
    def durability(self) -> Durability:
        return self.info.durability

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def poisoned(self) -> bool:
        return self._poisoned is not None

    def _poison_error(self, detail: str) -> StorePoisonedError:
        error = StorePoisonedError(f"{self.path}: {detail}")
        error.__cause__ = self._poisoned
        return error

    def _check(self) -> None:
        if self._pid != os.getpid():
            raise StoreForkedError(
                f"{self.path}: this store was opened by process {self._pid}, and this is a fork of it "
                f"(process {os.getpid()}); open the session afresh here"
            )
        if self._closed:
            raise StoreClosedError(f"{self.path}: the store is closed")
        if self._poisoned is not None:
            raise self._poison_error(
                f"an earlier write or sync failed ({self._poisoned!r}); reopen the session"
            )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.info.name} {self.path}>"


class SessionStore(StoreStatus):
    """A session open for writing through a synchronous backend.

    Commits from several threads are serialized; each is one transaction, one line, one write.
    """

    def __init__(
        self,
        backend: SyncBackend,
        pipeline: CommitPipeline,
        path: Path,
        info: BackendInfo,
        torn_bytes: int = 0,
    ) -> None:
        super().__init__(path, info, torn_bytes)
        self._backend = backend
        self._pipeline = pipeline
        pipeline.line_facts = getattr(backend, "line_facts", False)  # lines that carry their facts
        self._lock = threading.Lock()
        self._owner = 0  # the thread inside a call, to refuse a re-entrant one instead of deadlocking

    @classmethod
    def open_backend(
        cls,
        backend: SyncBackend,
        path: Path,
        info: BackendInfo,
        *,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    ) -> SessionStore:
        """Reduce what `backend` holds (repairing a torn tail, and in the power class a
        NUL-bearing last line) and wrap it; closes it on error."""
        try:
            check_max_line_bytes(max_line_bytes)
            data = backend.read()
            snapshot = read_snapshot_quietly(getattr(backend, "read_snapshot", None), path)
            pipeline, end, covered = reduce_stored_from(
                data,
                snapshot,
                path,
                **info.nul_rule(),
                max_line_bytes=max_line_bytes,
                known=hasattr(backend, "write_snapshot"),  # what a snapshot will be checked against
            )
            if end < len(data):
                backend.truncate(end)
        except BaseException:
            backend.close()
            raise
        store = cls(backend, pipeline, path, info, len(data) - end)
        store.snapshot_lines = covered
        return store

    def commit(self, facts: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Commit one transaction; return its facts with seq, id and timestamp. Durable per the
        backend's class when this returns. ValidationError: nothing was written."""
        me = threading.get_ident()  # inline `_call`: this is the hot path
        if self._owner == me:
            self._refuse_reentrant()
        with self._lock:
            self._owner = me
            try:
                return self._commit(facts)
            finally:
                self._owner = 0

    def _commit(self, facts: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        self._check()
        prepared = self._pipeline.prepare(facts)
        try:
            self._backend.append(prepared.line)
        except BaseException as error:
            self._pipeline.abandon(prepared)
            self._poisoned = error
            if not isinstance(error, Exception):  # Ctrl-C, SystemExit: poisoned, and as itself
                raise
            if isinstance(error, SessionChangedError):
                raise StorePoisonedError(
                    f"{error}; seq {prepared.facts[0]['seq']} was not written and the store is poisoned"
                ) from error
            raise StorePoisonedError(
                f"{self.path}: writing seq {prepared.facts[0]['seq']} failed; the store is poisoned "
                "and the commit may or may not be on disk (reopen to find out)"
            ) from error
        self._pipeline.acknowledge(prepared)
        return prepared.facts

    @property
    def header(self) -> dict[str, Any]:
        """The session's header (id, createdAt, cwd, provider, model, environmentIdentity)."""
        return dict(self._pipeline.reducer.header)

    def load(self) -> SessionState:
        """The state of everything committed so far."""
        with self._call():
            self._check()
            return self._pipeline.state()

    def write_snapshot(self) -> bool:
        """Write a snapshot of the state now (`core.snapshot`), whatever `worth_writing` says;
        whether one was written. Never raises for a failed write (counted in
        `snapshot_failures`, logged): the log is never touched, nor the store poisoned."""
        with self._call():
            self._check()
            return self._write_snapshot()

    def _write_snapshot(self) -> bool:
        backend = self._backend
        write, read_prefix = getattr(backend, "write_snapshot", None), getattr(backend, "read_prefix", None)
        if write is None or read_prefix is None:
            return False
        pipeline = self._pipeline
        try:
            blob = snapshot_of(pipeline, read_prefix(pipeline.length))
            if blob is None:
                return False
            write(blob)
        except Exception as error:  # a cache: the log and the store stay as they were
            self.snapshot_failures += 1
            log_snapshot_failure(self.path, "written", error)
            return False
        self.snapshot_lines = pipeline.lines
        return True

    def close(self) -> None:
        """Idempotent. After close every call raises StoreClosedError. Writes a snapshot first
        when one pays (`core.snapshot.worth_writing`)."""
        if self._pid != os.getpid():  # a fork's copy: the parent's file is not this process's to close
            self._closed = True
            return
        with self._call():
            if self._closed:
                return
            self._closed = True
            try:
                if self._poisoned is None and worth_writing(self._pipeline.lines, self.snapshot_lines):
                    self._write_snapshot()
            finally:
                self._backend.close()

    def _refuse_reentrant(self) -> None:
        raise ReentrantCallError(
            f"{self.path}: a store call from inside another call of the same store (a fact "
            "generator or mapping that calls the store?); refused instead of deadlocking"
        )

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        me = threading.get_ident()
        if self._owner == me:
            self._refuse_reentrant()
        with self._lock:
            self._owner = me
            try:
                yield
            finally:
                self._owner = 0

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

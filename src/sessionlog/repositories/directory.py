"""The directory repository: one session file per session (`<session id>.jsonl`, written by any
file backend, `jsonl-fsync` by default) and an index (`repositories.index`) so that listing
reads summaries, not logs.

One writer per session comes from the stores themselves (the writer lock, taken by default); a
session whose run is unfinished and whose lock nobody holds is `needs-recovery`. Session ids are
UUIDv7 strings and name the files: an id that is not one is refused before any path is made.
"""

from __future__ import annotations

import builtins
import errno
import fcntl
import functools
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..backends.jsonl_file import read_session_file
from ..core.errors import SessionExistsError, SessionLockedError, SessionNotFoundError, SessionPathError
from ..core.ids import new_id
from ..core.loading import reduce_bytes
from ..core.reducer import is_uuid7
from ..core.state import SessionState
from ..core.store import SessionStore
from ..maintenance import write_into_place
from ..opening import create, open
from ..plugins.registry import Registry, default_registry
from .base import RepositoryBase, checked_labels, fork_bytes
from .index import Index, signature
from .info import Candidate, Filters, SessionInfo, page

SUFFIX = ".jsonl"


class DirectoryRepository(RepositoryBase):
    """Sessions as files in `directory` (made if missing). `backend`: a sync file backend."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        backend: str = "jsonl-fsync",
        registry: Registry | None = None,
    ) -> None:
        self.registry = registry if registry is not None else default_registry()
        info = self.registry.info(backend)
        if not info.plain_file or info.api != "sync":
            raise ValueError(
                f"a directory repository needs a sync file backend, not {backend!r} (an async file "
                "backend such as jsonl-syncfs goes to sessionlog.repository_async)"
            )
        self.backend = backend
        self.rule = info.nul_rule()
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.directory.is_dir():
            raise SessionPathError(errno.ENOTDIR, f"not a directory: {self.directory}", str(self.directory))
        self._index = Index(self.directory)
        self._cached: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] | None = None

    def __repr__(self) -> str:
        return f"<DirectoryRepository {self.directory} ({self.backend})>"

    def close(self) -> None:
        self._index.close()

    def __enter__(self) -> DirectoryRepository:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def path(self, session_id: str) -> Path:
        """The file of a session; ValueError for anything that is not a session id."""
        if not is_uuid7(session_id):
            raise ValueError(f"not a session id (a UUIDv7): {session_id!r:.60}")
        return self.directory / f"{session_id}{SUFFIX}"

    # -- one session ---------------------------------------------------------------------------

    def create(
        self,
        *,
        provider: str,
        model: str,
        cwd: str | None = None,
        environment_identity: str | None = None,
        labels: Iterable[str] = (),
        **options: Any,
    ) -> SessionStore:
        """A new session, open for writing (its writer lock held)."""
        session_id = new_id()
        store = create(
            self.path(session_id),
            self.backend,
            provider=provider,
            model=model,
            cwd=cwd,
            environment_identity=environment_identity,
            session_id=session_id,
            registry=self.registry,
            **options,
        )
        if labels:
            self._index.set_labels(session_id, checked_labels(labels))
        return store

    def open(self, session_id: str, **options: Any) -> SessionStore:
        """A session for writing; SessionLockedError while another writer holds it."""
        return open(self.path(session_id), self.backend, registry=self.registry, **options)

    def load(self, session_id: str) -> SessionState:
        """The state of a session, read-only: never blocks its writer."""
        return reduce_bytes(read_session_file(self.path(session_id)), **self.rule)

    def export(self, session_id: str) -> bytes:
        """The committed lines of a session: the canonical JSONL any port reads."""
        data = read_session_file(self.path(session_id))
        return data[: reduce_bytes(data, **self.rule).repaired_length]

    def import_(self, data: bytes, *, labels: Iterable[str] = ()) -> str:
        """Store a session's bytes as they are, once the reducer accepted them; its id."""
        state = reduce_bytes(data)
        if state.repaired_length != len(data):
            raise ValueError("an imported session ends with its last LF (this one has a torn tail)")
        path = self.path(state.session_id)
        try:
            write_into_place(path, data)
        except SessionExistsError:
            raise SessionExistsError(
                errno.EEXIST, f"session {state.session_id} is already here", str(path)
            ) from None
        if labels:
            self._index.set_labels(state.session_id, checked_labels(labels))
        return state.session_id

    def fork(self, session_id: str, at_seq: int) -> str:
        """A new session holding the transactions of `session_id` through seq `at_seq` (which
        must end a transaction); its id. The facts keep their ids; the header gets a new one."""
        forked, data = fork_bytes(self.export(session_id), session_id, at_seq)
        write_into_place(self.path(forked), data)
        return forked

    def delete(self, session_id: str) -> None:
        """Remove a session and its summary; SessionLockedError while a writer holds it."""
        path = self.path(session_id)
        if _held(path):
            raise SessionLockedError(f"{path} is in use: a writer holds it; nothing was deleted")
        try:
            path.unlink()
        except FileNotFoundError:
            raise SessionNotFoundError(errno.ENOENT, f"no session {session_id} here", str(path)) from None
        self._index.forget(session_id)
        if self._cached is not None:
            self._cached.pop(session_id, None)

    def label(self, session_id: str, labels: Iterable[str]) -> None:
        """Set the caller's labels of a session (replacing its earlier ones)."""
        if not self.path(session_id).exists():
            raise SessionNotFoundError(
                errno.ENOENT, f"no session {session_id} here", str(self.path(session_id))
            )
        self._index.set_labels(session_id, checked_labels(labels))

    # -- many sessions -------------------------------------------------------------------------

    def list(self, **filters: Any) -> builtins.list[SessionInfo]:
        """Sessions newest first (by last write), filtered (`Filters`), at most `limit`, after
        `cursor` (the `cursor` of the last row of the previous page)."""
        wanted = Filters(**filters)
        labels = self._index.labels()
        found = sorted(self._summaries(), key=_newest_first, reverse=True)
        candidates = (
            Candidate(summary, labels.get(summary["session_id"], ()), functools.partial(_held, path))
            for summary, path in found  # made only for the rows a page reaches
        )
        return page(candidates, wanted)

    def latest(self, **filters: Any) -> SessionInfo | None:
        found = self.list(**{**filters, "limit": 1})
        return found[0] if found else None

    def unfinished(self) -> builtins.list[SessionInfo]:
        """Sessions with an unfinished run or compaction and no live writer: to recover."""
        return self.list(status="needs-recovery", limit=None)

    def _summaries(self) -> builtins.list[tuple[dict[str, Any], str]]:
        """Every session's summary and file, reducing only the files that changed since the index
        saw them (the index is read once per repository object, then kept in memory)."""
        if self._cached is None:
            self._cached = self._index.cached()
        cached = self._cached
        fresh, found = [], []
        present = set()
        for entry in os.scandir(self.directory):
            name = entry.name
            session_id = name[: -len(SUFFIX)]
            if not name.endswith(SUFFIX) or (session_id not in cached and not is_uuid7(session_id)):
                continue  # an id in the index was checked when it was indexed
            try:
                status = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted meanwhile
            if not stat.S_ISREG(status.st_mode):
                continue
            present.add(session_id)
            mark = signature(status)
            known = cached.get(session_id)
            if known is not None and known[0] == mark:
                summary = known[1]
            else:
                summary = {**self._summarize(Path(entry.path), status), "session_id": session_id}
                fresh.append((session_id, mark, summary))
                cached[session_id] = (mark, summary)
            found.append((summary, entry.path))
        gone = [session_id for session_id in cached if session_id not in present]
        for session_id in gone:
            del cached[session_id]
        if fresh or gone:
            self._index.store(fresh, gone)
        return found

    def _summarize(self, path: Path, status: os.stat_result) -> dict[str, Any]:
        try:
            data = read_session_file(path)
            state = reduce_bytes(data, **self.rule)
        except (OSError, ValueError) as error:  # a corrupt or unreadable log is listed as such
            return {
                "error": str(error)[:200],
                "bytes": status.st_size,
                "updated_at": status.st_mtime_ns // 1_000_000,
            }
        return summary_of(state, data, status.st_mtime_ns // 1_000_000)


def _newest_first(found: tuple[dict[str, Any], str]) -> tuple[int, str]:
    return (found[0]["updated_at"], found[0]["session_id"])


def summary_of(state: SessionState, data: bytes, updated_at: int) -> dict[str, Any]:
    """What `list` shows of a session, from its state (`info.info_of` adds status and labels)."""
    header = state.header
    title = next((message["content"] for message in state.transcript if message["role"] == "user"), None)
    if isinstance(title, str):
        title = " ".join(title.split())[:80]
    return {
        "session_id": header["id"],
        "provider": header["provider"],
        "model": header["model"],
        "created_at": header["createdAt"],
        "updated_at": updated_at,
        "idle": state.is_idle,
        "last_seq": state.last_seq,
        "lines": data.count(b"\n", 0, state.repaired_length),
        "bytes": state.repaired_length,
        "title": title if isinstance(title, str) else None,
        "usage": list(state.usage),
    }


def _held(path: str | Path) -> bool:
    """Whether a live writer holds the session's lock (the lock is taken by default)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # also releases the probe's lock at once
    return False


__all__ = ["DirectoryRepository", "summary_of"]

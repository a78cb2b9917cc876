"""The directory repository: one session file per session (`<session id>.jsonl`, written by any
file backend, `jsonl-fsync` by default) and an index (`repositories.index`) so that listing
reads summaries, not logs.

One writer per session comes from the stores themselves (the writer lock, taken by default); a
session whose run is unfinished and whose lock nobody holds is `needs-recovery`. Listing asks
whether the lock is held without taking it (`backends.writer_lock`): a read never refuses a
writer. Session ids are UUIDv7 strings and name the files: an id that is not one is refused
before any path is made.

* Each file is read with its writer's rule (`BackendInfo.nul_rule`): the backend the repository
  was given, or the one named by `reads_as=` (the async repository's group-commit backend, set
  through `read_as`), whose power-loss holes may lie anywhere in its last batch.
* Delete holds what it checks: the session's writer lock, taken on the file itself, is held
  across the unlink, so a writer can neither be open while its file goes nor open it meanwhile
  (one that opened the file just before and locks it after finds it has no name: its first
  commit is fenced, nothing acknowledged is lost).
* One object may be shared by threads: the index has its own lock, the in-memory cache this one.
* Debris of dead processes (the `.creating` / `.converting` temporaries of a create, fork or
  import killed before its rename) is removed when the repository is opened.
* `create=False`: the directory must exist (RepositoryNotFoundError) and nothing is made by
  reading it; the index is made by the first write that needs it (a label).
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import functools
import os
import re
import stat
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..backends import writer_lock
from ..backends.jsonl_file import read_session_file
from ..backends.side_files import process_alive, read_snapshot_file, remove_snapshot
from ..core.errors import (
    RepositoryError,
    RepositoryNotFoundError,
    SessionExistsError,
    SessionLockedError,
    SessionLogError,
    SessionNotFoundError,
    SessionPathError,
    shown,
)
from ..core.ids import new_id
from ..core.loading import reduce_bytes
from ..core.reducer import is_uuid7
from ..core.snapshot import load_with_snapshot
from ..core.state import SessionState
from ..core.store import SessionStore
from ..maintenance import write_into_place
from ..opening import create, open
from ..plugins.registry import Registry, default_registry
from . import directory_keys
from .base import CREATE_KEYWORDS, RepositoryBase, checked_create, checked_data, checked_labels, fork_bytes
from .index import INDEX_NAME, Index, signature
from .info import Candidate, Filters, SessionInfo, page
from .keys import KeySessions, checked_key

SUFFIX = ".jsonl"


class DirectoryRepository(RepositoryBase):
    """Sessions as files in `directory` (made if missing, unless `create=False`). `backend`: a
    sync file backend; `reads_as`: the backend that wrote the sessions when it is another (an
    async repository's `jsonl-group` or `jsonl-syncfs`), whose rule reads them."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        backend: str = "jsonl-fsync",
        registry: Registry | None = None,
        create: bool = True,
        reads_as: str | None = None,
    ) -> None:
        if type(create) is not bool:
            raise TypeError(f"create is True or False, not {shown(create)}")
        self.registry = registry if registry is not None else default_registry()
        info = self.registry.info(backend)
        if not info.plain_file or info.api != "sync":
            raise ValueError(
                f"a directory repository needs a sync file backend, not {shown(backend)} (an async "
                "file backend such as jsonl-syncfs goes to sessionlog.repository_async)"
            )
        self.backend = backend
        self.rule = info.nul_rule()
        if reads_as is not None:
            self.read_as(reads_as)
        self.directory = Path(directory)
        made = _missing_parents(self.directory) if create else []  # removed again if opening fails
        try:
            self._open(str(directory), create)
        except BaseException:
            self._closed = True
            with contextlib.suppress(AttributeError):
                self._index.close()
            for path in made:  # made by this call, nothing in them but what it put there
                with contextlib.suppress(OSError):
                    for leftover in path.glob(f"{INDEX_NAME}*"):
                        leftover.unlink()
                    path.rmdir()
            raise

    def _open(self, directory: str, create: bool) -> None:
        if create:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except FileExistsError:
                pass  # not a directory: said below
            except OSError as error:
                raise SessionPathError(
                    error.errno,
                    f"cannot make the repository {self.directory}: {error.strerror}",
                    directory,
                ) from None
        elif not os.path.lexists(self.directory):
            raise RepositoryNotFoundError(
                errno.ENOENT,
                f"no repository at {self.directory} (nothing was created: create=False)",
                str(self.directory),
            )
        if not self.directory.is_dir():
            raise SessionPathError(errno.ENOTDIR, f"not a directory: {self.directory}", str(self.directory))
        self._closed = False
        self._lock = threading.RLock()  # the in-memory cache, shared by the threads using this object
        self._index = Index(self.directory)
        self._index.open(create=create)
        self._cached: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] | None = None
        self._keys = directory_keys.KeyRecords(self.directory)
        remove_debris(self.directory)
        self._keys.remove_debris()

    def __repr__(self) -> str:
        return f"<DirectoryRepository {self.directory} ({self.backend})>"

    def read_as(self, backend: str) -> None:
        """Read the sessions with the rule of `backend`, the one that writes them (the async
        repository's group-commit backend: a power-loss hole may lie anywhere in its last batch)."""
        info = self.registry.info(backend)
        if not info.plain_file:
            raise ValueError(f"sessions of a directory are written by a file backend, not {shown(backend)}")
        self.rule = info.nul_rule()

    def close(self) -> None:
        """Idempotent. Every call after it raises RepositoryError (as every repository kind)."""
        self._closed = True
        self._index.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def _refuse_closed(self, operation: str, session_id: str | None = None) -> None:
        if self._closed:
            raise RepositoryError(operation, str(self.directory), "the repository is closed", session_id)

    def __enter__(self) -> DirectoryRepository:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def path(self, session_id: str) -> Path:
        """The file of a session; ValueError for anything that is not a session id."""
        if not is_uuid7(session_id):
            raise ValueError(f"not a session id (a UUIDv7): {shown(session_id)}")
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
        key: str | None = None,
        **options: Any,
    ) -> SessionStore:
        """A new session, open for writing (its writer lock held). Its labels are stored before
        its file is made, so that no listing ever shows it without them. `max_line_bytes` is
        the store's; any other keyword is a TypeError. `key=`: the key's current session, made
        (with that header) when it has none (`keys`, `directory_keys`)."""
        self._refuse_closed("create")
        if key is not None:
            key = checked_key(key)
            header: dict[str, Any] = {
                "provider": provider,
                "model": model,
                "cwd": cwd,
                "environment_identity": environment_identity,
            }
            checked_create(header | options, (*CREATE_KEYWORDS, "max_line_bytes"))
            return self.open_key(key, self.bind_key(key, **header, labels=labels), **options)
        checked_create(
            {"provider": provider, "model": model, "cwd": cwd, "environment_identity": environment_identity}
            | options,
            (*CREATE_KEYWORDS, "max_line_bytes"),
        )
        wanted = checked_labels(labels)
        session_id = new_id()
        if wanted:
            self._index.set_labels(session_id, wanted, "create")
        try:
            return create(
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
        except BaseException:
            if wanted:
                with contextlib.suppress(SessionLogError):  # labels of no session: never listed
                    self._index.forget(session_id)
            raise

    def open(self, session_id: str | None = None, *, key: str | None = None, **options: Any) -> SessionStore:
        """A session for writing; SessionLockedError while another writer holds it. `key=`: the
        key's current session (KeyNotFoundError when it has none)."""
        self._refuse_closed("open", session_id)
        if key is not None or session_id is None:
            return self.open_keyed(session_id, key, **options)
        return open(self.path(session_id), self.backend, registry=self.registry, **options)

    # -- caller keys (`keys`, kept in key records: `directory_keys`) ------------------------------

    def bind_key(self, key: str, *, replace: bool = False, labels: Iterable[str] = (), **header: Any) -> str:
        """The key's current session (made with `header` and `labels` when it has none, or when
        `replace`): its file made, then its key record linked."""
        self._refuse_closed("replace" if replace else "create")
        key = checked_key(key)
        checked_create(header)
        wanted = checked_labels(labels)

        def make() -> str:
            with self.create(**header, labels=wanted) as store:
                return store.load().session_id

        def discard(session_id: str) -> None:  # lost the race: no one knows this session
            with contextlib.suppress(SessionLogError, OSError):
                self.delete(session_id)

        return directory_keys.bind(
            self._keys, key, replace=replace, exists=self._exists, make=make, discard=discard
        )

    def _exists(self, session_id: str) -> bool:
        return is_uuid7(session_id) and self.path(session_id).is_file()

    def current_of(self, key: str) -> str | None:
        self._refuse_closed("open")
        return directory_keys.current_of(self._keys, checked_key(key), self._exists)

    def key_sessions(self, key: str) -> KeySessions | None:
        """The key's current session and those it replaced (None: the key names none)."""
        self._refuse_closed("key_sessions")
        return directory_keys.sessions_of(self._keys, checked_key(key), self._exists)

    def load(self, session_id: str) -> SessionState:
        """The state of a session, read-only: never blocks its writer."""
        self._refuse_closed("load", session_id)
        path = self.path(session_id)
        data = read_session_file(path)
        reducer, end, *_ = load_with_snapshot(data, read_snapshot_file(path), path=path, **self.rule)
        return SessionState(reducer, end)

    def export(self, session_id: str) -> bytes:
        """The committed lines of a session: the canonical JSONL any port reads."""
        self._refuse_closed("export", session_id)
        data = read_session_file(self.path(session_id))
        return data[: reduce_bytes(data, **self.rule).repaired_length]

    def import_(self, data: bytes, *, labels: Iterable[str] = ()) -> str:
        """Store a session's bytes as they are (byte for byte), once the reducer accepted them;
        its id."""
        self._refuse_closed("import")
        data = checked_data(data)
        wanted = checked_labels(labels)
        state = reduce_bytes(data)
        if state.repaired_length != len(data):
            raise ValueError("an imported session ends with its last LF (this one has a torn tail)")
        path = self.path(state.session_id)
        if os.path.lexists(path):
            raise SessionExistsError(errno.EEXIST, f"session {state.session_id} is already here", str(path))
        self._index.set_labels(state.session_id, wanted, "import")  # none: forget any of before
        try:
            self._write_new("import", state.session_id, data)
        except SessionExistsError:
            raise SessionExistsError(
                errno.EEXIST, f"session {state.session_id} is already here", str(path)
            ) from None
        return state.session_id

    def fork(self, session_id: str, at_seq: int) -> str:
        """A new session holding the transactions of `session_id` through seq `at_seq` (which
        must end a transaction); its id. The facts keep their ids; the header gets a new one."""
        self._refuse_closed("fork", session_id)
        forked, data = fork_bytes(self.export(session_id), session_id, at_seq)
        self._write_new("fork", forked, data, named=session_id)  # a failure names the source
        return forked

    def _write_new(self, operation: str, session_id: str, data: bytes, *, named: str | None = None) -> None:
        """A new session file, written whole under a temporary name and then linked into place;
        a failure (a full disk) leaves nothing, a kill a temporary that the next open removes.
        `named`: the session the error names when it is not the new one (a fork's source)."""
        try:
            write_into_place(self.path(session_id), data)
        except SessionLogError:
            raise
        except OSError as error:
            problem = f"{error.strerror or error} (nothing was written)"
            if named is not None:
                problem = f"{problem}; the new session would have been {session_id}"
            raise RepositoryError(operation, str(self.directory), problem, named or session_id) from error

    def delete(self, session_id: str) -> None:
        """Remove a session and its summary; SessionLockedError while a writer holds it. The
        session's writer lock is held from the check through the unlink."""
        self._refuse_closed("delete", session_id)
        path = self.path(session_id)
        _unlink_unheld(path, session_id)
        with contextlib.suppress(OSError):  # its snapshot goes with it (a stale one is never read)
            remove_snapshot(path)
        with self._lock:
            if self._cached is not None:
                self._cached.pop(session_id, None)
        with contextlib.suppress(RepositoryError):  # the file is gone: the next list drops its row
            self._index.forget(session_id)

    def label(self, session_id: str, labels: Iterable[str]) -> None:
        """Set the caller's labels of a session (replacing its earlier ones)."""
        self._refuse_closed("label", session_id)
        wanted = checked_labels(labels)
        path = self.path(session_id)
        if not path.exists():
            raise SessionNotFoundError(errno.ENOENT, f"no session {session_id} here", str(path))
        self._index.set_labels(session_id, wanted)
        if not path.exists():  # deleted meanwhile: its labels must not outlive it
            with contextlib.suppress(RepositoryError):
                self._index.forget(session_id)
            raise SessionNotFoundError(errno.ENOENT, f"no session {session_id} here", str(path))

    # -- many sessions -------------------------------------------------------------------------

    def list(self, **filters: Any) -> builtins.list[SessionInfo]:
        """Sessions newest first (by last write), filtered (`Filters`), at most `limit`, after
        `cursor` (the `cursor` of the last row of the previous page)."""
        self._refuse_closed("list")
        wanted = Filters(**filters)
        found = sorted(self._summaries(), key=_newest_first, reverse=True)
        labels = self._index.labels()
        keys = directory_keys.keys_by_session(self._keys)
        candidates = (
            Candidate(
                summary,
                labels.get(summary["session_id"], ()),
                functools.partial(writer_lock.held, path),
                *keys.get(summary["session_id"], (None, False)),
            )
            for summary, path in found  # made only for the rows a page reaches
        )
        return page(candidates, wanted)

    def latest(self, **filters: Any) -> SessionInfo | None:
        self._refuse_closed("latest")
        found = self.list(**{**filters, "limit": 1})
        return found[0] if found else None

    def unfinished(self) -> builtins.list[SessionInfo]:
        """Sessions with an unfinished run or compaction and no live writer: to recover."""
        self._refuse_closed("unfinished")
        return self.list(status="needs-recovery", limit=None)

    def _summaries(self) -> builtins.list[tuple[dict[str, Any], str]]:
        """Every session's summary and file, reducing only the files that changed since the index
        saw them (the index is read once per repository object, then kept in memory)."""
        with self._lock:
            return self._summaries_locked()

    def _summaries_locked(self) -> builtins.list[tuple[dict[str, Any], str]]:
        if self._cached is None:
            self._cached = self._index.cached()
        cached = self._cached
        rule = _rule_name(self.rule)
        fresh, found = [], []
        present = set()
        try:
            entries = builtins.list(os.scandir(self.directory))
        except OSError as error:  # removed, unreadable
            problem = f"cannot read the directory: {error.strerror or error}"
            raise RepositoryError("list", str(self.directory), problem) from error
        for entry in entries:
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
            if known is not None and known[0] == mark and known[1].get("rule") == rule:
                summary = known[1]
            else:  # changed, or read with another rule
                summary = {
                    **self._summarize(Path(entry.path), status),
                    "session_id": session_id,
                    "rule": rule,
                }
                fresh.append((session_id, mark, summary))
                cached[session_id] = (mark, summary)
            found.append((summary, entry.path))
        gone = [session_id for session_id in cached if session_id not in present]
        for session_id in gone:
            del cached[session_id]
        if fresh or gone:
            with contextlib.suppress(RepositoryError):  # a cache: the listing is right without it
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


def _missing_parents(directory: Path) -> builtins.list[Path]:
    """The directories a `mkdir(parents=True)` of `directory` would make, deepest first."""
    missing = []
    for path in (directory, *directory.parents):
        if os.path.lexists(path):
            break
        missing.append(path)
    return missing


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


def _rule_name(rule: dict[str, Any]) -> str:
    """The NUL rule a summary was computed with (a summary of another rule is computed again)."""
    return f"{int(rule.get('nul_tail', False))}:{rule.get('nul_window', 0)}"


def _unlink_unheld(path: Path, session_id: str) -> None:
    """Remove the session file unless a writer holds it, holding its writer lock (an exclusive
    flock on the file itself) from the check through the unlink: a writer that opens it meanwhile
    is refused (SessionLockedError), and one that opened it just before and locks it just after
    finds a file with no name, which fences its first commit."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise SessionNotFoundError(errno.ENOENT, f"no session {session_id} here", str(path)) from None
    except OSError as error:
        raise SessionPathError(error.errno, f"cannot delete {path}: {error.strerror}", str(path)) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SessionLockedError(f"{path} is in use: a writer holds it; nothing was deleted") from None
        except OSError as error:  # no locks on this filesystem: nothing can say it is unheld
            raise SessionPathError(
                error.errno,
                f"cannot lock {path} to delete it: {error.strerror}; nothing was deleted",
                str(path),
            ) from None
        held = os.fstat(fd)
        try:
            named = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            raise SessionNotFoundError(errno.ENOENT, f"no session {session_id} here", str(path)) from None
        if (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):  # replaced since it was opened
            raise SessionLockedError(f"{path} was replaced meanwhile (another writer); nothing was deleted")
        try:
            os.unlink(path)
        except FileNotFoundError:
            raise SessionNotFoundError(errno.ENOENT, f"no session {session_id} here", str(path)) from None
        except OSError as error:
            raise SessionPathError(
                error.errno, f"cannot delete {path}: {error.strerror}", str(path)
            ) from None
    finally:
        os.close(fd)  # releases the lock, now that the name is gone


_TEMPORARY = re.compile(
    r"\.(\.?[0-9a-f-]{36}\.jsonl.*)\.([0-9]+)\.[0-9a-f]{12}\.(?:creating|converting|snapshotting)"
)


def remove_debris(directory: Path) -> None:
    """Remove the temporaries that dead processes left in `directory` (a create, fork, import or
    convert killed between its write and its rename): `.ID.jsonl[...].PID.RANDOM.PURPOSE`. Those of
    a live process are its work in progress and stay."""
    try:
        names = [entry.name for entry in os.scandir(directory) if entry.name.startswith(".")]
    except OSError:
        return
    for name in names:
        match = _TEMPORARY.fullmatch(name)
        if match is None or not is_uuid7(match[1].lstrip(".")[:36]) or process_alive(int(match[2])):
            continue
        with contextlib.suppress(OSError):
            os.unlink(directory / name)


__all__ = ["DirectoryRepository", "remove_debris", "summary_of"]

"""A directory repository's caller keys (`keys`): key records, one small file per binding of a
key to a session, in `.sessionlog-keys/` beside the session files.

A record is named `<sha256 of the key>.<generation>` and holds one JSON object (the key, the
session id, the generation, when it was made). Generation 1 is the key's first session; each
`replace` links the next generation. The key's current session is the one of its highest
generation (none while that session is deleted); the lower ones are those it replaced.

* Race-free between processes: a record is written whole under a temporary name, fsynced, then
  linked to its name (`link` fails if the name exists: of two processes binding one generation
  at once exactly one wins, and the other reads the winner's record), and the directory is
  fsynced: a record acknowledged survives power loss.
* Records are never changed once linked, so a reader caches them by name; they are the truth,
  never the index (a cache that may be rebuilt: the keys survive that).
* The session file is made before its record is linked, so a record never names a session not
  yet there; a process killed between the two leaves a session no key names (listed, unkeyed).
  Temporaries of dead processes are removed when the repository opens.
* The records stay inside the repository: `.sessionlog-keys` is used only when it is a
  directory, never through a symlink (`_check_folder`, before each use). A process that could
  swap it for a symlink between that check and the use can write the session files themselves
  anyway: the repository's directory is trusted as its owner's.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from ..backends.side_files import process_alive
from ..core.errors import RepositoryError, SessionPathError
from ..core.regular_files import open_regular
from .directory_removal import sync_directory
from .keys import KeySessions, key_shown

KEYS_DIRECTORY = ".sessionlog-keys"
_RECORD = re.compile(r"([0-9a-f]{64})\.([1-9][0-9]{0,8})")
MAX_GENERATION = 999_999_999  # a key's sessions, at most (a record's name: nine digits at most)
_TEMPORARY = re.compile(r"\.[0-9a-f]{64}\.[0-9]+\.([0-9]+)\.[0-9a-f]{12}\.linking")
_MODE = 0o600
_TRIES = 100  # links lost in a row to other processes before a bind gives up


@dataclass(frozen=True)
class Record:
    key: str
    session_id: str
    generation: int


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class KeyRecords:
    """The key records of the repository in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / KEYS_DIRECTORY
        self._lock = threading.Lock()
        self._read: dict[str, Record | None] = {}  # by file name; None: not a record of ours

    def of(self, key: str) -> list[Record]:
        """The records of `key`, lowest generation first."""
        return self.looked_up(key)[0]

    def looked_up(self, key: str) -> tuple[list[Record], int]:
        """The records of `key` (lowest generation first) and the generation to link next, both
        from one look at the folder: one more than the highest generation named there, a record
        or not (a damaged record still holds its name: linking there would fail forever)."""
        names = self._names(digest(key) + ".")
        found = sorted(
            (record for record in self._records(names) if record.key == key),
            key=lambda record: record.generation,
        )
        generations = [int(match[2]) for name in names if (match := _RECORD.fullmatch(name)) is not None]
        return found, max(generations, default=0) + 1

    def every(self) -> list[Record]:
        return self._records(self._names(""))

    def _names(self, prefix: str) -> list[str]:
        try:
            self._check_folder()
            return [entry.name for entry in os.scandir(self.path) if entry.name.startswith(prefix)]
        except FileNotFoundError:
            return []
        except OSError as error:
            raise RepositoryError(
                "keys", str(self.path.parent), f"cannot read the key records in {self.path}: {error.strerror}"
            ) from None

    def _records(self, names: list[str]) -> list[Record]:
        found = []
        for name in names:
            if _RECORD.fullmatch(name) is None:
                continue
            with self._lock:
                cached = name in self._read
                known = self._read.get(name)
            if not cached:
                known = self._load(name)
                with self._lock:
                    self._read[name] = known
            if known is not None:
                found.append(known)
        return found

    def _load(self, name: str) -> Record | None:
        """The record in file `name` (None: not one sessionlog wrote; it is ignored)."""
        opened = open_regular(self.path / name)  # a FIFO put there must not hang a bind
        if opened is None:
            return None
        try:
            value = orjson.loads(os.read(opened[0], 4096))  # nesting bounded: a ValueError past it
        except (OSError, ValueError):
            return None
        finally:
            os.close(opened[0])
        match = _RECORD.fullmatch(name)
        if (
            type(value) is not dict
            or match is None
            or type(value.get("key")) is not str
            or type(value.get("session_id")) is not str
            or digest(value["key"]) != match[1]
            or value.get("generation") != int(match[2])
        ):
            return None
        return Record(value["key"], value["session_id"], value["generation"])

    def link(self, key: str, generation: int, session_id: str) -> bool:
        """Bind `session_id` to `key` at `generation`, durably; False when that generation was
        bound already (by another process: read it with `of`)."""
        name = f"{digest(key)}.{generation}"
        self._made()
        temporary = self.path / f".{name}.{os.getpid()}.{secrets.token_hex(6)}.linking"
        made = time.time_ns() // 1_000_000
        body = orjson.dumps(
            {"key": key, "session_id": session_id, "generation": generation, "created_at": made}
        )
        try:
            fd = os.open(
                temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, _MODE
            )
            try:
                os.write(fd, body)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(temporary, self.path / name)
            except FileExistsError:
                return False
            finally:
                os.unlink(temporary)
            sync_directory(self.path)
        except OSError as error:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise SessionPathError(
                error.errno,
                f"cannot write the key record {self.path / name}: {error.strerror} (the key was not bound)",
                str(self.path),
            ) from None
        return True

    def _made(self) -> None:
        """The records' directory, made (0700) and made durable if missing."""
        try:
            os.mkdir(self.path, 0o700)
        except FileExistsError:
            try:
                self._check_folder()
            except OSError as error:
                raise SessionPathError(
                    error.errno, f"{error.strerror} (the key was not bound)", str(self.path)
                ) from None
            return
        except OSError as error:
            raise SessionPathError(
                error.errno,
                f"cannot make {self.path}: {error.strerror} (the key was not bound)",
                str(self.path),
            ) from None
        sync_directory(self.path.parent)

    def _check_folder(self) -> None:
        """FileNotFoundError when the records' folder is missing; NotADirectoryError when its
        name holds anything but a directory (a symlink is never followed: the records stay in
        the repository)."""
        if not stat.S_ISDIR(os.lstat(self.path).st_mode):
            raise NotADirectoryError(
                errno.ENOTDIR, "no directory (a symlink is not followed)", str(self.path)
            )

    def remove_debris(self) -> None:
        """The temporaries of dead processes (killed between writing a record and linking it)."""
        try:
            self._check_folder()
            names = [entry.name for entry in os.scandir(self.path) if entry.name.startswith(".")]
        except OSError:
            return
        for name in names:
            match = _TEMPORARY.fullmatch(name)
            if match is not None and not process_alive(int(match[1])):
                with contextlib.suppress(OSError):
                    os.unlink(self.path / name)


def bind(
    records: KeyRecords,
    key: str,
    *,
    replace: bool,
    exists: Callable[[str], bool],
    make: Callable[[], str],
    discard: Callable[[str], None],
) -> str:
    """The id of the key's current session: the one of its highest generation if that session
    exists (and not `replace`), else a new one (`make()`, its file made before its record is
    linked). A process that loses the race to link a generation discards its session and reads
    the winner's (`replace`: links the next generation after it)."""
    for _ in range(_TRIES):
        found, generation = records.looked_up(key)  # one look: a link lost meanwhile is retried
        if generation > MAX_GENERATION:  # checked before a session is made for it
            raise RepositoryError(
                "replace" if replace else "create",
                str(records.path.parent),
                f"key {key_shown(key)} has {MAX_GENERATION:,} generations of records already (a damaged "
                "folder of key records?); nothing was bound",
            )
        top = found[-1] if found else None
        if top is not None and not replace and exists(top.session_id):
            return top.session_id
        session_id = make()
        if records.link(key, generation, session_id):
            return session_id
        discard(session_id)
    raise RepositoryError(
        "replace" if replace else "create",
        str(records.path.parent),
        f"{_TRIES} other processes bound key {key_shown(key)} while this one tried; nothing was bound",
    )


def current_of(records: KeyRecords, key: str, exists: Callable[[str], bool]) -> str | None:
    found = records.of(key)
    return found[-1].session_id if found and exists(found[-1].session_id) else None


def sessions_of(records: KeyRecords, key: str, exists: Callable[[str], bool]) -> KeySessions | None:
    found = records.of(key)
    current = current_of(records, key, exists)
    replaced = tuple(record.session_id for record in found[:-1] if exists(record.session_id))
    if current is None and not replaced:  # none, or every session of it deleted: it names none
        return None
    return KeySessions(key, current, replaced)


def keys_by_session(records: KeyRecords) -> dict[str, tuple[str, bool]]:
    """Each keyed session's key, and whether the key replaced it (a lower generation)."""
    every = records.every()
    top: dict[str, int] = {}
    for record in every:
        top[record.key] = max(top.get(record.key, 0), record.generation)
    return {record.session_id: (record.key, record.generation < top[record.key]) for record in every}

"""The JSONL writer core shared by every file backend.

The file is the log itself: a header line, then one LF-terminated transaction per line
(`sessionlog.core.framing` has the format). This module only moves bytes:

* create: write the header into a temp file in the same directory (mode 0600, O_NOFOLLOW), then
  `link` it into place, which refuses an existing session atomically; in the power class the
  temp file and then the directory are fsynced, so the new name survives power loss.
* open: O_NOFOLLOW (a symlink is refused), must be a regular file.
* append: one `write` loop of the whole line (a short write is continued, never split into two
  records; `append_many` does the same for several whole lines at once); the power class then
  `fdatasync`s. Whoever sees an error must stop using the file: after a failed fsync the kernel
  may have dropped the dirty pages, so a retry could report success for data that is gone. The
  store poisons itself and never calls again.
* one writer per file per process, keyed by (device, inode); `lock=True` adds a cross-process
  `flock` for writers in other processes.

All file operations go through `FileOps`, a seam for fault injection and power-loss traces; the
default is the `os` functions themselves.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

from ..core.errors import SessionExistsError, SessionLockedError, SessionNotFoundError, SessionPathError

_MODE = 0o600
_OPEN_FLAGS = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


class FileOps:
    """The file operations of the writer core. Subclass (or set attributes) to inject faults or
    record traces; the defaults call the os module directly."""

    open = staticmethod(os.open)
    write = staticmethod(os.write)
    pread = staticmethod(os.pread)
    fsync = staticmethod(os.fsync)
    fdatasync = staticmethod(os.fdatasync)
    ftruncate = staticmethod(os.ftruncate)
    link = staticmethod(os.link)
    unlink = staticmethod(os.unlink)
    close = staticmethod(os.close)

    def fsync_directory(self, directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


DEFAULT_OPS = FileOps()

_writers: set[tuple[int, int]] = set()
_writers_lock = threading.Lock()


class JsonlFile:
    """An open session file. `sync=True` makes every append (and the create) power-durable."""

    def __init__(self, path: Path, fd: int, key: tuple[int, int], *, sync: bool, ops: FileOps) -> None:
        self.path = path
        self._fd = fd
        self._key = key
        self._sync = sync
        self._ops = ops

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        header: bytes,
        *,
        sync: bool,
        lock: bool = False,
        ops: FileOps = DEFAULT_OPS,
    ) -> JsonlFile:
        path = Path(path)
        directory = path.parent
        if not directory.is_dir():
            raise SessionNotFoundError(
                errno.ENOENT, f"no directory for the session: {directory}", str(directory)
            )
        _check_free(path)
        temp = directory / f".{path.name}.{os.getpid()}.{threading.get_ident()}.creating"
        fd = ops.open(temp, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, _MODE)
        linked = False
        try:
            _write_all(ops, fd, header)
            if sync:
                ops.fsync(fd)
            try:
                ops.link(temp, path)
            except FileExistsError:
                raise SessionExistsError(
                    errno.EEXIST, f"a session already exists: {path}", str(path)
                ) from None
            finally:
                linked = True  # the temp name goes now, whether the link succeeded or not
                ops.unlink(temp)
            if sync:
                ops.fsync_directory(directory)
            return cls._claim(path, fd, sync=sync, lock=lock, ops=ops)
        except BaseException:
            if not linked:  # a failed header write or sync must not leave the temp file behind
                with contextlib.suppress(OSError):
                    ops.unlink(temp)
            ops.close(fd)
            raise

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], *, sync: bool, lock: bool = False, ops: FileOps = DEFAULT_OPS
    ) -> JsonlFile:
        path = Path(path)
        fd = _open_existing(path, _OPEN_FLAGS, ops)
        try:
            return cls._claim(path, fd, sync=sync, lock=lock, ops=ops)
        except BaseException:
            ops.close(fd)
            raise

    @classmethod
    def _claim(cls, path: Path, fd: int, *, sync: bool, lock: bool, ops: FileOps) -> JsonlFile:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SessionPathError(errno.EINVAL, f"not a regular file: {path}", str(path))
        key = (info.st_dev, info.st_ino)
        with _writers_lock:
            if key in _writers:
                raise SessionLockedError(f"{path} is already open for writing in this process")
            _writers.add(key)
        if lock:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                with _writers_lock:
                    _writers.discard(key)
                raise SessionLockedError(f"{path} is locked by another process") from None
        return cls(path, fd, key, sync=sync, ops=ops)

    # -- bytes -------------------------------------------------------------------------------

    def read(self) -> bytes:
        size = os.fstat(self._fd).st_size
        chunks = []
        offset = 0
        while offset < size:
            chunk = self._ops.pread(self._fd, size - offset, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def truncate(self, length: int) -> None:
        self._ops.ftruncate(self._fd, length)
        if self._sync:
            self._ops.fsync(self._fd)

    def append(self, data: bytes) -> None:
        _write_all(self._ops, self._fd, data)
        if self._sync:
            self._ops.fdatasync(self._fd)

    def append_many(self, lines: Sequence[bytes]) -> None:
        """Several whole transaction lines with one write loop (and one fdatasync in the power
        class): group commit, so that concurrent commits share one system call and one sync."""
        self.append(b"".join(lines))

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        with _writers_lock:
            _writers.discard(self._key)
        self._ops.close(fd)  # also releases a flock


def _open_existing(path: Path, flags: int, ops: FileOps) -> int:
    """Open an existing session file, mapping what can go wrong to the typed errors."""
    try:
        return ops.open(path, flags)
    except FileNotFoundError:
        raise SessionNotFoundError(errno.ENOENT, f"no session at {path}", str(path)) from None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise SessionPathError(
                errno.ELOOP, f"refusing a symlink as a session: {path}", str(path)
            ) from None
        if error.errno == errno.EISDIR:
            raise SessionPathError(errno.EISDIR, f"a directory is not a session: {path}", str(path)) from None
        raise SessionPathError(
            error.errno, f"cannot open the session {path}: {error.strerror}", str(path)
        ) from error


def read_session_file(path: str | os.PathLike[str]) -> bytes:
    """Every byte of a session file through a read-only descriptor: no writer claim, no lock."""
    path = Path(path)
    fd = _open_existing(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, DEFAULT_OPS)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SessionPathError(errno.EINVAL, f"not a regular file: {path}", str(path))
    with open(fd, "rb", closefd=True) as file:
        return file.read()


def _check_free(path: Path) -> None:
    """Nothing may be at `path` yet; a symlink or a directory there is a path error, not a session."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise SessionPathError(errno.ELOOP, f"refusing a symlink as a session: {path}", str(path))
    if stat.S_ISDIR(mode):
        raise SessionPathError(errno.EISDIR, f"a directory is not a session: {path}", str(path))
    if not stat.S_ISREG(mode):
        raise SessionPathError(errno.EINVAL, f"not a regular file: {path}", str(path))
    raise SessionExistsError(errno.EEXIST, f"a session already exists: {path}", str(path))


def _write_all(ops: FileOps, fd: int, data: bytes) -> None:
    written = ops.write(fd, data)
    if written == len(data):  # the usual case: one call wrote it all
        return
    if written <= 0:
        raise OSError(errno.EIO, "write made no progress")
    view = memoryview(data)[written:]
    while view:
        written = ops.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view = view[written:]

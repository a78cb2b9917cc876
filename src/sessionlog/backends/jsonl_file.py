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
* one writer per session: a claim per file per process, keyed by (device, inode), and an
  exclusive cross-process lock (`writer_lock`: a flock, which listings ask about without taking
  it), both by default. `unsafe_no_lock=True` skips the lock (for filesystems without locks, at
  the caller's risk). Before each append one `fstat` checks that the file still ends where this
  writer left it and still has a name; if anything else grew, cut, removed or replaced it, the
  append raises `SessionChangedError` and writes nothing (the store poisons itself).
* a file opened in one process is unusable in a child forked from it: the child's copy of the
  descriptor is closed at fork (so the parent's lock is not kept alive by it) and its claims
  dropped, so the child can open the session afresh; the store refuses the inherited object.
* a `JsonlFile` dropped without `close()` (garbage-collected) releases its claim and descriptor.
* temporary files are `.NAME.PID.RANDOM.creating`: never reused; those left by a killed
  process are removed by the next create or open of the same session.

All file operations go through `FileOps`, a seam for fault injection and power-loss traces; the
default is the `os` functions themselves.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.errors import (
    SessionChangedError,
    SessionExistsError,
    SessionLockedError,
    SessionLogError,
    SessionNotFoundError,
    SessionPathError,
    shown,
)
from . import writer_lock
from .side_files import read_snapshot_file, remove_stale_temporaries, snapshot_path, temporary_path

_MODE = 0o600
_OPEN_FLAGS = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


class FileOps:
    """The file operations of the writer core. Subclass (or set attributes) to inject faults or
    record traces; the defaults call the os module directly."""

    open = staticmethod(os.open)
    fstat = staticmethod(os.fstat)
    write = staticmethod(os.write)
    pread = staticmethod(os.pread)
    fsync = staticmethod(os.fsync)
    fdatasync = staticmethod(os.fdatasync)
    ftruncate = staticmethod(os.ftruncate)
    link = staticmethod(os.link)
    unlink = staticmethod(os.unlink)
    close = staticmethod(os.close)

    def syncfs(self, fd: int) -> None:
        """syncfs(2): every dirty page and the metadata of the whole filesystem holding `fd`,
        durable when it returns (Linux; it reports write-back errors since 5.8). `jsonl-syncfs`
        shares one such call among many session files."""
        _syncfs(fd)

    def fsync_directory(self, directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


DEFAULT_OPS = FileOps()

_writers: set[tuple[int, int]] = set()
_writers_lock = threading.Lock()
_open_files: weakref.WeakSet[JsonlFile] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child shares the parent's open file descriptions: writing through them would
    make two writers of one log. Close the child's copies (the parent keeps its lock) and drop
    the claims, so that the child can open a session afresh."""
    global _writers_lock
    _writers_lock = threading.Lock()
    _writers.clear()
    for file in list(_open_files):
        file._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _release(ops: FileOps, fd: int, key: tuple[int, int]) -> None:
    with _writers_lock:
        _writers.discard(key)
    with contextlib.suppress(OSError):
        ops.close(fd)  # also releases the flock


class JsonlFile:
    """An open session file. `sync=True` makes every append (and the create) power-durable."""

    def __init__(
        self, path: Path, fd: int, key: tuple[int, int], size: int, *, sync: bool, ops: FileOps
    ) -> None:
        self.path = path
        self._fd = fd
        self._key = key
        self._size = size  # where this writer believes the file ends
        self._sync = sync
        self._ops = ops
        # Released when garbage-collected without close(): a later open must not find it held.
        self._finalizer = weakref.finalize(self, _release, ops, fd, key)
        _open_files.add(self)

    # -- opening -----------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        header: bytes,
        *,
        sync: bool,
        unsafe_no_lock: bool = False,
        ops: FileOps = DEFAULT_OPS,
    ) -> JsonlFile:
        path = Path(path)
        directory = path.parent
        if not directory.is_dir():
            raise SessionNotFoundError(
                errno.ENOENT, f"no directory for the session: {directory}", str(directory)
            )
        _check_free(path)
        remove_stale_temporaries(path)
        temp = temporary_path(path, "creating")
        try:
            fd = ops.open(temp, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, _MODE)
        except OSError as error:
            raise _path_error(error, path, "cannot create the session") from error
        linked = False
        try:
            if not unsafe_no_lock:  # held before its name appears: a lister sees it held
                writer_lock.take(fd, path)
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
            return cls._claim(path, fd, sync=sync, unsafe_no_lock=unsafe_no_lock, ops=ops)
        except BaseException as error:
            if not linked:  # a failed header write or sync must not leave the temp file behind
                with contextlib.suppress(OSError):
                    ops.unlink(temp)
            ops.close(fd)
            if isinstance(error, OSError) and not isinstance(error, SessionLogError):
                raise _path_error(error, path, "cannot create the session") from error
            raise

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        sync: bool,
        unsafe_no_lock: bool = False,
        ops: FileOps = DEFAULT_OPS,
    ) -> JsonlFile:
        path = Path(path)
        fd = _open_existing(path, _OPEN_FLAGS, ops)
        try:
            opened = cls._claim(path, fd, sync=sync, unsafe_no_lock=unsafe_no_lock, ops=ops)
        except BaseException:
            ops.close(fd)
            raise
        remove_stale_temporaries(path)
        return opened

    @classmethod
    def _claim(cls, path: Path, fd: int, *, sync: bool, unsafe_no_lock: bool, ops: FileOps) -> JsonlFile:
        info = ops.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SessionPathError(errno.EINVAL, f"not a regular file: {path}", str(path))
        key = (info.st_dev, info.st_ino)
        with _writers_lock:
            if key in _writers:
                raise SessionLockedError(f"{path} is already open for writing in this process")
            _writers.add(key)
        try:
            if not unsafe_no_lock:
                writer_lock.take(fd, path)
            return cls(path, fd, key, ops.fstat(fd).st_size, sync=sync, ops=ops)
        except BaseException:
            with _writers_lock:
                _writers.discard(key)
            raise

    def _forked(self) -> None:
        """In a forked child: this object belongs to the parent. Close the child's descriptor."""
        fd, self._fd = self._fd, -1
        self._finalizer.detach()
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- bytes -------------------------------------------------------------------------------

    def read(self) -> bytes:
        size = self._ops.fstat(self._fd).st_size
        chunks = []
        offset = 0
        while offset < size:
            chunk = self._ops.pread(self._fd, size - offset, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        self._size = offset
        return b"".join(chunks)

    # -- the snapshot seam (`core.snapshot`: the core decides what a snapshot holds and trusts) --

    def read_prefix(self, length: int) -> bytes:
        """The file's first `length` bytes (fewer if it is shorter), leaving `_size` alone."""
        chunks = []
        offset = 0
        while offset < length:
            chunk = os.pread(self._fd, length - offset, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def read_snapshot(self) -> bytes | None:
        """The snapshot beside the file, or None when there is none."""
        return read_snapshot_file(self.path)

    def write_snapshot(self, blob: bytes) -> None:
        """Replace the snapshot beside the file: written whole under a temporary name (0600) and
        renamed over it. Not synced: a snapshot claims nothing (a lost or torn one is ignored)."""
        target = snapshot_path(self.path)
        temporary = temporary_path(target, "snapshotting")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _MODE)
        try:
            try:
                view = memoryview(blob)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise

    def truncate(self, length: int) -> None:
        self._check_size()
        self._ops.ftruncate(self._fd, length)
        self._size = length
        if self._sync:
            self._ops.fsync(self._fd)

    @property
    def device(self) -> int:
        """The filesystem (st_dev) holding the file."""
        return self._key[0]

    def append(self, data: bytes) -> None:
        self._write(data)
        if self._sync:
            self._ops.fdatasync(self._fd)

    def write_unsynced(self, lines: Sequence[bytes]) -> None:
        """`append_many` without the sync, for a caller that syncs the whole filesystem once for
        many files (`jsonl-syncfs`): the lines are durable only after that sync returned."""
        self._write(b"".join(lines))

    def _write(self, data: bytes) -> None:
        size = self._size
        self._check_size()
        self._size = -1  # unknown until the write returned whole (a failed one poisons the store)
        _write_all(self._ops, self._fd, data)
        self._size = size + len(data)

    def append_many(self, lines: Sequence[bytes]) -> None:
        """Several whole transaction lines with one write loop (and one fdatasync in the power
        class): group commit, so that concurrent commits share one system call and one sync."""
        self.append(b"".join(lines))

    def _check_size(self) -> None:
        """The file must end where this writer left it: anything else means another writer."""
        if self._fd < 0:
            raise OSError(
                errno.EBADF, f"{self.path}: the file is closed (or belongs to the parent of a fork)"
            )
        info = self._ops.fstat(self._fd)
        if info.st_size != self._size:
            raise SessionChangedError(
                f"{self.path}: the file is {info.st_size} bytes, this writer left it at {self._size}: "
                "something else wrote to or cut the session; nothing was written"
            )
        if info.st_nlink == 0:  # a commit would land in a file no name leads to
            raise SessionChangedError(
                f"{self.path}: the session file was removed or replaced by another; nothing was written"
            )

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        self._finalizer.detach()
        with _writers_lock:
            _writers.discard(self._key)
        self._ops.close(fd)  # also releases a flock


def open_file(
    path: Path, create: bytes | None, *, sync: bool, ops: FileOps, options: dict[str, Any]
) -> JsonlFile:
    """What the file backends' factories share: open (`create=None`) or atomically create the
    session. Options: `unsafe_no_lock=True` skips the cross-process lock; `lock=True` is
    accepted and changes nothing (the lock is the default)."""
    options = dict(options)
    if options.pop("lock", True) is not True:
        raise TypeError("the writer lock is always taken; unsafe_no_lock=True skips it (unsafe)")
    unsafe_no_lock = options.pop("unsafe_no_lock", False)
    if type(unsafe_no_lock) is not bool:
        raise TypeError(f"unsafe_no_lock must be True or False, not {shown(unsafe_no_lock)}")
    if options:
        raise TypeError(f"unknown backend options: {', '.join(sorted(options))}")
    if create is not None:
        return JsonlFile.create(path, create, sync=sync, unsafe_no_lock=unsafe_no_lock, ops=ops)
    return JsonlFile.open(path, sync=sync, unsafe_no_lock=unsafe_no_lock, ops=ops)


def _path_error(error: OSError, path: Path, what: str) -> SessionPathError:
    """An OSError about a hidden temporary file, as a typed error naming the session."""
    return SessionPathError(error.errno, f"{what} {path}: {error.strerror or error}", str(path))


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


def read_session_file(path: str | os.PathLike[str], *, limit: int | None = None) -> bytes:
    """Every byte of a regular file through a read-only descriptor: no writer claim, no lock.
    A FIFO, a device or a directory is refused without blocking on it or reading it (`O_NONBLOCK`),
    and no more than the size the file had when opened is read; `limit`: refuse a larger file."""
    path = Path(path)
    fd = _open_existing(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, DEFAULT_OPS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SessionPathError(errno.EINVAL, f"not a regular file: {path}", str(path))
        if limit is not None and info.st_size > limit:
            raise SessionPathError(
                errno.EFBIG, f"{path} is {info.st_size:,} bytes, more than the {limit:,} it may be", str(path)
            )
        chunks = []
        offset = 0
        while offset < info.st_size:
            chunk = os.pread(fd, info.st_size - offset, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


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


_libc: Any = None


def _syncfs(fd: int) -> None:
    import ctypes  # loaded by jsonl-syncfs users only

    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(_libc, "syncfs"):
        raise OSError(errno.ENOSYS, "this C library has no syncfs(2)")
    if _libc.syncfs(fd) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"syncfs: {os.strerror(code)}")


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

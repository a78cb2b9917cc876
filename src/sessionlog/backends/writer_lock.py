"""A session file's writer lock: taken by its writer, asked about by readers without taking it.

* The lock is an exclusive `flock` on the file itself, taken without waiting: a second writer (of
  this process through another descriptor, or of another) is refused at once with
  SessionLockedError, and a crashed writer's lock goes with its last descriptor.
* Readers ask whether it is held (`held`): a directory repository's listing tells a crashed
  session (`needs-recovery`) from a live one (`running`). Asking with `flock` itself would take
  the lock for a moment, and a writer opening the session in that moment would be refused
  although no writer exists (#38 item 14: up to 2% of opens beside a listing loop). A read must
  never make a writer fail, so the question is put to the kernel's lock table instead, which
  answers without taking anything: on Linux the writer also holds an open-file-description lock
  (`F_OFD_SETLK`, a write lock over the whole file; it too goes with the last descriptor, and
  conflicts between two descriptors of one process, as the flock does), and `held` asks
  `F_OFD_GETLK` whether a write lock would be granted.

Weighed and set aside: reading `/proc/locks` for the writer's flock (no change to the writer,
but the kernel hides there the locks of processes outside the reader's PID namespace, a writer
in another container sharing the directory, and it names files by device and inode numbers
that overlayfs may report otherwise than `stat`); a writer that retries a lock a prober holds
for a bounded time (a bet on timing: a prober descheduled for longer still refuses it).

Limits, the first two on the safe side (a live writer listed as crashed, whose session a
recovery then fails to open: the flock still refuses it): a writer of a sessionlog before this
one holds no OFD lock, so the probe does not see it; nor one on a filesystem that offers flock
but refuses the OFD lock, nor one that opened while another process held a read lock on the
file (a backup tool's POSIX lock: the OFD write lock is refused, the flock still taken). Where
there are no OFD locks (not Linux) the probe falls back to
`flock`, and a writer opening at its moment can still be refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
from pathlib import Path

from ..core.errors import SessionLockedError, SessionPathError

# struct flock (off_t is 64-bit: CPython is built with large-file support): l_type, l_whence,
# l_start, l_len (0: to the end, however far the file grows), l_pid (0, as OFD requests require).
_FLOCK = struct.Struct("hhqqi")
_WHOLE_FILE = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
_OFD_GETLK: int | None = getattr(fcntl, "F_OFD_GETLK", None)
_OFD_SETLK: int | None = getattr(fcntl, "F_OFD_SETLK", None)


def take(fd: int, path: Path) -> None:
    """Take the writer lock through `fd` (open for writing); SessionLockedError while another
    writer holds it, SessionPathError where the filesystem offers no locks."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SessionLockedError(f"{path} is in use: another process holds its writer lock") from None
    except OSError as error:  # ENOLCK on NFS, SMB, some FUSE filesystems
        raise SessionPathError(
            error.errno,
            f"cannot lock {path}: {error.strerror} (the filesystem offers no locks; "
            "unsafe_no_lock=True opens it anyway, if nothing else ever writes it)",
            str(path),
        ) from None
    if _OFD_SETLK is not None:
        with contextlib.suppress(OSError):  # the flock excludes; without this a listing sees no writer
            fcntl.fcntl(fd, _OFD_SETLK, _WHOLE_FILE)


def held(path: str | os.PathLike[str]) -> bool:
    """Whether a live writer holds the session's lock, asked without taking it (see above)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if _OFD_GETLK is not None:
            try:
                answer = fcntl.fcntl(fd, _OFD_GETLK, _WHOLE_FILE)
            except OSError:
                return False
            # the writer's is a write lock; a read lock someone else holds (a backup tool's
            # POSIX lock) conflicts with the question too, and is no writer
            return bool(_FLOCK.unpack(answer)[0] == fcntl.F_WRLCK)
        try:  # no lock table to ask: take the lock for a moment (a writer opening now is refused)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False
    finally:
        os.close(fd)  # also releases the fallback's lock at once


__all__ = ["held", "take"]

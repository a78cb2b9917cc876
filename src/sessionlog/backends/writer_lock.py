"""A session file's writer lock: taken by its writer, asked about by readers.

* The lock is an exclusive `flock` on the file itself, taken without waiting: a second writer (of
  this process through another descriptor, or of another) is refused at once with
  SessionLockedError, and a crashed writer's lock goes with its last descriptor.
* Readers ask whether it is held (`held`): a directory repository's listing tells a crashed
  session (`needs-recovery`) from a live one (`running`).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..core.errors import SessionLockedError, SessionPathError


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


def held(path: str | os.PathLike[str]) -> bool:
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


__all__ = ["held", "take"]

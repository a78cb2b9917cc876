"""Opening a file that something else may have put in place of the one expected: a side file, a
key, a record. `open_regular` never blocks (a FIFO opened for reading would wait for a writer
before any check could refuse it) and never follows a symlink unless asked; what is no regular
file is no file."""

from __future__ import annotations

import os
import stat

_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK


def open_regular(path: str | os.PathLike[str], *, follow: bool = False) -> tuple[int, os.stat_result] | None:
    """(A read-only descriptor, its stat) when `path` is a regular file (not followed through a
    symlink unless `follow`); None when it is missing, unreadable or anything else. The caller
    closes the descriptor."""
    try:
        fd = os.open(path, _FLAGS if follow else _FLAGS | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        return None
    return fd, info

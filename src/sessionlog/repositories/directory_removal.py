"""Removing names from a directory repository so that they stay removed: the directory synced
after its entries change (a key record replaced, a session unlinked)."""

from __future__ import annotations

import errno
import os
from pathlib import Path


def sync_directory(path: Path) -> None:
    """fsync a directory, so the names removed from it stay removed after a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno != errno.EINVAL:  # a filesystem that cannot sync a directory
            raise
    finally:
        os.close(fd)


__all__ = ["sync_directory"]

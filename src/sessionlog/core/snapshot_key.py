"""The key that signs this user's snapshots (`core.snapshot`; docs/snapshots.md argues the trust
model): a snapshot is trusted only when its MAC was made with this key, so a snapshot that came
with a session folder handed over, restored from a backup or shared with another user (made with
another key, or forged) is ignored, and the log is reduced in full.

The key is 32 random bytes, written in hex to `snapshot.key` in `$SESSIONLOG_STATE_DIR`, else
`$XDG_STATE_HOME/sessionlog`, else `~/.local/state/sessionlog`: a folder 0700 and a file 0600 of
this user, made by the first snapshot this user writes (never by a read: without a key no
snapshot is trusted, and none is made). A key file that another user owns, that others may read
or write, or that does not hold a key is not used (a warning says why): snapshots are then
neither trusted nor written, and every load reduces its log in full, as without snapshots.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
from pathlib import Path

from .regular_files import open_regular

KEY_BYTES = 32
KEY_FILE = "snapshot.key"

_log = logging.getLogger("sessionlog.snapshot")


class SnapshotKeyError(OSError):
    """This user's snapshot key cannot be made or used: no snapshot is written."""


def key_path() -> Path | None:
    """Where this user's snapshot key is kept; None when no absolute folder is named (a relative
    `XDG_STATE_HOME` is ignored, as the XDG spec says; an empty or relative HOME names none)."""
    if folder := os.environ.get("SESSIONLOG_STATE_DIR"):
        return Path(folder).absolute() / KEY_FILE
    state = os.environ.get("XDG_STATE_HOME", "")
    if os.path.isabs(state):
        return Path(state) / "sessionlog" / KEY_FILE
    home = os.environ.get("HOME")
    if home is None:  # the password entry's
        try:
            home = str(Path.home())
        except RuntimeError:
            return None
    if not os.path.isabs(home):  # expanduser would read an empty HOME as /
        return None
    return Path(home) / ".local" / "state" / "sessionlog" / KEY_FILE


def read_key() -> bytes | None:
    """This user's key, or None when there is none (or it cannot be used: warned once)."""
    path = key_path()
    if path is None:
        return None
    try:
        return _read(path)
    except FileNotFoundError:
        return None
    except SnapshotKeyError as error:
        warn_once(str(error))
        return None
    except OSError as error:
        warn_once(
            f"{path}: the snapshot key cannot be read ({error.strerror or error}): snapshots are not used"
        )
        return None


_warned: set[str] = set()


def warn_once(message: str) -> None:
    """A snapshot key's problem, logged once a process (every open and close would repeat it)."""
    if message not in _warned:
        _warned.add(message)
        _log.warning("%s", message)


def make_key() -> bytes:
    """This user's key, made now if there is none (two processes making it at once agree on
    one: it is linked into place, never replaced). SnapshotKeyError when it cannot be."""
    path = key_path()
    if path is None:
        raise SnapshotKeyError(
            "no folder for the snapshot key: HOME is empty or relative (set SESSIONLOG_STATE_DIR)"
        )
    with contextlib.suppress(FileNotFoundError):
        return _read(path)
    try:
        if path.parent.exists() and not path.parent.is_dir():
            raise SnapshotKeyError(
                f"{path.parent}: the snapshot key's folder is not a folder: snapshots are not used"
            )
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = path.parent / f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(6)}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, secrets.token_hex(KEY_BYTES).encode() + b"\n")
            os.fsync(fd)  # a key torn by a power loss would disable snapshots until removed
        finally:
            os.close(fd)
        try:
            os.link(temporary, path)  # never over another process's key
        except FileExistsError:
            pass
        finally:
            os.unlink(temporary)
        return _read(path)
    except SnapshotKeyError:
        raise
    except OSError as error:
        problem = error.strerror or error
        raise SnapshotKeyError(f"{path}: the snapshot key cannot be made ({problem})") from error


def _read(path: Path) -> bytes:
    if not os.path.lexists(path):
        raise FileNotFoundError(path)
    opened = open_regular(path, follow=True)  # never waits on a FIFO
    if opened is None:
        raise SnapshotKeyError(
            f"{path}: the snapshot key is not a readable regular file: snapshots are not used"
        )
    fd, status = opened
    try:
        if status.st_uid != os.geteuid() or status.st_mode & 0o077:
            raise SnapshotKeyError(
                f"{path}: the snapshot key must be this user's and 0600 (it is uid {status.st_uid}, "
                f"mode {stat.S_IMODE(status.st_mode):04o}): snapshots are not used"
            )
        text = os.read(fd, 4 * KEY_BYTES).strip()
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise SnapshotKeyError(
            f"{path}: the snapshot key file does not hold {KEY_BYTES} bytes in hex (remove it: a new "
            "one is made by the next snapshot written): snapshots are not used"
        )
    return key

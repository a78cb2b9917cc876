"""Caller keys: a framework's own name for a session (`user-42`, a thread id), in every
repository kind.

    store = repo.create(provider="openai", model="m", key="user-42")   # open or create
    with repo.session(key="user-42", tools=tools, model="m") as s: ...  # the same, as the loop
    store = repo.replace("user-42", provider="openai", model="m")      # a new current session
    repo.key_sessions("user-42")   # KeySessions(key, current, replaced)
    repo.list(key="user-42")       # its sessions, each row with `key` and `replaced`

A key names one *current* session, plus the sessions it *replaced* (oldest first): `replace`
makes a new session current for the key (what an adapter's `clear_session` does) and keeps the
old one, listed with `replaced=True`, readable, openable by its id. A key is kept apart from
session ids: `open(session_id)` never looks a key up, `open(key=...)` never reads its text as an
id (a key may look like a UUID).

* `create(key=K, ...)` and `session(key=K, ...)` open the key's current session for writing, or
  make one when the key has none (its header and labels then; when it exists they are not
  applied). Race-free between processes: two processes calling it at once agree on the session,
  one holds it, the other gets `KeyHeldError` naming the session (one writer per session, as
  always). `open(key=K)` opens the current session only: `KeyNotFoundError` when there is none.
* Deleting a key's current session leaves the key without one; its next `create(key=K)` makes a
  new current session (the replaced ones stay replaced).
* Kept durably in every kind: SQL repositories in the `session_keys` table (a unique index on
  the current session of each key), a directory in key records (`directory_keys`), never only in
  its index (a cache).

Keys are checked at the door (`checked_key`): a str, non-empty, at most `MAX_KEY` characters,
no NUL, storable as UTF-8 and NFC-stable (the same text in NFC: two spellings of one name would
otherwise be two keys). Messages name a key whole when it is short and by its length and first
characters when it is long (`key_shown`: an API key passed as a key is not echoed).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from ..core.errors import SessionLockedError, SessionLogError, SessionNotFoundError, short_shown, shown

MAX_KEY = 256
"""The longest key, in characters."""


class InvalidKeyError(SessionLogError, ValueError):
    """A caller key that cannot name a session (empty, too long, a NUL, not NFC, not UTF-8).
    `key` is the key refused."""

    key: str


class KeyNotFoundError(SessionNotFoundError):
    """The key names no current session (`open(key=...)`: `create(key=...)` makes one). `key`
    says which."""

    key: str


class KeyHeldError(SessionLockedError):
    """The key's current session is held by another writer. `key` and `session_id` say which:
    two processes racing to open or create one key agree on `session_id`."""

    def __init__(self, key: str, session_id: str, detail: str) -> None:
        super().__init__(f"key {key_shown(key)} names session {session_id}, held by another writer: {detail}")
        self.key = key
        self.session_id = session_id


@dataclass(frozen=True)
class KeySessions:
    """The sessions of one key: `current` (None once it was deleted) and those it `replaced`,
    oldest first (those deleted are not listed)."""

    key: str
    current: str | None
    replaced: tuple[str, ...] = ()


SHOWN_WHOLE = 16
"""The longest key a message shows whole (`key_shown`)."""


def key_shown(key: str) -> str:
    """A key for a message: whole (escaped) when it is at most `SHOWN_WHOLE` characters, as a
    name is (`user-42`, `thread_abc123`); a longer one as `shown` shows a value, its length and
    at most its first 8 characters (a UUID's first group says which one; an API key passed as a
    key by mistake keeps its random part hidden). The key itself is the error's `key`."""
    return short_shown(key, "key", SHOWN_WHOLE)


def escaped(key: str) -> str:
    """A key for a listing (`sessionlog ls`): quoted, every non-ASCII or control character
    escaped (a NUL, a lone surrogate, a combining mark are seen as what they are), at most about
    100 characters. A message names it by `key_shown` (which never shows a long one whole)."""
    if len(key) <= 80:
        return ascii(key)
    return f"{key[:60]!a}... ({len(key):,} characters)"


def checked_key(key: object) -> str:
    """`key` if it can name a session; TypeError for a non-str (shown as `shown` shows a wrong
    value), InvalidKeyError for a str that cannot, naming why and the key (`key_shown`)."""
    if type(key) is not str:
        raise TypeError(f"a key is a str (the caller's name of a session), not {shown(key)}")
    problem = key_problem(key)
    if problem is not None:
        error = InvalidKeyError(
            f"key {key_shown(key)} cannot name a session: {problem} (a key is a non-empty str of at most "
            f"{MAX_KEY} characters, no NUL, in NFC)"
        )
        error.key = key
        raise error
    return key


def key_problem(key: str) -> str | None:
    """Why the str `key` cannot name a session, or None when it can."""
    if not key:
        return "it is empty"
    if len(key) > MAX_KEY:
        return f"it has {len(key):,} characters, more than {MAX_KEY}"
    if "\x00" in key:
        return "it holds a NUL"
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return "UTF-8 cannot store it (a lone surrogate)"
    if unicodedata.normalize("NFC", key) != key:
        return "it is not in NFC (two spellings of one name would be two keys)"
    return None


def held_as_key(key: str, session_id: str, error: SessionLockedError) -> KeyHeldError:
    """The SessionLockedError of opening a key's session, as the key's."""
    return KeyHeldError(key, session_id, str(error))


__all__ = [
    "MAX_KEY",
    "InvalidKeyError",
    "KeyHeldError",
    "KeyNotFoundError",
    "KeySessions",
    "checked_key",
    "escaped",
    "key_problem",
]

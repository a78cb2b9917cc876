"""What every repository shares: the runtime's session (open or new), forking a session's bytes,
and checking labels."""

from __future__ import annotations

import errno
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import orjson

from ..core.commit import encode_header
from ..core.errors import SessionLockedError, shown
from ..core.framing import lines
from ..core.ids import new_id
from ..core.loading import reduce_bytes
from .keys import KeyNotFoundError, KeySessions, checked_key, held_as_key, key_shown

if TYPE_CHECKING:
    from ..core.async_store import AsyncSessionStore
    from ..core.store import SessionStore
    from ..runtime import Session
    from ..runtime_async import AsyncSession
    from ..tools import Tool, Tools


class RepositoryBase:
    """Mixed into the sync repositories (`create` and `open` are theirs)."""

    def session(
        self,
        session_id: str | None = None,
        *,
        tools: Tools | Iterable[Tool],
        model: str,
        provider: str = "sessionlog",
        labels: Iterable[str] = (),
        key: str | None = None,
        **options: Any,
    ) -> Session:
        """The agent loop (`sessionlog.Session`) on session `session_id`, opened for writing, or
        on a new session when it is None (`provider`, `labels` for it); `key=`: on the key's
        current session, made when it has none (`create(key=...)`). `options` go to `Session`."""
        from ..runtime import Session

        if session_id is not None and key is not None:
            raise TypeError("session() takes a session_id or a key=, not both")
        if session_id is None:
            extra = {} if key is None else {"key": key}
            store = self.create(provider=provider, model=model, labels=labels, **extra)  # type: ignore[attr-defined]
        else:
            store = self.open(session_id)  # type: ignore[attr-defined]
        return Session(store, tools=tools, model=model, **options)

    # -- caller keys (`keys`): a kind brings `bind_key`, `current_of` and `key_sessions` ------------

    def replace(self, key: str, **header: Any) -> SessionStore:
        """A new session, current for `key` from now on, opened for writing (`provider`,
        `model`, `cwd`, `environment_identity`, `labels` for it); the key's session before it is
        kept, listed as replaced (`key_sessions`). What an adapter's `clear_session` does."""
        key = checked_key(key)
        checked_create(header, call="replace")
        return self.open_key(key, self.bind_key(key, replace=True, **header))  # type: ignore[attr-defined]

    def open_key(self, key: str, session_id: str, **options: Any) -> SessionStore:
        """Open `session_id`, the session of `key`: KeyHeldError (naming it) while held."""
        try:
            store: SessionStore = self.open(session_id, **options)  # type: ignore[attr-defined]
        except SessionLockedError as error:
            raise held_as_key(key, session_id, error) from None
        return store

    def open_keyed(self, session_id: str | None, key: str | None, **options: Any) -> SessionStore:
        """`open(key=...)`: the key's current session (KeyNotFoundError when it has none)."""
        if session_id is not None or key is None:
            raise TypeError("open() takes a session_id or a key=, one of them")
        key = checked_key(key)
        found = self.current_of(key)  # type: ignore[attr-defined]
        if found is None:
            raise no_current(key, str(getattr(self, "directory", None) or getattr(self, "path", "")))
        return self.open_key(key, found, **options)


class AsyncRepositoryBase:
    """The same for the async repositories."""

    async def session(
        self,
        session_id: str | None = None,
        *,
        tools: Tools | Iterable[Tool],
        model: str,
        provider: str = "sessionlog",
        labels: Iterable[str] = (),
        key: str | None = None,
        **options: Any,
    ) -> AsyncSession:
        from ..runtime_async import AsyncSession

        if session_id is not None and key is not None:
            raise TypeError("session() takes a session_id or a key=, not both")
        if session_id is None:
            extra = {} if key is None else {"key": key}
            store = await self.create(provider=provider, model=model, labels=labels, **extra)  # type: ignore[attr-defined]
        else:
            store = await self.open(session_id)  # type: ignore[attr-defined]
        return AsyncSession(store, tools=tools, model=model, **options)

    async def replace(self, key: str, **header: Any) -> AsyncSessionStore:
        """As the sync `replace`, awaited."""
        key = checked_key(key)
        checked_create(header, call="replace")
        session_id = await self._call(self.sync.bind_key, key, replace=True, **header)  # type: ignore[attr-defined]
        return await self.open_key(key, session_id)

    async def open_key(self, key: str, session_id: str, **options: Any) -> AsyncSessionStore:
        try:
            store: AsyncSessionStore = await self.open(session_id, **options)  # type: ignore[attr-defined]
        except SessionLockedError as error:
            raise held_as_key(key, session_id, error) from None
        return store

    async def open_keyed(self, session_id: str | None, key: str | None, **options: Any) -> AsyncSessionStore:
        if session_id is not None or key is None:
            raise TypeError("open() takes a session_id or a key=, one of them")
        key = checked_key(key)
        found = await self._call(self.sync.current_of, key)  # type: ignore[attr-defined]
        if found is None:
            sync = self.sync  # type: ignore[attr-defined]
            raise no_current(key, str(getattr(sync, "directory", None) or getattr(sync, "path", "")))
        return await self.open_key(key, found, **options)

    async def key_sessions(self, key: str) -> KeySessions | None:
        return await self._call(self.sync.key_sessions, key)  # type: ignore[attr-defined, no-any-return]


def no_current(key: str, where: str) -> KeyNotFoundError:
    error = KeyNotFoundError(
        errno.ENOENT,
        f"key {key_shown(key)} names no current session in {where} (create(key=...) makes one)",
        where,
    )
    error.key = key
    return error


def fork_bytes(data: bytes, session_id: str, at_seq: int) -> tuple[str, bytes]:
    """A new session's id and bytes: the committed `data` of `session_id` through seq `at_seq`
    (which must end a transaction) under a new header. The facts keep their ids; every line is
    kept byte for byte (a lone CR inside a line is JSON whitespace, never a line break)."""
    if type(at_seq) is not int:  # a bool is an int to Python: fork(id, False) would fork at 0
        raise TypeError(f"at_seq is an integer (the seq that ends a transaction), not {shown(at_seq)}")
    header_end = data.index(b"\n") + 1
    end = header_end
    for _, offset, raw in lines(data, len(data)):
        if offset == 0:
            continue  # the header
        value = orjson.loads(raw)
        if (value[-1] if type(value) is list else value)["seq"] > at_seq:
            break
        end = offset + len(raw) + 1
    if reduce_bytes(data[:end]).last_seq != at_seq:
        raise ValueError(f"seq {at_seq} does not end a transaction of {session_id}")
    header = orjson.loads(data[: header_end - 1])
    forked = new_id()
    new_header = encode_header(
        session_id=forked,
        cwd=header["cwd"],
        provider=header["provider"],
        model=header["model"],
        environment_identity=header["environmentIdentity"],
    )
    return forked, new_header + data[header_end:end]


def checked_data(data: object) -> bytes:
    """A session's bytes to import: bytes (or a bytearray, a memoryview, taken as bytes), never
    a str. One check for every repository kind, so that each refuses the same way."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"a session to import is bytes (its JSONL file), not {shown(data)}")
    return bytes(data)


CREATE_KEYWORDS = ("provider", "model", "cwd", "environment_identity", "labels")


def checked_create(
    header: dict[str, Any], allowed: Iterable[str] = CREATE_KEYWORDS, call: str = "create"
) -> None:
    """The keywords of a repository's `create`: TypeError for any other (a `session_id=` is
    never the caller's: the repository makes it), naming the allowed ones, or for a missing
    `provider` or `model`, the same in every kind; ValueError for a header string that cannot
    be stored as UTF-8 (a lone surrogate)."""
    allowed = tuple(allowed)
    unknown = sorted(key for key in header if key not in allowed)
    if unknown:
        named = ", ".join(keyword_shown(key) for key in unknown)
        raise TypeError(f"{call}() takes the keywords {', '.join(allowed)}; not {named}")
    missing = [key for key in ("provider", "model") if key not in header]
    if missing:
        raise TypeError(f"{call}() needs the keywords provider and model; missing {' and '.join(missing)}")
    for key in ("provider", "model", "cwd", "environment_identity"):
        value = header.get(key)
        if isinstance(value, str) and not _encodable(value):
            raise ValueError(f"{key} is text that UTF-8 can store (no lone surrogate), not {shown(value)}")


def keyword_shown(key: str) -> str:
    """A keyword the caller wrote in code, shown as it is when it is a short identifier."""
    return key if key.isascii() and key.isidentifier() and len(key) <= 40 else shown(key)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def checked_labels(labels: Iterable[str], what: str = "labels") -> list[str]:
    """A caller's labels, sorted and unique. TypeError unless `labels` is an iterable of strings
    (a str or bytes is refused whole: iterating it would make a label of each character),
    ValueError for an empty label, one longer than `MAX_LABEL` characters, or one UTF-8 cannot
    store (a lone surrogate)."""
    if isinstance(labels, str | bytes | bytearray | memoryview) or not isinstance(labels, Iterable):
        raise TypeError(f"{what} are an iterable of strings (a list, a tuple, a set), not {shown(labels)}")
    found = []
    for label in labels:
        if type(label) is not str:
            raise TypeError(f"a label is a string, not {shown(label)} (in {what})")
        if not label or len(label) > MAX_LABEL:
            raise ValueError(
                f"a label is a non-empty string of at most {MAX_LABEL} characters, not {shown(label)}"
            )
        if not _encodable(label):  # stored, it would break every later listing of the repository
            raise ValueError(f"a label is text that UTF-8 can store (no lone surrogate), not {shown(label)}")
        found.append(label)
    return sorted(set(found))


MAX_LABEL = 200

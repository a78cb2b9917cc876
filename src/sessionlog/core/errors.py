"""The error hierarchy. Every error sessionlog raises on purpose is a `SessionLogError`."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

# The reducer's error codes, exactly as in the contract's expected-state schema.
CODES = (
    "INVALID_UTF8",
    "MISSING_HEADER",
    "INVALID_HEADER",
    "UNSUPPORTED_VERSION",
    "BLANK_LINE",
    "CRLF_NOT_ALLOWED",
    "MALFORMED_JSON",
    "EMPTY_TRANSACTION",
    "INVALID_FACT",
    "SEQ_MISMATCH",
    "DUPLICATE_ID",
    "INVALID_REFERENCE",
    "INVALID_TRANSITION",
    "INVALID_TRANSCRIPT",
)


def shown(value: object) -> str:
    """A value for an error message, bounded and never a secret: a string shows only its kind,
    its length and a prefix of at most `SHOWN_PREFIX` characters and at most a quarter of it;
    a short scalar its text; anything else only its kind. A wrong field may hold a secret (an
    API key pasted into the wrong argument) or a tool's whole output, and a message is copied
    into logs, tracebacks, `SessionInfo.error` and the directory index.

    Why that prefix is no secret: what it shows of a key is its public format marker, never its
    secret part. API keys begin with a marker of their issuer (`sk-proj-`, `sk-ant-`, `ghp_`,
    `github_pat_`, `xoxb-`, `AKIA`, `AIza`), then 20 to 100 random characters; 8 characters
    cover the marker (or its first 8) and leave every random character hidden: of a 40-character
    key, 32 stay unknown. A quarter bounds what a short secret loses: a password of 8 shows 2
    characters and keeps 6 (of 95 printable characters each, 95**6 ~ 7e11 candidates left), one
    of 4 shows 1, of 3 or fewer nothing. The length is shown because it tells what the value
    was (a 40-character key, a 2 MB tool output) and costs a random secret nothing to say."""
    if isinstance(value, str):
        size = len(value)
        text = f"a string of {size:,} character{'' if size == 1 else 's'}"
        prefix = value[: min(SHOWN_PREFIX, size // 4)]
        return f"{text} starting {prefix!r}" if prefix else text
    if value is None or isinstance(value, bool | float):
        return repr(value)
    if isinstance(value, int):
        text = str(value) if -(10**20) < value < 10**20 else f"an integer of {len(str(abs(value)))} digits"
        return text
    if isinstance(value, bytes | bytearray):
        return f"{len(value):,} bytes"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return f"a {type(value).__name__}"


SHOWN_PREFIX = 8  # characters, at most, of a string in a message (see `shown`)

_TYPE_NAME = type.__dict__["__name__"]
_TYPE_QUALNAME = type.__dict__["__qualname__"]
_TYPE_DICT = type.__dict__["__dict__"]


def type_named(value: object, qualified: bool = False) -> str:
    """The name of `value`'s type (its qualified name and module, `qualified`), read from the
    type object itself, so that no code of the value's runs: a metaclass may override
    `__name__`, and a message about a value a tool returned must never raise."""
    kind = type(value)
    try:
        if not qualified:
            return str.__str__(_TYPE_NAME.__get__(kind))
        name = str.__str__(_TYPE_QUALNAME.__get__(kind))
        module = _TYPE_DICT.__get__(kind).get("__module__")  # the class body's, as written
        return name if type(module) is not str or module == "builtins" else f"{module}.{name}"
    except Exception:
        return "an unnamed type"


def short_shown(text: str, noun: str, whole: int) -> str:
    """A caller's name or key for a message: whole (escaped) when it is at most `whole`
    characters, as a name is (`deploy`, `user-42`); a longer one as `shown` shows a value, its
    length and at most its first `SHOWN_PREFIX` characters (`a NOUN of 40 characters starting
    'sk_live_'`), so that a secret passed as a name by mistake keeps its random part hidden."""
    if len(text) <= whole:
        return ascii(text)
    prefix = text[: min(SHOWN_PREFIX, len(text) // 4)]
    return f"a {noun} of {len(text):,} characters starting {prefix!a}"


def name_shown(name: str) -> str:
    """A name written in code (a tool's, a kind's) for a message: as written, quoted, every
    non-ASCII or control character escaped, at most about 100 characters, so that the message
    says which one. Never for a value, which may be a secret: that is `shown`."""
    if len(name) <= 80:
        return ascii(name)
    return f"{name[:60]!a}... ({len(name):,} characters)"


class SessionLogError(Exception):
    """Base of every error sessionlog raises on purpose."""


class ContractError(SessionLogError):
    """A contract rule was broken. `code`, `line` and `seq` match the contract's error form."""

    def __init__(self, code: str, line: int, seq: int | None = None, detail: str = "") -> None:
        self.code = code
        self.line = line
        self.seq = seq
        self.detail = detail
        super().__init__(self._message())

    def _where(self) -> str:
        where = f"line {self.line}"
        if self.seq is not None:
            where += f", seq {self.seq}"
        return where

    def _message(self) -> str:
        text = f"{self.code} at {self._where()}"
        return f"{text}: {self.detail}" if self.detail else text

    def to_json(self) -> dict[str, object]:
        """The contract's error object: `{code, line}` plus `seq` when it is known."""
        error: dict[str, object] = {"code": self.code, "line": self.line}
        if self.seq is not None:
            error["seq"] = self.seq
        return error


class CorruptionError(ContractError, ValueError):
    """Stored bytes break the contract. Carries where: path, line, byte offset of the line, seq."""

    def __init__(
        self,
        code: str,
        line: int,
        seq: int | None = None,
        detail: str = "",
        *,
        offset: int | None = None,
        path: str | Path | None = None,
    ) -> None:
        self.offset = offset
        self.path = None if path is None else str(path)
        super().__init__(code, line, seq, detail)

    def _message(self) -> str:
        where = f"{self.path or '<bytes>'}: line {self.line}"
        if self.offset is not None:
            where += f" (byte offset {self.offset})"
        if self.seq is not None:
            where += f", seq {self.seq}"
        text = f"{self.code} at {where}"
        return f"{text}: {self.detail}" if self.detail else text

    def located(self, path: str | Path) -> CorruptionError:
        """The same error, naming the file it came from."""
        located = CorruptionError(self.code, self.line, self.seq, self.detail, offset=self.offset, path=path)
        located.__cause__ = self.__cause__
        return located


class ValidationError(ContractError, ValueError):
    """A commit was rejected: nothing was written and the store is unchanged."""

    def _message(self) -> str:
        seq = f"seq {self.seq}" if self.seq is not None else "the transaction"
        text = f"commit rejected, {self.code} at {seq}"
        return f"{text}: {self.detail}" if self.detail else text


class ConfigurationError(SessionLogError, ValueError):
    """The current configuration given to the planner is malformed; `key` names the bad key
    (`tools[2].definitionDigest`), `problem` says what is wrong with it."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(f"current configuration: {key} {problem}")


class SessionLockedError(SessionLogError):
    """Another writer holds the session."""


class SessionChangedError(SessionLogError):
    """The session's bytes changed under an open writer: something else wrote to or cut it."""


class StoreClosedError(SessionLogError):
    """The store was closed."""


class StoreForkedError(StoreClosedError):
    """The store was opened in another process (this one is a fork of it): open the session
    afresh here."""


class ReentrantCallError(SessionLogError, RuntimeError):
    """A store method was called from inside another call of the same store (a fact generator
    calling `load()`, say): refused instead of deadlocking."""


class StorePoisonedError(SessionLogError):
    """A write or sync failed: the store accepts nothing until it is reopened."""


class CommitOutcomeUnknownError(SessionLogError):
    """The connection to the database broke during COMMIT: the commit may or may not have
    landed. Nothing retries it (that could store it twice); reopening the session reads back
    whether its line is there, byte for byte."""


class DurabilityUnavailableError(SessionLogError):
    """The server cannot give the durability class asked for (fsync off, no synchronous standby
    configured or connected, `synchronous_commit` too weak): refused when the repository opens."""


class UnknownBackendError(SessionLogError, LookupError):
    """No backend by that name is registered."""

    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.name = name
        self.known = sorted(known)
        super().__init__(f"unknown backend {shown(name)}; registered: {', '.join(self.known) or 'none'}")


class _Worded(OSError):
    """An OSError whose str is its message alone: never `[Errno 0] ...: 'path'` (errno and the
    path stay as attributes)."""

    def __str__(self) -> str:
        return self.strerror if isinstance(self.strerror, str) else super().__str__()


class SessionExistsError(SessionLogError, _Worded, FileExistsError):
    """A session already exists at that path."""


class SessionNotFoundError(SessionLogError, _Worded, FileNotFoundError):
    """No session exists at that path."""


class SessionPathError(SessionLogError, _Worded):
    """The path cannot hold a session: a symlink, a directory, not a regular file, or unreadable."""


class RepositoryNotFoundError(SessionLogError, _Worded, FileNotFoundError):
    """No repository exists at that location, and the caller asked for an existing one
    (`create=False`, as every read-only command does): nothing was created."""


class RepositoryError(SessionLogError):
    """The database or filesystem under a repository failed an operation (a dropped connection,
    a full disk, a damaged file). `operation` names what was asked (`list`, `open`, ...),
    `session_id` the session when there is one, `location` the repository without its password.
    The driver's own error is the `__cause__`; the message never holds credentials."""

    def __init__(self, operation: str, location: str, problem: str, session_id: str | None = None) -> None:
        self.operation = operation
        self.location = location
        self.problem = problem
        self.session_id = session_id
        where = f" of session {session_id}" if session_id else ""
        super().__init__(f"{operation}{where} in {location} failed: {problem}")

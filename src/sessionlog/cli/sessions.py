"""Reading a session for the command line: read-only, as a store of its backend reads it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import opening
from ..backends.jsonl_file import read_session_file
from ..core.errors import (
    ConfigurationError,
    CorruptionError,
    RepositoryNotFoundError,
    SessionLogError,
    SessionPathError,
)
from ..core.framing import lines, parse_line
from ..core.loading import reduce_bytes
from ..core.planner import check_current
from ..core.reducer import is_uuid7
from ..core.state import SessionState
from ..core.store import BackendInfo, SessionStore
from ..plugins.registry import Registry, default_registry
from ..repositories.locations import masked
from .output import PROG, Progress, status

CURRENT_LIMIT = 16 << 20  # bytes: a current configuration is a few kilobytes


class UsageError(Exception):
    """Bad input from the command line (exit 2)."""


class Mismatch(SessionLogError):
    """A converted session does not reduce to the state of its source (exit 1)."""


def read_session(path: str, backend: str, registry: Registry) -> tuple[bytes, dict[str, Any]]:
    """The stored bytes of a session, read-only, and how its store reads them (`BackendInfo.
    nul_rule`): the file itself for the built-in file backends and a directory repository's
    sessions, otherwise the backend's own read path (opened, read, closed; never truncated),
    without the writer's hold where the backend can (`BackendInfo.opens_read_only`)."""
    if in_repository(path, registry.info(backend)):
        from ..repositories.directory import DirectoryRepository

        location, session_id = path.rsplit("#", 1)
        with open_repository(location, registry) as repository:
            if isinstance(repository, DirectoryRepository):  # as stored, a torn tail included
                named = registry.info(backend)  # the backend that wrote them, when it is named
                rule = (
                    named.nul_rule() if named.plain_file and named.durability == "power" else repository.rule
                )
                return read_session_file(repository.path(session_id)), rule
            return bytes(repository.export(session_id)), repository.info.nul_rule()
    return opening.read_stored(path, backend, registry), registry.info(backend).nul_rule()


SQLITE_MAGIC = b"SQLite format 3\x00"


def backend_of(path: str) -> str:
    """The backend a session at `path` is read with when none was named: `sqlite` for a SQLite
    database (its first 16 bytes say so; `DB#SESSION_ID` names one of its sessions), `jsonl`
    for anything else (a file's lines read the same in every JSONL class; a location with `://`
    is a repository's). Only a regular file is looked into (a FIFO would block the reader)."""
    location, separator, session_id = path.rpartition("#")
    if not (separator and location and is_uuid7(session_id)):
        location = path
    if "://" in location:
        return "jsonl"
    try:
        fd = os.open(location, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return "jsonl"  # the backend's own open says what is wrong with it
    try:
        return "sqlite" if stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, 16) == SQLITE_MAGIC else "jsonl"
    finally:
        os.close(fd)


def stored_by(path: str, backend: str, registry: Registry) -> str:
    """What stores the session at `path`, as the CLI names it: a repository's kind for
    `LOCATION#SESSION_ID` in a repository, else the backend."""
    if not in_repository(path, registry.info(backend)):
        return backend
    location = path.rpartition("#")[0]
    scheme = location.partition("://")[0] if "://" in location else "file"
    kind = {"sqlite": "SQLite", "postgresql": "PostgreSQL", "postgres": "PostgreSQL", "file": "directory"}
    return f"{kind.get(scheme, scheme)} repository"


def check_not_directory(path: str) -> None:
    """A directory named where a session is expected: say how to name one of its sessions."""
    if "#" not in path and "://" not in path and os.path.isdir(path):
        raise UsageError(
            f"{path} is a directory: a directory repository? name one of its sessions as "
            f"{path}#SESSION_ID ({PROG} ls {path} lists them)"
        )


def in_repository(path: str, backend: BackendInfo | None = None) -> bool:
    """`LOCATION#SESSION_ID` names a session in a repository (a directory or `sqlite:///...`);
    for a backend whose path names a database (`--backend sqlite`), `DB#SESSION_ID` is that
    backend's own path of one session, not a repository's."""
    location, separator, session_id = path.rpartition("#")
    if backend is not None and backend.single_file and "://" not in location:
        return False
    return bool(separator and location and is_uuid7(session_id))


@contextlib.contextmanager
def open_for_writing(name: str, backend: str, registry: Registry) -> Iterator[SessionStore]:
    """A session for writing: a file by (sync) backend, or `LOCATION#SESSION_ID` in a repository."""
    if not in_repository(name, registry.info(backend)):
        with opening.open(name, backend, registry=registry) as store:
            yield store
        return
    location, session_id = name.rsplit("#", 1)
    with open_repository(location, registry) as repository, repository.open(session_id) as store:
        yield store


def check_session_name(name: str) -> None:
    """A repository's URL where a session is wanted (`verify sqlite:////var/agent.db`): say how
    to name one of its sessions, rather than look for a file of that name; a SQLite database
    that does not exist is said not to exist."""
    if "://" in name and not in_repository(name):
        tail = name.rpartition("#")[2]
        if "#" in name and ("@" in tail or "/" in tail):  # a `#` inside the URL itself (a password?)
            raise UsageError(
                "a '#' inside a location must be written %23 (in a password too); "
                "a session is named after the location as LOCATION#SESSION_ID"
            )
        location = name.rpartition("#")[0] or name  # `DB#` or `DB#not-an-id`: DB is meant
        if not os.path.lexists(sqlite_file(location) or "."):
            raise UsageError(f"{location} does not exist (nothing was created)")
        raise UsageError(
            f"{name} is a repository: name one of its sessions as {location}#SESSION_ID "
            f"({PROG} ls {location} lists them)"
        )


def sqlite_file(location: str) -> str | None:
    """The file a `sqlite:///relative.db` or `sqlite:////absolute.db` URL names, or None."""
    scheme, _, rest = location.partition("://")
    path = rest.partition("?")[0]
    if scheme != "sqlite" or not path.startswith("/") or path == "/":
        return None
    return path[1:]


# A libpq keyword DSN (`host=db password=...`) is no location: as a directory name it would be
# made (by import) or reported missing under that name, password and all.
_KEYWORD_DSN = re.compile(r"^\s*(host|hostaddr|port|dbname|user|password|service|sslmode)\s*=", re.IGNORECASE)


def open_repository(location: str, registry: Registry, *, create: bool = False) -> Any:
    """The repository at `location`, as given on the command line. `create=False` (every command
    but import and convert, which write into it): a missing repository is a usage error and
    nothing is created (no directory, index or database file)."""
    from ..repositories import repository

    if not location.strip():  # not the current directory
        raise UsageError("the location is empty (a directory, sqlite:///PATH or postgresql://...)")
    if "://" not in location and _KEYWORD_DSN.match(location):
        raise UsageError(
            f"{location}: not a repository location (a directory, sqlite:///PATH or "
            "postgresql://USER@HOST/DATABASE; a keyword DSN is not one)"
        )
    if location.startswith("sqlite://") and sqlite_file(location) is None:  # as typed, masked
        raise UsageError(
            "a SQLite URL is sqlite:///relative/path.db or sqlite:////absolute/path.db, "
            f"not {masked(location)}"
        )
    if "://" not in location and backend_of(location) == "sqlite":  # `ls sessions.db`: what it is
        location = "sqlite:///" + urllib.parse.quote(location)  # ./x.db, or /abs (four slashes)
    if sqlite_file(location) is not None and "#" in location:  # `ls sqlite:///r.db#x`
        raise UsageError(
            f"{masked(location)}: a repository is named without '#...' (a '#' in a file's name is %23)"
        )
    try:
        return repository(location, registry=registry, create=create)
    except RepositoryNotFoundError:
        file = sqlite_file(location)
        looked = "" if file is None else f"no file {urllib.parse.unquote(file)}{_slashes(location)}; "
        raise UsageError(f"{masked(location)}: no such repository ({looked}nothing was created)") from None
    except ValueError as error:
        raise UsageError(str(error)) from None


def _slashes(location: str) -> str:
    """The hint a SQLite URL with three slashes needs: it is relative to the working directory."""
    if location.startswith("sqlite:////"):
        return ""
    return f" relative to {Path.cwd()}; an absolute path takes four slashes: sqlite:////abs/path.db"


def reduce_session(
    path: str, data: bytes, mode: str, power: dict[str, Any], registry: Registry | None = None
) -> SessionState:
    """As the store reads it: in the power class a hole-shaped NUL run in the last write is torn,
    not corrupt. A log refused with the rule it was read with, that the rule of another power-class
    file backend would open, is refused with a hint naming that backend."""
    with status(mode, f"reducing {path}", len(data)):
        try:
            return reduce_bytes(data, path=path, **power)
        except CorruptionError as error:
            hint = _power_class_hint(data, power, registry)
            if hint is None:
                raise
            raise CorruptionError(
                error.code,
                error.line,
                error.seq,
                f"{error.detail}; NUL bytes there are what a power loss leaves in a power-class log: {hint}",
                offset=error.offset,
                path=error.path,
            ) from None


def _power_class_hint(data: bytes, used: dict[str, Any], registry: Registry | None) -> str | None:
    """Which file backends' rule opens `data` (`BackendInfo.nul_rule`), when the rule `used` did
    not: the narrowest such rule, and every backend whose rule is as wide or wider (a wider
    window reads whatever a narrower one reads). The last write of a group-committing backend
    holds a batch, so a hole inside it needs that backend's rule (`jsonl-group`, `jsonl-syncfs`),
    which `jsonl-fsync`'s refuses."""
    registry = registry if registry is not None else default_registry()
    rules: dict[tuple[bool, int], list[str]] = {}
    for name in registry:
        info = registry.info(name)
        if info.plain_file and info.durability == "power":
            rule = info.nul_rule()
            rules.setdefault((rule["nul_tail"], rule["nul_window"]), []).append(name)
    wider = sorted(key for key in rules if key > (bool(used.get("nul_tail")), used.get("nul_window", 0)))
    for index, (tail, window) in enumerate(wider):
        try:
            reduce_bytes(data, nul_tail=tail, nul_window=window)
        except CorruptionError:
            continue
        readers = [name for key in wider[index:] for name in rules[key]]
        named = readers[0] if len(readers) == 1 else f"{', '.join(readers[:-1])} or {readers[-1]}"
        alike = f" ({'they read' if len(readers) > 1 else 'it reads'} it alike)"
        where = " (a hole inside the last batch of a group commit)" if window else ""
        return f"if {named} wrote it{where}, read it with --backend {rules[(tail, window)][0]}{alike}"
    return None


def load_session(path: str, backend: str, registry: Registry, mode: str) -> tuple[bytes, SessionState]:
    """The stored bytes of a session and their state, read-only, as a store of `backend` reads them."""
    data, rule = read_session(path, backend, registry)
    return data, reduce_session(path, data, mode, rule, registry)


def count_lines(data: bytes, end: int, mode: str, path: str) -> dict[str, Any]:
    """What the committed lines hold, by kind, entry role and record type (of a reduced log)."""
    kinds: Counter[str] = Counter()
    entries: Counter[str] = Counter()
    records: Counter[str] = Counter()
    progress = Progress(mode, f"counting {path}", end)
    numbered = lines(data, end)
    next(numbered)  # the header
    transactions = 0
    try:
        for number, offset, raw in numbered:
            transactions += 1
            value = parse_line(raw, number, offset)
            for fact in value if type(value) is list else [value]:
                kind = fact["kind"]
                kinds[kind] += 1
                if kind == "entry":
                    entry = fact["entry"]
                    entries[entry["message"]["role"] if entry["type"] == "message" else "compaction"] += 1
                elif kind == "record":
                    records[fact["record"]["type"]] += 1
            if not number & 0xFFF:
                progress.update(offset)
    finally:
        progress.close()
    return {
        "lines": transactions + 1,
        "transactions": transactions,
        "facts": sum(kinds.values()),
        "entries": kinds["entry"],
        "records": kinds["record"],
        "usage": kinds["usage"],
        "entryKinds": dict(sorted(entries.items())),
        "recordTypes": dict(sorted(records.items())),
    }


def load_current(path: str) -> dict[str, Any]:
    """The current-configuration JSON file the planner needs, checked by the planner's own
    validator (`core.planner.check_current`), which names the bad key."""
    try:
        text = read_session_file(path, limit=CURRENT_LIMIT).decode("utf-8")
    except SessionPathError as error:
        raise UsageError(f"--current {path}: cannot read it: {error.strerror}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"--current {path}: cannot read it: {error}") from None
    try:
        value = json.loads(text)
    except ValueError as error:
        raise UsageError(f"--current {path}: not JSON: {error}") from None
    try:
        check_current(value)
    except ConfigurationError as error:
        raise UsageError(f"--current {path}: not a current configuration: {error}") from None
    return value  # type: ignore[no-any-return]


CURRENT_HELP = (
    'the current configuration, a JSON file: {"configurationDigest": "sha256:...", '
    '"environmentIdentity": "...", "tools": [{"name": ..., "definitionDigest": "sha256:...", '
    '"replay": "safe" or "never", "replayKey": ...}, ...]} (the contract\'s '
    "current-configuration.schema.json); default: the configuration the session last recorded (its "
    "current step's snapshot, its intents' replay declarations and environment), said when used"
)

"""What a repository says of each session (`SessionInfo`), and listing: filters, order, pages."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core.errors import shown
from ..core.reducer import is_uuid7
from ..core.state import Usage
from .base import checked_labels
from .keys import checked_key

Status = Literal["idle", "running", "needs-recovery", "corrupt"]
_NO_USAGE = Usage(0, 0, 0, 0)
_NOT_FIELDS = ("idle", "usage", "session_id", "rule")  # of a summary: no field of SessionInfo


@dataclass(frozen=True)
class SessionInfo:
    """One session, as a listing shows it. `status`: `idle`, `running` (a run or compaction is
    unfinished and a live writer holds the session), `needs-recovery` (unfinished, no live
    writer: recover it), `corrupt` (the log is refused; `error` says why). Times are ms since
    the epoch; `updated_at` is the last write. `cursor` continues a listing after this row.
    `key`: the caller key naming it, if any; `replaced`: no longer the key's current session."""

    session_id: str
    status: Status
    provider: str = ""
    model: str = ""
    created_at: int = 0
    updated_at: int = 0
    last_seq: int = 0
    lines: int = 0
    bytes: int = 0
    title: str | None = None
    labels: tuple[str, ...] = ()
    usage: Usage = _NO_USAGE
    writer: bool = False  # a live writer holds it
    error: str | None = None
    key: str | None = None  # the caller's key of the session (`keys`)
    replaced: bool = False  # the key has another current session now

    @property
    def cursor(self) -> str:
        return f"{self.updated_at}:{self.session_id}"


def info_of(
    summary: dict[str, Any],
    labels: tuple[str, ...],
    held: Callable[[], bool],
    key: str | None = None,
    replaced: bool = False,
) -> SessionInfo:
    """A listing row from a session's summary; `held()` says whether a live writer holds it (only
    asked of unfinished sessions); `key`, `replaced`: its caller key (`keys`)."""
    session_id = summary["session_id"]
    if "error" in summary:
        return SessionInfo(
            session_id,
            "corrupt",
            updated_at=summary["updated_at"],
            bytes=summary["bytes"],
            error=summary["error"],
            key=key,
            replaced=replaced,
        )
    writer = not summary["idle"] and held()
    status: Status = "idle" if summary["idle"] else "running" if writer else "needs-recovery"
    fields = {key: value for key, value in summary.items() if key not in _NOT_FIELDS}
    return SessionInfo(
        session_id,
        status,
        labels=labels,
        usage=Usage(*summary["usage"]),
        writer=writer,
        key=key,
        replaced=replaced,
        **fields,
    )


STATUSES: tuple[Status, ...] = ("idle", "running", "needs-recovery", "corrupt")
_MAX_INT = 2**63 - 1  # what every database stores in an integer column and takes as a LIMIT
_CURSOR = re.compile(r"([0-9]{1,19}):(.+)", re.ASCII | re.DOTALL)


@dataclass(frozen=True)
class Filters:
    """`list` filters: `status` (one or several of `STATUSES`), `updated_after` /
    `updated_before` (ms since the epoch), `labels` (every one must be set), `limit` (a positive
    integer; None: all), `cursor` (the `cursor` of the last row of the previous page), `key`
    (the sessions of one caller key, its current one and those it replaced).

    Every filter is checked here, at the door, the same for every repository: a value of the
    wrong type is a TypeError, one out of range (or a status nobody has) a ValueError naming the
    filter, so that a typo never returns an empty listing and no value reaches a database as a
    raw driver error. `status` becomes a frozenset and `labels` a tuple."""

    status: str | Iterable[str] | None = None
    updated_after: int | None = None
    updated_before: int | None = None
    labels: Iterable[str] | None = field(default_factory=tuple)
    limit: int | None = 100
    cursor: str | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        if self.key is not None:
            checked_key(self.key)
        object.__setattr__(self, "status", _statuses(self.status))
        labels = () if self.labels is None else tuple(checked_labels(self.labels, "the labels filter"))
        object.__setattr__(self, "labels", labels)
        for name in ("updated_after", "updated_before"):
            value = getattr(self, name)
            if value is not None:
                _integer(name, value, 0, _MAX_INT, "a time in ms since the epoch")
        if self.limit is not None:
            _integer("limit", self.limit, 1, _MAX_INT, "a positive integer or None")
        _cursor(self.cursor)

    @property
    def after(self) -> tuple[int, str] | None:
        """The cursor as (updated_at, session_id): rows strictly older come next."""
        return _cursor(self.cursor)


def _cursor(cursor: object) -> tuple[int, str] | None:
    if cursor is None:
        return None
    if type(cursor) is not str:
        raise TypeError(f"cursor is the `cursor` of a listed row (a str), not {shown(cursor)}")
    match = _CURSOR.fullmatch(cursor)
    if match is None or int(match[1]) > _MAX_INT or not is_uuid7(match[2]):
        raise ValueError(f"not a cursor of this listing: {shown(cursor)}")
    return int(match[1]), match[2]


def _statuses(status: object) -> frozenset[str]:
    if status is None:
        return frozenset()
    if isinstance(status, str):
        found = [status]
    elif isinstance(status, bytes | bytearray | memoryview) or not isinstance(status, Iterable):
        raise TypeError(f"status is a status or an iterable of them, not {shown(status)}")
    else:
        found = list(status)
    for one in found:
        if one not in STATUSES:
            raise ValueError(f"status {shown(one)} is none of {', '.join(STATUSES)}")
    return frozenset(found)


def _integer(name: str, value: object, low: int, high: int, what: str) -> None:
    if type(value) is not int:  # a bool is an int to Python, never a limit or a time here
        raise TypeError(f"{name} is {what}, not {shown(value)}")
    if not low <= value <= high:
        raise ValueError(f"{name} is {what} from {low} to {high}, not {shown(value)}")


@dataclass(frozen=True)
class Candidate:
    """A session before it is listed: its summary (with `session_id` and `updated_at`), its labels,
    and how to ask whether a writer holds it (asked only of unfinished sessions that are listed)."""

    summary: dict[str, Any]
    labels: tuple[str, ...]
    held: Callable[[], bool]
    caller_key: str | None = None
    replaced: bool = False

    @property
    def key(self) -> tuple[int, str]:
        return (self.summary["updated_at"], self.summary["session_id"])


def page(candidates: Iterable[Candidate], wanted: Filters) -> list[SessionInfo]:
    """The rows of one page from candidates sorted newest first: filters, cursor, limit; a
    writer probe only for the unfinished sessions that get that far."""
    statuses = wanted.status
    labels = set(wanted.labels or ())
    after = wanted.after
    rows: list[SessionInfo] = []
    for candidate in candidates:
        updated_at = candidate.summary["updated_at"]
        if wanted.updated_after is not None and updated_at <= wanted.updated_after:
            break  # newest first: everything after is older still
        if wanted.updated_before is not None and updated_at >= wanted.updated_before:
            continue
        if after is not None and candidate.key >= after:
            continue
        if not labels <= set(candidate.labels):
            continue
        if wanted.key is not None and candidate.caller_key != wanted.key:
            continue
        info = info_of(
            candidate.summary, candidate.labels, candidate.held, candidate.caller_key, candidate.replaced
        )
        if statuses and info.status not in statuses:
            continue
        rows.append(info)
        if wanted.limit is not None and len(rows) >= wanted.limit:
            break
    return rows

"""What a repository says of each session (`SessionInfo`), and listing: filters, order, pages."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core.state import Usage

Status = Literal["idle", "running", "needs-recovery", "corrupt"]
_NO_USAGE = Usage(0, 0, 0, 0)


@dataclass(frozen=True)
class SessionInfo:
    """One session, as a listing shows it. `status`: `idle`, `running` (a run or compaction is
    unfinished and a live writer holds the session), `needs-recovery` (unfinished, no live
    writer: recover it), `corrupt` (the log is refused; `error` says why). Times are ms since
    the epoch; `updated_at` is the last write. `cursor` continues a listing after this row."""

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

    @property
    def cursor(self) -> str:
        return f"{self.updated_at}:{self.session_id}"


def info_of(summary: dict[str, Any], labels: tuple[str, ...], held: Callable[[], bool]) -> SessionInfo:
    """A listing row from a session's summary; `held()` says whether a live writer holds it (only
    asked of unfinished sessions)."""
    session_id = summary["session_id"]
    if "error" in summary:
        return SessionInfo(
            session_id,
            "corrupt",
            updated_at=summary["updated_at"],
            bytes=summary["bytes"],
            error=summary["error"],
        )
    writer = not summary["idle"] and held()
    status: Status = "idle" if summary["idle"] else "running" if writer else "needs-recovery"
    fields = {key: value for key, value in summary.items() if key not in ("idle", "usage", "session_id")}
    return SessionInfo(
        session_id, status, labels=labels, usage=Usage(*summary["usage"]), writer=writer, **fields
    )


@dataclass(frozen=True)
class Filters:
    """`list` filters: `status` (one or several), `updated_after` / `updated_before` (ms),
    `labels` (every one must be set), `limit` (None: all), `cursor` (from the previous page)."""

    status: str | Iterable[str] | None = None
    updated_after: int | None = None
    updated_before: int | None = None
    labels: Iterable[str] = field(default_factory=tuple)
    limit: int | None = 100
    cursor: str | None = None

    def __post_init__(self) -> None:
        if self.limit is not None and (type(self.limit) is not int or self.limit < 1):
            raise ValueError(f"limit is a positive integer or None, not {self.limit!r}")
        if self.cursor is not None:
            updated, _, session_id = self.cursor.partition(":")
            if not updated.isdigit() or not session_id:
                raise ValueError(f"not a cursor of this listing: {self.cursor!r:.80}")


@dataclass(frozen=True)
class Candidate:
    """A session before it is listed: its summary (with `session_id` and `updated_at`), its labels,
    and how to ask whether a writer holds it (asked only of unfinished sessions that are listed)."""

    summary: dict[str, Any]
    labels: tuple[str, ...]
    held: Callable[[], bool]

    @property
    def key(self) -> tuple[int, str]:
        return (self.summary["updated_at"], self.summary["session_id"])


def page(candidates: Iterable[Candidate], wanted: Filters) -> list[SessionInfo]:
    """The rows of one page from candidates sorted newest first: filters, cursor, limit; a
    writer probe only for the unfinished sessions that get that far."""
    statuses = {wanted.status} if isinstance(wanted.status, str) else set(wanted.status or ())
    labels = set(wanted.labels)
    after: tuple[int, str] | None = None
    if wanted.cursor is not None:
        updated, _, session_id = wanted.cursor.partition(":")
        after = (int(updated), session_id)
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
        info = info_of(candidate.summary, candidate.labels, candidate.held)
        if statuses and info.status not in statuses:
            continue
        rows.append(info)
        if wanted.limit is not None and len(rows) >= wanted.limit:
            break
    return rows

"""One session in a SQL database: what its writer knows of it (the last line, bytes and summary)
and the statements that append lines after it, for SQLite and PostgreSQL alike.

A session is a summary row in `sessions` and its lines in `lines`, byte for byte. A commit is
one transaction that first updates the summary row `WHERE session_id = ? AND writer_epoch = ?
AND head_line = ?`, then inserts the lines: when the update changed no row, another writer took
the session over (or it moved on under this one), nothing was written, and the commit fails with
SessionChangedError (fenced). The repository supplies the connection, the transaction and the
statements (`ROW_SQL` in SQLite's `?` style, `{s}` before each table: `sql.statements` makes each
database's dialect; PostgreSQL's update also renews the writer's lease).
"""

from __future__ import annotations

import contextlib
import errno
import time
from collections.abc import Sequence
from typing import Any

import orjson

from ..core.errors import SessionChangedError, SessionNotFoundError, SessionPathError
from ..core.state import SessionState

Written = tuple[int, int, dict[str, Any]]  # head line, head bytes, summary once written

ROW_SQL = {
    "summary": "select summary from {s}sessions where session_id = ?",
    "head": "select head_line, head_bytes, summary from {s}sessions where session_id = ?",
    "update": "update {s}sessions set head_line = ?, head_bytes = ?, updated_at = ?, summary = ?, idle = ? "
    "where session_id = ? and writer_epoch = ? and head_line = ?",
    "insert": "insert into {s}lines values (?, ?, ?)",
    "lengths": "select length(line) from {s}lines where session_id = ? order by line_no",
    "cut": "delete from {s}lines where session_id = ? and line_no > ?",
    "cut_head": "update {s}sessions set head_line = ?, head_bytes = ? "
    "where session_id = ? and writer_epoch = ?",
    "release": "update {s}sessions set writer = null where session_id = ? and writer_epoch = ?",
}


class SessionRows:
    """Where one writer's session stands, and how to write lines after it inside a transaction
    the caller opened. `epoch` 0: opened read-only, every write is refused."""

    # The store hands this backend `core.commit.Line`s: the summary row is made from their facts.
    line_facts = True

    def __init__(self, repository: Any, session_id: str, epoch: int) -> None:
        self.repository = repository
        self.sql: dict[str, str] = repository.row_sql
        self.session_id = session_id
        self.epoch = epoch
        self.head_line = 0
        self.head_bytes = 0
        self.summary: dict[str, Any] = {}

    def load(self, connection: Any) -> bytes:
        data: bytes = self.repository.read(self.session_id, connection)
        self.head_line, self.head_bytes = data.count(b"\n"), len(data)
        row = connection.execute(self.sql["summary"], (self.session_id,)).fetchone()
        if row is None:  # deleted between the two reads (by a writer that saw the session unheld)
            raise SessionNotFoundError(
                errno.ENOENT, f"no session {self.session_id} here (deleted while it was opened)",
                str(self.repository.path),
            )  # fmt: skip
        self.summary = orjson.loads(row[0])
        return data

    def find_head(self, connection: Any) -> None:
        """Where the session stands, from its summary row alone (its lines unread)."""
        row = connection.execute(self.sql["head"], (self.session_id,)).fetchone()
        if row is None:
            self.check(0)  # deleted under this writer: fenced, nothing written
        self.head_line, self.head_bytes, self.summary = int(row[0]), int(row[1]), orjson.loads(row[2])

    def write(self, connection: Any, lines: Sequence[bytes]) -> Written:
        """Update the summary row (only if this writer still holds the session at the head it
        knows) and insert `lines`; the new (head line, head bytes, summary), to `advance` to
        once the transaction committed. Where the database has one statement for both
        (`append`), it is one round trip, and in autocommit its own transaction."""
        if not self.summary:  # written before any read (a copy into a new session): where it stands
            self.find_head(connection)
        written, update = self.next(lines)
        if "append" in self.sql:
            statement = self.sql["append_one" if len(lines) == 1 else "append"]
            self.check(connection.execute(statement, self.append_values(update, lines)).rowcount)
            return written
        self.check(connection.execute(self.sql["update"], update).rowcount)
        if len(lines) == 1:
            connection.execute(self.sql["insert"], (self.session_id, written[0], lines[0]))
        else:
            connection.cursor().executemany(
                self.sql["insert"],
                [(self.session_id, self.head_line + number, line) for number, line in enumerate(lines, 1)],
            )
        return written

    def next(self, lines: Sequence[bytes]) -> tuple[Written, tuple[Any, ...]]:
        """Where the session stands once `lines` are written, and the summary row's update."""
        summary = self.summary
        for line in lines:
            summary = summary_after(summary, line)
        head_line, head_bytes = self.head_line + len(lines), self.head_bytes + sum(map(len, lines))
        update = (
            head_line,
            head_bytes,
            time.time_ns() // 1_000_000,
            orjson.dumps(summary).decode(),
            summary["idle"],
            self.session_id,
            self.epoch,
            self.head_line,
        )
        return (head_line, head_bytes, summary), update

    def append_values(self, update: tuple[Any, ...], lines: Sequence[bytes]) -> tuple[Any, ...]:
        """The parameters of `append` (`append_one` for one line): the update's, then the lines'
        numbers and bytes."""
        if len(lines) == 1:
            return (*update, self.head_line + 1, lines[0])
        return (*update, list(range(self.head_line + 1, self.head_line + 1 + len(lines))), list(lines))

    def cut(self, connection: Any, length: int) -> None:
        """Drop a torn tail: keep the first `length` bytes. Rows hold whole lines, each written
        in one transaction, so a torn tail is only ever a row that another program wrote."""
        with self.repository.transaction(connection) as open_connection:
            kept_lines = kept_bytes = 0
            for (size,) in open_connection.execute(self.sql["lengths"], (self.session_id,)).fetchall():
                if kept_bytes + size > length:
                    break
                kept_lines, kept_bytes = kept_lines + 1, kept_bytes + size
            if kept_bytes != length:
                raise SessionPathError(
                    errno.EIO,
                    f"{self.repository.path}: session {self.session_id} cannot be cut at byte {length}",
                    str(self.repository.path),
                )
            open_connection.execute(self.sql["cut"], (self.session_id, kept_lines))
            changed = open_connection.execute(
                self.sql["cut_head"], (kept_lines, kept_bytes, self.session_id, self.epoch)
            ).rowcount
            self.check(changed)
        self.head_line, self.head_bytes = kept_lines, kept_bytes

    def check(self, changed: int) -> None:
        """Fenced when the summary row of this writer did not change (another writer holds it)."""
        if not self.epoch:
            raise SessionChangedError(
                f"{self.repository.path}: session {self.session_id} was opened read-only"
            )
        if not changed:
            self.repository.fenced += 1
            raise SessionChangedError(
                f"{self.repository.path}: session {self.session_id} was taken over by another writer "
                "(fenced); nothing was written"
            )

    def advance(self, written: Written) -> None:
        self.head_line, self.head_bytes, self.summary = written

    def release(self, connection: Any) -> None:
        """Give up the hold, if it is still this writer's: at best effort (a release that cannot
        be written leaves a hold that is known dead or expires), never raising."""
        self.repository.forget_hold(self.session_id, self.epoch)
        with contextlib.suppress(Exception), self.repository.transaction(connection) as open_connection:
            open_connection.execute(self.sql["release"], (self.session_id, self.epoch))


def summary_after(summary: dict[str, Any], line: bytes) -> dict[str, Any]:
    """The summary row once `line` is committed (it was validated: its facts are sound). A line
    the commit pipeline made carries its facts (`core.commit.Line`): they are used as they are,
    the line is not parsed again; any other line (a copy's, an import's) is parsed."""
    facts = getattr(line, "facts", None)
    if facts is None:
        value = orjson.loads(line)
        facts = value if type(value) is list else [value]
    summary = dict(summary)
    for fact in facts:
        summary["last_seq"] = fact["seq"]
        kind = fact["kind"]
        if kind == "usage":
            counts = fact["usage"]
            summary["usage"] = [
                total + counts[key]
                for total, key in zip(
                    summary["usage"], ("input", "output", "cacheRead", "cacheWrite"), strict=True
                )
            ]
        elif kind == "record" and fact["record"]["type"] in ("runStarted", "compactionStarted"):
            summary["idle"] = False
        elif kind == "record" and fact["record"]["type"] == "operationFinished":
            summary["idle"] = True
        elif kind == "entry" and summary["title"] is None:
            message = fact["entry"].get("message") or {}
            if message.get("role") == "user" and isinstance(message.get("content"), str):
                summary["title"] = " ".join(message["content"].split())[:80]
    return summary


def summary_row(state: SessionState) -> dict[str, Any]:
    """The summary row of a session from its state (at create and import)."""
    header = state.header
    title = next((m["content"] for m in state.transcript if m["role"] == "user"), None)
    return {
        "provider": header["provider"],
        "model": header["model"],
        "idle": state.is_idle,
        "last_seq": state.last_seq,
        "title": " ".join(title.split())[:80] if isinstance(title, str) else None,
        "usage": list(state.usage),
    }

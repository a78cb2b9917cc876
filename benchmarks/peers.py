"""Peers: the libraries a user would otherwise pick to persist an agent session.

Every peer does the same logical work: append one ~500-byte chat message (the same
messages as the ceilings, see :func:`benchmarks.ceilings.make_messages`) per commit to ONE
session, ``commits`` times, timing each commit; then read the whole session back and decode
it through a freshly opened handle (``load_s``, open time excluded, warm page cache).

Peers, each at the durability class its own storage settings give it:

* stdlib ``sqlite3``, WAL, ``synchronous=FULL`` (power) and ``synchronous=NORMAL`` (process):
  one INSERT + COMMIT per message;
* ``eventsourcing`` with its SQLite persistence module: one aggregate event per message,
  ``Application.save`` per commit, ``repository.get`` to load;
* ``langgraph-checkpoint-sqlite`` ``SqliteSaver``: one ``put_writes`` per message against a
  single checkpoint, ``get_tuple`` (pending writes) to load;
* ``openai-agents`` ``SQLiteSession``: ``add_items`` per message (async), ``get_items`` to load.

The durability label is not assumed: it is read back from the peer's own SQLite connection
(``PRAGMA journal_mode`` / ``PRAGMA synchronous``) after the peer has configured it. None of the
third-party peers sets ``synchronous``, so they run at SQLite's compiled-in default (FULL on
stock builds). A peer that is missing or fails goes to the skipped list with the reason; no
number is ever made up. Peers are imported lazily so that a missing one is a skip.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import json
import pathlib
import sqlite3
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict, cast

import orjson

from benchmarks.ceilings import (
    BenchRow,
    Durability,
    Progress,
    make_messages,
    make_row,
    sub_progress,
    time_commits,
)

Messages = list[dict[str, Any]]
Tick = Callable[[int, int], None] | None
PeerFn = Callable[[pathlib.Path, Messages, Tick], BenchRow]

_SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


class Skipped(TypedDict):
    name: str
    reason: str


def sqlite_durability(pragma: Callable[[str], Any]) -> tuple[Durability, str]:
    """Durability class from a SQLite connection's pragmas; pragma(sql) returns the first column.

    WAL + synchronous NORMAL loses the last commits on power loss (process class); WAL + FULL
    syncs the WAL on every commit (power). A rollback journal is power class from NORMAL up.
    """
    mode = str(pragma("PRAGMA journal_mode")).lower()
    sync = int(pragma("PRAGMA synchronous"))
    label = f"journal_mode={mode} synchronous={_SYNC_NAMES.get(sync, sync)}"
    if mode == "wal":
        return ("power" if sync >= 2 else "process"), label
    if mode in ("memory", "off") or sync == 0:
        return "process", label
    return "power", label


def _durability_of(conn: sqlite3.Connection) -> tuple[Durability, str]:
    return sqlite_durability(lambda sql: conn.execute(sql).fetchone()[0])


def _disk_bytes(directory: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _check(loaded: Sequence[Mapping[str, Any]], messages: Messages) -> None:
    """Refuse to report a load that did not return every message, in order."""
    if len(loaded) != len(messages):
        raise RuntimeError(f"loaded {len(loaded)} messages, wrote {len(messages)}")
    for want, got in zip(messages, loaded, strict=True):
        if got.get("seq") != want["seq"] or got.get("id") != want["id"]:
            raise RuntimeError(f"message {want['seq']} came back as {got.get('seq')!r}")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _row(
    name: str,
    durability: Durability,
    samples: list[int],
    total: float,
    load_s: float,
    directory: pathlib.Path,
    n: int,
    note: str,
) -> BenchRow:
    return make_row(
        name,
        "peer",
        durability,
        samples,
        total,
        bytes_per_fact=_disk_bytes(directory) / n,
        load_s=load_s,
        note=f"durability {durability}: {note}; bytes_per_fact = files on disk after close / messages",
    )


def _stdlib_sqlite(synchronous: str) -> PeerFn:
    def run(directory: pathlib.Path, messages: Messages, tick: Tick) -> BenchRow:
        path = directory / "session.db"
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={synchronous}")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS messages (session_id TEXT NOT NULL, seq INTEGER NOT NULL, "
                "body BLOB NOT NULL, PRIMARY KEY (session_id, seq))"
            )
            durability, label = _durability_of(conn)
            sql = "INSERT INTO messages (session_id, seq, body) VALUES (?, ?, ?)"

            def commit(i: int) -> None:
                conn.execute("BEGIN")
                conn.execute(sql, ("s1", i, orjson.dumps(messages[i])))
                conn.execute("COMMIT")

            samples, total = time_commits(commit, len(messages), progress=tick)
        finally:
            conn.close()
        reader = sqlite3.connect(path)
        try:
            t0 = time.perf_counter()
            rows = reader.execute("SELECT body FROM messages WHERE session_id = ? ORDER BY seq", ("s1",))
            loaded = [orjson.loads(body) for (body,) in rows]
            load_s = time.perf_counter() - t0
        finally:
            reader.close()
        _check(loaded, messages)
        return _row(
            f"sqlite3 WAL synchronous={synchronous}",
            durability,
            samples,
            total,
            load_s,
            directory,
            len(messages),
            f"stdlib sqlite3 {sqlite3.sqlite_version}, {label}, one INSERT + COMMIT per message; "
            "load = SELECT ... ORDER BY seq + orjson.loads per row",
        )

    return run


@functools.cache
def _es_session_class() -> Any:
    """The eventsourcing aggregate, defined once: eventsourcing registers every class by topic
    (module:qualname) and refuses a second class under the same topic."""
    from eventsourcing.domain import Aggregate, event

    class Session(Aggregate):
        def __init__(self) -> None:
            self.messages: list[dict[str, Any]] = []

        @event("MessageAppended")
        def append(self, message: dict[str, Any]) -> None:
            self.messages.append(message)

    return Session


def _eventsourcing(directory: pathlib.Path, messages: Messages, tick: Tick) -> BenchRow:
    from eventsourcing.application import Application

    session_cls = _es_session_class()
    env = {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(directory / "es.db")}
    app: Application[Any] = Application(env=env)
    try:
        with app.recorder.datastore.transaction(commit=False) as cur:  # type: ignore[attr-defined]

            def pragma(sql: str) -> Any:
                cur.execute(sql)
                return cur.fetchone()[0]

            durability, label = sqlite_durability(pragma)
        session = session_cls()
        app.save(session)

        def commit(i: int) -> None:
            session.append(messages[i])
            app.save(session)

        samples, total = time_commits(commit, len(messages), progress=tick)
    finally:
        app.close()
    reader: Application[Any] = Application(env=env)
    try:
        t0 = time.perf_counter()
        loaded: list[dict[str, Any]] = reader.repository.get(session.id).messages
        load_s = time.perf_counter() - t0
    finally:
        reader.close()
    _check(loaded, messages)
    return _row(
        "eventsourcing (sqlite)",
        durability,
        samples,
        total,
        load_s,
        directory,
        len(messages),
        f"eventsourcing {_version('eventsourcing')}, PERSISTENCE_MODULE=eventsourcing.sqlite, {label} "
        "(it sets WAL, leaves synchronous at the SQLite default); one aggregate event + "
        "Application.save per message; load = repository.get (replays all events)",
    )


def _langgraph(directory: pathlib.Path, messages: Messages, tick: Tick) -> BenchRow:
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = directory / "checkpoints.sqlite"
    conn = sqlite3.connect(path, check_same_thread=False)  # as in SqliteSaver's own docs
    try:
        saver = SqliteSaver(conn)
        saver.setup()
        durability, label = _durability_of(conn)
        config = saver.put(
            {"configurable": {"thread_id": "s1", "checkpoint_ns": ""}},
            empty_checkpoint(),
            {"source": "input", "step": -1},
            {},
        )

        def commit(i: int) -> None:
            # One task per message: writes are keyed (checkpoint, task_id, idx), so reusing a
            # task_id would silently drop the write.
            saver.put_writes(config, [("messages", messages[i])], task_id=f"{i:012d}")

        samples, total = time_commits(commit, len(messages), progress=tick)
    finally:
        conn.close()
    reader_conn = sqlite3.connect(path, check_same_thread=False)
    try:
        reader = SqliteSaver(reader_conn)
        t0 = time.perf_counter()
        tup = reader.get_tuple(config)
        loaded = [] if tup is None or tup.pending_writes is None else [v for _, _, v in tup.pending_writes]
        load_s = time.perf_counter() - t0
    finally:
        reader_conn.close()
    _check(loaded, messages)
    return _row(
        "langgraph SqliteSaver.put_writes",
        durability,
        samples,
        total,
        load_s,
        directory,
        len(messages),
        f"langgraph-checkpoint-sqlite {_version('langgraph-checkpoint-sqlite')}, {label} (it sets WAL, "
        "leaves synchronous at the SQLite default); one put_writes per message on one checkpoint; "
        "load = get_tuple + its pending writes",
    )


def _openai_agents(directory: pathlib.Path, messages: Messages, tick: Tick) -> BenchRow:
    from agents import SQLiteSession

    path = directory / "agents.db"
    items: list[Any] = [[m] for m in messages]  # role + content, plus id/seq/ts kept verbatim
    with asyncio.Runner() as runner:
        session = SQLiteSession("s1", path)
        try:
            # Same configuration as its worker-thread connections (_configure_connection).
            durability, label = _durability_of(session._get_connection())
            samples, total = time_commits(
                lambda i: runner.run(session.add_items(items[i])), len(messages), progress=tick
            )
        finally:
            session.close()
        reader = SQLiteSession("s1", path)
        try:
            t0 = time.perf_counter()
            loaded = cast(list[dict[str, Any]], runner.run(reader.get_items()))
            load_s = time.perf_counter() - t0
        finally:
            reader.close()
    _check(loaded, messages)
    return _row(
        "openai-agents SQLiteSession",
        durability,
        samples,
        total,
        load_s,
        directory,
        len(messages),
        f"openai-agents {_version('openai-agents')}, {label} (it sets WAL, leaves synchronous at the "
        "SQLite default); async add_items per message, each awaited via asyncio.Runner.run (the library "
        "hops to a worker thread per call); load = get_items",
    )


_PEERS: tuple[tuple[str, str | None, PeerFn], ...] = (
    ("sqlite3 WAL synchronous=FULL", None, _stdlib_sqlite("FULL")),
    ("sqlite3 WAL synchronous=NORMAL", None, _stdlib_sqlite("NORMAL")),
    ("eventsourcing (sqlite)", "eventsourcing", _eventsourcing),
    ("langgraph SqliteSaver.put_writes", "langgraph-checkpoint-sqlite", _langgraph),
    ("openai-agents SQLiteSession", "openai-agents", _openai_agents),
)


def run_peers(
    directory: pathlib.Path, commits: int, *, progress: Progress | None = None
) -> tuple[list[BenchRow], list[Skipped]]:
    """Run every peer on its own subdirectory of directory; return (rows, skipped)."""
    messages = make_messages(commits)
    rows: list[BenchRow] = []
    skipped: list[Skipped] = []
    for index, (name, dist, fn) in enumerate(_PEERS):
        peer_dir = directory / f"peer-{index}"
        peer_dir.mkdir(parents=True, exist_ok=True)
        try:
            rows.append(fn(peer_dir, messages, sub_progress(progress, name)))
        except ImportError as exc:
            skipped.append(Skipped(name=name, reason=f"not installed (pip install {dist}): {exc}"))
        except Exception as exc:
            skipped.append(Skipped(name=name, reason=f"failed: {type(exc).__name__}: {exc}"))
    return rows, skipped


if __name__ == "__main__":
    import sys

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with tempfile.TemporaryDirectory() as tmp:
        rows, skipped = run_peers(pathlib.Path(tmp), n)
        print(json.dumps(rows, indent=1))
        print(json.dumps(skipped, indent=1))

"""Shape g, a resume: what a user feels when an agent restarts. A session of N ~550-byte messages
is opened, loaded and listed (`list(state.active_context)`: the messages to send to the model
next), beside the read path of each peer on the same messages:

* openai-agents: `SQLiteSession(id, db).get_items()`;
* LangGraph: `SqliteSaver.get_tuple(config)` in two layouts: the messages as the pending writes
  of one checkpoint (what `put_writes` leaves, as shapes a and c commit them), and every message
  in one checkpoint's `channel_values` (what a graph's state holds after a step);
* eventsourcing: `Application.repository.get(id)` of an aggregate that appended every message.

Each session is built in one write, outside the timing (appending the messages one by one,
each synced, would take minutes): sessionlog's holds a message a transaction (a line each, as
a session of turns does; the bytes made once by the `jsonl` backend), written as one file (a
JSONL backend) or imported in one transaction (a SQLite backend); openai-agents' by one
`add_items`; LangGraph's by one `put_writes`, or one `put`; eventsourcing's by one `save` of the
N events. A round of a row is one
resume, from opening to the list in hand; a row's figure is messages a second (N over the
resume's time), its p50 the resume's time. Every read is checked to give back all N messages
(a row that gives fewer fails: a wrong layout must not look fast), and each row is set beside
sessionlog's first row (`jsonl` when it runs) measured in the same rounds. Beside `jsonl`, the
same file without its snapshot (every line reduced: a session's first resume after a crash)
shows what the snapshot saves.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sessionlog
from sessionlog.backends.jsonl import open_jsonl
from sessionlog.backends.side_files import remove_snapshot, snapshot_path
from sessionlog.backends.sqlite_info import INFOS
from sessionlog.core import facts as F
from sessionlog.core.snapshot import worth_writing
from sessionlog.core.store import BackendInfo
from sessionlog.plugins.hookspecs import hookimpl
from sessionlog.plugins.registry import Registry, plugin_manager

from .measure import WINDOW, Job
from .peers import session_aggregate
from .shapes import HEADER

SQLITE_BACKENDS = frozenset(info.name for info in INFOS.values())
CONTENT = "m" * 515  # with its index: {"role": "user", "content": ...} is 550 bytes of JSON
NO_SNAPSHOT = "jsonl without its snapshot: every line reduced"
NO_SNAPSHOT_BACKEND = "bench-jsonl-without-snapshots"  # registered in a registry of the bench's own
Read = Callable[[], int]  # one resume; how many messages it gave back
Built = tuple[Read, Callable[[], Any]]  # (read, close)


def messages(count: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"{index:06d} {CONTENT}"} for index in range(count)]


@dataclass(frozen=True)
class Reader:
    """A peer in shape g: `build(folder, messages)` stores the messages in one write under
    `folder` and gives (read, close); `read()` opens, loads and lists them, as a user's resume
    does, and returns how many it got."""

    name: str
    build: Callable[[Path, list[dict[str, Any]]], Built]


def resume_job(read: Read, expected: int, row: str) -> Job:
    """One resume a round: `read()`, timed, its count checked."""

    def run() -> tuple[int, float, list[float]]:
        # A resume is what a process does after a restart, on a heap that has just been
        # collected; this run's process holds every row's sessions and every peer's data (180k
        # objects), and a full collection the previous round's survivors were owed fell into
        # the next round of whichever row allocated most (measured: 318 ms of one 445 ms jsonl
        # round). So the collector starts each round of every row from the same state, untimed.
        gc.collect()
        WINDOW.start()
        start = time.perf_counter()
        got = read()
        elapsed = time.perf_counter() - start
        WINDOW.stop()
        if got != expected:
            raise ValueError(f"{row} gave back {got} messages of {expected}")
        return got, elapsed, [elapsed]

    return run


def session_bytes(folder: Path, items: list[dict[str, Any]]) -> bytes:
    """A session of the messages, one a transaction (one line each, as a session of turns holds
    them), written by the `jsonl` backend: the bytes every backend's session of shape g holds."""
    path = folder / "source.jsonl"
    with sessionlog.create(path, "jsonl", **HEADER) as store:
        for item in items:
            store.commit([F.user_message(item["content"])])
    data = path.read_bytes()
    path.unlink()
    remove_snapshot(path)  # its close wrote one: no file of it is left in the scratch folder
    return data


def _store(path: Path, backend: str, data: bytes, registry: Any) -> None:
    """`data` as a session of `backend` at `path`, in one write: a JSONL file's bytes; a SQLite
    backend's database (a SQLite repository holding one session) by one `import_`, one
    transaction; any other backend by a commit a transaction (its own writing: slower)."""
    info = sessionlog.backends(registry)[backend]
    if info.plain_file:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    elif backend in SQLITE_BACKENDS:
        with sessionlog.repository(f"sqlite:///{path}", durability="process") as repo:
            repo.import_(data)
    elif info.api == "sync":
        with sessionlog.create(path, backend, registry=registry, **HEADER) as store:
            for transaction in sessionlog.reduce_bytes(data).transcript:
                store.commit([F.user_message(transaction["content"])])
    else:
        raise ValueError(f"shape g stores a session of {backend} only when it is a file or SQLite backend")


def sessionlog_build(backend: str, registry: Any = None) -> Callable[[Path, bytes], Built]:
    """A session of `backend` holding `data` (`session_bytes`); a read opens it (its backend's
    open: read, repair a torn tail, reduce), loads the state and lists its active context. It is
    read once untimed, so its rounds resume a session as a writer's close leaves it: with the
    snapshot a backend keeps (a writer killed before its close leaves none; that first resume
    reduces every line, as shape d's loads measure)."""

    def build(folder: Path, data: bytes) -> Built:
        path = folder / f"{backend}.session"
        _store(path, backend, data, registry)
        if sessionlog.backends(registry)[backend].api == "sync":

            def read() -> int:
                with sessionlog.open(path, backend, registry=registry) as store:
                    return len(list(store.load().active_context))

            read()  # untimed: the session as its writer's close leaves it, its snapshot beside it
            _check_snapshot(path, backend, data, registry)
            return read, lambda: None

        runner = asyncio.Runner()

        async def resume() -> int:
            store = await sessionlog.open_async(path, backend, registry=registry)
            try:
                return len(list((await store.load()).active_context))
            finally:
                await store.close()

        runner.run(resume())  # untimed, as for a sync backend
        try:
            _check_snapshot(path, backend, data, registry)
        except BaseException:
            runner.close()
            raise
        return lambda: runner.run(resume()), runner.close

    return build


def _check_snapshot(path: Path, backend: str, data: bytes, registry: Any) -> None:
    """RuntimeError when a file backend's session long enough for a snapshot has none after its
    untimed read's close (no key could sign it, the disk is full): the row would time a full
    reduction as a resume from the snapshot."""
    keeps = sessionlog.backends(registry)[backend].plain_file and worth_writing(data.count(b"\n"), 0)
    if keeps and not snapshot_path(path).exists():
        raise RuntimeError(
            f"no snapshot was written at the close of the {backend} session (the sessionlog.snapshot "
            "warning says why): its row would time a full reduction as a resume from the snapshot"
        )


class _WithoutSnapshots:
    """A `jsonl` backend without the snapshot seam: the core finds no `read_snapshot` nor
    `write_snapshot` (`core.store`), so a load reduces every line and a close writes none."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        if name in ("read_snapshot", "write_snapshot"):
            raise AttributeError(name)
        return getattr(self._backend, name)


class _NoSnapshotPlugin:
    """Registers NO_SNAPSHOT_BACKEND: `jsonl`, through `_WithoutSnapshots`."""

    @hookimpl
    def register_backends(self, register: Any) -> None:
        def open_without(path: Path, **options: Any) -> Any:
            return _WithoutSnapshots(open_jsonl(path, **options))

        info = BackendInfo(NO_SNAPSHOT_BACKEND, "process", "sync", "jsonl without snapshots", plain_file=True)
        register(NO_SNAPSHOT_BACKEND, open_without, info)


def no_snapshot_build(folder: Path, data: bytes) -> Built:
    """The `jsonl` session without its snapshot seam (as a writer killed before its close
    leaves it, with none): a read is the `jsonl` row's (open, load, list, close), every line
    reduced and no snapshot written, the load a session's first resume after a crash pays."""
    path = folder / "no-snapshot.jsonl"
    path.write_bytes(data)
    registry = Registry(plugin_manager(entry_points=False, plugins=[_NoSnapshotPlugin()]))

    def read() -> int:
        with sessionlog.open(path, NO_SNAPSHOT_BACKEND, registry=registry) as store:
            return len(list(store.load().active_context))

    read()  # untimed, as the other rows' first read
    return read, lambda: None


def _openai_agents(folder: Path, items: list[dict[str, Any]]) -> Built:
    from agents import SQLiteSession

    runner = asyncio.Runner()
    path = folder / "agents.db"
    store = SQLiteSession("s", path)
    runner.run(store.add_items(items))  # type: ignore[arg-type, unused-ignore]
    store.close()

    def read() -> int:
        session = SQLiteSession("s", path)
        try:
            return len(runner.run(session.get_items()))
        finally:
            session.close()

    return read, runner.close


THREAD: Any = {  # a RunnableConfig
    "configurable": {"thread_id": "s", "checkpoint_ns": ""}
}


def _langgraph(layout: str) -> Callable[[Path, list[dict[str, Any]]], Built]:
    """`layout` "writes": the messages as one checkpoint's pending writes; "checkpoint": all of
    them in one checkpoint's channel values."""

    def build(folder: Path, items: list[dict[str, Any]]) -> Built:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.sqlite import SqliteSaver

        path = folder / f"langgraph-{layout}.sqlite"
        with sqlite3.connect(path, check_same_thread=False) as connection:
            saver = SqliteSaver(connection)
            saver.setup()
            checkpoint = empty_checkpoint()
            if layout == "writes":
                config = saver.put(THREAD, checkpoint, {}, {})
                saver.put_writes(config, [("messages", item) for item in items], task_id="t")
            else:
                checkpoint["channel_values"] = {"messages": items}
                checkpoint["channel_versions"] = {"messages": 1}
                saver.put(THREAD, checkpoint, {}, {"messages": 1})
        connection.close()

        def read() -> int:
            with sqlite3.connect(path, check_same_thread=False) as reading:
                found = SqliteSaver(reading).get_tuple(THREAD)
            reading.close()
            if found is None:
                return 0
            if layout == "writes":
                return len(
                    [value for _, channel, value in found.pending_writes or () if channel == "messages"]
                )
            return len(found.checkpoint["channel_values"].get("messages", ()))

        return read, lambda: None

    return build


def _eventsourcing(folder: Path, items: list[dict[str, Any]]) -> Built:
    from eventsourcing.application import Application

    env = {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(folder / "es.db")}
    app: Application[Any] = Application(env=env)
    aggregate = session_aggregate()()
    for item in items:
        aggregate.append(item)
    app.save(aggregate)  # every pending event in one write
    app.close()
    wanted = aggregate.id

    def read() -> int:
        reading: Application[Any] = Application(env=env)
        try:
            return len(reading.repository.get(wanted).messages)
        finally:
            reading.close()

    return read, lambda: None


def readers() -> list[Reader]:
    """Every peer's read path (imported when built: one not installed is skipped)."""
    return [
        Reader("openai-agents SQLiteSession.get_items", _openai_agents),
        Reader("LangGraph SqliteSaver.get_tuple, messages as pending writes", _langgraph("writes")),
        Reader("LangGraph SqliteSaver.get_tuple, messages in one checkpoint", _langgraph("checkpoint")),
        Reader("eventsourcing (SQLite) repository.get", _eventsourcing),
    ]


def resume_rows(
    folder: Path,
    count: int,
    backends: list[str],
    usable: list[Reader],
    registry: Any = None,
) -> tuple[dict[str, tuple[Job, dict[str, Any]]], list[Callable[[], Any]]]:
    """The jobs of one size of shape g (sessionlog's rows first, each row set beside the first
    of them) and what closes them after the rounds."""
    items = messages(count)
    data = session_bytes(folder, items) if backends else b""
    built: list[tuple[str, str, Built]] = [
        (name, "backend", sessionlog_build(name, registry)(folder, data)) for name in backends
    ]
    if "jsonl" in backends:
        built.insert(1, (NO_SNAPSHOT, "backend", no_snapshot_build(folder, data)))
    built += [(f"peer: {reader.name}", "peer", reader.build(folder, items)) for reader in usable]
    reference = built[0][0] if built else None
    jobs: dict[str, tuple[Job, dict[str, Any]]] = {}
    for name, kind, (read, _) in built:
        meta: dict[str, Any] = {"durability": "-", "kind": kind, "unit": "messages/s", "versus": "sessionlog"}
        if name != reference:
            meta["ceiling"] = reference
        jobs[name] = (resume_job(read, count, name), meta)
    return jobs, [close for _, _, (_, close) in built]

"""The third-party peers of `sessionlog bench`, for `python -m benchmarks`: each one session of the
library a framework would otherwise pick, one ~500-byte message a commit, at the durability its
own defaults give (SQLite's `synchronous=FULL`: the power class). A peer that is not installed is
listed as skipped by the bench, with the reason."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sessionlog.bench.shapes import TEXT, Peer

Opened = tuple[Callable[[int], Any], Callable[[], Any]]


def _message(index: int) -> dict[str, Any]:
    return {"role": "user", "content": f"{index} {TEXT}"}


def _eventsourcing(folder: Path, session: int) -> Opened:
    from eventsourcing.application import Application

    from benchmarks.peers import _es_session_class

    app: Application[Any] = Application(
        env={"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(folder / f"es-{session}.db")}
    )
    aggregate = _es_session_class()()
    app.save(aggregate)

    def commit(index: int) -> None:
        aggregate.append(_message(index))
        app.save(aggregate)

    return commit, app.close


def _langgraph(folder: Path, session: int) -> Opened:
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.sqlite import SqliteSaver

    connection = sqlite3.connect(folder / f"checkpoints-{session}.sqlite", check_same_thread=False)
    saver = SqliteSaver(connection)
    saver.setup()
    config = saver.put({"configurable": {"thread_id": "s", "checkpoint_ns": ""}}, empty_checkpoint(), {}, {})

    def commit(index: int) -> None:  # a task id a message: reusing one would drop the write
        saver.put_writes(config, [("messages", _message(index))], task_id=f"{index:012d}")

    return commit, connection.close


def _openai_agents(folder: Path, session: int) -> Opened:
    from agents import SQLiteSession

    runner = asyncio.Runner()
    store = SQLiteSession(f"s{session}", folder / f"agents-{session}.db")

    def commit(index: int) -> None:
        runner.run(store.add_items([_message(index)]))  # type: ignore[list-item]

    def close() -> None:
        store.close()
        runner.close()

    return commit, close


PEERS = (
    Peer("eventsourcing (SQLite)", "power", _eventsourcing),
    Peer("LangGraph SqliteSaver.put_writes", "power", _langgraph),
    Peer("openai-agents SQLiteSession", "power", _openai_agents, concurrent=False),
)

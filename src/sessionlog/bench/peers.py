"""The other libraries a framework would pick, as `shapes.Peer`s: one session of each, one
~500-byte message a commit, at the durability its own defaults give (SQLite's compiled-in
`synchronous=FULL`, PostgreSQL's `synchronous_commit=on`: the power class). Each is imported only
when the bench opens it; one that is not installed is listed as skipped with the reason, never
estimated (`pip install 'sessionlog[bench]'` installs them)."""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .shapes import TEXT, Peer

Opened = tuple[Callable[[int], Any], Callable[[], Any]]


def _message(index: int) -> dict[str, Any]:
    return {"role": "user", "content": f"{index} {TEXT}"}


def sqlite3_peer(synchronous: str) -> Peer:
    """The stdlib peer: SQLite in WAL mode, one `INSERT` + `COMMIT` of a ~500-byte row per
    commit, one connection a session, all sessions in one database file."""
    import sqlite3

    line = b"x" * 499 + b"\n"

    def open_session(folder: Path, session: int) -> tuple[Callable[[int], Any], Callable[[], Any]]:
        path = folder / "peer.db"
        connection = sqlite3.connect(path, isolation_level=None, timeout=60, check_same_thread=False)
        connection.execute("pragma journal_mode=wal")
        connection.execute(f"pragma synchronous={synchronous}")
        connection.execute(
            "create table if not exists lines (session integer, line_no integer, line blob, "
            "primary key (session, line_no))"
        )

        def commit(index: int) -> None:
            connection.execute("begin immediate")
            connection.execute("insert into lines values (?, ?, ?)", (session, index, line))
            connection.execute("commit")

        return commit, connection.close

    durability = "power" if synchronous.lower() == "full" else "process"
    return Peer(f"sqlite3 WAL synchronous={synchronous.upper()}", durability, open_session)


@functools.cache
def session_aggregate() -> Any:
    """eventsourcing's aggregate, defined once: it refuses a second class under one topic."""
    from eventsourcing.domain import Aggregate, event

    class Session(Aggregate):  # type: ignore[misc, unused-ignore]  # Any when not installed
        def __init__(self) -> None:
            self.messages: list[dict[str, Any]] = []

        @event("MessageAppended")  # type: ignore[misc, untyped-decorator, unused-ignore]
        def append(self, message: dict[str, Any]) -> None:
            self.messages.append(message)

    return Session


def _eventsourcing(env: Callable[[Path, int], dict[str, str]]) -> Callable[[Path, int], Opened]:
    def open_session(folder: Path, session: int) -> Opened:
        from eventsourcing.application import Application

        app: Application[Any] = Application(env=env(folder, session))
        aggregate = session_aggregate()()
        app.save(aggregate)

        def commit(index: int) -> None:
            aggregate.append(_message(index))
            app.save(aggregate)

        return commit, app.close

    return open_session


def _langgraph_sqlite(folder: Path, session: int) -> Opened:
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.sqlite import SqliteSaver

    connection = sqlite3.connect(folder / f"checkpoints-{session}.sqlite", check_same_thread=False)
    saver = SqliteSaver(connection)
    saver.setup()
    config = saver.put({"configurable": {"thread_id": "s", "checkpoint_ns": ""}}, empty_checkpoint(), {}, {})

    def commit(index: int) -> None:  # a task id a message: reusing one would drop the write
        saver.put_writes(config, [("messages", _message(index))], task_id=f"{index:012d}")

    return commit, connection.close


def _langgraph_postgres(url: str) -> Callable[[Path, int], Opened]:
    def open_session(folder: Path, session: int) -> Opened:
        import psycopg
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.postgres import PostgresSaver

        connection = psycopg.connect(url, autocommit=True, prepare_threshold=0)
        saver = PostgresSaver(connection)  # type: ignore[arg-type, unused-ignore]
        saver.setup()
        thread = f"{folder.name}-{session}"
        config = saver.put(
            {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, empty_checkpoint(), {}, {}
        )

        def commit(index: int) -> None:
            saver.put_writes(config, [("messages", _message(index))], task_id=f"{index:012d}")

        return commit, connection.close

    return open_session


def _openai_agents(folder: Path, session: int) -> Opened:
    from agents import SQLiteSession

    runner = asyncio.Runner()
    store = SQLiteSession(f"s{session}", folder / f"agents-{session}.db")

    def commit(index: int) -> None:
        runner.run(store.add_items([_message(index)]))  # type: ignore[list-item, unused-ignore]

    def close() -> None:
        store.close()
        runner.close()

    return commit, close


def _openai_agents_sqlalchemy(url: str) -> Callable[[Path, int], Opened]:
    """openai-agents' `SQLAlchemySession` on PostgreSQL (psycopg 3 as SQLAlchemy's async driver)."""

    def open_session(folder: Path, session: int) -> Opened:
        from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession

        runner = asyncio.Runner()
        store = SQLAlchemySession.from_url(
            f"{folder.name}-{session}",
            url="postgresql+psycopg://" + url.split("://", 1)[1],
            create_tables=True,
        )

        def commit(index: int) -> None:
            runner.run(store.add_items([_message(index)]))  # type: ignore[list-item, unused-ignore]

        def close() -> None:
            runner.run(store.engine.dispose())
            runner.close()

        return commit, close

    return open_session


def _postgres_env(url: str) -> Callable[[Path, int], dict[str, str]]:
    def env(folder: Path, session: int) -> dict[str, str]:
        import psycopg

        info = psycopg.conninfo.conninfo_to_dict(url)
        return {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": str(info["dbname"]),
            "POSTGRES_HOST": str(info.get("host", "localhost")),
            "POSTGRES_PORT": str(info.get("port", 5432)),
            "POSTGRES_USER": str(info.get("user", "")),
            "POSTGRES_PASSWORD": str(info.get("password", "")),
            "CREATE_TABLE": "y",
            "POSTGRES_POOL_SIZE": "1",  # one connection an application: 64 of them fit the server
            "POSTGRES_MAX_OVERFLOW": "0",
        }

    return env


def peers(postgres: str | None = None) -> list[Peer]:
    """Every peer; those on PostgreSQL only with a server's URL."""
    found = [
        sqlite3_peer("full"),
        sqlite3_peer("normal"),
        Peer(
            "eventsourcing (SQLite)",
            "power",
            _eventsourcing(
                lambda folder, session: {
                    "PERSISTENCE_MODULE": "eventsourcing.sqlite",
                    "SQLITE_DBNAME": str(folder / f"es-{session}.db"),
                }
            ),
        ),
        Peer("LangGraph SqliteSaver.put_writes", "power", _langgraph_sqlite),
        Peer("openai-agents SQLiteSession", "power", _openai_agents, concurrent=False),
    ]
    if postgres:
        found += [
            Peer(
                "LangGraph PostgresSaver.put_writes",
                "power",
                _langgraph_postgres(postgres),
                kept_open=False,  # a connection a session: opened and closed each round
                on_postgres=True,
            ),
            Peer(
                "eventsourcing (PostgreSQL)",
                "power",
                _eventsourcing(_postgres_env(postgres)),
                kept_open=False,
                on_postgres=True,
            ),
            Peer(
                "openai-agents SQLAlchemySession (PostgreSQL)",
                "power",
                _openai_agents_sqlalchemy(postgres),
                concurrent=False,
                on_postgres=True,
            ),
        ]
    return found

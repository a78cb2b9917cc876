"""PostgreSQL: sessionlog's repository beside the ceilings and the peers on the same server, in one
run (ratios of medians of alternating rounds; absolute times drift here).

    python -m benchmarks.postgres [--postgres URL] [--full]

Without `--postgres` a throwaway server is started (and, for the replicated class, a synchronous
standby beside it). Shapes, for the power and the replicated class:

1. one session, one committer: sessionlog's commit; the ceiling, a bare `INSERT` + `COMMIT` of
   the same bytes; the peers: LangGraph `PostgresSaver.put_writes` per message, eventsourcing's
   PostgreSQL recorder (`Application.save` per message). Bounds: >= 0.8x the bare INSERT+COMMIT,
   >= 1.0x the best peer.
2. 64 sessions, one writer each: the async repository (one writer thread: the commits queued
   meanwhile share a transaction, one WAL flush), the sync repository with a thread per session,
   64 threads of bare INSERT+COMMIT, the peers with a thread per session. Bound: >= 8x shape 1.
3. loading a 10,000-line session: reading its rows (one binary `string_agg`) vs reducing them.
   Bound: <= 0.5x.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import sessionlog
from sessionlog.bench.shapes import in_threads
from sessionlog.core import facts as F
from sessionlog.testing.postgres import PostgresServer

HEADER: dict[str, Any] = {"provider": "p", "model": "m", "cwd": "/bench"}
LINE = b'{"kind":"entry","seq":1,"id":"x","timestamp":1,"entry":' + b"x" * 440 + b"}\n"


def _message(index: int) -> dict[str, Any]:
    return F.user_message(f"message {index} " + "x" * 380)


# -- shape 1: one session ------------------------------------------------------------------------


def _sessionlog_one(url: str, durability: str) -> Callable[[int], None]:
    repo = sessionlog.repository(url, durability=durability)
    store = repo.create(**HEADER)
    return lambda index: store.commit([_message(index)])  # type: ignore[func-returns-value]


def _bare_one(url: str) -> Callable[[int], None]:
    import psycopg

    connection = psycopg.connect(url, autocommit=True)
    connection.execute("create table if not exists bare (id bigserial primary key, line bytea not null)")

    def commit(index: int) -> None:
        connection.execute("insert into bare (line) values (%s)", (LINE,))  # its own transaction

    return commit


def _langgraph_one(url: str) -> Callable[[int], None]:
    import psycopg
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.postgres import PostgresSaver

    connection = psycopg.connect(url, autocommit=True, prepare_threshold=0)
    saver = PostgresSaver(connection)  # type: ignore[arg-type]
    saver.setup()
    thread = f"t{time.monotonic_ns()}"
    config = saver.put(
        {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, empty_checkpoint(), {}, {}
    )
    return lambda index: saver.put_writes(config, [("messages", _message(index))], task_id=f"{index:012d}")


def _eventsourcing_one(url: str) -> Callable[[int], None]:
    import psycopg
    from eventsourcing.application import Application

    from benchmarks.peers import _es_session_class  # the aggregate the SQLite peer row uses

    Session = _es_session_class()

    info = psycopg.conninfo.conninfo_to_dict(url)
    env = {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": str(info["dbname"]),
        "POSTGRES_HOST": str(info["host"]),
        "POSTGRES_PORT": str(info["port"]),
        "POSTGRES_USER": str(info["user"]),
        "POSTGRES_PASSWORD": str(info["password"]),
        "CREATE_TABLE": "y",
        "POSTGRES_POOL_SIZE": "1",  # one connection an application: 64 of them fit the server
        "POSTGRES_MAX_OVERFLOW": "0",
    }
    app: Application[Any] = Application(env=env)
    session = Session()
    app.save(session)

    def commit(index: int) -> None:
        session.append(_message(index))
        app.save(session)

    return commit


ONE: dict[str, Callable[[str, str], Callable[[int], None]]] = {
    "sessionlog": _sessionlog_one,
    "bare INSERT+COMMIT": lambda url, durability: _bare_one(url),
    "LangGraph PostgresSaver.put_writes": lambda url, durability: _langgraph_one(url),
    "eventsourcing (PostgreSQL recorder)": lambda url, durability: _eventsourcing_one(url),
}


def one_session(url: str, durability: str, commits: int, rounds: int) -> dict[str, Any]:
    """Commits per second of each row, medians of alternating rounds (or why it was skipped)."""
    committers: dict[str, Callable[[int], None]] = {}
    skipped: dict[str, str] = {}
    for name, make in ONE.items():
        try:
            committers[name] = make(url, durability)
        except Exception as error:  # a missing peer is a skip with its reason, never a number
            skipped[name] = f"{type(error).__name__}: {error}"[:200]
    rates: dict[str, list[float]] = {name: [] for name in committers}
    number = 0
    for _ in range(rounds):
        for name, commit in committers.items():
            start = time.perf_counter()
            for _ in range(commits):
                commit(number)
                number += 1
            rates[name].append(commits / (time.perf_counter() - start))
    return {"rates": {name: statistics.median(values) for name, values in rates.items()}, "skipped": skipped}


# -- shape 2: 64 sessions ------------------------------------------------------------------------


def _threads(make: Callable[[], Callable[[int], None]], sessions: int, commits: int) -> float:
    committers = [make() for _ in range(sessions)]
    done, seconds, _ = in_threads(sessions, commits, lambda session, index: committers[session](index))
    return done / seconds


def _sessionlog_async(url: str, durability: str, sessions: int, commits: int) -> float:
    async def main() -> float:
        repo = await sessionlog.repository_async(url, durability=durability)
        stores = [await repo.create(**HEADER) for _ in range(sessions)]

        async def writer(store: Any) -> None:
            for index in range(commits):
                await store.commit([_message(index)])

        start = time.perf_counter()
        await asyncio.gather(*(writer(store) for store in stores))
        rate = sessions * commits / (time.perf_counter() - start)
        for store in stores:
            await store.close()
        await repo.close()
        return rate

    return asyncio.run(main())


def many_sessions(url: str, durability: str, sessions: int, commits: int, rounds: int) -> dict[str, Any]:
    repo = sessionlog.repository(url, durability=durability, max_connections=sessions)

    def sessionlog_sync() -> Callable[[int], None]:
        store = repo.create(**HEADER)
        return lambda index: store.commit([_message(index)])  # type: ignore[func-returns-value]

    rows: dict[str, Callable[[], float]] = {
        "sessionlog async (one writer thread)": lambda: _sessionlog_async(url, durability, sessions, commits),
        "sessionlog sync (a thread per session)": lambda: _threads(sessionlog_sync, sessions, commits),
        "bare INSERT+COMMIT (a thread per session)": lambda: _threads(
            lambda: _bare_one(url), sessions, commits
        ),
        "LangGraph PostgresSaver.put_writes (a thread per session)": lambda: _threads(
            lambda: _langgraph_one(url), sessions, commits
        ),
        "eventsourcing (a thread per session)": lambda: _threads(
            lambda: _eventsourcing_one(url), sessions, commits
        ),
    }
    rates: dict[str, list[float]] = {name: [] for name in rows}
    skipped: dict[str, str] = {}
    for _ in range(rounds):
        for name, run in rows.items():
            if name in skipped:
                continue
            try:
                rates[name].append(run())
            except Exception as error:
                skipped[name] = f"{type(error).__name__}: {error}"[:200]
    repo.close()
    return {
        "rates": {name: statistics.median(values) for name, values in rates.items() if values},
        "skipped": skipped,
    }


# -- shape 3: loading ----------------------------------------------------------------------------


def loading(url: str, lines: int, rounds: int) -> dict[str, float]:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="sessionlog-bench-") as folder:
        path = Path(folder) / "session.jsonl"
        with sessionlog.create(path, "jsonl", **HEADER) as store:  # made locally, imported whole
            for index in range(lines - 1):
                store.commit([_message(index)])
        repo = sessionlog.repository(url)
        session_id = repo.import_(path.read_bytes())
    read, reduce = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        data = repo.read(session_id)
        read.append(time.perf_counter() - start)
        start = time.perf_counter()
        sessionlog.reduce_bytes(data)
        reduce.append(time.perf_counter() - start)
    repo.close()
    return {"read_ms": statistics.median(read) * 1e3, "reduce_ms": statistics.median(reduce) * 1e3}


# -- the run -------------------------------------------------------------------------------------


def run(url: str | None, full: bool) -> dict[str, Any]:
    commits, rounds = (100, 9) if full else (40, 5)
    results: dict[str, Any] = {}
    servers: list[PostgresServer] = []
    try:
        if url is None:
            servers.append(PostgresServer.start())
            url = servers[0].new_database()
        results["power"] = {
            "one": one_session(url, "power", commits, rounds),
            "many": many_sessions(url, "power", 64, commits // 4, 3),
        }
        results["load"] = loading(url, 10_000, 5)
        if servers:
            replicated = PostgresServer.start()
            servers.append(replicated)
            replicated.standby()
            replicated_url = replicated.new_database()
            results["replicated"] = {
                "one": one_session(replicated_url, "replicated", commits, rounds),
                "many": many_sessions(replicated_url, "replicated", 64, commits // 4, 3),
            }
    finally:
        for server in servers:
            server.stop()
    return results


def report(results: dict[str, Any]) -> str:
    lines = ["PostgreSQL (commits/s, medians of alternating rounds; ratios measured in this run)", ""]
    for durability in ("power", "replicated"):
        if durability not in results:
            lines.append(f"{durability}: not run (give a server with a synchronous standby with --postgres)")
            continue
        one, many = results[durability]["one"], results[durability]["many"]
        lines.append(f"{durability}, 1 session, 1 committer:")
        for name, rate in sorted(one["rates"].items(), key=lambda item: -item[1]):
            lines.append(f"  {name:<45} {rate:>10,.0f}")
        for name, reason in one["skipped"].items():
            lines.append(f"  {name:<45} skipped: {reason}")
        mine = one["rates"]["sessionlog"]
        bare = one["rates"].get("bare INSERT+COMMIT")
        peers = [
            rate for name, rate in one["rates"].items() if name not in ("sessionlog", "bare INSERT+COMMIT")
        ]
        if bare:
            lines.append(f"  sessionlog / bare INSERT+COMMIT: {mine / bare:.2f}x (bound >= 0.8x)")
        if peers:
            lines.append(f"  sessionlog / best peer: {mine / max(peers):.2f}x (bound >= 1.0x)")
        lines.append(f"{durability}, 64 sessions, one writer each:")
        for name, rate in sorted(many["rates"].items(), key=lambda item: -item[1]):
            lines.append(f"  {name:<60} {rate:>10,.0f}")
        for name, reason in many["skipped"].items():
            lines.append(f"  {name:<60} skipped: {reason}")
        best = max(rate for name, rate in many["rates"].items() if name.startswith("sessionlog"))
        lines.append(f"  best sessionlog / 1 session: {best / mine:.1f}x (bound >= 8x)")
        many_peers = [
            rate for name, rate in many["rates"].items() if not name.startswith(("sessionlog", "bare"))
        ]
        if many_peers:
            lines.append(f"  best sessionlog / best peer: {best / max(many_peers):.2f}x (bound >= 1.0x)")
        lines.append("")
    load = results["load"]
    lines.append(
        f"loading a 10,000-line session: reading its rows {load['read_ms']:.1f} ms, reducing them "
        f"{load['reduce_ms']:.1f} ms: {load['read_ms'] / load['reduce_ms']:.2f}x (bound <= 0.5x)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.postgres", description=__doc__.split("\n")[0])
    parser.add_argument("--postgres", metavar="URL", help="a server to use (else a throwaway one)")
    parser.add_argument("--full", action="store_true", help="more commits and rounds")
    args = parser.parse_args(argv)
    print(report(run(args.postgres, args.full)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

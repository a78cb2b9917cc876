"""The workloads, each as a job of `measure`: one round of one row.

* `sessions_job`: N sessions, one writer each (threads for sync stores, tasks for async ones);
  N = 1 is one session with one committer. `facts` facts a transaction.
* `committers_job`: one session, many asyncio tasks committing at once (async stores).
* `ceiling_job`: what the machine allows for the same shape: N threads each appending 500-byte
  lines to a file of its own, with `fdatasync` (or `syncfs`, for the rows syncing that way) after
  each (power) or without (process); on fresh files each round, or (`kept`, named `KEPT_OPEN`)
  on files opened before the first round and appended to across rounds, as the rows' sessions are.
* `postgres_ceiling_job`: what a PostgreSQL server allows one session: a bare INSERT of a
  500-byte line on one autocommit connection a commit (the ceiling of the rows on that server).
* `repository_job`: N sessions of one repository (a SQLite file, a PostgreSQL database) through
  its async twin, whose writer thread puts the commits queued meanwhile in one transaction.
* `Kept`: the sessions of `sessions_job`, `repository_job` and `peer_job` are opened before a
  row's first round and closed after its last, not remade each round.
* `load_job`, `listing_job`: reading a session back; `list` and `unfinished` over many sessions
  (filled by `restart.fill`).

Shapes g and h are in `resume` and `restart`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sessionlog
from sessionlog.backends.jsonl_file import DEFAULT_OPS
from sessionlog.core import facts as F

from .measure import WINDOW, Job, timed

HEADER: dict[str, Any] = {"provider": "bench", "model": "bench", "cwd": "/bench"}
TEXT = "x" * 380  # a user message of this makes a ~500-byte line


def transaction(index: int, facts: int) -> list[dict[str, Any]]:
    return [F.user_message(f"{index}:{part} {TEXT}") for part in range(facts)]


class Scratch:
    """A directory under the filesystem under test, removed at the end of the run."""

    def __init__(self, parent: str | None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="sessionlog-bench-", dir=parent))
        self._count = 0
        # The run's sessions sign their snapshots with a key of the scratch's (core.snapshot_key),
        # removed with it: never one made in the user's HOME, which may also be read-only.
        self._state = os.environ.get("SESSIONLOG_STATE_DIR")
        os.environ["SESSIONLOG_STATE_DIR"] = str(self.root / "state")

    def fresh(self) -> Path:
        self._count += 1
        folder = self.root / str(self._count)
        folder.mkdir()
        return folder

    def remove(self) -> None:
        if self._state is None:
            os.environ.pop("SESSIONLOG_STATE_DIR", None)
        else:
            os.environ["SESSIONLOG_STATE_DIR"] = self._state
        shutil.rmtree(self.root, ignore_errors=True)


def in_threads(sessions: int, commits: int, commit: Any) -> tuple[int, float, list[float]]:
    """`commit(session, index)` from one thread a session, started together (one session: in
    this thread)."""
    if sessions == 1:
        return timed(commits, lambda index: commit(0, index))
    start_line = threading.Barrier(sessions + 1)
    latencies: list[list[float]] = [[] for _ in range(sessions)]
    stopping = threading.Event()

    def one(session: int, index: int) -> None:
        if stopping.is_set():
            raise _Stopped
        commit(session, index)

    def run(session: int) -> None:
        try:
            start_line.wait()
            latencies[session] = timed(commits, lambda index: one(session, index), window=False)[2]
        except (threading.BrokenBarrierError, _Stopped):
            return  # the main thread was interrupted: it stops the round

    threads = [threading.Thread(target=run, args=(session,)) for session in range(sessions)]
    started: list[threading.Thread] = []  # one interrupted in its start() cannot be joined: it ends alone
    try:
        for thread in threads:
            thread.start()
            started.append(thread)
        WINDOW.start()
        start_line.wait()
        start = time.perf_counter()
        for thread in threads:
            thread.join()
    except BaseException:
        # Interrupted (Ctrl-C): a worker waiting at the start line, or committing, would keep the
        # process alive after the run's cleanup (threading's shutdown joins them).
        stopping.set()
        start_line.abort()
        for thread in started:
            thread.join()
        raise
    elapsed = time.perf_counter() - start
    WINDOW.stop()
    return sessions * commits, elapsed, [value for mine in latencies for value in mine]


class _Stopped(Exception):
    """A worker of `in_threads` stops: its main thread was interrupted."""


async def _in_tasks(sessions: int, commits: int, commit: Any) -> tuple[int, float, list[float]]:
    """`await commit(session, index)` from one task a session."""
    clock = time.perf_counter
    latencies: list[float] = []

    async def run(session: int) -> None:
        for index in range(commits):
            began = clock()
            await commit(session, index)
            latencies.append(clock() - began)

    WINDOW.start()
    start = clock()
    await asyncio.gather(*(run(session) for session in range(sessions)))
    elapsed = clock() - start
    WINDOW.stop()
    return sessions * commits, elapsed, latencies


def _sized_loop(workers: int) -> asyncio.AbstractEventLoop:
    """An event loop whose default executor has a thread for each of `workers` (asyncio's own has
    min(32, cpus + 4), which caps many fsyncing sessions at a fraction of what threads reach)."""
    loop = asyncio.new_event_loop()
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max(4, workers)))
    return loop


PREFILL_FACTS = 100  # facts a transaction when a session is filled before its timed commits

Opening = Callable[[], tuple[Job, Callable[[], Any]]]  # -> (one round, what closes it)


KEPT_UP_TO = 64  # sessions a row keeps open from its first round to its last


class Kept:
    """A job whose sessions are opened before its first round and kept until `close()`
    (`measure.close_all`, after its last round): opening 64 sessions (a SQLite session's schema,
    a peer's tables and connections) took most of a round's time, and redoing it each round
    measured nothing. Every round commits into the same sessions, each a round's commits
    longer; the timing and the flush window cover the commits only, as before."""

    def __init__(self, opening: Opening, sessions: int = 1) -> None:
        self._opening = opening
        self._round: Job | None = None
        self._close: Callable[[], Any] | None = None
        # Past KEPT_UP_TO sessions, opened and closed around each round: hundreds of held
        # sessions waiting through the other rows' rounds of a busy machine outlived their leases
        # (a `--full` run's 256 SQLite sessions were poisoned: SessionChangedError)
        self._keep = sessions <= KEPT_UP_TO

    def __call__(self) -> tuple[int, float, list[float]]:
        if self._round is None:
            self._round, self._close = self._opening()
        if self._keep:
            return self._round()
        try:
            return self._round()
        finally:
            self.close()

    def close(self) -> None:
        close, self._round, self._close = self._close, None, None
        if close is not None:
            close()


def sessions_job(
    scratch: Scratch,
    backend: str,
    sessions: int,
    commits: int,
    facts: int = 1,
    registry: Any = None,
    held: int = 0,
) -> Job:
    """`registry`: where `backend` is registered (None: the default one, third-party plugins too);
    `held`: facts each session holds before the timed commits (committed first, 100 a
    transaction, before the first round). The sessions are created once (`Kept`)."""
    info = sessionlog.backends(registry)[backend]
    fills = [transaction(index, PREFILL_FACTS) for index in range(-(-held // PREFILL_FACTS))]

    def commit(store: Any, index: int) -> Any:
        return store.commit(transaction(index, facts))

    def opening() -> tuple[Job, Callable[[], Any]]:
        folder = scratch.fresh()
        paths = [folder / f"{number}.session" for number in range(sessions)]
        if info.api == "sync":
            stores: list[Any] = []

            def close() -> None:
                try:
                    for store in stores:
                        store.close()
                finally:
                    shutil.rmtree(folder, ignore_errors=True)

            try:
                for path in paths:
                    stores.append(sessionlog.create(path, backend, registry=registry, **HEADER))
                    for fill in fills:
                        stores[-1].commit(fill)
            except BaseException:
                close()
                raise

            def one_round() -> tuple[int, float, list[float]]:
                return in_threads(sessions, commits, lambda session, index: commit(stores[session], index))

            return one_round, close

        loop = _sized_loop(sessions)
        opened: list[Any] = []

        async def create() -> None:
            for path in paths:
                opened.append(await sessionlog.create_async(path, backend, registry=registry, **HEADER))
                for fill in fills:
                    await opened[-1].commit(fill)

        async def close_all() -> None:
            for store in opened:
                await store.close()

        def close_async() -> None:
            try:
                loop.run_until_complete(close_all())
            finally:
                loop.close()
                shutil.rmtree(folder, ignore_errors=True)

        try:
            loop.run_until_complete(create())
        except BaseException:
            close_async()
            raise

        def async_round() -> tuple[int, float, list[float]]:
            return loop.run_until_complete(
                _in_tasks(sessions, commits, lambda session, index: commit(opened[session], index))
            )

        return async_round, close_async

    return Kept(opening, sessions)


def committers_job(
    scratch: Scratch, backend: str, committers: int, commits: int, registry: Any = None
) -> Job:
    """One session of an async backend, `committers` tasks committing at once."""

    def run() -> tuple[int, float, list[float]]:
        folder = scratch.fresh()

        async def main() -> tuple[int, float, list[float]]:
            store = await sessionlog.create_async(
                folder / "one.session", backend, registry=registry, **HEADER
            )
            try:
                return await _in_tasks(
                    committers, commits, lambda task, index: store.commit(transaction(index, 1))
                )
            finally:
                await store.close()

        loop = _sized_loop(4)
        try:
            return loop.run_until_complete(main())
        finally:
            loop.close()
            shutil.rmtree(folder, ignore_errors=True)

    return run


CEILINGS = ("os.write", "write+fdatasync", "write+syncfs")
KEPT_OPEN = ", kept open"  # the name of a ceiling's twin whose files are kept open across rounds


def ceiling_job(scratch: Scratch, sessions: int, commits: int, how: str, kept: bool = False) -> Job:
    """N threads each writing 500-byte lines to its own file, `how` one of CEILINGS (the sync, if
    any, after each line): new files each round, or (`kept`) files opened before the first round
    and closed after the last (`Kept`, as the rows' sessions are), each round appending to them."""
    if how not in CEILINGS:
        raise ValueError(f"a ceiling is one of {CEILINGS}, not {how!r}")
    line = b"x" * 499 + b"\n"
    sync = {"os.write": None, "write+fdatasync": os.fdatasync, "write+syncfs": DEFAULT_OPS.syncfs}[how]

    def opening() -> tuple[Job, Callable[[], Any]]:
        folder = scratch.fresh()
        fds: list[int] = []

        def close() -> None:
            try:
                for fd in fds:
                    os.close(fd)
            finally:
                shutil.rmtree(folder, ignore_errors=True)

        try:
            for number in range(sessions):
                fds.append(os.open(folder / f"{number}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        except BaseException:
            close()
            raise

        def write(session: int, index: int) -> None:
            os.write(fds[session], line)
            if sync is not None:
                sync(fds[session])

        return (lambda: in_threads(sessions, commits, write)), close

    if kept:
        return Kept(opening, sessions)

    def run() -> tuple[int, float, list[float]]:
        one_round, close = opening()
        try:
            return one_round()
        finally:
            close()

    return run


POSTGRES_CEILING = "PostgreSQL: INSERT+COMMIT"


def postgres_ceiling_job(url: str, commits: int) -> Job:
    """One thread, one autocommit psycopg connection, a bare `INSERT` of a 500-byte line a commit
    (one statement and its commit in one round trip, as a sessionlog commit's one statement is)
    into a table of the scratch database `url` (dropped with it)."""

    def opening() -> tuple[Job, Callable[[], Any]]:
        import psycopg

        connection = psycopg.connect(url, autocommit=True)
        connection.execute(
            "create table if not exists bench_bare_lines (number bigint primary key, line bytea)"
        )
        line, numbers = b"x" * 499 + b"\n", itertools.count()  # one thread: no lock

        def write(session: int, index: int) -> None:
            connection.execute("insert into bench_bare_lines values (%s, %s)", (next(numbers), line))

        return (lambda: in_threads(1, commits, write)), connection.close

    return Kept(opening, 1)


def sync_repository_job(location: Any, commits: int) -> Job:
    """One session of the repository `location()` gives, through its sync API, one committer
    (shape a: a repository's store as a single agent commits to it), made once (`Kept`)."""

    def opening() -> tuple[Job, Callable[[], Any]]:
        repo = sessionlog.repository(location())
        try:
            store = repo.create(**HEADER)
        except BaseException:
            repo.close()
            raise

        def close() -> None:
            try:
                store.close()
            finally:
                repo.close()

        return (lambda: in_threads(1, commits, lambda _, index: store.commit(transaction(index, 1)))), close

    return Kept(opening, 1)


def repository_job(location: Any, sessions: int, commits: int, **options: Any) -> Job:
    """N sessions of the repository `location()` gives, one task each, made once (`Kept`)."""

    def opening() -> tuple[Job, Callable[[], Any]]:
        loop = asyncio.new_event_loop()
        stores: list[Any] = []
        repos: list[Any] = []

        async def create() -> None:
            repos.append(await sessionlog.repository_async(location(), **options))
            for _ in range(sessions):
                stores.append(await repos[0].create(**HEADER))

        async def close_all() -> None:
            try:
                for store in stores:
                    await store.close()
            finally:
                for repo in repos:
                    await repo.close()

        def close() -> None:
            try:
                loop.run_until_complete(close_all())
            finally:
                loop.close()

        try:
            loop.run_until_complete(create())
        except BaseException:
            close()
            raise

        def one_round() -> tuple[int, float, list[float]]:
            return loop.run_until_complete(
                _in_tasks(
                    sessions, commits, lambda session, index: stores[session].commit(transaction(index, 1))
                )
            )

        return one_round, close

    return Kept(opening, sessions)


def load_job(path: Path, backend: str = "jsonl") -> Job:
    """Open the session at `path` and reduce it (read-only: the bytes, then the reducer)."""

    def run() -> tuple[int, float, list[float]]:
        start = time.perf_counter()
        state = sessionlog.reduce_bytes(path.read_bytes())
        elapsed = time.perf_counter() - start
        return state.last_seq, elapsed, [elapsed]

    return run


def parse_ceiling_job(path: Path) -> Job:
    """What any reader pays at least: split the lines and parse each with orjson."""
    import orjson

    def run() -> tuple[int, float, list[float]]:
        start = time.perf_counter()
        count = 0
        for line in path.read_bytes().split(b"\n"):
            if line:
                value = orjson.loads(line)
                count += len(value) if type(value) is list else 1
        elapsed = time.perf_counter() - start
        return count, elapsed, [elapsed]

    return run


def write_session(folder: Path, facts: int, compactions: int = 0) -> Path:
    """A session of an agent at work (`testing.sessions`, the bulk profile: prompts, model
    attempts, tool calls and results, usage) of `facts` facts and `compactions` compactions."""
    from sessionlog.testing.sessions import generate_session

    path = folder / f"load-{facts}-{compactions}.jsonl"
    path.write_bytes(generate_session(5, facts, profile="bulk", compactions=compactions).to_bytes())
    return path


def listing_job(repo: Any, call: str) -> Job:
    """One `list(limit=100)` or `unfinished()` of `repo`."""

    def run() -> tuple[int, float, list[float]]:
        start = time.perf_counter()
        repo.list(limit=100) if call == "list" else repo.unfinished()
        elapsed = time.perf_counter() - start
        return 1, elapsed, [elapsed]

    return run


@dataclass(frozen=True)
class Peer:
    """Another library in shapes a and c: `open(folder, session)` opens one session of it under
    `folder` (shared by the sessions of a round) and gives (commit(index), close)."""

    name: str
    durability: str
    open: Callable[[Path, int], tuple[Callable[[int], Any], Callable[[], Any]]]
    concurrent: bool = True  # also N sessions at once, a thread each
    # its N sessions kept open across the rounds (`Kept`); False for a connection a session to a
    # server: two such peers' 64 each would pass a default server's 100 connections
    kept_open: bool = True
    on_postgres: bool = False  # its data on the PostgreSQL server: measured against its ceiling


def peer_job(scratch: Scratch, peer: Peer, sessions: int, commits: int) -> Job:
    """A peer's N sessions, a thread each; opened once (`Kept`) unless the peer says otherwise
    (`Peer.kept_open`)."""

    def opening() -> tuple[Job, Callable[[], Any]]:
        folder = scratch.fresh()
        opened: list[tuple[Callable[[int], Any], Callable[[], Any]]] = []

        def close() -> None:
            try:
                for _, close_one in opened:
                    close_one()
            finally:
                shutil.rmtree(folder, ignore_errors=True)

        try:
            for session in range(sessions):
                opened.append(peer.open(folder, session))
        except BaseException:
            close()
            raise

        done = [0]  # commits of the rounds before: a round's indices follow them (a peer's key)

        def one_round() -> tuple[int, float, list[float]]:
            first, done[0] = done[0], done[0] + commits
            return in_threads(sessions, commits, lambda session, index: opened[session][0](first + index))

        return one_round, close

    if peer.kept_open:
        return Kept(opening, sessions)

    def run() -> tuple[int, float, list[float]]:
        one_round, close = opening()
        try:
            return one_round()
        finally:
            close()

    return run

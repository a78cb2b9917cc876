"""The async repositories: the same methods awaited; SQLite commits of many sessions share one
transaction (one writer thread), a fenced session fails alone."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from sessionlog.core import facts as F

HEADER: dict[str, Any] = {"provider": "openrouter", "model": "test/model", "cwd": "/w"}


def _location(kind: str, where: Path) -> str:
    where.mkdir(parents=True, exist_ok=True)
    return str(where / "repo") if kind == "directory" else f"sqlite:///{where / 'sessions.db'}"


@pytest.mark.parametrize("kind", ["directory", "sqlite"])
def test_the_async_twin_has_the_same_methods(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        repo = await sessionlog.repository_async(_location(kind, tmp_path))
        store = await repo.create(**HEADER, labels=["a"])
        await store.commit(F.accept_prompt("async task"))
        session_id = (await store.load()).session_id
        (row,) = await repo.list()
        assert row.status == "running" and row.labels == ("a",) and row.title == "async task"
        with pytest.raises(sessionlog.SessionLockedError):
            await repo.open(session_id)
        await store.close()
        assert [info.session_id for info in await repo.unfinished()] == [session_id]
        assert (await repo.load(session_id)).last_seq == 2
        forked = await repo.fork(session_id, 2)
        assert (await repo.latest(labels=[])) is not None
        exported = await repo.export(session_id)
        await repo.delete(session_id)
        assert await repo.import_(exported) == session_id
        assert {info.session_id for info in await repo.list()} == {session_id, forked}
        again = await repo.open(session_id)
        await again.commit([F.user_message("more")])
        await again.close()
        await repo.close()

    asyncio.run(main())


def test_sqlite_commits_of_many_sessions_share_transactions_and_all_land(tmp_path: Path) -> None:
    sessions, commits = 32, 20

    async def main() -> None:
        repo = await sessionlog.repository_async(_location("sqlite", tmp_path))
        stores = [await repo.create(**HEADER) for _ in range(sessions)]

        async def writer(store: Any, number: int) -> None:
            for index in range(commits):
                await store.commit([F.user_message(f"s{number} m{index}")])

        transactions = []
        real = repo.writer._write

        def counting(batch: list[Any]) -> None:
            transactions.append(len(batch))
            real(batch)

        repo.writer._write = counting  # type: ignore[method-assign]
        await asyncio.gather(*(writer(store, number) for number, store in enumerate(stores)))
        assert sum(transactions) == sessions * commits
        assert len(transactions) < sessions * commits  # batches of several sessions shared one
        for number, store in enumerate(stores):
            state = await repo.load((await store.load()).session_id)
            assert [m["content"] for m in state.transcript] == [f"s{number} m{i}" for i in range(commits)]
            await store.close()
        await repo.close()

    asyncio.run(main())


def test_sqlite_a_fenced_session_fails_alone_in_a_shared_transaction(tmp_path: Path) -> None:
    async def main() -> None:
        repo = await sessionlog.repository_async(_location("sqlite", tmp_path))
        fenced = await repo.create(**HEADER)
        neighbour = await repo.create(**HEADER)
        fenced_id = (await fenced.load()).session_id
        with repo.sync.transaction() as connection:  # another writer took `fenced` over
            connection.execute(
                "update sessions set writer = null, writer_epoch = writer_epoch + 1 where session_id = ?",
                (fenced_id,),
            )
        results = await asyncio.gather(
            fenced.commit([F.user_message("lost hold")]),
            neighbour.commit([F.user_message("fine")]),
            return_exceptions=True,
        )
        assert isinstance(results[0], sessionlog.StorePoisonedError) and "fenced" in str(results[0])
        assert not isinstance(results[1], BaseException)
        assert (await repo.load(fenced_id)).last_seq == 0
        assert (await neighbour.load()).last_seq == 1
        await fenced.close()
        await neighbour.close()
        await repo.close()

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_closing_the_repository_before_its_stores_never_hangs(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The next commit of a store whose repository was closed is refused, typed, and its close
    returns; the session is free for the next writer."""
    if kind == "postgresql":
        location = request.getfixturevalue("postgres_server").new_database()
    else:
        location = _location(kind, tmp_path)

    async def main() -> None:
        repo = await sessionlog.repository_async(location)
        store = await repo.create(**HEADER)
        await store.commit(F.accept_prompt("before the close"))
        session_id = (await store.load()).session_id
        await repo.close()
        # generous bounds: only a hang detector, never a timing verdict
        with pytest.raises((sessionlog.StoreClosedError, sessionlog.StorePoisonedError)) as caught:
            await asyncio.wait_for(store.commit([F.user_message("after the close")]), 60)
        assert "may or may not" not in str(caught.value)  # nothing was sent: known, and said
        assert "not written" in str(caught.value)
        await asyncio.wait_for(store.close(), 60)
        with pytest.raises(sessionlog.SessionLogError):
            await asyncio.wait_for(repo.list(), 60)
        again = await sessionlog.repository_async(location)
        reopened = await again.open(session_id)
        assert [m["content"] for m in (await reopened.load()).transcript] == ["before the close"]
        await reopened.commit([F.user_message("the next writer")])
        await reopened.close()
        await again.close()

    asyncio.run(main())


def test_a_batch_that_fails_unexpectedly_never_stops_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever goes wrong inside one batch (here the batch's outcomes do not match it) fails
    that batch's commits; the writer thread lives on for every later one."""

    async def main() -> None:
        repo = await sessionlog.repository_async(_location("sqlite", tmp_path))
        first, second = await repo.create(**HEADER), await repo.create(**HEADER)
        real = repo.sync.write_batch
        monkeypatch.setattr(repo.sync, "write_batch", lambda connection, batch: [])
        with pytest.raises(sessionlog.StorePoisonedError):
            await asyncio.wait_for(first.commit(F.accept_prompt("lost")), 60)  # a hang detector
        monkeypatch.setattr(repo.sync, "write_batch", real)
        await asyncio.wait_for(second.commit(F.accept_prompt("goes on")), 60)
        assert (await repo.load((await second.load()).session_id)).last_seq == 2
        await first.close()
        await second.close()
        await repo.close()

    asyncio.run(main())


def test_a_dropped_async_sqlite_store_gives_its_session_back(tmp_path: Path) -> None:
    """An async store dropped without `close()` gives its session up once collected, as a sync
    one does (its last batch is not kept alive by the writer thread)."""
    import gc

    async def main() -> None:
        repo = await sessionlog.repository_async(_location("sqlite", tmp_path))
        dropped, other = await repo.create(**HEADER), await repo.create(**HEADER)
        await dropped.commit(F.accept_prompt("dropped"))
        session_id = (await dropped.load()).session_id
        del dropped
        gc.collect()
        again = await repo.open(session_id)  # not SessionLockedError: the hold was given back
        await other.commit(F.accept_prompt("after the drop"))
        await again.commit([F.user_message("picked up")])
        assert [m["content"] for m in (await repo.load(session_id)).transcript] == ["dropped", "picked up"]
        await again.close()
        await other.close()
        await repo.close()

    asyncio.run(main())

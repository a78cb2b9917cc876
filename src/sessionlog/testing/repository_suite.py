"""The repository conformance suite: what every repository (a directory, SQLite, a third party's
scheme) must do, as a mixin a test class inherits in one line:

    from sessionlog.testing.repository_suite import RepositoryContract

    class TestMine(RepositoryContract):
        def location(self, where):          # a fresh, empty place under `where`
            return f"mine://{where}/sessions"

The default location is a directory. The tests need pytest; nothing here needs a plugin.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from sessionlog.core import facts as build

from .blocking import Blocking
from .sessions import READ_SNAPSHOT

HEADER: dict[str, Any] = {"provider": "openrouter", "model": "test/model", "cwd": "/w"}


def prompt(text: str) -> list[dict[str, Any]]:
    """A transaction that accepts a prompt: the session then has an unfinished run."""
    return build.accept_prompt(text)


def grow(store: sessionlog.SessionStore) -> None:
    """One more valid transaction in a session whose run is open: its model attempt."""
    state = store.load()
    context = state.active_context_through or ""
    store.commit([build.step_attempt(state.operation["operationId"], context, READ_SNAPSHOT)])


class RepositoryContract:
    """Mixin: every method of the repository API, one writer per session, fencing, listing,
    schema migrations. Hooks a repository kind overrides:

    * `location(where)`: a fresh, empty place under `where` (default: a directory);
    * `downgrade(where)`: turn the repository there into the previous schema version, as the
      previous sessionlog left it (None: no previous version; the migration tests skip);
    * `take_over(where, session_id)`: what another writer does to take the session (another host
      whose lease expired, a program replacing the file); the hold of the writer open now is lost.
    """

    def location(self, where: Path) -> str:
        return str(where / "repository")

    def repository(self, where: Path) -> Any:
        return sessionlog.repository(self.location(where))

    def downgrade(self, where: Path) -> None:
        pytest.skip(f"{type(self).__name__}: no previous schema version (no `downgrade` hook)")

    def take_over(self, where: Path, session_id: str) -> None:
        pytest.skip(f"{type(self).__name__}: no way to take a session over (no `take_over` hook)")

    def _opener(self) -> str:
        """Python source of `open_repository(location)` for a child process."""
        return "import sessionlog\nopen_repository = sessionlog.repository\n"

    def test_create_list_load_export_and_labels(self, tmp_path: Path) -> None:
        with self.repository(tmp_path) as repo:
            with repo.create(**HEADER, labels=["b", "a"]) as store:
                store.commit(prompt("Fix the failing build in CI, please"))
                first = store.load().session_id
            with repo.create(**HEADER) as store:
                second = store.load().session_id
            rows = repo.list()
            assert {row.session_id for row in rows} == {first, second}
            one = next(row for row in rows if row.session_id == first)
            assert one.title == "Fix the failing build in CI, please" and one.labels == ("a", "b")
            assert one.status == "needs-recovery" and one.last_seq == 2  # a run open, nobody holds it
            assert next(row for row in rows if row.session_id == second).status == "idle"
            assert repo.list(labels=["a"]) == [one]
            assert repo.load(first).last_seq == 2
            assert sessionlog.reduce_bytes(repo.export(first)) == repo.load(first)
            assert [row.session_id for row in repo.unfinished()] == [first]
            with repo.open(first):
                assert repo.list(status="running")[0].session_id == first  # a live writer holds it
                assert repo.unfinished() == []
                with pytest.raises(sessionlog.SessionLockedError):
                    repo.open(first)
            repo.label(second, ["x"])
            latest = repo.latest(labels=["x"])
            assert latest is not None and latest.session_id == second

    def test_listing_is_newest_first_in_pages(self, tmp_path: Path) -> None:
        with self.repository(tmp_path) as repo:
            for index in range(7):
                with repo.create(**HEADER) as store:
                    store.commit(prompt(f"task {index}"))
                time.sleep(0.003)  # distinct last-write times
            first = repo.list(limit=3)
            second = repo.list(limit=3, cursor=first[-1].cursor)
            third = repo.list(limit=3, cursor=second[-1].cursor)
            titles = [row.title for row in first + second + third]
            assert titles == [f"task {index}" for index in range(6, -1, -1)]
            assert repo.list(updated_after=first[1].updated_at - 1, limit=None) == first[:2]
            with pytest.raises(ValueError, match="cursor"):
                repo.list(cursor="nonsense")

    def test_fork_import_delete(self, tmp_path: Path) -> None:
        repo = self.repository(tmp_path / "a")
        with repo.create(**HEADER) as store:
            store.commit(prompt("first"))
            grow(store)
            source = store.load().session_id
        forked = repo.fork(source, 2)
        state = repo.load(forked)
        assert state.session_id == forked and state.last_seq == 2 and state.step is None
        with pytest.raises(ValueError, match="does not end a transaction"):
            repo.fork(source, 1)
        other = self.repository(tmp_path / "b")
        assert other.import_(repo.export(source)) == source
        assert other.load(source) == repo.load(source)
        with pytest.raises(sessionlog.SessionExistsError):
            other.import_(repo.export(source))
        with pytest.raises(sessionlog.CorruptionError):
            other.import_(repo.export(source)[:-5] + b"xxxx\n")
        with repo.open(source), pytest.raises(sessionlog.SessionLockedError):
            repo.delete(source)
        repo.delete(source)
        assert {row.session_id for row in repo.list()} == {forked}
        with pytest.raises(sessionlog.SessionNotFoundError):
            repo.delete(source)
        repo.close()
        other.close()

    def test_a_session_id_is_never_a_path(self, tmp_path: Path) -> None:
        with self.repository(tmp_path) as repo:
            for bad in ("../etc/passwd", "x", "", "0" * 36):
                with pytest.raises(ValueError, match="not a session id"):
                    repo.open(bad)
            assert repo.list() == []

    def test_a_writer_in_another_process_is_seen(self, tmp_path: Path) -> None:
        repo = self.repository(tmp_path)
        with repo.create(**HEADER) as store:
            store.commit(prompt("long task"))
            session_id = store.load().session_id
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys, sessionlog; s = sessionlog.repository(sys.argv[1]).open(sys.argv[2]); "
                "print('held', flush=True); sys.stdin.read()",
                self.location(tmp_path),
                session_id,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            (row,) = repo.list()
            assert row.status == "running" and row.writer
            with pytest.raises(sessionlog.SessionLockedError):
                repo.open(session_id)
        finally:
            holder.communicate("", timeout=30)
        assert repo.unfinished()[0].session_id == session_id  # its holder is gone
        with repo.open(session_id) as store:  # and a new writer takes it
            grow(store)
        repo.close()

    # -- one writer ------------------------------------------------------------------------

    def test_concurrent_first_writers_one_wins(self, tmp_path: Path) -> None:
        with self.repository(tmp_path) as repo:
            with repo.create(**HEADER) as store:
                session_id = store.load().session_id
            start = threading.Barrier(8)
            outcomes: list[Any] = []

            def open_it() -> None:
                start.wait()
                try:
                    outcomes.append(repo.open(session_id))
                except sessionlog.SessionLockedError as error:
                    outcomes.append(error)

            threads = [threading.Thread(target=open_it) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            winners = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
            assert len(outcomes) == 8 and len(winners) == 1, outcomes
            winners[0].commit([build.user_message("the one writer")])
            winners[0].close()
            assert repo.load(session_id).transcript[-1]["content"] == "the one writer"

    def test_a_writer_that_lost_its_hold_writes_nothing(self, tmp_path: Path) -> None:
        with self.repository(tmp_path) as repo:
            store = repo.create(**HEADER)
            store.commit(prompt("mine"))
            session_id = store.load().session_id
            self.take_over(tmp_path, session_id)
            before = repo.export(session_id)
            with pytest.raises(sessionlog.StorePoisonedError):
                store.commit([build.user_message("too late")])
            assert repo.export(session_id) == before
            store.close()

    # -- schema versions -------------------------------------------------------------------

    def test_a_repository_of_the_previous_schema_is_migrated(self, tmp_path: Path) -> None:
        with self.repository(tmp_path) as repo:
            with repo.create(**HEADER, labels=["kept"]) as store:
                store.commit(prompt("from before the upgrade"))
                session_id = store.load().session_id
            with repo.create(**HEADER):
                pass
            before = repo.list()
        self.downgrade(tmp_path)
        with self.repository(tmp_path) as repo:
            assert repo.list() == before
            assert [row.session_id for row in repo.unfinished()] == [session_id]
            with repo.open(session_id) as store:
                grow(store)
            assert repo.list(labels=["kept"])[0].last_seq == 3

    def test_many_processes_opening_an_old_repository_at_once_all_succeed(self, tmp_path: Path) -> None:
        with self.repository(tmp_path) as repo, repo.create(**HEADER) as store:
            store.commit(prompt("migrate me"))
            session_id = store.load().session_id
        self.downgrade(tmp_path)
        source = self._opener() + (
            "import sys\nrepo = open_repository(sys.argv[1])\n"
            "print(len(repo.list()), repo.load(sys.argv[2]).last_seq)\nrepo.close()\n"
        )
        children = [
            subprocess.Popen(
                [sys.executable, "-c", source, self.location(tmp_path), session_id],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(6)
        ]
        answers = [child.communicate(timeout=120) for child in children]
        assert [out.split() for out, _ in answers] == [["1", "2"]] * 6, [error for _, error in answers]
        with self.repository(tmp_path) as repo:
            assert [row.session_id for row in repo.unfinished()] == [session_id]


class AsyncRepositoryContract(RepositoryContract):
    """The same tests through `sessionlog.repository_async`: each call of the async repository
    and of its stores runs to completion on the test's own event loop (`Blocking`)."""

    loop: asyncio.AbstractEventLoop

    @pytest.fixture(autouse=True)
    def _event_loop(self) -> Iterator[None]:
        self.loop = asyncio.new_event_loop()
        yield
        self.loop.close()

    def repository(self, where: Path) -> Any:
        opened = self.loop.run_until_complete(sessionlog.repository_async(self.location(where)))
        return Blocking(opened, self.loop)

    def test_concurrent_first_writers_one_wins(self, tmp_path: Path) -> None:
        with self.repository(tmp_path) as repo:
            with repo.create(**HEADER) as store:
                session_id = store.load().session_id

            async def open_at_once() -> list[Any]:
                opens = [repo._thing.open(session_id) for _ in range(8)]
                return await asyncio.gather(*opens, return_exceptions=True)

            outcomes = self.loop.run_until_complete(open_at_once())
            winners = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
            assert len(winners) == 1, outcomes
            assert all(
                isinstance(outcome, sessionlog.SessionLockedError)
                for outcome in outcomes
                if outcome not in winners
            )
            self.loop.run_until_complete(winners[0].close())

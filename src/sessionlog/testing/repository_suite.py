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
from .repository_keys import KeysContract
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


class RepositoryContract(KeysContract):
    """Mixin: every method of the repository API, one writer per session, fencing, listing,
    schema migrations, caller keys (`repository_keys`). Hooks a repository kind overrides:

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

    # -- inputs ----------------------------------------------------------------------------

    def test_labels_and_filters_are_checked_at_the_door(self, tmp_path: Path) -> None:
        """A value of the wrong kind is refused naming what is wrong, never stored changed (a str
        is iterable: `labels="support"` must not become the labels o, p, r, s, t, u) and never
        met as a raw driver error (an out-of-range limit or cursor)."""
        with self.repository(tmp_path) as repo:
            with repo.create(**HEADER, labels=["kept"]) as store:
                session_id = store.load().session_id
            for labels in ("support", b"support", 7, None, ["ok", 3], ["ok", ""], [b"x"], ["x" * 201]):
                with pytest.raises((TypeError, ValueError), match="label"):
                    repo.label(session_id, labels)
                with pytest.raises((TypeError, ValueError), match="label"):
                    repo.create(**HEADER, labels=labels)
                if labels is not None:  # None: no label filter
                    with pytest.raises((TypeError, ValueError), match="label"):
                        repo.list(labels=labels)
            assert [(row.session_id, row.labels) for row in repo.list()] == [(session_id, ("kept",))]
            refused: list[dict[str, Any]] = [
                {"status": "needs_recovery"},
                {"status": ["idle", "stopped"]},
                {"status": b"idle"},
                {"status": 1},
                {"limit": 2**63},
                {"limit": -1},
                {"limit": 0},
                {"limit": True},
                {"limit": 1.5},
                {"limit": "10"},
                {"updated_after": 2**63},
                {"updated_after": -(2**63) - 1},
                {"updated_after": True},
                {"updated_before": "yesterday"},
                {"cursor": "nonsense"},
                {"cursor": f"{2**64}:{session_id}"},
                {"cursor": f"-1:{session_id}"},
                {"cursor": "1:x"},
                {"cursor": f"\u00b2:{session_id}"},
                {"cursor": 5},
            ]
            for filters in refused:
                (name,) = filters
                with pytest.raises((TypeError, ValueError), match=name) as caught:
                    repo.list(**filters)
                assert isinstance(caught.value, sessionlog.SessionLogError | ValueError | TypeError)
                assert type(caught.value).__module__.split(".")[0] in ("sessionlog", "builtins"), filters
            with pytest.raises(ValueError, match="needs-recovery"):  # the message names the known ones
                repo.list(status="needs_recovery")
            assert repo.list(limit=2**63 - 1, updated_after=0, status=("idle", "running"))[0].session_id == (
                session_id
            )
            assert repo.list(cursor=f"{2**63 - 1}:{session_id}") != []
            assert repo.list(labels=iter(["kept"]))[0].session_id == session_id  # any iterable, once
            for at_seq in (False, True, "0", 0.0, None):  # fork(id, False) is no fork at seq 0
                with pytest.raises(TypeError, match="at_seq"):
                    repo.fork(session_id, at_seq)
            with pytest.raises(TypeError):
                repo.import_(repo.export(session_id).decode())
            assert [row.session_id for row in repo.list()] == [session_id]  # nothing was made

    def test_text_bytes_and_keywords_are_checked_at_the_door(self, tmp_path: Path) -> None:
        """What cannot be stored as UTF-8 (a lone surrogate) is a ValueError before anything is
        made, in a label and in every header string; `import_` takes bytes and refuses a str
        with the same TypeError in every kind (a bytearray or memoryview is taken as bytes); an
        unknown keyword of `create` is a TypeError naming the known ones; a missing session's
        message is plain words, not `[Errno 0] ...: 'path'`."""
        with self.repository(tmp_path) as repo:
            with repo.create(**HEADER) as store:
                store.commit(prompt("hello"))
                session_id = store.load().session_id
            for labels in (["\ud800"], ["ok", "a\udfffb"]):
                with pytest.raises(ValueError, match="label"):
                    repo.create(**HEADER, labels=labels)
                with pytest.raises(ValueError, match="label"):
                    repo.label(session_id, labels)
            for key in ("provider", "model", "cwd", "environment_identity"):
                with pytest.raises(ValueError, match=key):
                    repo.create(**{**HEADER, key: "x\ud800"})
            with pytest.raises(TypeError, match="session_id") as caught:
                repo.create(**HEADER, session_id="0190a6b2-0000-7000-8000-000000000000")
            assert "provider" in str(caught.value) and "labels" in str(caught.value)
            for missing in ("provider", "model"):  # a TypeError naming it, with a key too
                without = {name: value for name, value in HEADER.items() if name != missing}
                for keyed in ({}, {"key": "k"}):
                    with pytest.raises(TypeError, match=missing):
                        repo.create(**without, **keyed)
            assert [(row.session_id, row.labels) for row in repo.list()] == [(session_id, ())]
            data = repo.export(session_id)
            for wrong in (data.decode(), None, 7):
                with pytest.raises(TypeError, match="a session to import is bytes"):
                    repo.import_(wrong)
            repo.delete(session_id)
            assert repo.import_(memoryview(data)) == session_id
            repo.delete(session_id)
            assert repo.import_(bytearray(data)) == session_id
            assert repo.export(session_id) == data
            missing = "0190a6b2-0000-7000-8000-000000000000"
            with pytest.raises(sessionlog.SessionNotFoundError) as not_found:
                repo.load(missing)
            assert "Errno" not in str(not_found.value) and missing in str(not_found.value)

    def test_a_closed_repository_refuses_everything(self, tmp_path: Path) -> None:
        """After close(), every operation is a RepositoryError "the repository is closed",
        never done on a closed repository as if it were open."""
        repo = self.repository(tmp_path)
        with repo.create(**HEADER) as store:
            store.commit(prompt("hello"))
            session_id = store.load().session_id
        data = repo.export(session_id)
        repo.close()
        calls: list[tuple[str, Any]] = [
            ("create", lambda: repo.create(**HEADER)),
            ("open", lambda: repo.open(session_id)),
            ("load", lambda: repo.load(session_id)),
            ("export", lambda: repo.export(session_id)),
            ("import", lambda: repo.import_(data)),
            ("fork", lambda: repo.fork(session_id, 1)),
            ("delete", lambda: repo.delete(session_id)),
            ("label", lambda: repo.label(session_id, ["x"])),
            ("list", lambda: repo.list()),
            ("latest", lambda: repo.latest()),
            ("unfinished", lambda: repo.unfinished()),
        ]
        for name, call in calls:
            with pytest.raises(sessionlog.RepositoryError, match="the repository is closed") as caught:
                call()
            assert caught.value.operation == name
        repo.close()  # idempotent
        reopened = self.repository(tmp_path)
        try:
            assert [row.session_id for row in reopened.list()] == [session_id]  # nothing was done
            assert reopened.export(session_id) == data
        finally:
            reopened.close()

    # -- threads ---------------------------------------------------------------------------

    def test_one_repository_shared_by_eight_threads(self, tmp_path: Path) -> None:
        """Eight threads share ONE repository object: each creates, labels, lists, opens, commits
        and deletes sessions of its own, and all of them open, commit to and delete the same few
        shared sessions at once. Checked exactly afterwards: no error but a refusal (a held or
        deleted session), every label set is there, every acknowledged commit is there, a
        deleted session is gone, and no delete succeeded while a writer held its session."""
        rounds = 4
        with self.repository(tmp_path) as repo:
            shared = []
            for _ in range(3):
                with repo.create(**HEADER) as store:
                    shared.append(store.load().session_id)
            history = _History()
            own: dict[int, list[str]] = {}
            start = threading.Barrier(8)

            def work(worker: int) -> None:
                start.wait()
                mine = own.setdefault(worker, [])
                for turn in range(rounds):
                    with repo.create(**HEADER, labels=[f"w{worker}"]) as store:
                        session_id = store.load().session_id
                        mine.append(session_id)
                        writer = history.opened(session_id)
                        text = f"{worker}/{turn}/new"
                        store.commit([build.user_message(text)])
                        history.acknowledged(session_id, text)
                        history.closing(writer)
                    history.labelled(session_id, (f"turn{turn}", f"w{worker}"))
                    repo.label(session_id, [f"w{worker}", f"turn{turn}"])
                    assert session_id in {
                        row.session_id for row in repo.list(labels=[f"w{worker}"], limit=None)
                    }
                    with repo.open(mine[0]) as store:  # one of its own, again
                        writer = history.opened(mine[0])
                        text = f"{worker}/{turn}/again"
                        store.commit([build.user_message(text)])
                        history.acknowledged(mine[0], text)
                        history.closing(writer)
                    assert repo.load(mine[0]).transcript[-1]["content"] == text
                    if turn % 2 == 1:  # its newest but one goes
                        victim = mine.pop(-2)
                        repo.delete(victim)
                        history.deleted(victim)
                    target = shared[(worker + turn) % len(shared)]
                    try:
                        with repo.open(target) as store:
                            writer = history.opened(target)
                            text = f"{worker}/{turn}/shared"
                            try:
                                store.commit([build.user_message(text)])
                            except sessionlog.StorePoisonedError:
                                history.fenced.add(target)  # deleted under a writer: fenced
                            else:
                                history.acknowledged(target, text)
                            history.closing(writer)
                    except (sessionlog.SessionLockedError, sessionlog.SessionNotFoundError):
                        pass  # held by another thread, or deleted by one
                    if (worker + turn) % 8 == 3:
                        doomed = shared[turn % len(shared)]
                        try:
                            repo.delete(doomed)
                        except (sessionlog.SessionLockedError, sessionlog.SessionNotFoundError):
                            pass  # held by a writer, or deleted already
                        else:
                            history.deleted(doomed)
                    repo.list(limit=None)
                    repo.unfinished()

            errors = _run_threads(work, 8)
            assert errors == [], f"{len(errors)} threads failed; the first:\n{errors[0]}"
            history.check_deletes()
            rows = {row.session_id: row for row in repo.list(limit=None)}
            for sessions in own.values():
                for session_id in sessions:
                    assert rows[session_id].labels == history.labels[session_id], session_id
                    assert rows[session_id].status == "idle"
            gone = history.gone()
            assert not gone & set(rows)
            for session_id in gone:
                with pytest.raises(sessionlog.SessionNotFoundError):
                    repo.load(session_id)
            for session_id, texts in history.acks.items():
                if session_id in gone:
                    continue
                transcript = [message["content"] for message in repo.load(session_id).transcript]
                assert transcript == texts, session_id  # every acknowledged commit, in order
            expected = {session_id for sessions in own.values() for session_id in sessions}
            assert set(rows) == expected | (set(shared) - gone)

    def test_threads_racing_to_label_and_list_one_session(self, tmp_path: Path) -> None:
        """Eight threads label one session over and over and list it between: every listing
        shows one whole label set, and afterwards the labels are one thread's last set."""
        with self.repository(tmp_path) as repo:
            with repo.create(**HEADER) as store:
                session_id = store.load().session_id
            last: dict[int, tuple[str, ...]] = {}
            start = threading.Barrier(8)

            def work(worker: int) -> None:
                start.wait()
                for turn in range(15):
                    labels = (f"t{turn:02}", f"w{worker}")
                    repo.label(session_id, list(labels))
                    last[worker] = labels
                    (row,) = repo.list(limit=None)
                    assert row.session_id == session_id and len(row.labels) == 2, row.labels

            errors = _run_threads(work, 8)
            assert errors == [], f"{len(errors)} threads failed; the first:\n{errors[0]}"
            (row,) = repo.list()
            assert row.labels in {labels for labels in last.values() if labels[0] == "t14"}

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


class _History:
    """What the threads did, in the order it happened (Jepsen's history, in small): writers
    opened and closing, commits acknowledged, deletes begun and done, labels set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clock = 0
        self.acks: dict[str, list[str]] = {}
        self.labels: dict[str, tuple[str, ...]] = {}
        self.writers: list[list[Any]] = []  # [session, opened at, closing at or None]
        self.deletes: list[tuple[str, int]] = []  # session, done at
        self.fenced: set[str] = set()

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def opened(self, session_id: str) -> int:
        with self._lock:
            self.writers.append([session_id, self._tick(), None])
            return len(self.writers) - 1

    def closing(self, writer: int) -> None:
        with self._lock:
            self.writers[writer][2] = self._tick()

    def acknowledged(self, session_id: str, text: str) -> None:
        with self._lock:
            self.acks.setdefault(session_id, []).append(text)

    def labelled(self, session_id: str, labels: tuple[str, ...]) -> None:
        with self._lock:
            self.labels[session_id] = labels

    def deleted(self, session_id: str) -> None:
        with self._lock:
            self.deletes.append((session_id, self._tick()))

    def gone(self) -> set[str]:
        return {session_id for session_id, _ in self.deletes}

    def check_deletes(self) -> None:
        """No delete completed while a writer that opened the session before it was still open
        (that writer's acknowledged commits would go with the session); a writer fenced only
        where its session was deleted under it."""
        for session_id, done in self.deletes:
            for writer, opened, closing in self.writers:
                if writer == session_id and opened < done:
                    assert closing is not None and closing < done, (
                        f"session {session_id} was deleted while a writer held it"
                    )
        assert self.fenced <= self.gone(), self.fenced - self.gone()


def _run_threads(work: Any, count: int) -> list[str]:
    """Run `work(index)` on `count` threads; the tracebacks of those that raised."""
    import traceback

    errors: list[str] = []

    def run(index: int) -> None:
        try:
            work(index)
        except BaseException:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


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

    def test_one_repository_shared_by_eight_threads(self, tmp_path: Path) -> None:
        pytest.skip("an async repository belongs to one event loop: tasks share it, not threads")

    def test_threads_racing_to_label_and_list_one_session(self, tmp_path: Path) -> None:
        pytest.skip("an async repository belongs to one event loop: tasks share it, not threads")

    def test_processes_racing_for_one_key_agree_on_its_session(self, tmp_path: Path) -> None:
        pytest.skip("the racing processes use the sync API: the sync contract of this kind runs it")

    def test_one_repository_shared_by_eight_tasks(self, tmp_path: Path) -> None:
        """The async twin of the eight threads: eight tasks on the repository's loop create,
        label, list, open, commit to and delete sessions, their own and a few shared ones, at
        once. Checked exactly as for the threads."""
        with self.repository(tmp_path) as blocking:
            repo = blocking._thing
            shared = []
            for _ in range(3):
                with blocking.create(**HEADER) as store:
                    shared.append(store.load().session_id)
            history = _History()
            own: dict[int, list[str]] = {}

            async def work(worker: int) -> None:
                mine = own.setdefault(worker, [])
                for turn in range(4):
                    store = await repo.create(**HEADER, labels=[f"w{worker}"])
                    session_id = (await store.load()).session_id
                    mine.append(session_id)
                    writer = history.opened(session_id)
                    await store.commit([build.user_message(f"{worker}/{turn}/new")])
                    history.acknowledged(session_id, f"{worker}/{turn}/new")
                    history.closing(writer)
                    await store.close()
                    history.labelled(session_id, (f"turn{turn}", f"w{worker}"))
                    await repo.label(session_id, [f"w{worker}", f"turn{turn}"])
                    listed = await repo.list(labels=[f"w{worker}"], limit=None)
                    assert session_id in {row.session_id for row in listed}
                    if turn % 2 == 1:  # its newest but one goes
                        victim = mine.pop(-2)
                        await repo.delete(victim)
                        history.deleted(victim)
                    target = shared[(worker + turn) % len(shared)]
                    try:
                        store = await repo.open(target)
                    except (sessionlog.SessionLockedError, sessionlog.SessionNotFoundError):
                        continue
                    writer = history.opened(target)
                    try:
                        await store.commit([build.user_message(f"{worker}/{turn}/shared")])
                        history.acknowledged(target, f"{worker}/{turn}/shared")
                    except sessionlog.StorePoisonedError:
                        history.fenced.add(target)
                    history.closing(writer)
                    await store.close()
                    if (worker + turn) % 8 == 3:
                        doomed = shared[turn % len(shared)]
                        try:
                            await repo.delete(doomed)
                        except (sessionlog.SessionLockedError, sessionlog.SessionNotFoundError):
                            pass
                        else:
                            history.deleted(doomed)
                    await repo.unfinished()

            async def all_at_once() -> list[Any]:
                return await asyncio.gather(*(work(worker) for worker in range(8)), return_exceptions=True)

            outcomes = self.loop.run_until_complete(all_at_once())
            assert [outcome for outcome in outcomes if outcome is not None] == []
            history.check_deletes()
            rows = {row.session_id: row for row in blocking.list(limit=None)}
            gone = history.gone()
            for sessions in own.values():
                for session_id in sessions:
                    assert rows[session_id].labels == history.labels[session_id], session_id
            for session_id, texts in history.acks.items():
                if session_id in gone:
                    continue
                transcript = [message["content"] for message in blocking.load(session_id).transcript]
                assert transcript == texts, session_id
            expected = {session_id for sessions in own.values() for session_id in sessions}
            assert set(rows) == expected | (set(shared) - gone)

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

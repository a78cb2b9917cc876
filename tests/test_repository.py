"""Repositories: many sessions in one place. Every behaviour runs for the directory repository
(one file per session, an index) and the SQLite repository (one database, a summary row per
session)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from sessionlog.core import facts as F
from sessionlog.core.ids import new_id
from sessionlog.repositories import directory as directory_module
from sessionlog.repositories import sqlite as sqlite_module
from sessionlog.repositories.index import INDEX_NAME
from sessionlog.testing.repository_suite import AsyncRepositoryContract, RepositoryContract
from sessionlog.testing.sessions import READ_SNAPSHOT
from test_recovery import CURRENT

HEADER: dict[str, Any] = {"provider": "openrouter", "model": "test/model", "cwd": "/w"}
KINDS = ["directory", "sqlite"]


def _repository(kind: str, where: Path) -> Any:
    if kind == "directory":
        return sessionlog.repository(where)
    where.mkdir(parents=True, exist_ok=True)
    return sessionlog.repository(f"sqlite:///{where / 'sessions.db'}")


class DirectoryHooks:
    def downgrade(self, where: Path) -> None:
        """The index as sessionlog left it before schema versions: no version table."""
        with contextlib.closing(sqlite3.connect(where / "repository" / INDEX_NAME)) as connection:
            connection.execute("drop table schema_version")
            connection.commit()

    def take_over(self, where: Path, session_id: str) -> None:
        """Another program puts a new file in the session's place."""
        path = where / "repository" / f"{session_id}.jsonl"
        copy = path.with_name("copy")
        copy.write_bytes(path.read_bytes())
        os.replace(copy, path)


class SQLiteHooks:
    def location(self, where: Path) -> str:
        where.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{where / 'sessions.db'}"

    def downgrade(self, where: Path) -> None:
        """Schema version 1: no `idle` column, no caller keys."""
        with contextlib.closing(sqlite3.connect(where / "sessions.db")) as connection:
            connection.executescript(
                "drop table session_keys; drop index sessions_open; alter table sessions drop column idle; "
                "update schema_version set version = 1;"
            )

    def take_over(self, where: Path, session_id: str) -> None:
        """A writer on another host takes the session (its hold of the row, a new epoch)."""
        with contextlib.closing(sqlite3.connect(where / "sessions.db")) as connection:
            connection.execute(
                "update sessions set writer = 'elsewhere:1', writer_epoch = writer_epoch + 1 "
                "where session_id = ?",
                (session_id,),
            )
            connection.commit()


class TestDirectoryRepository(DirectoryHooks, RepositoryContract):
    pass


class TestSQLiteRepository(SQLiteHooks, RepositoryContract):
    pass


class TestAsyncDirectoryRepository(DirectoryHooks, AsyncRepositoryContract):
    pass


class TestAsyncSQLiteRepository(SQLiteHooks, AsyncRepositoryContract):
    pass


def _user(text: str) -> list[dict[str, Any]]:
    return F.accept_prompt(text)


def test_listing_reduces_only_what_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = sessionlog.repository(tmp_path)
    ids = []
    for index in range(5):
        with repo.create(**HEADER) as store:
            store.commit(_user(f"task {index}"))
            ids.append(store.load().session_id)
    reduced: list[str] = []
    real = directory_module.summary_of

    def counting(state: sessionlog.SessionState, data: bytes, updated_at: int) -> dict[str, Any]:
        reduced.append(state.session_id)
        return real(state, data, updated_at)

    monkeypatch.setattr(directory_module, "summary_of", counting)
    assert len(repo.list()) == 5 and len(reduced) == 5
    assert len(repo.list()) == 5 and len(reduced) == 5  # nothing changed: nothing reduced
    with repo.open(ids[2]) as store:
        _grow(store)
    assert len(repo.list()) == 5 and reduced[5:] == [ids[2]]
    assert len(sessionlog.repository(tmp_path).list()) == 5 and len(reduced) == 6  # the index persists
    repo.close()


def _grow(store: sessionlog.SessionStore) -> None:
    """One more valid transaction: the run's model attempt."""
    state = store.load()
    store.commit(
        [F.step_attempt(state.operation["operationId"], state.active_context_through or "", READ_SNAPSHOT)]
    )


def test_paging_newest_first(tmp_path: Path) -> None:
    repo = sessionlog.repository(tmp_path)
    for index in range(7):
        with repo.create(**HEADER) as store:
            store.commit(_user(f"task {index}"))
            session_id = store.load().session_id
        os.utime(repo.path(session_id), ns=(index * 10**9, index * 10**9))
    first = repo.list(limit=3)
    second = repo.list(limit=3, cursor=first[-1].cursor)
    third = repo.list(limit=3, cursor=second[-1].cursor)
    titles = [row.title for row in first + second + third]
    assert titles == [f"task {index}" for index in range(6, -1, -1)]
    assert repo.list(updated_after=4000, limit=None) == first[:2]
    with pytest.raises(ValueError, match="cursor"):
        repo.list(cursor="nonsense")
    repo.close()


def test_a_corrupt_session_is_listed_as_such(tmp_path: Path) -> None:
    repo = sessionlog.repository(tmp_path)
    with repo.create(**HEADER) as store:
        session_id = store.load().session_id
    with open(repo.path(session_id), "ab") as file:
        file.write(b"not json\n")
    (row,) = repo.list()
    assert row.status == "corrupt" and "MALFORMED_JSON" in (row.error or "")
    repo.close()


def test_sqlite_a_writer_that_lost_its_hold_is_fenced(tmp_path: Path) -> None:
    repo = _repository("sqlite", tmp_path)
    store = repo.create(**HEADER)
    session_id = store.load().session_id
    store.commit(_user("first"))
    # Another writer takes the session over (as after a crash of this host's holder).
    with repo.transaction() as connection:
        connection.execute("update sessions set writer = null, writer_epoch = writer_epoch + 1")
    with repo.open(session_id) as taker:
        assert taker.load().last_seq == 2
    before = repo.export(session_id)
    with pytest.raises(sessionlog.StorePoisonedError, match="fenced"):
        _grow(store)
    assert repo.export(session_id) == before  # nothing of the fenced writer was written
    store.close()
    repo.close()


def test_sqlite_two_processes_commit_to_different_sessions_of_one_file(tmp_path: Path) -> None:
    repo = _repository("sqlite", tmp_path)
    ids = []
    for _ in range(2):
        with repo.create(**HEADER) as store:
            ids.append(store.load().session_id)
    script = (
        "import sys, sessionlog\n"
        "from sessionlog.core import facts as F\n"
        "repo = sessionlog.repository(sys.argv[1])\n"
        "with repo.open(sys.argv[2]) as store:\n"
        "    for n in range(60):\n"
        "        store.commit([F.user_message(f'm{n}')])\n"
    )
    location = f"sqlite:///{tmp_path / 'sessions.db'}"
    workers = [subprocess.Popen([sys.executable, "-c", script, location, session_id]) for session_id in ids]
    assert [worker.wait(timeout=120) for worker in workers] == [0, 0]
    assert [repo.load(session_id).last_seq for session_id in ids] == [60, 60]
    repo.close()


@pytest.mark.parametrize("others", ["commit", "stall"])
def test_sqlite_a_writer_waits_while_others_commit_and_gives_up_when_nobody_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, others: str
) -> None:
    """SQLite's write lock is not fair: on a busy disk the writers of other sessions of the file
    can hold it, commit after commit, for longer than the busy limit in all. A writer waiting for
    it waits on while they commit (it used to give up after 5 s of that, its store poisoned), and
    gives up (SessionLockedError) once the limit passed with no commit by anyone. On a virtual clock: each
    retry's sleep is a second in which the other writer commits and takes the lock again, or not."""
    repo = _repository("sqlite", tmp_path)
    with repo.create(**HEADER) as made:
        other_id = made.load().session_id
    store = repo.create(**HEADER)
    session_id = store.load().session_id
    limit = sqlite_module._BUSY_SECONDS
    held_for = 4 * limit  # virtual seconds the other writer keeps the lock
    clock = types.SimpleNamespace(now=0.0, commits=0)
    other = sqlite3.connect(tmp_path / "sessions.db", isolation_level=None)

    def sleep(seconds: float) -> None:
        clock.now += 1.0
        if clock.now > 20 * held_for:  # a hang detector, on the virtual clock
            raise AssertionError(f"the writer still waited after {clock.now:.0f} virtual seconds")
        if others == "commit" and other.in_transaction:
            other.execute("update sessions set updated_at = updated_at + 1 where session_id = ?", (other_id,))
            other.execute("commit")
            clock.commits += 1
            if clock.now < held_for:
                other.execute("begin immediate")

    monkeypatch.setattr(
        sqlite_module, "time", types.SimpleNamespace(monotonic=lambda: clock.now, sleep=sleep)
    )
    other.execute("begin immediate")
    try:
        if others == "commit":
            store.commit(_user("after the others"))
            assert clock.now >= held_for > limit and clock.commits >= held_for  # waited past the limit
        else:
            with pytest.raises(sessionlog.StorePoisonedError) as refused:
                store.commit(_user("never"))
            assert isinstance(refused.value.__cause__, sessionlog.SessionLockedError), refused.value
            assert "no commit by any writer" in str(refused.value.__cause__)
            assert limit <= clock.now <= limit + 2  # the limit, counted from the last commit seen
    finally:
        if other.in_transaction:
            other.rollback()
        other.close()
    monkeypatch.undo()
    store.close()
    landed = [message["content"] for message in repo.load(session_id).transcript]
    assert landed == (["after the others"] if others == "commit" else [])
    repo.close()


def test_sqlite_refuses_a_file_that_is_not_its_database(tmp_path: Path) -> None:
    bogus = tmp_path / "not.db"
    bogus.write_bytes(b"this is not a database" * 100)
    with pytest.raises(sessionlog.SessionPathError):
        sessionlog.repository(f"sqlite:///{bogus}")
    assert bogus.read_bytes() == b"this is not a database" * 100


def test_a_third_party_repository_scheme_registers_through_the_hook(tmp_path: Path) -> None:
    from sessionlog.plugins.hookspecs import hookimpl
    from sessionlog.plugins.registry import Registry, plugin_manager

    class Plugin:
        @staticmethod
        @hookimpl
        def register_repositories(register: Any) -> None:
            register("mine", lambda rest, **options: ("mine", rest, options))

    registry = Registry(plugin_manager(plugins=[Plugin()]))
    assert sessionlog.repository("mine://x/y", registry=registry, flag=1) == ("mine", "x/y", {"flag": 1})
    with pytest.raises(ValueError, match="registered: file, mine, postgres, postgresql, sqlite"):
        sessionlog.repository("nope://x", registry=registry)


def test_sqlite_refuses_another_applications_database_and_changes_nothing(tmp_path: Path) -> None:
    import sqlite3

    foreign = tmp_path / "app.db"
    connection = sqlite3.connect(foreign)
    connection.execute("create table sessions (id integer primary key, user text)")
    connection.execute("insert into sessions (user) values ('alice')")
    connection.commit()
    connection.close()
    before = foreign.read_bytes()
    with pytest.raises(sessionlog.SessionPathError, match="another application"):
        sessionlog.repository(f"sqlite:///{foreign}")
    assert foreign.read_bytes() == before and sorted(item.name for item in tmp_path.iterdir()) == ["app.db"]


def test_sqlite_in_a_missing_directory_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(sessionlog.SessionPathError):
        sessionlog.repository(f"sqlite:///{tmp_path / 'missing' / 'sessions.db'}")


def test_sqlite_on_a_full_disk_poisons_the_store_and_keeps_what_was_acknowledged(tiny_disk: Any) -> None:
    folder = tiny_disk("256k")
    repo = sessionlog.repository(f"sqlite:///{folder / 'sessions.db'}")
    store = repo.create(**HEADER)
    acknowledged = 0
    with pytest.raises(sessionlog.StorePoisonedError):
        for index in range(100_000):
            store.commit([F.user_message(f"{index} " + "x" * 2000)])
            acknowledged += 1
    assert acknowledged > 0 and store.poisoned
    session_id = repo.list()[0].session_id
    store.close()
    assert len(repo.load(session_id).transcript) >= acknowledged
    repo.close()


@pytest.mark.parametrize("kind", KINDS)
def test_the_cli_on_a_repository(kind: str, tmp_path: Path, cli: Any) -> None:
    repo = _repository(kind, tmp_path / "repo")
    location = (
        str(tmp_path / "repo") if kind == "directory" else f"sqlite:///{tmp_path / 'repo' / 'sessions.db'}"
    )
    with repo.create(**HEADER, labels=["ops"]) as store:
        store.commit(_user("Deploy \x1b[2Kthe thing"))
        session_id = store.load().session_id
    run = cli("ls", location)
    assert run.code == 0 and session_id in run.out and "needs-recovery" in run.out and "\x1b" not in run.out
    assert cli("ls", location, "--json").json()[0]["labels"] == ["ops"]
    assert cli("ls", location, "--status", "idle").out.strip() == "no sessions"
    name = f"{location}#{session_id}"
    assert cli("verify", name).code == 0
    assert cli("inspect", name, "--json").json()["lastSeq"] == 2
    exported = tmp_path / "exported.jsonl"
    assert cli("export", name, "-o", exported).code == 0
    assert exported.read_bytes() == repo.export(session_id)
    assert cli("export", name, "-o", exported).code == 2  # never overwrites
    other = tmp_path / "other"
    assert cli("import", other, exported).code == 0
    assert sessionlog.repository(other).load(session_id) == repo.load(session_id)
    current = tmp_path / "current.json"
    current.write_text(json.dumps(CURRENT))
    run = cli("recover", name, "--current", current)
    assert run.code == 0 and "plan left: startStep" in run.out
    with repo.open(session_id):
        assert cli("recover", name, "--current", current).code == 3  # in use
    run = cli("abort", name, "--current", current)
    assert run.code == 0 and "finish aborted" in run.out
    assert repo.load(session_id).is_idle
    run = cli("fork", name, "--at", "2")
    assert run.code == 0 and "forked" in run.out
    assert cli("fork", name, "--at", "1").code == 2
    with repo.open(session_id):
        assert cli("rm", name).code == 3
    assert cli("rm", name).code == 0 and len(repo.list()) == 1
    assert cli("rm", name).code == 2
    assert cli("ls", "nope://x").code == 2
    repo.close()


def test_the_cli_reads_a_held_sqlite_session_without_taking_the_writer_hold(tmp_path: Path, cli: Any) -> None:
    path = tmp_path / "agent.db"
    with sessionlog.create(path, backend="sqlite", **HEADER) as store:
        store.commit(_user("hello"))
        assert cli("verify", path, "--backend", "sqlite").code == 0
        assert cli("inspect", path, "--backend", "sqlite", "--json").json()["lastSeq"] == 2
        store.commit([F.user_message("still the writer")])  # not fenced by the reads
    assert cli("verify", path, "--backend", "sqlite-async").code == 0


def test_a_sqlite_path_names_one_session_of_a_database_of_many(tmp_path: Path) -> None:
    database = tmp_path / "sessions.db"
    with sessionlog.create(database, backend="sqlite", **HEADER) as store:
        first = store.load().session_id
    with pytest.raises(sessionlog.SessionExistsError, match="holds session"):
        sessionlog.create(database, backend="sqlite", **HEADER)
    second = new_id()
    with sessionlog.create(f"{database}#{second}", backend="sqlite", session_id=second, **HEADER) as store:
        store.commit(_user("the second"))
    with pytest.raises(ValueError, match="names session"):
        sessionlog.create(f"{database}#{new_id()}", backend="sqlite", **HEADER)
    with pytest.raises(sessionlog.SessionPathError, match="many sessions"):
        sessionlog.open(database, backend="sqlite")
    with sessionlog.open(f"{database}#{first}", backend="sqlite") as store:
        assert store.load().last_seq == 0
    with sessionlog.repository(f"sqlite:///{database}") as repo:
        assert {row.session_id for row in repo.list()} == {first, second}
        assert repo.load(second).last_seq == 2


def test_convert_copies_a_session_between_repositories_byte_for_byte(tmp_path: Path, cli: Any) -> None:
    directory = sessionlog.repository(tmp_path / "dir")
    with directory.create(**HEADER) as store:
        store.commit(_user("move me"))
        session_id = store.load().session_id
    database = f"sqlite:///{tmp_path / 'sessions.db'}"
    run = cli("convert", f"{tmp_path / 'dir'}#{session_id}", database)
    assert run.code == 0, run.err
    with sessionlog.repository(database) as sqlite_repo:
        assert sqlite_repo.export(session_id) == directory.export(session_id)
        before = sqlite_repo.export(session_id)
        run = cli("convert", f"{tmp_path / 'dir'}#{session_id}", database)
        assert run.code == 2 and "already" in run.err  # never overwrites
        assert sqlite_repo.export(session_id) == before
    back = tmp_path / "back"
    back.mkdir()
    assert cli("convert", f"{database}#{session_id}", back).code == 0
    assert sessionlog.repository(back).export(session_id) == before
    assert cli("convert", f"{database}#{session_id}", back, "--to", "jsonl").code == 2
    assert cli("convert", f"{database}#{session_id}", tmp_path / "one.jsonl", "--to", "jsonl").code == 0
    assert (tmp_path / "one.jsonl").read_bytes() == before
    directory.close()


def test_repair_of_a_repository_session_drops_its_torn_tail(tmp_path: Path, cli: Any) -> None:
    with sessionlog.repository(tmp_path / "dir") as repo:
        with repo.create(**HEADER) as store:
            store.commit(_user("kept"))
            session_id = store.load().session_id
        committed = repo.export(session_id)
        with repo.path(session_id).open("ab") as file:
            file.write(b'[{"kind":"ent')
        name = f"{tmp_path / 'dir'}#{session_id}"
        run = cli("repair", name)
        assert run.code == 0 and "dropped a torn tail of 13 bytes" in run.out, run.err
        assert repo.export(session_id) == committed
        assert "no torn tail" in cli("repair", name).out
    database = f"sqlite:///{tmp_path / 'sessions.db'}"
    with sessionlog.repository(database) as repo, repo.create(**HEADER) as store:
        other = store.load().session_id
    run = cli("repair", f"{database}#{other}", "--quarantine")
    assert run.code == 2 and "session files" in run.err
    assert cli("repair", f"{database}#{other}").code == 0


@pytest.mark.parametrize("backend", ["sqlite", "sqlite-normal", "sqlite-async", "sqlite-normal-async"])
def test_a_full_disk_under_a_sqlite_backend_is_enospc_and_loses_nothing(backend: str) -> None:
    from sessionlog.testing.faults import real_enospc

    result = real_enospc(backend, size="256k")
    if result.skipped is not None:
        pytest.skip(f"no small filesystem to fill: {result.skipped}")
    assert result.failures == [] and result.lost == 0 and result.acknowledged > 0


def test_a_store_whose_release_could_not_be_written_holds_nothing(tmp_path: Path) -> None:
    """A full disk can keep the row naming this (live) process: the session still reopens here."""
    path = tmp_path / "agent.db"
    store = sessionlog.create(path, backend="sqlite", **HEADER)
    session_id = store.load().session_id
    store.close()
    with contextlib.closing(sqlite3.connect(path)) as connection:  # what a failed release leaves
        connection.execute("update sessions set writer = ?", (f"{socket.gethostname()}:{os.getpid()}",))
        connection.commit()
    with sessionlog.open(path, backend="sqlite") as store:
        assert store.load().session_id == session_id
        with pytest.raises(sessionlog.SessionLockedError):
            sessionlog.open(path, backend="sqlite")  # this one is held, by the store above


def test_sqlite_in_a_read_only_directory_is_a_typed_error_and_creates_nothing(tmp_path: Path) -> None:
    import subprocess as run

    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only filesystem needs root (permissions do not stop root)")
    done = run.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {done.stderr.decode().strip()}")
    try:
        with pytest.raises(sessionlog.SessionPathError) as caught:
            sessionlog.repository(f"sqlite:///{folder / 'sessions.db'}")
        assert "sessions.db" in str(caught.value)
        with pytest.raises(sessionlog.SessionPathError):
            sessionlog.create(folder / "agent.db", backend="sqlite", **HEADER)
        assert os.listdir(folder) == []
    finally:
        run.run(["umount", str(folder)], capture_output=True)

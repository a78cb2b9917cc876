"""The SQLite repository (and the SQL it shares with PostgreSQL) under threads, dropped stores,
foreign hosts and files, hostile inputs: each test reproduces a defect of issue 21."""

from __future__ import annotations

import contextlib
import gc
import os
import sqlite3
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import sessionlog
from sessionlog.core import facts as F

HEADER: dict[str, Any] = {"provider": "openrouter", "model": "test/model", "cwd": "/w"}


def _location(path: Path) -> str:
    return f"sqlite:///{path}"  # an absolute path: sqlite:////tmp/...


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[Any]:
    with sessionlog.repository(_location(tmp_path / "sessions.db")) as repository:
        yield repository


def _writer_of(database: Path, session_id: str) -> Any:
    with contextlib.closing(sqlite3.connect(database)) as connection:
        row = connection.execute("select writer from sessions where session_id = ?", (session_id,)).fetchone()
    return row[0]


# -- 1. delete holds what it checks ---------------------------------------------------------------


def _delete_racing_a_writer(repo: Any, other: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`repo.delete` with a writer of `other` (another repository object, as another process
    would be) opening the session and committing between delete's check and its removal; every
    commit that writer was acknowledged must still be there afterwards."""
    store = repo.create(**HEADER)
    session_id = store.load().session_id
    store.commit([F.user_message("first")])
    store.close()
    acknowledged: list[str] = []
    failures: list[BaseException] = []

    def writer() -> None:
        try:
            with other.open(session_id) as racing:
                racing.commit([F.user_message("racing")])
                acknowledged.append("racing")
        except sessionlog.SessionLogError as error:
            failures.append(error)

    real_holds = repo.holds
    threads: list[threading.Thread] = []

    def holds_then_race(holder: Any, checked: str) -> bool:
        answer = real_holds(holder, checked)
        monkeypatch.setattr(repo, "holds", real_holds)  # once
        thread = threading.Thread(target=writer)
        threads.append(thread)
        thread.start()
        thread.join(timeout=3)  # a database that serialises writers keeps it waiting: fine
        return bool(answer)

    monkeypatch.setattr(repo, "holds", holds_then_race)
    with contextlib.suppress(sessionlog.SessionLockedError):
        repo.delete(session_id)
    assert len(threads) == 1
    threads[0].join()
    if acknowledged:  # the writer's commit was acknowledged: it must not have been deleted
        assert b"racing" in other.export(session_id)
    else:
        assert failures, "the racing writer neither committed nor failed"


def test_sqlite_delete_never_deletes_a_commit_acknowledged_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = _location(tmp_path / "sessions.db")
    with sessionlog.repository(database) as repo, sessionlog.repository(database) as other:
        _delete_racing_a_writer(repo, other, monkeypatch)


def test_postgres_delete_never_deletes_a_commit_acknowledged_meanwhile(
    postgres_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = postgres_server.url
    with sessionlog.repository(url) as repo, sessionlog.repository(url) as other:
        _delete_racing_a_writer(repo, other, monkeypatch)


# -- 2. one repository shared by threads ----------------------------------------------------------


def test_a_sqlite_repository_is_safe_to_share_between_threads(repo: Any) -> None:
    errors: list[BaseException] = []
    made: dict[int, str] = {}
    start = threading.Barrier(8)

    def work(number: int) -> None:
        try:
            start.wait()
            with repo.create(**HEADER) as store:
                made[number] = store.load().session_id
                store.commit([F.user_message(f"hello {number}")])
            for round_number in range(20):
                repo.label(made[number], [f"t{number}", f"r{round_number}"])
                repo.list(limit=5)
                repo.load(made[number])
        except BaseException as error:  # anything raw is the defect
            errors.append(error)

    threads = [threading.Thread(target=work, args=(number,)) for number in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    labels = {info.session_id: info.labels for info in repo.list()}
    assert all(labels[made[number]] == ("r19", f"t{number}") for number in range(8))


# -- 3. holds that end ----------------------------------------------------------------------------


def test_a_dropped_sqlite_store_releases_its_hold(tmp_path: Path) -> None:
    database = tmp_path / "sessions.db"
    repo = sessionlog.repository(_location(database))
    store = repo.create(**HEADER)
    session_id = store.load().session_id
    store.commit([F.user_message("hi")])
    assert _writer_of(database, session_id) is not None
    del store
    gc.collect()
    assert _writer_of(database, session_id) is None  # released for every process, not only this one
    with repo.open(session_id) as again:
        again.commit([F.user_message("again")])
    repo.close()


def test_a_sqlite_holder_on_another_host_is_taken_over_only_when_asked(tmp_path: Path) -> None:
    database = tmp_path / "sessions.db"
    repo = sessionlog.repository(_location(database))
    with repo.create(**HEADER) as store:
        session_id = store.load().session_id
    with contextlib.closing(sqlite3.connect(database)) as connection:
        connection.execute(
            "update sessions set writer = 'a-restarted-container:7', writer_epoch = writer_epoch + 1, "
            "lease_expires_at = null"
        )
        connection.commit()
    with pytest.raises(sessionlog.SessionLockedError, match="take_over=True"):
        repo.open(session_id)
    with repo.open(session_id, take_over=True) as store:
        store.commit([F.user_message("mine now")])
    assert repo.load(session_id).last_seq == 1
    repo.close()


def test_a_sqlite_writer_taken_over_is_fenced(tmp_path: Path) -> None:
    database = _location(tmp_path / "sessions.db")
    with sessionlog.repository(database) as repo, sessionlog.repository(database) as other:
        first = repo.create(**HEADER)
        first.commit([F.user_message("one")])
        session_id = first.load().session_id
        with other.open(session_id, take_over=True) as second:
            second.commit([F.user_message("two")])
        with pytest.raises(sessionlog.SessionLogError):
            first.commit([F.user_message("fenced")])
        first.close()
        assert b"fenced" not in repo.export(session_id)


# -- 4. files only the owner reads ----------------------------------------------------------------


def test_the_database_and_its_wal_and_shm_are_created_0600(tmp_path: Path) -> None:
    database = tmp_path / "sessions.db"
    old = os.umask(0o022)
    try:
        with sessionlog.repository(_location(database)) as repo, repo.create(**HEADER) as store:
            store.commit([F.user_message("secret prompt")])
            modes = {
                path.name: stat.S_IMODE(path.stat().st_mode)
                for path in (database, Path(f"{database}-wal"), Path(f"{database}-shm"))
            }
    finally:
        os.umask(old)
    assert modes == {"sessions.db": 0o600, "sessions.db-wal": 0o600, "sessions.db-shm": 0o600}


# -- 5. import and fork byte-exact ----------------------------------------------------------------


def _with_a_lone_cr(repo: Any) -> bytes:
    with repo.create(**HEADER) as store:
        store.commit([F.user_message("one")])
        store.commit([F.user_message("two")])
        session_id = store.load().session_id
    data = repo.export(session_id)
    repo.delete(session_id)  # to be imported again
    header, second, third = data.split(b"\n")[:3]
    second = second.replace(b'","', b'",\r"', 1)  # JSON whitespace inside the line
    assert b"\r" in second
    return b"\n".join([header, second, third]) + b"\n"


def test_import_is_byte_exact_for_a_lone_cr_and_commits_go_on(repo: Any) -> None:
    data = _with_a_lone_cr(repo)
    session_id = repo.import_(data)
    assert session_id == orjson.loads(data.split(b"\n")[0])["id"]
    assert repo.export(session_id) == data
    with repo.open(session_id) as store:
        store.commit([F.user_message("three")])
    assert repo.load(session_id).last_seq == 3
    forked = repo.fork(session_id, 3)
    assert repo.export(forked).split(b"\n", 1)[1] == repo.export(session_id).split(b"\n", 1)[1]
    with repo.open(forked) as store:
        store.commit([F.user_message("four")])


# -- 7. another application's database, damaged files ---------------------------------------------


@pytest.mark.parametrize("version", ["'1.0.3'", "1"])
def test_another_applications_schema_version_table_is_refused_unchanged(tmp_path: Path, version: str) -> None:
    foreign = tmp_path / "app.db"
    with contextlib.closing(sqlite3.connect(foreign)) as connection:
        connection.executescript(
            f"create table schema_version (version text); insert into schema_version values ({version});"
            "create table sessions (id integer primary key, user text); insert into sessions values (1, 'a');"
        )
    before = foreign.read_bytes()
    with pytest.raises(sessionlog.SessionPathError, match=r"app\.db"):
        sessionlog.repository(_location(foreign))
    assert foreign.read_bytes() == before and sorted(item.name for item in tmp_path.iterdir()) == ["app.db"]


def test_a_database_damaged_under_an_open_repository_gives_typed_errors(tmp_path: Path) -> None:
    database = tmp_path / "sessions.db"
    repo = sessionlog.repository(_location(database))
    with repo.create(**HEADER) as store:
        session_id = store.load().session_id
    repo.close()
    repo = sessionlog.repository(_location(database))
    size = database.stat().st_size
    database.write_bytes(b"\x00garbage" * (size // 8 + 1))
    for name, call in {
        "list": lambda: repo.list(),
        "load": lambda: repo.load(session_id),
        "label": lambda: repo.label(session_id, ["x"]),
        "delete": lambda: repo.delete(session_id),
    }.items():
        with pytest.raises(sessionlog.SessionLogError) as caught:
            call()
        assert isinstance(caught.value.__cause__, sqlite3.Error) or caught.value.__cause__ is None, name
        assert str(database) in str(caught.value), name
    repo.close()


# -- 9. the SQLAlchemy form of a SQLite URL -------------------------------------------------------


def test_a_sqlite_url_with_three_slashes_is_relative_four_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    with sessionlog.repository("sqlite:///sub/relative.db") as repo:
        assert Path(repo.path).resolve() == tmp_path / "sub" / "relative.db"
    assert (tmp_path / "sub" / "relative.db").is_file()
    absolute = tmp_path / "absolute.db"
    with sessionlog.repository(f"sqlite:////{str(absolute).lstrip('/')}") as repo:
        assert Path(repo.path) == absolute
    assert absolute.is_file()
    with pytest.raises(ValueError, match="sqlite:///"):
        sessionlog.repository("sqlite://host/x.db")
    with pytest.raises(ValueError, match="create"):  # a keyword, never a URL's text ("false" is no False)
        sessionlog.repository("sqlite:///never.db?create=false")
    assert not (tmp_path / "never.db").exists()


# -- 10. create=False creates nothing -------------------------------------------------------------


def test_create_false_on_a_missing_database_creates_nothing(tmp_path: Path) -> None:
    for location in (tmp_path / "missing.db", tmp_path / "no" / "such.db"):
        with pytest.raises(sessionlog.RepositoryNotFoundError, match=location.name):
            sessionlog.repository(_location(location), create=False)
    empty = tmp_path / "empty.db"
    empty.touch()
    with pytest.raises(sessionlog.RepositoryNotFoundError):
        sessionlog.repository(_location(empty), create=False)
    assert sorted(item.name for item in tmp_path.iterdir()) == ["empty.db"] and empty.stat().st_size == 0
    with sessionlog.repository(_location(tmp_path / "made.db")) as repo:
        repo.create(**HEADER).close()
    with sessionlog.repository(_location(tmp_path / "made.db"), create=False) as repo:
        assert len(repo.list()) == 1


def test_the_sqlite_backend_creates_no_database_when_only_reading(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    with pytest.raises(sessionlog.SessionLogError):
        sessionlog.open(empty, backend="sqlite", read_only=True)
    assert empty.stat().st_size == 0 and sorted(item.name for item in tmp_path.iterdir()) == ["empty.db"]
    with pytest.raises(FileNotFoundError):
        sessionlog.open(tmp_path / "missing.db", backend="sqlite", read_only=True)
    assert sorted(item.name for item in tmp_path.iterdir()) == ["empty.db"]


# -- 11. no out-of-range integer reaches SQL ------------------------------------------------------


@pytest.mark.parametrize(
    "filters",
    [
        {"limit": 2**63},
        {"limit": 2**70},
        {"updated_after": 2**70},
        {"updated_before": -(2**70)},
        {"cursor": f"{2**70}:01900000-0000-7000-8000-000000000000"},
        {"cursor": f"{-(2**70)}:01900000-0000-7000-8000-000000000000"},
    ],
)
def test_out_of_range_integers_never_reach_sqlite(repo: Any, filters: dict[str, Any]) -> None:
    repo.create(**HEADER).close()
    with contextlib.suppress(ValueError):  # refused at the door: fine; OverflowError or sqlite3's: not
        repo.list(**filters)


def test_a_session_id_in_a_message_is_shown_bounded(repo: Any) -> None:
    secret = "sk-" + "s" * 40
    with pytest.raises(ValueError) as caught:
        repo.load(secret)
    assert secret not in str(caught.value) and secret[:30] not in str(caught.value)


# -- 6. a -wal removed under a live writer --------------------------------------------------------

_REMOVES_THE_WAL = """
import os, sys
import sessionlog
from sessionlog.core import facts as F
database = sys.argv[1]
repo = sessionlog.repository("sqlite:///" + database)
store = repo.create(provider="p", model="m")
for number in range(5):
    store.commit([F.user_message(f"acknowledged {number}")])
print(store.load().session_id, flush=True)
os.remove(database + "-wal")
try:
    store.commit([F.user_message("after the removal")])
    print("acknowledged", flush=True)
except sessionlog.SessionLogError as error:
    print("refused", type(error).__name__, flush=True)
os.kill(os.getpid(), 9)
"""


def test_a_wal_removed_under_a_live_writer_loses_no_acknowledged_commit(tmp_path: Path) -> None:
    import subprocess
    import sys

    database = tmp_path / "sessions.db"
    child = subprocess.run(
        [sys.executable, "-c", _REMOVES_THE_WAL, str(database)], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == -9, child.stderr
    session_id, outcome = child.stdout.split("\n")[:2]
    with sessionlog.repository(_location(database)) as repo:
        data = repo.export(session_id)
        assert all(f"acknowledged {number}".encode() in data for number in range(5))
        if outcome == "acknowledged":
            assert b"after the removal" in data
        else:
            assert outcome == "refused StorePoisonedError" and b"after the removal" not in data
            with repo.open(session_id) as store:  # the killed writer is gone: taken over
                store.commit([F.user_message("goes on")])


# -- a closed repository, a read-only filesystem ---------------------------------------------------


def test_every_operation_of_a_closed_repository_is_refused_typed(tmp_path: Path) -> None:
    repo = sessionlog.repository(_location(tmp_path / "sessions.db"))
    with repo.create(**HEADER) as store:
        store.commit([F.user_message("one")])
        session_id = store.load().session_id
    data = repo.export(session_id)
    repo.close()
    calls = {
        "create": lambda: repo.create(**HEADER),
        "open": lambda: repo.open(session_id),
        "load": lambda: repo.load(session_id),
        "export": lambda: repo.export(session_id),
        "import": lambda: repo.import_(data),
        "fork": lambda: repo.fork(session_id, 1),
        "delete": lambda: repo.delete(session_id),
        "label": lambda: repo.label(session_id, ["x"]),
        "list": lambda: repo.list(),
        "latest": lambda: repo.latest(),
        "unfinished": lambda: repo.unfinished(),
    }
    for operation, call in calls.items():
        with pytest.raises(sessionlog.RepositoryError, match="closed") as caught:
            call()
        assert caught.value.operation in (operation, "create"), operation
    with sessionlog.repository(_location(tmp_path / "sessions.db")) as again:
        assert again.export(session_id) == data  # nothing changed


def test_a_database_on_a_read_only_filesystem_is_a_typed_error(tiny_disk: Any) -> None:
    import subprocess

    folder = tiny_disk("1m", name="ro")
    with sessionlog.repository(_location(folder / "sessions.db")) as repo, repo.create(**HEADER) as store:
        store.commit([F.user_message("one")])
    if subprocess.run(["mount", "-o", "remount,ro", str(folder)], capture_output=True).returncode:
        pytest.skip("the filesystem cannot be remounted read-only here")
    for create in (True, False):
        with pytest.raises(sessionlog.SessionPathError, match=r"sessions\.db") as caught:
            sessionlog.repository(_location(folder / "sessions.db"), create=create)
        assert isinstance(caught.value.__cause__, sqlite3.Error)


def test_a_full_disk_is_a_typed_error_for_every_write_of_the_repository(tiny_disk: Any) -> None:
    folder = tiny_disk("256k", name="tiny")
    with sessionlog.repository(_location(folder / "sessions.db")) as repo:
        with repo.create(**HEADER) as store:
            session_id = store.load().session_id
        filler = folder / "filler"
        with contextlib.suppress(OSError), filler.open("wb") as out:
            while True:
                out.write(b"x" * 4096)
                out.flush()
        big = ["x" * 190 + str(number) for number in range(400)]  # labels too big for what is left
        for name, call in {
            "label": lambda: repo.label(session_id, big),
            "create": lambda: [repo.create(**HEADER, labels=big) for _ in range(50)],
        }.items():
            with pytest.raises(sessionlog.SessionLogError) as caught:
                call()
            assert isinstance(caught.value, OSError) and caught.value.errno == 28, (name, caught.value)
        assert [info.session_id for info in repo.list()][-1] == session_id


def test_a_row_torn_inside_by_another_program_is_a_typed_error_at_open(tmp_path: Path) -> None:
    database = tmp_path / "sessions.db"
    with sessionlog.repository(_location(database)) as repo:
        with repo.create(**HEADER) as store:
            store.commit([F.user_message("one")])
            session_id = store.load().session_id
        line = repo.export(session_id).split(b"\n")[1] + b"\n"
    with contextlib.closing(sqlite3.connect(database)) as connection:  # one row: a line, then a torn one
        connection.execute(
            "update lines set line = ? where session_id = ? and line_no = 2", (line + b'{"torn', session_id)
        )
        connection.commit()
    with sessionlog.repository(_location(database)) as repo, pytest.raises(sessionlog.SessionLogError):
        repo.open(session_id)


# -- a fork of a process holding a repository and a store -----------------------------------------


def _in_a_fork(work: Any) -> int:
    """Run `work()` in a forked child; its exit status (0: it returned)."""
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        status = 1
        try:
            work()
            status = 0
        finally:
            os._exit(status)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_fork_that_drops_its_copy_of_a_store_leaves_the_parents_hold(tmp_path: Path) -> None:
    database = tmp_path / "sessions.db"
    with sessionlog.repository(_location(database)) as repo:
        store = repo.create(**HEADER)
        session_id = store.load().session_id
        held = _writer_of(database, session_id)

        def drop_the_copy() -> None:
            nonlocal store
            del store
            gc.collect()

        assert _in_a_fork(drop_the_copy) == 0
        assert _writer_of(database, session_id) == held  # the parent still holds it
        other = sessionlog.repository(_location(database))
        with pytest.raises(sessionlog.SessionLockedError):
            other.open(session_id)
        other.close()
        store.commit([F.user_message("still mine")])
        store.close()


def test_a_forks_child_holds_none_of_its_parents_sessions(tmp_path: Path) -> None:
    """In the child the parent's hold is lost (nothing renews it there, a commit of it is refused)
    and the session is the parent's, held; in the parent it goes on."""
    database = tmp_path / "sessions.db"
    with sessionlog.repository(_location(database)) as repo:
        store = repo.create(**HEADER)
        session_id = store.load().session_id
        (key,) = repo.heartbeat.held()

        def in_the_child() -> None:
            assert repo.heartbeat.held() == []
            with pytest.raises(sessionlog.SessionChangedError, match="forked"):
                repo.heartbeat.check(key)
            with pytest.raises(sessionlog.SessionLockedError):
                repo.open(session_id)

        assert _in_a_fork(in_the_child) == 0
        assert repo.heartbeat.held() == [key]
        store.commit([F.user_message("the parent's")])
        assert [m["content"] for m in repo.load(session_id).transcript] == ["the parent's"]
        store.close()


def test_a_fork_uses_a_repository_through_a_connection_of_its_own(tmp_path: Path) -> None:
    with sessionlog.repository(_location(tmp_path / "sessions.db")) as repo:
        with repo.create(**HEADER) as store:
            session_id = store.load().session_id
        inherited = repo.connection

        def use() -> None:
            repo.label(session_id, ["from the child"])
            assert repo.connection is not inherited
            with repo.create(**HEADER) as child_store:
                child_store.commit([F.user_message("child")])

        assert _in_a_fork(use) == 0
        assert repo.connection is inherited
        assert {info.labels for info in repo.list()} == {("from the child",), ()}


def test_take_over_through_the_sqlite_backend_and_the_async_repository(tmp_path: Path) -> None:
    import asyncio

    database = tmp_path / "sessions.db"
    with sessionlog.repository(_location(database)) as repo, repo.create(**HEADER) as store:
        session_id = store.load().session_id

    def elsewhere() -> None:
        with contextlib.closing(sqlite3.connect(database)) as connection:
            connection.execute(  # a hold without a lease (an older sessionlog's): only take_over ends it
                "update sessions set writer = 'host-b:7', writer_epoch = writer_epoch + 1, "
                "lease_expires_at = null"
            )
            connection.commit()

    elsewhere()
    with pytest.raises(sessionlog.SessionLockedError):
        sessionlog.open(f"{database}#{session_id}", backend="sqlite")
    with sessionlog.open(f"{database}#{session_id}", backend="sqlite", take_over=True) as store:
        store.commit([F.user_message("through the backend")])
    elsewhere()

    async def main() -> None:
        async with await sessionlog.repository_async(_location(database)) as arepo:
            with pytest.raises(sessionlog.SessionLockedError):
                await arepo.open(session_id)
            store = await arepo.open(session_id, take_over=True)
            await store.commit([F.user_message("through the async repository")])
            await store.close()

    asyncio.run(main())
    with sessionlog.repository(_location(database)) as repo:
        assert repo.load(session_id).last_seq == 2


# -- leases ---------------------------------------------------------------------------------------


def _set_holder(database: Path, session_id: str, writer: str, lease_ms_from_now: int | None) -> None:
    from sessionlog.repositories.sqlite_holds import NOW_MS

    lease = "null" if lease_ms_from_now is None else f"{NOW_MS} + {lease_ms_from_now}"
    with contextlib.closing(sqlite3.connect(database)) as connection:
        connection.execute(
            f"update sessions set writer = ?, writer_epoch = writer_epoch + 1, lease_expires_at = {lease} "
            "where session_id = ?",
            (writer, session_id),
        )
        connection.commit()


def test_a_holder_elsewhere_holds_while_its_lease_runs_and_no_longer(tmp_path: Path) -> None:
    database = tmp_path / "sessions.db"
    with sessionlog.repository(_location(database)) as repo:
        with repo.create(**HEADER) as store:
            store.commit(F.accept_prompt("unfinished run"))  # a run started, never finished
            session_id = store.load().session_id
        _set_holder(database, session_id, "old-container:1", 3_600_000)
        with pytest.raises(sessionlog.SessionLockedError):
            repo.open(session_id)
        assert repo.unfinished() == [] and repo.list()[0].status == "running"
        _set_holder(database, session_id, "old-container:1", None)  # an older sessionlog's hold: no lease
        with pytest.raises(sessionlog.SessionLockedError):
            repo.open(session_id)
        _set_holder(database, session_id, "old-container:1", -1)  # its lease ran out
        assert [info.session_id for info in repo.unfinished()] == [session_id]
        with repo.open(session_id) as store:  # no take_over needed
            store.commit([F.user_message("recovered")])


def test_the_heartbeat_renews_the_leases_this_process_holds_and_no_other(tmp_path: Path) -> None:
    from sessionlog.repositories import sqlite_holds

    database = tmp_path / "sessions.db"

    def lease_of(session_id: str) -> Any:
        with contextlib.closing(sqlite3.connect(database)) as connection:
            return connection.execute(
                f"select lease_expires_at - {sqlite_holds.NOW_MS} from sessions where session_id = ?",
                (session_id,),
            ).fetchone()[0]

    with sessionlog.repository(_location(database)) as repo:
        mine = repo.create(**HEADER)
        my_id = mine.load().session_id
        with repo.create(**HEADER) as other:
            other_id = other.load().session_id
        _set_holder(database, other_id, "elsewhere:1", -1)
        with contextlib.closing(sqlite3.connect(database)) as connection:  # as if a model call took long
            connection.execute("update sessions set lease_expires_at = 0 where session_id = ?", (my_id,))
            connection.commit()
        assert lease_of(my_id) < 0
        repo.heartbeat.renew_now()  # one beat of the heartbeat thread
        assert lease_of(my_id) > sqlite_holds.LEASE_MS / 2 and lease_of(other_id) < 0
        mine.commit([F.user_message("still mine")])  # not fenced
        mine.close()


@pytest.mark.parametrize("how", ["taken over", "lease ran out"])
def test_a_sqlite_writer_whose_hold_was_lost_knows_before_its_commit(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another connection keeps the database's write lock, so a commit sent would wait on it. A
    writer whose session was taken over (seen by a renewal), or whose lease ran out while every
    renewal was blocked, refuses its next commit (typed, poisoned, nothing written) at once."""
    import time

    database = tmp_path / "sessions.db"
    with (
        sessionlog.repository(_location(database)) as repo,
        sessionlog.repository(_location(database)) as other,
    ):
        if how == "lease ran out":
            monkeypatch.setattr(repo.heartbeat, "lease", 1.0)  # on this host's clock; the row's is longer
        store = repo.create(**HEADER)
        store.commit(F.accept_prompt("mine"))
        session_id = store.load().session_id
        if how == "taken over":
            other.open(session_id, take_over=True).close()
            repo.heartbeat.renew_now()  # one round of the heartbeat: the row is another writer's
        nemesis = sqlite3.connect(database, isolation_level=None)
        try:
            nemesis.execute("begin immediate")  # every renewal and every commit sent waits on it
            if how == "lease ran out":
                time.sleep(2.5)  # past the lease: no renewal got through
            # a commit sent would wait 5 s on the lock, then fail as one that may have landed
            with pytest.raises(sessionlog.StorePoisonedError) as refused:
                store.commit([F.user_message("after the hold was lost")])
        finally:
            nemesis.rollback()
            nemesis.close()
        assert isinstance(refused.value.__cause__, sessionlog.SessionChangedError), refused.value
        assert ("lease" if how == "lease ran out" else "took the session over") in str(refused.value)
        assert [m["content"] for m in repo.load(session_id).transcript] == ["mine"]
        store.close()


# -- the sqlite backend written without a read first (as `convert --to sqlite` does) -------------


@pytest.mark.parametrize("backend", ["sqlite", "sqlite-async"])
def test_the_sqlite_backend_appends_right_after_create_without_a_read(tmp_path: Path, backend: str) -> None:
    import asyncio

    from sessionlog.plugins.registry import default_registry

    source = tmp_path / "agent.jsonl"
    with sessionlog.create(source, provider="p", model="m") as store:
        store.commit(F.accept_prompt("hello"))
        store.commit([F.user_message("more")])
    data = source.read_bytes()
    header, *body = (line + b"\n" for line in data.split(b"\n")[:-1])
    registry = default_registry()
    factory = registry.factory(backend)
    target = tmp_path / "out.db"
    if registry.info(backend).api == "sync":
        opened = factory(target, create=header)
        for line in body:
            opened.append(line)
        opened.close()
    else:

        async def copy() -> None:
            opened = await factory(target, create=header)
            await opened.append_batch(body)
            await opened.close()

        asyncio.run(copy())
    with sessionlog.repository(_location(target)) as repo:
        (info,) = repo.list()
        assert repo.export(info.session_id) == data
        assert info.title == "hello" and info.last_seq == repo.load(info.session_id).last_seq


@pytest.mark.parametrize("durability", ["power", "process"])
def test_sqlite_reads_with_the_rule_its_writers_use(tmp_path: Path, durability: str) -> None:
    """`load`, `list` and every store (sync or async) of a SQLite repository judge a session's
    bytes alike: rows are whole lines, no writer of either kind leaves a NUL window."""
    with sessionlog.repository(_location(tmp_path / "s.db"), durability=durability) as repo:
        assert repo.info.nul_rule() == repo.async_info.nul_rule()
        assert repo.info.nul_rule()["nul_window"] == 0
        assert repo.info.nul_rule()["nul_tail"] == (durability == "power")


def test_a_database_that_cannot_be_made_on_a_full_disk_leaves_no_file(tiny_disk: Any) -> None:
    import subprocess
    import sys

    folder = tiny_disk("256k", name="tiny")
    with contextlib.suppress(OSError), (folder / "filler").open("wb") as out:
        while True:
            out.write(b"x" * 4096)
            out.flush()
    script = (  # in a child: SQLite meeting a full disk must not take pytest down with it
        "import sys, sessionlog\n"
        "try:\n"
        "    sessionlog.repository('sqlite:///' + sys.argv[1])\n"
        "except sessionlog.SessionPathError as error:\n"
        "    print(error.errno)\n"
    )
    command = [sys.executable, "-c", script, str(folder / "new.db")]
    child = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert child.stdout.strip() == "28", child.stderr
    assert sorted(item.name for item in folder.iterdir()) == ["filler"]

"""The directory repository under races, kills, faults and careless input: delete holds the
session's lock through the unlink, the index is private and a cache (a damaged one is made
anew), group-commit files are read with their writer's rule, the debris of killed processes goes
at the next open, a full disk is a typed error, import and fork are byte-exact, `create=False`
creates nothing, and a listing's writer probe never refuses a writer. (The contract every
repository meets is `RepositoryContract`, in test_repository.py.)"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from sessionlog.backends import jsonl_file, writer_lock
from sessionlog.core import facts as F
from sessionlog.core.framing import SECTOR
from sessionlog.repositories.index import INDEX_NAME
from sessionlog.testing.sessions import READ_SNAPSHOT

HEADER: dict[str, Any] = {"provider": "openrouter", "model": "test/model", "cwd": "/w"}


def _session(repo: Any, text: str = "hello") -> str:
    with repo.create(**HEADER) as store:
        store.commit([F.user_message(text)])
        return str(store.load().session_id)


@pytest.fixture
def unlink_hook(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """`hook["before"](path)` runs inside `os.unlink` of a session file, just before the real
    unlink: the moment between delete's check for a writer and its removal of the file."""
    hook: dict[str, Any] = {"before": None}
    real = os.unlink

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        before = hook["before"]
        if before is not None and str(path).endswith(".jsonl"):
            hook["before"] = None
            before(Path(path))
        real(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    yield hook


# -- 1. delete holds what it checks ------------------------------------------------------------


def test_a_writer_cannot_open_and_commit_between_deletes_check_and_its_unlink(
    tmp_path: Path, unlink_hook: dict[str, Any]
) -> None:
    repo = sessionlog.repository(tmp_path)
    session_id = _session(repo)
    acknowledged: list[str] = []
    refused: list[BaseException] = []
    writers: list[Any] = []

    def writer_slips_in(path: Path) -> None:
        try:
            store = repo.open(session_id)
        except sessionlog.SessionLockedError as error:
            refused.append(error)
            return
        writers.append(store)
        store.commit([F.user_message("acknowledged before the unlink")])
        acknowledged.append("acknowledged before the unlink")

    unlink_hook["before"] = writer_slips_in
    try:
        repo.delete(session_id)
        deleted = True
    except sessionlog.SessionLockedError:
        deleted = False
    for store in writers:
        store.close()
    if deleted and acknowledged:
        pytest.fail(
            "the delete removed a session a writer had just committed to (its commit was acknowledged)"
        )
    assert refused and not acknowledged and deleted  # the writer was refused: the delete held the lock
    with pytest.raises(sessionlog.SessionNotFoundError):
        repo.open(session_id)
    repo.close()


def test_a_writer_that_opened_the_file_before_the_unlink_and_locks_it_after_is_fenced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its descriptor leads to a file with no name: the store's link-count check before each
    append refuses the commit, so nothing is acknowledged into a deleted file."""
    repo = sessionlog.repository(tmp_path)
    session_id = _session(repo)
    has_descriptor = threading.Event()
    deleted = threading.Event()
    real_lock = writer_lock.take
    writer_thread: list[int] = []

    def lock_after_the_delete(fd: int, path: Path) -> None:
        if writer_thread and threading.get_ident() == writer_thread[0]:
            has_descriptor.set()
            assert deleted.wait(30)
        real_lock(fd, path)

    monkeypatch.setattr(writer_lock, "take", lock_after_the_delete)
    outcome: list[Any] = []

    def writer() -> None:
        writer_thread.append(threading.get_ident())
        try:
            store = repo.open(session_id)
        except sessionlog.SessionNotFoundError as error:
            outcome.append(error)  # refused at open: as good
            return
        try:
            store.commit([F.user_message("into a deleted file?")])
            outcome.append("acknowledged")
        except sessionlog.StorePoisonedError as error:
            outcome.append(error)
        finally:
            store.close()

    thread = threading.Thread(target=writer)
    thread.start()
    assert has_descriptor.wait(30)
    repo.delete(session_id)
    deleted.set()
    thread.join(30)
    assert outcome and outcome[0] != "acknowledged", outcome
    assert not repo.path(session_id).exists()
    repo.close()


_RACING_WRITER = """
import os, random, sys, time, sessionlog
from sessionlog.core import facts as F
folder, turns = sys.argv[1], int(sys.argv[2])
repo = sessionlog.repository(folder)
print("ready", flush=True)
for turn in range(turns):
    names = [name[:-6] for name in os.listdir(folder) if name.endswith(".jsonl")]
    if not names:
        continue
    session_id = random.choice(names)
    try:
        store = repo.open(session_id)
    except (sessionlog.SessionLockedError, sessionlog.SessionNotFoundError):
        continue
    opened = time.monotonic_ns()
    try:
        store.commit([F.user_message(f"{os.getpid()}/{turn}")])
        acked = 1
    except sessionlog.StorePoisonedError:
        acked = 0
    closing = time.monotonic_ns()
    store.close()
    print(session_id, opened, acked, closing, f"{os.getpid()}/{turn}", flush=True)
"""


def test_deletes_racing_writers_in_many_processes_lose_no_acknowledged_commit(tmp_path: Path) -> None:
    """Four processes open, commit to and close random sessions over and over while this one
    creates sessions and deletes them. A history on one system-wide monotonic clock: each writer
    reports when its open returned, whether its commit was acknowledged and when it began to
    close; each delete when it returned. No writer with an acknowledged commit may have been open
    across a delete of its session, and every session left holds every acknowledged commit."""
    repo = sessionlog.repository(tmp_path)
    sessions = [_session(repo, "racing") for _ in range(16)]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _RACING_WRITER, str(tmp_path), "400"], stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    for child in children:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
    deleted: dict[str, int] = {}
    while any(child.poll() is None for child in children):
        sessions.append(_session(repo, "racing"))
        for session_id in sessions[-16:-8]:  # each lives a while: the writers find it
            if session_id in deleted:
                continue
            try:
                repo.delete(session_id)
            except sessionlog.SessionLockedError:
                continue
            deleted[session_id] = time.monotonic_ns()
    outputs = [child.stdout.read() for child in children if child.stdout is not None]  # after readline
    assert [child.wait(timeout=120) for child in children] == [0, 0, 0, 0]
    writers = [line.split() for output in outputs for line in output.splitlines()]
    assert sum(acked == "1" for _, _, acked, _, _ in writers) > 50  # the writers did race the deletes
    for session_id, opened, acked, closing, _ in writers:
        if acked == "1" and session_id in deleted:
            done = deleted[session_id]
            assert not int(opened) < done < int(closing), f"{session_id} was deleted under its writer"
    for session_id in set(sessions) - set(deleted):
        acknowledged = sorted(
            text for held, _, acked, _, text in writers if held == session_id and acked == "1"
        )
        transcript = [message["content"] for message in repo.load(session_id).transcript]
        assert sorted(transcript[1:]) == acknowledged, session_id  # every one, and nothing else
    repo.close()


def test_a_new_session_is_held_from_the_moment_its_name_appears(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lister (a recovery worker, a process scanning the directory) may find a new session's
    file the instant it is linked into place: it must be refused, never take the session from
    the writer creating it."""
    repo = sessionlog.repository(tmp_path)
    interlopers: list[Any] = []
    real_link = jsonl_file.DEFAULT_OPS.link

    def link_then_race(source: Any, destination: Any) -> None:
        real_link(source, destination)
        if str(destination).endswith(".jsonl") and not interlopers:

            def interloper() -> None:
                try:
                    interlopers.append(sessionlog.open(destination, "jsonl-fsync"))
                except sessionlog.SessionLockedError as error:
                    interlopers.append(error)

            thread = threading.Thread(target=interloper)  # another thread: not this call's claim
            thread.start()
            thread.join()

    monkeypatch.setattr(jsonl_file.DEFAULT_OPS, "link", link_then_race)
    try:
        with repo.create(**HEADER) as store:
            store.commit([F.user_message("mine")])
    finally:
        for found in interlopers:
            if not isinstance(found, BaseException):
                found.close()
    assert len(interlopers) == 1 and isinstance(interlopers[0], sessionlog.SessionLockedError), interlopers
    repo.close()


# -- 4. the index is private -------------------------------------------------------------------


def test_the_index_and_its_wal_are_private_from_their_first_byte(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        repo = sessionlog.repository(tmp_path / "repo")
        with repo.create(**HEADER, labels=["secret-project"]) as store:
            store.commit(F.accept_prompt("the first words of a private prompt"))
        assert repo.list()[0].labels == ("secret-project",)
        made = sorted(path.name for path in (tmp_path / "repo").iterdir() if path.name.startswith(INDEX_NAME))
        assert INDEX_NAME in made and f"{INDEX_NAME}-wal" in made
        for name in made:
            assert stat.S_IMODE((tmp_path / "repo" / name).stat().st_mode) == 0o600, name
        repo.close()
    finally:
        os.umask(old)


def test_an_index_an_older_sessionlog_made_readable_becomes_private(tmp_path: Path) -> None:
    sessionlog.repository(tmp_path).close()
    os.chmod(tmp_path / INDEX_NAME, 0o644)
    with sessionlog.repository(tmp_path) as repo:
        repo.list()
    assert stat.S_IMODE((tmp_path / INDEX_NAME).stat().st_mode) == 0o600


# -- 5. group-commit files read with their writer's rule ---------------------------------------


def _with_hole_in_line(data: bytes, line: int) -> bytes:
    """What a power loss leaves in a batch written at once (as in test_powerloss): NULs from
    where `line` begins to the next sector boundary, the lines after it intact."""
    starts = [0, *[index + 1 for index, byte in enumerate(data) if byte == 0x0A][:-1]]
    at = starts[line - 1]
    stop = min((at // SECTOR + 1) * SECTOR, data.index(b"\n", at))
    assert stop < data.index(b"\n", at)  # a hole inside the line, up to a sector boundary
    return data[:at] + bytes(stop - at) + data[stop:]


@pytest.mark.parametrize("backend", [None, "jsonl-group", "jsonl-syncfs"])
def test_a_power_loss_hole_inside_a_group_commit_batch_reads_as_a_torn_tail(
    tmp_path: Path, backend: str | None
) -> None:
    options = {} if backend is None else {"backend": backend}

    async def write() -> str:
        repo = await sessionlog.repository_async(tmp_path, **options)
        store = await repo.create(**HEADER)
        await store.commit(F.accept_prompt("run this"))
        state = await store.load()
        attempt = F.step_attempt(state.operation["operationId"], state.active_context_through, READ_SNAPSHOT)
        await store.commit([attempt])
        step = (await store.load()).step
        await store.commit([F.assistant_message(step["stepId"], step["attemptId"], "an answer " * 400)])
        await store.commit([F.user_message("and the last line of the batch")])
        session_id = str(state.session_id)
        await store.close()
        await repo.close()
        return session_id

    session_id = asyncio.run(write())
    path = tmp_path / f"{session_id}.jsonl"
    path.write_bytes(_with_hole_in_line(path.read_bytes(), 4))  # the answer; line 5 intact after it

    async def read() -> tuple[Any, Any, Any]:
        repo = await sessionlog.repository_async(tmp_path, **options)
        try:
            return await repo.list(), await repo.unfinished(), await repo.load(session_id)
        finally:
            await repo.close()

    rows, unfinished, state = asyncio.run(read())
    assert [(row.session_id, row.status) for row in rows] == [(session_id, "needs-recovery")], rows
    assert [row.session_id for row in unfinished] == [session_id]
    assert state.last_seq == 3 and state.step is not None and state.step["status"] == "attempting"
    writer = backend or "jsonl-group"  # the sync repository told who wrote the files reads alike
    with sessionlog.repository(tmp_path, reads_as=writer) as repo:
        assert [row.status for row in repo.list()] == ["needs-recovery"]
        assert repo.load(session_id).last_seq == 3


# -- 7. a damaged index, a full disk, debris ---------------------------------------------------


def _damage(path: Path, how: str) -> None:
    if how == "garbage":
        path.write_bytes(b"this is no database at all " * 200)
    elif how == "zero-length":
        path.write_bytes(b"")
    elif how == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2 + 100])
    elif how == "foreign schema":
        path.unlink()
        connection = sqlite3.connect(path)
        connection.execute("create table sessions (id integer primary key, user text)")
        connection.execute("insert into sessions (user) values ('alice')")
        connection.commit()
        connection.close()
    elif how == "foreign schema_version":
        path.unlink()
        connection = sqlite3.connect(path)
        connection.execute("create table schema_version (version text)")
        connection.execute("insert into schema_version values ('1.0.3')")
        connection.commit()
        connection.close()


@pytest.mark.parametrize(
    "how", ["garbage", "zero-length", "truncated", "foreign schema", "foreign schema_version"]
)
def test_a_damaged_index_is_set_aside_and_made_anew_from_the_session_files(tmp_path: Path, how: str) -> None:
    with sessionlog.repository(tmp_path) as repo:
        ids = [_session(repo, f"task {index}") for index in range(30)]
        repo.label(ids[0], ["kept"])
        assert len(repo.list(limit=None)) == 30
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"{INDEX_NAME}{suffix}").unlink(missing_ok=True)
    index = tmp_path / INDEX_NAME
    connection = sqlite3.connect(index)
    connection.execute("pragma journal_mode=delete")  # the whole index in its main file
    connection.close()
    _damage(index, how)
    before = index.read_bytes()
    with sessionlog.repository(tmp_path) as repo:
        rows = repo.list(limit=None)
        assert sorted(row.session_id for row in rows) == sorted(ids)
        assert all(row.status == "idle" for row in rows)
        repo.label(ids[1], ["new"])
        assert repo.list(labels=["new"])[0].session_id == ids[1]
    if how != "zero-length":  # nothing was destroyed: the damaged file is kept aside
        assert (tmp_path / f"{INDEX_NAME}.damaged").read_bytes() == before


def test_an_index_row_damaged_in_place_is_computed_again(tmp_path: Path) -> None:
    with sessionlog.repository(tmp_path) as repo:
        ids = [_session(repo, f"task {index}") for index in range(3)]
        repo.list()
    connection = sqlite3.connect(tmp_path / INDEX_NAME)
    connection.execute("update sessions set info = 'not json' where session_id = ?", (ids[0],))
    connection.execute("update sessions set info = '{\"x\": 1}' where session_id = ?", (ids[1],))
    connection.commit()
    connection.close()
    with sessionlog.repository(tmp_path) as repo:
        rows = repo.list()
        assert sorted(row.session_id for row in rows) == sorted(ids)
        assert all(row.status == "idle" and row.last_seq == 1 for row in rows)


def test_a_directory_removed_under_the_repository_is_a_typed_error(tmp_path: Path) -> None:
    import shutil

    repo = sessionlog.repository(tmp_path / "repo")
    session_id = _session(repo)
    shutil.rmtree(tmp_path / "repo")
    with pytest.raises(sessionlog.RepositoryError, match="list"):
        repo.list()
    with pytest.raises(sessionlog.SessionNotFoundError):
        repo.load(session_id)
    repo.close()


def test_a_full_disk_is_a_typed_error_for_label_and_no_error_for_list(tiny_disk: Any) -> None:
    folder = tiny_disk("256k")
    big = _big_session()
    repo = None
    try:
        repo = sessionlog.repository(folder)
        ids = [_session(repo, f"task {index}") for index in range(3)]
        repo.label(ids[0], ["before"])
        _fill(folder / "filler")
        more = []
        try:
            for index in range(500):  # sessions the index has not seen yet
                more.append(_session(repo, f"more {index}"))
        except (sessionlog.SessionPathError, sessionlog.StorePoisonedError, OSError):
            pass
        with pytest.raises((sessionlog.RepositoryError, sessionlog.SessionPathError)) as caught:
            for index in range(200):
                repo.label(ids[1], [f"label {index} " + "x" * 150])
        assert isinstance(caught.value, sessionlog.SessionLogError)
        rows = {row.session_id: row for row in repo.list(limit=None)}  # the index is a cache
        assert set(ids) <= set(rows) and rows[ids[0]].labels == ("before",)
        with pytest.raises((sessionlog.RepositoryError, sessionlog.SessionPathError)):
            repo.import_(big)
        assert not [name for name in os.listdir(folder) if name.endswith((".converting", ".creating"))]
    finally:
        if repo is not None:
            repo.close()


def _fill(path: Path) -> None:
    """Write `path` until the filesystem is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError) as caught:
            while True:
                os.write(fd, b"x" * 4096)
        assert caught.value.errno == 28  # ENOSPC
    finally:
        os.close(fd)


def _big_session() -> bytes:
    """A valid session of about 600 KB, made elsewhere."""
    import tempfile

    with tempfile.TemporaryDirectory() as where, sessionlog.repository(where) as other:
        session_id = _session(other, "y" * 600_000)
        return other.export(session_id)


_KILLED_BEFORE_RENAME = """
import os, signal, sys
import sessionlog
from sessionlog import maintenance

def killed(temp, destination):
    print("written", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

maintenance.link_into_place = killed
repo = sessionlog.repository(sys.argv[1])
if sys.argv[2] == "import":
    repo.import_(open(sys.argv[3], "rb").read())
else:
    repo.fork(sys.argv[3], int(sys.argv[4]))
"""


def test_a_fork_or_import_killed_between_write_and_rename_leaves_debris_the_next_open_removes(
    tmp_path: Path,
) -> None:
    source = tmp_path / "source"
    with sessionlog.repository(source) as repo:
        session_id = _session(repo, "to fork and to import " * 1000)
        exported = tmp_path / "exported.jsonl"
        exported.write_bytes(repo.export(session_id))
    target = tmp_path / "target"
    target.mkdir()
    runs = [
        [str(target), "import", str(exported)],
        [str(source), "fork", session_id, "1"],
        [str(target), "import", str(exported)],
    ]
    for arguments in runs:
        child = subprocess.Popen(
            [sys.executable, "-c", _KILLED_BEFORE_RENAME, *arguments], stdout=subprocess.PIPE, text=True
        )
        assert child.communicate(timeout=60)[0] == "written\n" and child.returncode == -signal.SIGKILL
        left = [path for path in _debris(source, target) if f".{child.pid}." in path.name]
        assert len(left) == 1 and left[0].stat().st_size > 20_000  # the whole copy, never renamed
    live = target / f".{session_id}.jsonl.{os.getpid()}.0123456789ab.converting"  # a live process's
    live.write_bytes(b"work in progress")
    for folder in (source, target):
        sessionlog.repository(folder).close()
    assert _debris(source, target) == [live]
    with sessionlog.repository(target) as repo:
        assert repo.import_(exported.read_bytes()) == session_id  # the retry works


def _debris(*folders: Path) -> list[Path]:
    return [path for folder in folders for path in folder.iterdir() if path.suffix == ".converting"]


# -- 8. byte-exact ----------------------------------------------------------------------------


def test_import_fork_and_export_are_byte_exact_with_a_lone_cr_inside_a_line(tmp_path: Path) -> None:
    with sessionlog.repository(tmp_path / "a") as repo:
        with repo.create(**HEADER) as store:
            store.commit([F.user_message("one")])
            store.commit([F.user_message("two")])
            session_id = store.load().session_id
        data = repo.export(session_id)
    lines = data.split(b"\n")
    lines[1] = lines[1].replace(b'{"', b'{\r"', 1)  # a CR where JSON allows whitespace
    crafted = b"\n".join(lines)
    assert b"\r" in crafted and sessionlog.reduce_bytes(crafted).last_seq == 2
    with sessionlog.repository(tmp_path / "b") as other:
        assert other.import_(crafted) == session_id
        assert other.export(session_id) == crafted
        forked = other.fork(session_id, 2)
        assert other.export(forked).split(b"\n", 1)[1] == crafted.split(b"\n", 1)[1]
        with other.open(session_id) as store:  # and it goes on: not fenced
            store.commit([F.user_message("three")])
        assert other.export(session_id).startswith(crafted)
        assert other.load(session_id).last_seq == 3


# -- 9. create=False, read-only -------------------------------------------------------------


def test_create_false_on_a_missing_directory_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "typo" / "sessions"
    with pytest.raises(sessionlog.RepositoryNotFoundError) as caught:
        sessionlog.repository(missing, create=False)
    assert str(missing) in str(caught.value) and isinstance(caught.value, FileNotFoundError)
    assert not (tmp_path / "typo").exists()


def test_reading_with_create_false_never_makes_the_index(tmp_path: Path) -> None:
    with sessionlog.repository(tmp_path) as repo:
        session_id = _session(repo)
    for path in tmp_path.iterdir():
        if path.name.startswith(INDEX_NAME):
            path.unlink()
    before = sorted(os.listdir(tmp_path))
    with sessionlog.repository(tmp_path, create=False) as repo:
        assert [row.session_id for row in repo.list()] == [session_id]
        assert repo.load(session_id).last_seq == 1
        assert repo.export(session_id)
        assert repo.unfinished() == []
        assert sorted(os.listdir(tmp_path)) == before
        forked = repo.fork(session_id, 1)  # writes of no labels need no index either
        repo.delete(forked)
        assert sorted(os.listdir(tmp_path)) == before
        repo.label(session_id, ["a write"])  # a write of labels makes it
        assert repo.list()[0].labels == ("a write",)


def test_a_read_only_directory_is_read_without_making_an_index(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("a read-only mount needs root (permissions do not stop root)")
    source = tmp_path / "source"
    with sessionlog.repository(source) as repo:
        first = _session(repo)
    (source / INDEX_NAME).unlink()
    folder = tmp_path / "ro"
    folder.mkdir()
    done = subprocess.run(["mount", "--bind", "-o", "ro", str(source), str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount read-only here: {done.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True)
        if os.access(folder, os.W_OK):
            pytest.skip("the bind mount is not read-only here")
        for create in (True, False):
            with sessionlog.repository(folder, create=create) as repo:
                assert [row.session_id for row in repo.list()] == [first]
                assert repo.load(first).last_seq == 1
                with pytest.raises(sessionlog.RepositoryError, match="read-only"):
                    repo.label(first, ["x"])
        assert sorted(os.listdir(folder)) == [f"{first}.jsonl"]
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


# -- 14. a listing never refuses a writer -------------------------------------------------------


@pytest.fixture
def inside_the_probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """`hook["during"]()` runs once inside the first lock call (`flock` or `fcntl`) that anything
    makes on a read-only descriptor of a session file, right after the real call: the listing's
    writer probe, at the moment a probe that takes the writer lock holds it."""
    hook: dict[str, Any] = {"during": None}
    real_flock, real_fcntl = fcntl.flock, fcntl.fcntl

    def probed(fd: int) -> None:
        during = hook["during"]
        read_only = real_fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
        if during is not None and read_only and os.readlink(f"/proc/self/fd/{fd}").endswith(".jsonl"):
            hook["during"] = None
            during()

    def flock(fd: int, operation: int) -> None:
        real_flock(fd, operation)
        probed(fd)

    def fcntl_(fd: int, cmd: int, arg: Any = 0) -> Any:
        result = real_fcntl(fd, cmd, arg)
        if cmd not in (fcntl.F_GETFL, fcntl.F_GETFD, fcntl.F_SETFD):
            probed(fd)
        return result

    monkeypatch.setattr(fcntl, "flock", flock)
    monkeypatch.setattr(fcntl, "fcntl", fcntl_)
    yield hook


@pytest.mark.skipif(
    not hasattr(fcntl, "F_OFD_GETLK"), reason="no OFD locks here: the probe takes the flock (writer_lock)"
)
def test_a_writer_opening_a_session_while_a_listing_probes_it_is_not_refused(
    tmp_path: Path, inside_the_probe: dict[str, Any]
) -> None:
    """A crashed session (a prompt accepted, its writer gone) is probed for a live writer by
    `unfinished()`; a writer that opens it at that moment gets it. A read never makes a writer
    fail (#38 item 14: 613 of 21,724 opens were refused by a probe's flock)."""
    repo = sessionlog.repository(tmp_path)
    with repo.create(**HEADER) as store:
        store.commit(F.accept_prompt("long task"))
        session_id = str(store.load().session_id)
    opened: list[Any] = []
    inside_the_probe["during"] = lambda: opened.append(repo.open(session_id))
    unfinished = repo.unfinished()
    assert inside_the_probe["during"] is None, "the listing probed no session: the seam missed it"
    (store,) = opened  # raised SessionLockedError here while the probe took the writer lock
    assert [row.session_id for row in unfinished] == [session_id]  # probed before the writer came
    with store:
        store.commit([F.user_message("the writer that recovers it")])
        (row,) = repo.list()
        assert (row.status, row.writer) == ("running", True)  # its live writer is still seen
        assert repo.unfinished() == []
    assert [row.session_id for row in repo.unfinished()] == [session_id]
    repo.close()


@pytest.mark.skipif(
    not hasattr(fcntl, "F_OFD_GETLK"), reason="no OFD locks on this platform: the probe takes the flock"
)
def test_a_read_lock_someone_else_holds_is_no_live_writer(tmp_path: Path) -> None:
    """A backup or sync tool holding a POSIX read lock on a crashed session's file made the
    probe (which asks whether a write lock would be granted) report a live writer: the session
    was `running` and never recovered. Only a write lock is a writer's (found by a review)."""
    repo = sessionlog.repository(tmp_path)
    with repo.create(**HEADER) as store:
        store.commit(F.accept_prompt("long task"))
        session_id = str(store.load().session_id)
    holder = subprocess.Popen(
        [sys.executable, "-c", _READ_LOCKER, str(repo.path(session_id))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        assert [row.session_id for row in repo.unfinished()] == [session_id]
    finally:
        holder.communicate("")
    repo.close()


_READ_LOCKER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.lockf(fd, fcntl.LOCK_SH)  # a POSIX read lock, as a backup tool takes
print("locked", flush=True)
sys.stdin.read()
"""

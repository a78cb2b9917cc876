"""Acknowledged commits stay, whoever else touches the session: the NUL rule, the single writer,
fork, dropped stores, interrupted commits."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import errno
import fcntl
import gc
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from conftest import HEADER
from sessionlog import CorruptionError
from sessionlog.backends.jsonl_file import FileOps
from sessionlog.core.framing import NUL_WINDOW


def _user(text: str) -> dict[str, object]:
    return {"kind": "entry", "entry": {"type": "message", "message": {"role": "user", "content": text}}}


# -- 1. the NUL rule ---------------------------------------------------------------------------


def test_a_flipped_bit_in_a_group_commit_log_is_refused_not_cut(tmp_path: Path) -> None:
    """One space turned NUL in line 50 of 100 synced commits: refused, nothing truncated."""
    path = tmp_path / "s.jsonl"

    async def write() -> None:
        async with await sessionlog.create_async(path, "jsonl-group", **HEADER) as store:
            for index in range(100):
                await store.commit([_user(f"message number {index}")])

    asyncio.run(write())
    data = path.read_bytes()
    starts = [0, *[index + 1 for index, byte in enumerate(data) if byte == 0x0A]]
    at = data.index(b" ", starts[49])  # line 50
    flipped = data[:at] + b"\0" + data[at + 1 :]
    path.write_bytes(flipped)

    async def reopen() -> None:
        await sessionlog.open_async(path, "jsonl-group")

    with pytest.raises(CorruptionError) as caught:
        asyncio.run(reopen())
    assert (caught.value.code, caught.value.line) == ("MALFORMED_JSON", 50)
    assert path.read_bytes() == flipped  # nothing cut


def test_a_batch_larger_than_the_format_window_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="max_batch_bytes is at most"):
            await sessionlog.create_async(
                tmp_path / "s.jsonl", "jsonl-group", max_batch_bytes=NUL_WINDOW + 1, **HEADER
            )

    asyncio.run(main())
    assert not (tmp_path / "s.jsonl").exists()  # validated before the disk was touched


# -- 8. bad arguments leave nothing behind ------------------------------------------------------

BAD_ARGUMENTS = [
    {"provider": ""},
    {"model": 5},
    {"cwd": ""},
    {"environment_identity": ""},
    {"session_id": "not-a-uuid"},
    {"max_line_bytes": 0},
    {"bogus": 1},
]


@pytest.mark.parametrize("bad", BAD_ARGUMENTS, ids=lambda bad: next(iter(bad)))
@pytest.mark.parametrize("backend", ["jsonl", "jsonl-fsync", "jsonl-async", "jsonl-group"])
def test_create_checks_every_argument_before_touching_the_disk(
    backend: str, bad: dict[str, object], tmp_path: Path
) -> None:
    path = tmp_path / "s.jsonl"
    arguments = {**HEADER, **bad}
    api = sessionlog.backends()[backend].api

    def create(**arguments: object) -> None:
        if api == "sync":
            sessionlog.create(path, backend, **arguments).close()  # type: ignore[arg-type]
            return

        async def main() -> None:
            await (await sessionlog.create_async(path, backend, **arguments)).close()  # type: ignore[arg-type]

        asyncio.run(main())

    with pytest.raises((sessionlog.ValidationError, ValueError, TypeError)):
        create(**arguments)
    assert list(tmp_path.iterdir()) == []  # no session, no temporary file
    create(**HEADER)  # the retry with good arguments is not refused as "exists"
    assert path.exists()


# -- 2. a second writer cannot corrupt a session ------------------------------------------------


@pytest.mark.parametrize("backend", ["jsonl", "jsonl-fsync"])
def test_a_writer_whose_file_changed_under_it_is_poisoned_and_writes_nothing(
    backend: str, tmp_path: Path
) -> None:
    path = tmp_path / "s.jsonl"
    with sessionlog.create(path, backend, **HEADER) as store:
        store.commit([_user("one")])
        with open(path, "ab") as other:  # another writer, which ignored the lock
            other.write(b'{"kind":"entry"')
        grown = path.read_bytes()
        with pytest.raises(sessionlog.StorePoisonedError, match="something else wrote to or cut"):
            store.commit([_user("two")])
        assert path.read_bytes() == grown  # nothing written after the stranger's bytes
        assert store.poisoned
    with sessionlog.create(tmp_path / "t.jsonl", backend, **HEADER) as store:
        store.commit([_user("one")])
        with open(tmp_path / "t.jsonl", "r+b") as other:
            other.truncate(len((tmp_path / "t.jsonl").read_bytes()) - 5)
        with pytest.raises(sessionlog.StorePoisonedError, match="something else wrote to or cut"):
            store.commit([_user("two")])


def test_an_async_writer_whose_file_changed_under_it_is_poisoned(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"

    async def main() -> None:
        async with await sessionlog.create_async(path, "jsonl-group", **HEADER) as store:
            await store.commit([_user("one")])
            with open(path, "ab") as other:
                other.write(b"[")
            with pytest.raises(sessionlog.StorePoisonedError):
                await store.commit([_user("two")])

    asyncio.run(main())
    assert path.read_bytes().endswith(b"\n[")


# -- 3. fork ---------------------------------------------------------------------------------


def _in_child(work: Callable[[], str]) -> str:
    """Run `work` in a forked child; return what it returned (or its error's type and text)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        try:
            result = work()
        except BaseException as error:
            result = f"{type(error).__name__}: {error}"
        os.write(write, result.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        result = pipe.read().decode()
    os.waitpid(pid, 0)
    return result


def test_a_store_is_refused_in_a_forked_child_and_the_child_can_reopen(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    store = sessionlog.create(path, "jsonl-fsync", **HEADER)
    store.commit([_user("parent")])

    def child_commits() -> str:
        store.commit([_user("child")])
        return "committed"

    assert _in_child(child_commits).startswith("StoreForkedError")

    def child_reopens() -> str:
        store.close()  # the inherited copy: closes nothing of the parent's
        with sessionlog.open(path, "jsonl-fsync") as mine:
            return str(mine.load().last_seq)

    # The parent still holds the session: the child is refused as another process.
    assert _in_child(child_reopens).startswith("SessionLockedError")
    store.commit([_user("parent again")])  # the parent's store is untouched by the children
    store.close()
    assert _in_child(child_reopens) == "2"  # released by the parent: the child opens afresh
    assert sessionlog.reduce_bytes(path.read_bytes()).last_seq == 2


# -- 10. filesystems without locks, unwritable directories ---------------------------------------


def test_a_filesystem_without_locks_is_a_typed_error_and_leaks_no_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.jsonl"
    sessionlog.create(path, "jsonl", **HEADER).close()

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(sessionlog.SessionPathError, match="unsafe_no_lock") as caught:
        sessionlog.open(path, "jsonl")
    assert str(path) in str(caught.value)
    sessionlog.open(path, "jsonl", unsafe_no_lock=True).close()  # no claim was leaked


class _FailingOps(FileOps):
    """The errors an unwritable, read-only or full directory gives (root ignores modes, so they
    are injected)."""

    def __init__(self, operation: str, code: int) -> None:
        self.operation, self.code = operation, code

    def open(self, path: Any, flags: int, mode: int = 0o777, **kwargs: Any) -> int:  # type: ignore[override]
        if self.operation == "open":
            raise OSError(self.code, os.strerror(self.code), str(path))
        return os.open(path, flags, mode, **kwargs)

    def write(self, fd: int, data: Any) -> int:  # type: ignore[override]
        if self.operation == "write":
            raise OSError(self.code, os.strerror(self.code))
        return os.write(fd, data)


@pytest.mark.parametrize(
    ("operation", "code"), [("open", errno.EACCES), ("open", errno.EROFS), ("write", errno.ENOSPC)]
)
def test_an_unwritable_directory_is_a_typed_error_naming_the_session(
    operation: str, code: int, tmp_path: Path
) -> None:
    path = tmp_path / "s.jsonl"
    with pytest.raises(sessionlog.SessionPathError) as caught:
        sessionlog.create(path, "jsonl-fsync", ops=_FailingOps(operation, code), **HEADER)
    assert caught.value.errno == code
    assert str(path) in str(caught.value) and ".creating" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


# -- 9. temporaries of a killed create -----------------------------------------------------------


def test_stale_temporaries_of_a_dead_process_go_and_live_ones_stay(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f".s.jsonl.{dead_pid}.abcdef.creating"
    stale.write_bytes(b"{}")
    old_style = tmp_path / f".s.jsonl.{dead_pid}.{threading.get_ident()}.creating"
    old_style.write_bytes(b"{}")
    live = tmp_path / f".s.jsonl.{os.getpid()}.123456.creating"
    live.write_bytes(b"{}")
    other = tmp_path / f".t.jsonl.{dead_pid}.abcdef.creating"
    other.write_bytes(b"{}")
    sessionlog.create(path, "jsonl", **HEADER).close()
    assert not stale.exists() and not old_style.exists()
    assert live.exists() and other.exists()  # in progress, or another session's


# -- 11. a store dropped without close -----------------------------------------------------------


@pytest.mark.parametrize("backend", ["jsonl", "jsonl-fsync"])
def test_a_dropped_store_releases_its_claim_and_descriptor(backend: str, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    store = sessionlog.create(path, backend, **HEADER)
    store.commit([_user("one")])
    del store
    gc.collect()
    with sessionlog.open(path, backend) as again:
        assert again.load().last_seq == 1


@pytest.mark.parametrize("backend", ["jsonl-async", "jsonl-group"])
def test_an_async_store_whose_loop_ended_releases_its_claim(backend: str, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"

    async def leave_open() -> None:
        store = await sessionlog.create_async(path, backend, **HEADER)
        await store.commit([_user("one")])

    asyncio.run(leave_open())
    gc.collect()

    async def reopen() -> int:
        async with await sessionlog.open_async(path, backend) as store:
            return (await store.load()).last_seq

    assert asyncio.run(reopen()) == 1


# -- 12, 13. interrupted and re-entrant commits ------------------------------------------------------


def test_ctrl_c_during_a_commit_poisons_the_store_and_stays_keyboard_interrupt(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    ops = _InterruptingOps()
    store = sessionlog.create(path, "jsonl", ops=ops, **HEADER)
    ops.interrupt = True
    with pytest.raises(KeyboardInterrupt):
        store.commit([_user("interrupted")])
    assert store.poisoned
    with pytest.raises(sessionlog.StorePoisonedError):
        store.commit([_user("after")])
    store.close()


class _InterruptingOps(FileOps):
    interrupt = False

    def write(self, fd: int, data: Any) -> int:  # type: ignore[override]
        if self.interrupt:
            raise KeyboardInterrupt
        return os.write(fd, data)


def test_a_fact_generator_calling_the_store_is_refused_not_deadlocked(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with sessionlog.create(path, "jsonl", **HEADER) as store:

        def facts() -> Iterator[dict[str, object]]:
            store.load()
            yield _user("never")

        with pytest.raises(sessionlog.ReentrantCallError):
            store.commit(facts())
        store.commit([_user("the store still works")])
        assert store.load().last_seq == 1


# -- 6, 7. what a commit accepts -------------------------------------------------------------------


class _Colour(enum.Enum):
    RED = "red"


class _Name(enum.StrEnum):
    ADA = "ada"


@dataclasses.dataclass
class _Point:
    x: int


class _Text(str):
    pass


NOT_JSON = {
    "nan": (float("nan"), "float nan"),
    "infinity": (float("inf"), "float inf"),
    "overflow": (1e400, "float inf"),
    "datetime": (datetime.datetime(2026, 1, 1), "datetime"),
    "uuid": (uuid.UUID(int=1), "UUID"),
    "enum": (_Colour.RED, "_Colour"),
    "str enum": (_Name.ADA, "_Name"),
    "dataclass": (_Point(1), "_Point"),
    "tuple": ((1, 2), "tuple"),
    "str subclass": (_Text("x"), "_Text"),
    "bytes": (b"x", "bytes"),
    "set": ({1}, "set"),
    "big int": (1 << 70, "beyond 64 bits"),
}


@pytest.mark.parametrize("name", NOT_JSON)
def test_a_commit_accepts_json_values_only_and_names_the_bad_path(name: str, tmp_path: Path) -> None:
    bad, what = NOT_JSON[name]
    with sessionlog.create(tmp_path / "s.jsonl", "jsonl", **HEADER) as store:
        store.commit([_user("first")])
        before = (tmp_path / "s.jsonl").read_bytes()
        fact = {"kind": "entry", "entry": {"type": "message", "message": {"role": "user", "content": "x"}}}
        fact["entry"]["message"]["extra"] = [0, bad]  # type: ignore[index]
        with pytest.raises(sessionlog.ValidationError) as caught:
            store.commit([_user("fine"), fact])
        assert caught.value.code == "INVALID_FACT" and caught.value.seq == 3
        where = "[1].entry.message[a string of 5 characters starting 'e'][1]"  # not a contract key: bounded
        assert where in str(caught.value) and what in str(caught.value)
        assert (tmp_path / "s.jsonl").read_bytes() == before  # nothing written
        assert store.commit([_user("next")])[0]["seq"] == 2  # and nothing consumed


def test_a_key_that_is_not_a_string_is_named() -> None:
    pipeline = _pipeline()
    with pytest.raises(sessionlog.ValidationError, match=r"entry is an object with a key of type int"):
        pipeline.prepare([{"kind": "entry", "entry": {1: "x"}}])


@pytest.mark.parametrize("supplied", [0, "", False, [], None, 12345, "not-a-uuid"])
def test_every_supplied_id_is_checked_the_same_way(supplied: object) -> None:
    pipeline = _pipeline()
    with pytest.raises(sessionlog.ValidationError) as caught:
        pipeline.prepare([{**_user("x"), "id": supplied}])
    assert caught.value.code == "INVALID_FACT"


def _pipeline() -> Any:
    from sessionlog.core.commit import CommitPipeline, encode_header
    from sessionlog.core.loading import load

    header = encode_header(cwd="/", provider="p", model="m", environment_identity="e")
    reducer, end = load(header)
    return CommitPipeline(reducer, end, 1)


# -- issue 12, item 8: bounded messages that never echo a secret ------------------------------------


def test_an_error_message_never_echoes_a_wrong_field_and_stays_short() -> None:
    pipeline = _pipeline()
    huge = "k" * 30_000_000
    with pytest.raises(sessionlog.ValidationError) as caught:
        pipeline.prepare([{"kind": huge}])
    assert len(str(caught.value)) < 300 and "30,000,000 characters" in str(caught.value)
    with pytest.raises(sessionlog.ValidationError) as caught:
        pipeline.prepare([{**_user("x"), huge: 1}])
    assert len(str(caught.value)) < 300
    secret = {"api_key": "sk-live-0123456789abcdef"}
    for fact in (
        {"kind": "record", "record": {"type": "toolStarted", "replay": secret}},
        {"kind": "record", "record": {"type": secret}},
        {"kind": secret},
    ):
        with pytest.raises(sessionlog.ValidationError) as caught:
            pipeline.prepare([fact])
        assert "sk-live" not in str(caught.value) and "api_key" not in str(caught.value)


def test_only_a_whole_next_transaction_before_a_stray_byte_is_a_damaged_line_end(tmp_path: Path) -> None:
    """Stale bytes that merely parse as JSON (`{}` and more) are a torn tail, cut as usual; the
    next transaction, whole, followed by a byte other than LF is a damaged LF, refused."""
    path = tmp_path / "s.jsonl"
    with sessionlog.create(path, "jsonl-fsync", **HEADER) as store:
        store.commit([_user("one")])
    good = path.read_bytes()
    path.write_bytes(good + b"{}\x07stale")
    with sessionlog.open(path, "jsonl-fsync") as store:
        assert store.torn_bytes == 8 and store.load().last_seq == 1
    with sessionlog.open(path, "jsonl-fsync") as store:
        store.commit([_user("two")])
    damaged = path.read_bytes()[:-1] + b"\x0b"  # the LF of seq 2 flipped to VT
    path.write_bytes(damaged)
    with pytest.raises(CorruptionError, match="damaged line end"):
        sessionlog.open(path, "jsonl-fsync")
    assert path.read_bytes() == damaged

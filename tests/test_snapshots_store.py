"""Snapshots as a user meets them (core/snapshot.py through a file store): written on close when
they pay, 0600 and hidden beside the log, never listed as a session, removed with it, not copied
by fork, ignored by export; a failed write changes nothing; a log that changed under its snapshot
loads as its full reduction."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import orjson
import pytest

import sessionlog
from sessionlog.backends.jsonl_file import JsonlFile
from sessionlog.backends.side_files import snapshot_path
from sessionlog.core import facts as F
from sessionlog.core import snapshot

HEADER = {"provider": "p", "model": "m", "cwd": "/w"}
MANY = snapshot.MIN_LINES + 10


def fill(path: Path, messages: int, backend: str = "jsonl") -> None:
    with sessionlog.create(path, backend, **HEADER, exist_ok=True) as store:
        for index in range(messages):
            store.commit([F.user_message(f"message {index}")])


def state_of(path: Path, backend: str = "jsonl") -> tuple[bytes, int]:
    with sessionlog.open(path, backend) as store:
        return orjson.dumps(store.load().to_json()), store.snapshot_lines


def full(path: Path) -> bytes:
    return orjson.dumps(sessionlog.reduce_bytes(path.read_bytes()).to_json())


@pytest.mark.parametrize("backend", ["jsonl", "jsonl-fsync"])
def test_a_close_writes_a_hidden_0600_snapshot_that_the_next_open_uses(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "a.jsonl"
    fill(path, MANY, backend)
    kept = snapshot_path(path)
    assert kept.name == ".a.jsonl.snapshot"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == [".a.jsonl.snapshot", "a.jsonl"]  # no temporary left
    state, covered = state_of(path, backend)
    assert covered == MANY + 1  # the header and every message line
    assert state == full(path)


def test_a_short_session_gets_no_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    fill(path, 10)
    assert not snapshot_path(path).exists()


def test_commits_after_a_restore_are_what_they_are_after_a_full_reduction(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    fill(path, MANY)
    with sessionlog.open(path) as store:
        assert store.snapshot_lines == MANY + 1
        used = store.load().last_seq
        store.commit([F.user_message("after")])
        fact = F.user_message("again")
        store.commit([fact])
        with pytest.raises(sessionlog.ValidationError) as error:  # an id already taken
            store.commit([fact])
        assert error.value.code == "DUPLICATE_ID"
        assert store.load().last_seq == used + 2
    snapshot_path(path).unlink()
    assert state_of(path)[0] == full(path)


def test_a_log_that_changed_under_its_snapshot_loads_as_its_full_reduction(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    fill(path, MANY)
    blob = snapshot_path(path).read_bytes()
    data = path.read_bytes()
    cases = {
        "shorter": data[: data.index(b"\n", len(data) // 2) + 1],
        "same length, another message": data.replace(b"message 7", b"message X"),
        "another session": b"",
    }
    other = tmp_path / "b.jsonl"
    fill(other, MANY)
    cases["another session"] = other.read_bytes()
    for name, log in cases.items():
        path.write_bytes(log)
        snapshot_path(path).write_bytes(blob)
        state, covered = state_of(path)
        assert covered == 0, name
        assert state == full(path), name


def test_a_damaged_snapshot_is_ignored_and_replaced(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    fill(path, MANY)
    kept = snapshot_path(path)
    blob = bytearray(kept.read_bytes())
    blob[len(blob) // 2] ^= 0x10
    kept.write_bytes(bytes(blob))
    state, covered = state_of(path)
    assert (state, covered) == (full(path), 0)
    assert state_of(path)[1] == MANY + 1  # the close above wrote a good one again


def test_a_failed_snapshot_write_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.jsonl"
    fill(path, 10)

    def refuse(self: JsonlFile, blob: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(JsonlFile, "write_snapshot", refuse)
    with sessionlog.open(path) as store:
        for index in range(MANY):
            store.commit([F.user_message(f"more {index}")])
        assert store.write_snapshot() is False
        assert store.snapshot_failures == 1
        store.commit([F.user_message("still writing")])
    assert store.snapshot_failures == 2  # the close tried too
    assert not snapshot_path(path).exists()
    assert sessionlog.reduce_bytes(path.read_bytes()).last_seq == 10 + MANY + 1


def test_a_snapshot_is_never_a_session_and_goes_with_its_own(tmp_path: Path) -> None:
    repo = sessionlog.repository(tmp_path)
    store = repo.create(**HEADER)
    for index in range(MANY):
        store.commit([F.user_message(f"message {index}")])
    session_id = store.header["id"]
    store.close()
    kept = snapshot_path(repo.path(session_id))
    assert kept.exists()
    assert [info.session_id for info in repo.list()] == [session_id]
    assert repo.export(session_id) == repo.path(session_id).read_bytes()
    assert orjson.dumps(repo.load(session_id).to_json()) == full(repo.path(session_id))  # through it
    kept.write_bytes(kept.read_bytes()[:-1])  # cut: ignored
    assert orjson.dumps(repo.load(session_id).to_json()) == full(repo.path(session_id))
    forked = repo.fork(session_id, 3)
    assert not snapshot_path(repo.path(forked)).exists()  # a fork is a new log: no snapshot copied
    assert sorted(info.session_id for info in repo.list()) == sorted([session_id, forked])
    repo.delete(session_id)
    assert not kept.exists()
    assert [info.session_id for info in repo.list()] == [forked]


@pytest.mark.parametrize("backend", ["jsonl-async", "jsonl-group"])
def test_an_async_store_writes_and_uses_snapshots_too(tmp_path: Path, backend: str) -> None:
    import asyncio

    path = tmp_path / "a.jsonl"

    async def run() -> tuple[bytes, int]:
        store = await sessionlog.create_async(path, backend, **HEADER)
        await asyncio.gather(*(store.commit([F.user_message(f"m {index}")]) for index in range(MANY)))
        await store.close()
        assert store.snapshot_failures == 0
        store = await sessionlog.open_async(path, backend)
        try:
            return orjson.dumps((await store.load()).to_json()), store.snapshot_lines
        finally:
            await store.close()

    state, covered = asyncio.run(run())
    assert covered == MANY + 1
    assert state == full(path)

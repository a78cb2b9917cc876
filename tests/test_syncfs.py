"""`jsonl-syncfs`: sessions of one filesystem share syncfs rounds. The contract suite, kill -9,
power-loss, fault and hostile-path tests run for it with every file backend; here what is its own:
the rounds, a failed round, the group's lifetime, the kernel check, the directory repository."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from conftest import HEADER, run
from sessionlog.backends import syncfs_file
from sessionlog.backends.jsonl_file import FileOps
from sessionlog.core import facts as F
from sessionlog.core.errors import DurabilityUnavailableError, StorePoisonedError

pytestmark = pytest.mark.skipif(
    syncfs_file.refusal(os.uname().sysname, os.uname().release) is not None,
    reason="jsonl-syncfs needs Linux 5.8 or later",
)


class OrderedOps(FileOps):
    """The real operations, each event numbered in one sequence: a write's end, a syncfs's start
    and end; `fail_syncfs` makes every syncfs fail with EIO."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.fail_syncfs = False
        self._lock = threading.Lock()

    def note(self, kind: str, fd: int = -1) -> int:
        with self._lock:
            self.events.append((kind, fd))
            return len(self.events) - 1

    def write(self, fd: int, data: Any) -> int:
        written = os.write(fd, data)
        self.note("write", fd)
        return written

    def fdatasync(self, fd: Any) -> None:
        self.note("fdatasync", fd)
        os.fdatasync(fd)

    def syncfs(self, fd: int) -> None:
        self.note("syncfs-start")
        time.sleep(0.002)  # a round long enough for the others to queue behind it
        if self.fail_syncfs:
            self.note("syncfs-failed")
            raise OSError(errno.EIO, "injected syncfs failure")
        super().syncfs(fd)
        self.note("syncfs-end")

    def count(self, kind: str) -> int:
        return sum(1 for seen, _ in self.events if seen == kind)


def _fd(store: Any) -> int:
    return store._backend.file._fd  # type: ignore[no-any-return]


def test_sessions_share_rounds_and_each_ack_follows_a_syncfs_begun_after_its_write(tmp_path: Path) -> None:
    ops = OrderedOps()
    sessions, commits = 16, 12

    async def main() -> list[tuple[int, int]]:
        stores = [
            await sessionlog.create_async(tmp_path / f"{n}.jsonl", "jsonl-syncfs", ops=ops, **HEADER)
            for n in range(sessions)
        ]
        acks: list[tuple[int, int]] = []  # (event index, fd)

        async def writer(store: Any) -> None:
            for index in range(commits):
                await store.commit([F.user_message(f"{index}")])
                acks.append((ops.note("ack", _fd(store)), _fd(store)))

        start = len(ops.events)
        await asyncio.gather(*(writer(store) for store in stores))
        assert ops.count("fdatasync") == 0  # no per-file sync at commit
        syncs = sum(1 for kind, _ in ops.events[start:] if kind == "syncfs-start")
        assert syncs <= sessions * commits / 3, f"{syncs} syncfs for {sessions * commits} commits"
        for store in stores:
            await store.close()
        return acks

    acks = run(main)
    assert len(acks) == sessions * commits
    events = ops.events
    for ack, fd in acks:
        wrote = max(i for i in range(ack) if events[i] == ("write", fd))
        covered = any(
            events[i][0] == "syncfs-start"
            and i > wrote
            and any(events[j][0] == "syncfs-end" for j in range(i + 1, ack))
            for i in range(wrote + 1, ack)
        )
        assert covered, f"event {ack}: acknowledged without a syncfs begun after its write (event {wrote})"
    for n in range(sessions):
        assert sessionlog.open(tmp_path / f"{n}.jsonl", "jsonl").load().last_seq == commits


def test_a_failed_syncfs_fails_its_round_and_poisons_the_group_never_retried(tmp_path: Path) -> None:
    ops = OrderedOps()

    async def main() -> None:
        first = await sessionlog.create_async(tmp_path / "a.jsonl", "jsonl-syncfs", ops=ops, **HEADER)
        second = await sessionlog.create_async(tmp_path / "b.jsonl", "jsonl-syncfs", ops=ops, **HEADER)
        await asyncio.gather(
            first.commit([F.user_message("kept a")]), second.commit([F.user_message("kept b")])
        )
        ops.fail_syncfs = True
        before = ops.count("syncfs-start")
        results = await asyncio.gather(
            first.commit([F.user_message("maybe a")]),
            second.commit([F.user_message("maybe b")]),
            return_exceptions=True,
        )
        assert all(isinstance(result, StorePoisonedError) for result in results), results
        assert ops.count("syncfs-start") == before + 1, "one failed syncfs, and no retry"
        ops.fail_syncfs = False
        # A session opened while the group's poisoned members are open joins it, and fails too,
        # writing nothing.
        third = await sessionlog.create_async(tmp_path / "c.jsonl", "jsonl-syncfs", ops=ops, **HEADER)
        with pytest.raises(StorePoisonedError) as caught:
            await third.commit([F.user_message("after")])
        assert "never retried" in str(caught.value.__cause__)
        assert ops.count("syncfs-start") == before + 1
        for store in (first, second, third):
            await store.close()
        # Once the last member closed, a new group syncs again.
        fourth = await sessionlog.open_async(tmp_path / "c.jsonl", "jsonl-syncfs", ops=ops)
        await fourth.commit([F.user_message("new group")])
        await fourth.close()

    run(main)
    for name, kept in (("a", "kept a"), ("b", "kept b")):
        transcript = sessionlog.open(tmp_path / f"{name}.jsonl", "jsonl").load().transcript
        contents = [message["content"] for message in transcript]
        assert contents[0] == kept and contents[1:] in ([], [f"maybe {name}"])
    transcript = sessionlog.open(tmp_path / "c.jsonl", "jsonl").load().transcript
    assert [message["content"] for message in transcript] == ["new group"]


def test_a_cancelled_waiter_leaves_the_round_to_the_others(tmp_path: Path) -> None:
    ops = OrderedOps()

    async def main() -> None:
        store = await sessionlog.create_async(tmp_path / "a.jsonl", "jsonl-syncfs", ops=ops, **HEADER)
        group = store._backend.group
        started = asyncio.ensure_future(group.sync())  # the round in flight
        await asyncio.sleep(0)
        late = [asyncio.ensure_future(group.sync()) for _ in range(3)]  # the next round
        await asyncio.sleep(0)
        late[0].cancel()
        await started
        await asyncio.gather(*late[1:])
        assert late[0].cancelled()
        await store.close()

    run(main)


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_the_group_goes_with_its_last_session(tmp_path: Path) -> None:
    loops = []

    def groups() -> list[Any]:
        return [group for key, group in syncfs_file._groups.items() if key[0] in loops]

    async def main() -> None:
        loops.append(asyncio.get_running_loop())
        stores = [
            await sessionlog.create_async(tmp_path / f"{n}.jsonl", "jsonl-syncfs", **HEADER) for n in range(3)
        ]
        assert len({id(store._backend.group) for store in stores}) == 1  # one filesystem, one loop
        assert groups() == [stores[0]._backend.group]
        await asyncio.gather(*(store.commit([F.user_message("x")]) for store in stores))
        for store in stores[:2]:
            await store.close()
        del stores[:2]
        assert groups(), "a member is left"
        stores.clear()  # dropped unclosed: the group goes with it too

    before = _descriptors()
    run(main)
    assert groups() == []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        _descriptors() > before or any(t.name.startswith("sessionlog-syncfs") for t in threading.enumerate())
    ):
        time.sleep(0.01)
    assert _descriptors() <= before, "the group's directory descriptor is closed"
    assert not [t.name for t in threading.enumerate() if t.name.startswith("sessionlog-syncfs")]


@pytest.mark.parametrize(
    ("sysname", "release", "trusted"),
    [
        ("Linux", "6.18.44-fc-v857", True),
        ("Linux", "5.8.0", True),
        ("Linux", "5.7.19", False),
        ("Linux", "4.19.0-25-amd64", False),
        ("Darwin", "23.1.0", False),
    ],
)
def test_syncfs_is_trusted_only_where_it_reports_writeback_errors(
    sysname: str, release: str, trusted: bool
) -> None:
    reason = syncfs_file.refusal(sysname, release)
    assert (reason is None) == trusted
    if reason is not None:
        assert release in reason and "jsonl-group" in reason


def test_an_untrusted_kernel_refuses_before_creating_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(syncfs_file, "refusal", lambda sysname, release: "no syncfs here")
    with pytest.raises(DurabilityUnavailableError, match="no syncfs here"):
        run(lambda: sessionlog.create_async(tmp_path / "a.jsonl", "jsonl-syncfs", **HEADER))
    assert list(tmp_path.iterdir()) == []


def test_a_directory_repository_commits_through_jsonl_syncfs(tmp_path: Path) -> None:
    async def main() -> list[str]:
        repo = await sessionlog.repository_async(tmp_path, backend="jsonl-syncfs")
        stores = [await repo.create(**HEADER) for _ in range(8)]
        assert {store.info.name for store in stores} == {"jsonl-syncfs"}
        await asyncio.gather(*(store.commit([F.user_message(f"{n}")]) for n, store in enumerate(stores)))
        ids = [store.path.name.removesuffix(".jsonl") for store in stores]
        for store in stores:
            await store.close()
        assert len(await repo.list()) == 8
        await repo.close()
        return ids

    ids = run(main)
    with sessionlog.repository(tmp_path) as repo:
        assert [repo.load(session_id).last_seq for session_id in ids] == [1] * 8


def test_a_sync_directory_repository_points_to_the_async_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="repository_async"):
        sessionlog.repository(tmp_path, backend="jsonl-syncfs")

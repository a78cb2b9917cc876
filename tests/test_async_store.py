"""AsyncSessionStore over jsonl-async and jsonl-group: order, group commit, call-time validation,
poisoning through the FileOps seam, close, batch bounds, and parity with the sync `jsonl`."""

from __future__ import annotations

import asyncio
import errno
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest

import sessionlog
from conftest import ASYNC_BACKENDS, HEADER, run
from sessionlog import new_id
from sessionlog.backends.jsonl_async import INFO as ASYNC_INFO
from sessionlog.backends.jsonl_async import open_jsonl_async
from sessionlog.backends.jsonl_file import DEFAULT_OPS, FileOps
from sessionlog.core import facts as F
from sessionlog.core.async_store import AsyncSessionStore
from sessionlog.core.store import AsyncBackend

T = TypeVar("T")
HUNG = 60.0  # seconds: a hang detector's bound (what a test waits for comes long before)
AN_HOUR_US = 3_600_000_000  # a max wait no test sits out


def user(index: int, size: int = 450) -> list[dict[str, Any]]:
    text = f"message {index} "
    return [F.user_message(text + "x" * max(0, size - len(text)))]


def file_lines(path: Path) -> list[Any]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()[1:]]


def seqs(path: Path) -> list[int]:
    return [line["seq"] for line in file_lines(path)]


class Ops(FileOps):
    """Fault injection and a gate: `hold()` makes the next write wait (in its worker thread) until
    `release()` (for `jsonl-syncfs`, which writes on the event loop, the next syncfs waits);
    `fail_write_on` / `fail_sync_on` make the n-th write / sync (counting from 1, the header's
    write included) raise, after writing half the data if `short_then_fail`."""

    def __init__(self) -> None:
        self.writes = 0
        self.syncs = 0
        self.fail_write_on: int | None = None
        self.fail_sync_on: int | None = None
        self.short_then_fail = False
        self._gate: threading.Event | None = None
        self.entered = threading.Event()

    def hold(self) -> None:
        self.entered.clear()
        self._gate = threading.Event()

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.set()

    def _wait_at_gate(self) -> None:
        gate = self._gate
        if gate is not None:
            self.entered.set()
            if not gate.wait(HUNG):
                raise TimeoutError(f"the test never released the gate (waited {HUNG:.0f} s)")

    def write(self, fd: int, data: Any) -> int:
        if not _on_event_loop():
            self._wait_at_gate()
        self.writes += 1
        if self.writes == self.fail_write_on:
            if self.short_then_fail:
                os.write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.EIO, "injected write failure")
        return os.write(fd, data)

    def fdatasync(self, fd: int) -> None:  # type: ignore[override]
        self.syncs += 1
        if self.syncs == self.fail_sync_on:
            raise OSError(errno.EIO, "injected fdatasync failure")
        os.fdatasync(fd)

    def syncfs(self, fd: int) -> None:
        self._wait_at_gate()
        self.syncs += 1
        if self.syncs == self.fail_sync_on:
            raise OSError(errno.EIO, "injected syncfs failure")
        super().syncfs(fd)


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def entered(ops: Ops) -> None:
    """Wait until the writer's worker thread is inside the held write."""
    assert await asyncio.to_thread(ops.entered.wait, HUNG), f"no write reached the gate in {HUNG:.0f} s"


async def within(awaitable: Awaitable[T], what: str) -> T:
    """`awaitable`'s result; a failure naming `what` it waited for if that took `HUNG` seconds."""
    started = time.monotonic()
    try:
        return await asyncio.wait_for(awaitable, HUNG)
    except TimeoutError:
        raise AssertionError(f"waited {time.monotonic() - started:.0f} s for {what}") from None


async def waiting_for_company(store: AsyncSessionStore) -> None:
    """Let the tasks just made run, then wait until the writer waits for more commits (its
    max-wait timer running)."""

    async def gathering() -> None:
        await asyncio.sleep(0)
        while store._gathering is None:
            await asyncio.sleep(0.001)

    await within(gathering(), "the writer to wait for company")


class Counting:
    """An AsyncBackend wrapper that records every batch."""

    def __init__(self, inner: AsyncBackend) -> None:
        self.inner = inner
        self.batches: list[list[bytes]] = []
        self.reads = 0

    async def read(self) -> bytes:
        self.reads += 1
        return await self.inner.read()

    async def truncate(self, length: int) -> None:
        await self.inner.truncate(length)

    async def append_batch(self, lines: list[bytes]) -> None:
        self.batches.append(list(lines))
        await self.inner.append_batch(lines)

    async def close(self) -> None:
        await self.inner.close()


async def counted(
    path: Path, ops: FileOps = DEFAULT_OPS, **options: Any
) -> tuple[AsyncSessionStore, Counting]:
    header = sessionlog.encode_header(
        cwd="/workspace", provider="openrouter", model="test/model", environment_identity="t"
    )
    backend = Counting(await open_jsonl_async(path, create=header, ops=ops))
    return await AsyncSessionStore.open_backend(backend, path, ASYNC_INFO, **options), backend


async def create(path: Path, backend: str, **options: Any) -> AsyncSessionStore:
    return await sessionlog.create_async(path, backend, **HEADER, **options)


# -- order and group commit -------------------------------------------------------------------


@pytest.mark.parametrize("backend", ASYNC_BACKENDS)
def test_concurrent_commits_keep_call_order(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "s.jsonl"

    async def main() -> None:
        async with await create(path, backend) as store:
            done: list[int] = []

            async def one(index: int) -> int:
                committed = await store.commit(user(index))
                done.append(committed[0]["seq"])
                return int(committed[0]["seq"])

            results = await asyncio.gather(*(one(index) for index in range(200)))
            assert results == list(range(1, 201))
            assert done == results  # acknowledged in log order
            state = await store.load()
        assert state == sessionlog.reduce_bytes(path.read_bytes())
        assert seqs(path) == list(range(1, 201))
        contents = [line["entry"]["message"]["content"] for line in file_lines(path)]
        assert [int(text.split()[1]) for text in contents] == list(range(200))

    run(main)


def test_concurrent_commits_share_writes(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"

    async def main() -> None:
        store, backend = await counted(path)
        await asyncio.gather(*(store.commit(user(index)) for index in range(300)))
        await store.close()
        assert len(backend.batches) < 300 // 4
        assert sum(len(batch) for batch in backend.batches) == 300
        assert max(len(batch) for batch in backend.batches) > 1
        assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for b in backend.batches for line in b)
        assert b"".join(line for batch in backend.batches for line in batch) == b"\n".join(
            path.read_bytes().split(b"\n")[1:]
        )

    run(main)


def test_load_reads_no_file(tmp_path: Path) -> None:
    async def main() -> None:
        store, backend = await counted(tmp_path / "s.jsonl")
        async with store:
            for index in range(5):
                await store.commit(user(index))
                assert (await store.load()).last_seq == index + 1
        assert backend.reads == 1  # the open

    run(main)


def test_a_commit_returns_only_after_its_write(tmp_path: Path) -> None:
    ops = Ops()

    async def main() -> None:
        store = await create(tmp_path / "s.jsonl", "jsonl-async", ops=ops)
        ops.hold()
        task = asyncio.create_task(store.commit(user(1)))
        await entered(ops)
        await asyncio.sleep(0.02)
        assert not task.done()
        assert (await store.load()).last_seq == 0  # acknowledged state only
        ops.release()
        assert (await task)[0]["seq"] == 1
        assert (await store.load()).last_seq == 1
        await store.close()

    run(main)


# -- validation at call time ------------------------------------------------------------------


@pytest.mark.parametrize("backend", ASYNC_BACKENDS)
def test_a_bad_transaction_fails_at_once_and_never_queues(tmp_path: Path, backend: str) -> None:
    ops = Ops()
    path = tmp_path / "s.jsonl"

    async def main() -> None:
        store = await create(path, backend, ops=ops)
        ops.hold()
        prompt = F.user_message("go", id=new_id())
        first = asyncio.create_task(store.commit([prompt]))
        await entered(ops)  # the user entry is in flight, not acknowledged
        # A transaction that builds on the queued one validates against it ...
        run_fact = F.run_started(prompt["id"])
        second = asyncio.create_task(store.commit([run_fact]))
        await asyncio.sleep(0)
        # ... and one that contradicts it fails at once, while the write is still held.
        with pytest.raises(sessionlog.ValidationError) as caught:
            await asyncio.wait_for(store.commit([F.run_started(prompt["id"])]), 1)
        assert caught.value.code == "INVALID_TRANSITION"
        with pytest.raises(sessionlog.ValidationError):
            await store.commit([])
        with pytest.raises(sessionlog.ValidationError):
            await store.commit([{**F.user_message("x"), "seq": 9}])
        with pytest.raises(TypeError):
            await store.commit(F.user_message("one fact, not a list"))  # type: ignore[arg-type]
        ops.release()
        assert (await first)[0]["seq"] == 1
        assert (await second)[0]["seq"] == 2
        assert (await store.commit(user(3)))[0]["seq"] == 3
        state = await store.load()
        await store.close()
        assert seqs(path) == [1, 2, 3]
        assert state == sessionlog.reduce_bytes(path.read_bytes())

    run(main)


# -- poisoning --------------------------------------------------------------------------------


@pytest.mark.parametrize("short", [False, True], ids=["error", "short-write-then-error"])
@pytest.mark.parametrize("backend", ASYNC_BACKENDS)
def test_a_failed_write_poisons_the_batch_the_queue_and_the_store(
    tmp_path: Path, backend: str, short: bool
) -> None:
    ops = Ops()
    path = tmp_path / "s.jsonl"

    async def main() -> None:
        store = await create(path, backend, ops=ops, max_batch_commits=4)
        assert (await store.commit(user(1)))[0]["seq"] == 1
        writes = ops.writes
        if backend == "jsonl-syncfs":  # it writes on the event loop: the write fails at once
            ops.fail_write_on, ops.short_then_fail = writes + 1, short
            held = asyncio.create_task(store.commit(user(2)))
            behind = [asyncio.create_task(store.commit(user(index))) for index in range(3, 14)]
        else:
            ops.hold()
            held = asyncio.create_task(store.commit(user(2)))
            await entered(ops)
            behind = [asyncio.create_task(store.commit(user(index))) for index in range(3, 14)]
            await asyncio.sleep(0)
            ops.fail_write_on, ops.short_then_fail = writes + 1, short  # the held write fails
            ops.release()
        results = await asyncio.gather(held, *behind, return_exceptions=True)
        assert all(isinstance(result, sessionlog.StorePoisonedError) for result in results), results
        assert isinstance(results[0], BaseException) and isinstance(results[0].__cause__, OSError)
        assert store.poisoned
        assert ops.writes == writes + 1  # the batches behind it were never attempted
        with pytest.raises(sessionlog.StorePoisonedError):
            await store.commit(user(99))
        with pytest.raises(sessionlog.StorePoisonedError):
            await store.load()
        with pytest.raises(sessionlog.StorePoisonedError):
            await store.flush()
        await store.close()
        await store.close()
        assert ops.writes == writes + 1  # never retried
        reopened = await sessionlog.open_async(path, backend)
        last = (await reopened.load()).last_seq
        if backend == "jsonl-syncfs":  # its failed batch held several commits: whole lines may land
            assert 1 <= last <= 13
        else:
            assert last == 1  # a torn half line is dropped
        assert (await reopened.commit(user(2)))[0]["seq"] == last + 1
        await reopened.close()

    run(main)


def test_a_failed_write_fails_its_whole_batch(tmp_path: Path) -> None:
    ops = Ops()
    path = tmp_path / "s.jsonl"

    async def main() -> None:
        store = await create(path, "jsonl-async", ops=ops)
        ops.hold()
        first = asyncio.create_task(store.commit(user(1)))
        await entered(ops)
        batch = [asyncio.create_task(store.commit(user(index))) for index in range(2, 9)]
        await asyncio.sleep(0)
        ops.fail_write_on = ops.writes + 2  # the write after the held one: the batch 2..8
        ops.release()
        assert (await first)[0]["seq"] == 1
        outcomes = await asyncio.gather(*batch, return_exceptions=True)
        assert all(isinstance(outcome, sessionlog.StorePoisonedError) for outcome in outcomes), outcomes
        assert "may or may not be on disk" in str(outcomes[0])
        await store.close()
        assert seqs(path) == [1]

    run(main)


def test_a_failed_fdatasync_poisons_its_batch_and_is_never_retried(tmp_path: Path) -> None:
    ops = Ops()
    path = tmp_path / "s.jsonl"

    async def main() -> None:
        store = await create(path, "jsonl-group", ops=ops)
        assert (await store.commit(user(1)))[0]["seq"] == 1
        ops.hold()
        held = asyncio.create_task(store.commit(user(2)))
        await entered(ops)
        batch = [asyncio.create_task(store.commit(user(index))) for index in range(3, 9)]
        await asyncio.sleep(0)
        syncs = ops.syncs
        ops.fail_sync_on = syncs + 2  # the sync of batch 3..8, which queued behind the held write
        ops.release()
        assert (await held)[0]["seq"] == 2
        results = await asyncio.gather(*batch, return_exceptions=True)
        assert all(isinstance(result, sessionlog.StorePoisonedError) for result in results), results
        assert ops.syncs == syncs + 2
        writes = ops.writes
        for _ in range(3):
            with pytest.raises(sessionlog.StorePoisonedError):
                await store.commit(user(0))
        await store.close()
        assert (ops.syncs, ops.writes) == (syncs + 2, writes)  # no retry, no later write

    run(main)


# -- close ------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ASYNC_BACKENDS)
def test_close_drains_the_queue(tmp_path: Path, backend: str) -> None:
    ops = Ops()
    path = tmp_path / "s.jsonl"

    async def main() -> None:
        store = await create(path, backend, ops=ops)
        ops.hold()
        tasks = [asyncio.create_task(store.commit(user(index))) for index in range(1, 51)]
        await entered(ops)
        closing = asyncio.create_task(store.close())
        await asyncio.sleep(0)
        assert store.closed
        with pytest.raises(sessionlog.StoreClosedError):
            await store.commit(user(0))
        with pytest.raises(sessionlog.StoreClosedError):
            await store.load()
        ops.release()
        await closing
        results = await asyncio.gather(*tasks)
        assert [result[0]["seq"] for result in results] == list(range(1, 51))
        await store.close()  # idempotent
        assert seqs(path) == list(range(1, 51))

    run(main)


def test_a_cancelled_close_still_drains_and_closes(tmp_path: Path) -> None:
    ops = Ops()
    path = tmp_path / "s.jsonl"

    async def main() -> None:
        store = await create(path, "jsonl-group", ops=ops)
        ops.hold()
        tasks = [asyncio.create_task(store.commit(user(index))) for index in range(1, 21)]
        await entered(ops)
        closing = asyncio.create_task(store.close())
        await asyncio.sleep(0)
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        ops.release()
        results = await asyncio.gather(*tasks)
        assert len(results) == 20
        await store.close()
        # The file is released: it opens again in this process.
        again = await sessionlog.open_async(path, "jsonl-group")
        assert (await again.load()).last_seq == 20
        await again.close()

    run(main)


def test_a_cancelled_writer_fails_what_it_never_wrote_with_store_closed(tmp_path: Path) -> None:
    """What an event loop shutting down does to the private writer task: the write in flight may
    land (the store is poisoned: reopen to find out), the queue behind it never does."""
    ops = Ops()
    path = tmp_path / "s.jsonl"

    async def main() -> None:
        store = await create(path, "jsonl-async", ops=ops, max_batch_commits=1)
        ops.hold()
        first = asyncio.create_task(store.commit(user(1)))
        await entered(ops)
        queued = [asyncio.create_task(store.commit(user(index))) for index in range(2, 6)]
        await asyncio.sleep(0)
        writer = store._writer
        assert writer is not None
        writer.cancel()
        results = await asyncio.gather(first, *queued, return_exceptions=True)
        assert isinstance(results[0], sessionlog.StorePoisonedError)
        assert all(isinstance(result, sessionlog.StoreClosedError) for result in results[1:])
        ops.release()
        await store.close()
        reopened = await sessionlog.open_async(path, "jsonl-async")
        assert (await reopened.load()).last_seq == 1  # the held write finished in its thread
        await reopened.close()

    run(main)


def test_open_and_create_release_the_file_on_error(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"

    async def main() -> None:
        await (await create(path, "jsonl-async")).close()
        with pytest.raises(sessionlog.SessionExistsError):
            await create(path, "jsonl-group")
        with pytest.raises(ValueError):
            await sessionlog.open_async(path, "jsonl-async", max_batch_commits=0)
        with pytest.raises(ValueError):
            await sessionlog.open_async(path, "jsonl-async", max_wait_us=-1)
        with pytest.raises(TypeError):
            await sessionlog.open_async(path, "jsonl-async", no_such_option=1)
        with pytest.raises(TypeError):
            await sessionlog.open_async(path, "jsonl")  # a sync backend
        store = await sessionlog.open_async(path, "jsonl-group", lock=True)  # nothing was left claimed
        with pytest.raises(sessionlog.SessionLockedError):
            await sessionlog.open_async(path, "jsonl-async")
        await store.close()

    run(main)


# -- batch bounds -----------------------------------------------------------------------------


def _held_burst(
    tmp_path: Path, count: int, sizes: Callable[[int], int], **options: Any
) -> tuple[list[list[bytes]], Path]:
    ops = Ops()
    path = tmp_path / "s.jsonl"

    async def main() -> list[list[bytes]]:
        header = sessionlog.encode_header(cwd="/w", provider="p", model="m", environment_identity="e")
        backend = Counting(await open_jsonl_async(path, create=header, ops=ops))
        store = await AsyncSessionStore.open_backend(backend, path, ASYNC_INFO, **options)
        ops.hold()
        first = asyncio.create_task(store.commit(user(0)))
        await entered(ops)
        tasks = [asyncio.create_task(store.commit(user(index, sizes(index)))) for index in range(1, count)]
        await asyncio.sleep(0)
        ops.release()
        await asyncio.gather(first, *tasks)
        await store.close()
        return backend.batches[1:]  # after the held one

    return run(main), path


def test_max_batch_commits_is_respected(tmp_path: Path) -> None:
    batches, path = _held_burst(tmp_path, 51, lambda _: 450, max_batch_commits=7)
    assert [len(batch) for batch in batches] == [7] * 7 + [1]
    assert seqs(path) == list(range(1, 52))


def test_max_batch_bytes_is_respected_and_a_big_commit_goes_alone(tmp_path: Path) -> None:
    big = 5_000
    batches, path = _held_burst(
        tmp_path, 31, lambda index: big if index == 10 else 450, max_batch_bytes=2_000
    )
    assert all(sum(map(len, batch)) <= 2_000 or len(batch) == 1 for batch in batches)
    assert max(len(batch) for batch in batches) == 3  # ~560-byte lines
    alone = [batch for batch in batches if any(len(line) > big for line in batch)]
    assert len(alone) == 1 and len(alone[0]) == 1
    assert seqs(path) == list(range(1, 32))


def test_max_wait_gathers_spaced_commits_and_a_full_batch_does_not_wait(tmp_path: Path) -> None:
    # An hour-long timer: only the behaviour under test (a full batch, a second commit, close)
    # can end the writer's wait before `within`'s hang detector gives up.
    async def main() -> None:
        waiting, backend = await counted(tmp_path / "a.jsonl", max_wait_us=AN_HOUR_US, max_batch_commits=5)
        commits = []
        for index in range(5):  # each arrives while the writer waits; the fifth fills the batch
            commits.append(asyncio.create_task(waiting.commit(user(index))))
            if index < 4:
                await waiting_for_company(waiting)
        await within(asyncio.gather(*commits), "a full batch to be written before its timer")
        assert [len(batch) for batch in backend.batches] == [5]
        await waiting.close()

        alone, backend = await counted(tmp_path / "b.jsonl", max_wait_us=AN_HOUR_US, max_batch_commits=2)
        first = asyncio.create_task(alone.commit(user(0)))
        await waiting_for_company(alone)
        assert not first.done() and backend.batches == []  # a lone commit waits for company
        second = asyncio.create_task(alone.commit(user(1)))
        await within(asyncio.gather(first, second), "the company to fill the batch")
        assert [len(batch) for batch in backend.batches] == [2]
        await alone.close()

        timed, backend = await counted(tmp_path / "e.jsonl", max_wait_us=30_000)
        await within(timed.commit(user(0)), "the max-wait timer to write a lone commit")
        assert [len(batch) for batch in backend.batches] == [1]
        await timed.close()

        closing, backend = await counted(tmp_path / "d.jsonl", max_wait_us=AN_HOUR_US)
        pending = asyncio.create_task(closing.commit(user(0)))
        await waiting_for_company(closing)
        await within(closing.close(), "close to write the commit kept for company")  # not the hour
        assert (await pending)[0]["seq"] == 1

        # The default writes at once: a lone commit reaches the write with nothing else queued,
        # and what arrives during that write goes in the next batch.
        ops = Ops()
        eager, backend = await counted(tmp_path / "c.jsonl", ops=ops)

        async def straight_to_the_write() -> None:
            while not ops.entered.is_set():
                assert eager._gathering is None, "the default writer waited for company"
                await asyncio.sleep(0.001)

        ops.hold()
        first = asyncio.create_task(eager.commit(user(0)))
        await within(straight_to_the_write(), "a lone commit's write")
        later = [asyncio.create_task(eager.commit(user(index))) for index in (1, 2)]
        await asyncio.sleep(0)
        ops.release()
        await within(asyncio.gather(first, *later), "the eager writer's two batches")
        assert [len(batch) for batch in backend.batches] == [1, 2]
        await eager.close()

    run(main)


def test_flush_waits_for_what_was_queued(tmp_path: Path) -> None:
    ops = Ops()

    async def main() -> None:
        store = await create(tmp_path / "s.jsonl", "jsonl-group", ops=ops)
        await store.flush()  # nothing queued: returns at once
        ops.hold()
        tasks = [asyncio.create_task(store.commit(user(index))) for index in range(10)]
        await entered(ops)
        flushing = asyncio.create_task(store.flush())
        await asyncio.sleep(0.01)
        assert not flushing.done()
        ops.release()
        await flushing
        assert (await store.load()).last_seq == 10
        await asyncio.gather(*tasks)
        await store.close()

    run(main)


# -- sync/async parity ------------------------------------------------------------------------

SNAPSHOT = {
    "model": "test/model",
    "systemPromptDigest": "sha256:" + "0" * 64,
    "tools": [{"name": "ls", "definitionDigest": "sha256:" + "1" * 64}],
    "adapterIdentity": "adapter",
    "routingIdentity": "route",
    "outputOptionsDigest": "sha256:" + "2" * 64,
}


def agent_turn() -> list[list[dict[str, Any]]]:
    """One run with a tool call, every fact with an explicit id (so both files can match)."""
    prompt = F.user_message("list the files", id=new_id())
    started_run = F.run_started(prompt["id"], operation_id=new_id(), id=new_id())
    operation = started_run["record"]["operationId"]
    first = F.step_attempt(
        operation, prompt["id"], SNAPSHOT, step_id=new_id(), attempt_id=new_id(), id=new_id()
    )
    step, attempt = first["record"]["stepId"], first["record"]["attemptId"]
    call = F.tool_call("call_1", "ls", "{}")
    assistant = F.assistant_message(step, attempt, None, tool_calls=[call], id=new_id())
    intent = F.tool_started(
        operation,
        step,
        assistant["id"],
        0,
        call,
        {},
        replay="safe",
        replay_key="builtin:ls:v1",
        environment_identity="t",
        result_entry_id=new_id(),
        id=new_id(),
    )
    result = F.tool_result(intent, "a.txt b.txt")
    second = F.step_attempt(
        operation, result["id"], SNAPSHOT, step_id=new_id(), attempt_id=new_id(), id=new_id()
    )
    final = F.assistant_message(
        second["record"]["stepId"], second["record"]["attemptId"], "Two files.", id=new_id()
    )
    used = F.usage(
        operation, {"input": 120, "output": 7}, attempt_id=second["record"]["attemptId"], id=new_id()
    )
    finished = F.operation_finished(
        operation, "run", "completed", completion="normal", final_entry_id=final["id"], id=new_id()
    )
    return [
        [prompt, started_run],
        [first],
        [assistant],
        [intent],
        [result],
        [second],
        [final, used],
        [finished],
        [F.user_message("thanks", id=new_id())],
    ]


_CLOCK = re.compile(rb'"(timestamp|createdAt)":\d+')


def normalised(data: bytes) -> bytes:
    return _CLOCK.sub(rb'"\1":0', data)


def test_sync_and_async_write_the_same_bytes_and_state(tmp_path: Path) -> None:
    transactions = agent_turn() + agent_turn()
    session_id = new_id()
    sync_path, async_path = tmp_path / "sync.jsonl", tmp_path / "async.jsonl"

    with sessionlog.create(sync_path, "jsonl", session_id=session_id, **HEADER) as sync_store:
        sync_out = [sync_store.commit(transaction) for transaction in transactions]
        sync_state = sync_store.load()

    async def main() -> tuple[list[list[dict[str, Any]]], sessionlog.SessionState]:
        async with await sessionlog.create_async(
            async_path, "jsonl-async", session_id=session_id, **HEADER
        ) as store:
            out = [await store.commit(transaction) for transaction in transactions]
            return out, await store.load()

    async_out, async_state = run(main)
    sync_bytes, async_bytes = sync_path.read_bytes(), async_path.read_bytes()
    assert normalised(sync_bytes) == normalised(async_bytes)
    assert len(sync_bytes) == len(async_bytes)
    assert sync_state == sessionlog.reduce_bytes(sync_bytes)
    assert async_state == sessionlog.reduce_bytes(async_bytes)
    assert sessionlog.reduce_bytes(normalised(sync_bytes)) == sessionlog.reduce_bytes(normalised(async_bytes))
    strip = [[{k: v for k, v in fact.items() if k != "timestamp"} for fact in tx] for tx in sync_out]
    assert strip == [[{k: v for k, v in fact.items() if k != "timestamp"} for fact in tx] for tx in async_out]

    # ... and concurrent async commits of independent transactions land the same bytes too.
    prompts = [[F.user_message(f"prompt {index}", id=new_id())] for index in range(50)]
    with sessionlog.create(tmp_path / "sync2.jsonl", "jsonl", session_id=session_id, **HEADER) as sync_store:
        for transaction in prompts:
            sync_store.commit(transaction)

    async def burst() -> None:
        async with await sessionlog.create_async(
            tmp_path / "async2.jsonl", "jsonl-group", session_id=session_id, **HEADER
        ) as store:
            await asyncio.gather(*(store.commit(transaction) for transaction in prompts))

    run(burst)
    assert normalised((tmp_path / "sync2.jsonl").read_bytes()) == normalised(
        (tmp_path / "async2.jsonl").read_bytes()
    )


def test_store_properties(tmp_path: Path) -> None:
    async def main() -> None:
        for backend, durability in (("jsonl-async", "process"), ("jsonl-group", "power")):
            info = sessionlog.backends()[backend]
            assert (info.durability, info.api) == (durability, "async")
            store = await create(tmp_path / f"{backend}.jsonl", backend)
            assert (store.durability, store.info, store.path) == (
                durability,
                info,
                tmp_path / f"{backend}.jsonl",
            )
            assert not store.closed and not store.poisoned
            assert backend in repr(store)
            await store.close()
            assert store.closed

    run(main)

"""Cancelling a caller of `commit` never tears the log or splits memory from file.

A prepared commit is never dropped (later ones were validated against it): it lands whole unless
the store is poisoned, whether or not its caller is still waiting. The stress test cancels
callers at random points (before their task ran, while queued, while their batch is being
written or synced, through `wait_for` timeouts) and checks after every round: no partial line,
acknowledgement order equals log order, every acknowledged commit present exactly once, nothing
present that was not submitted, and `load()` equal to `reduce_bytes` of the file.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import orjson
import pytest

import sessionlog
from conftest import ASYNC_BACKENDS, HEADER, run
from sessionlog import new_id
from sessionlog.backends.jsonl_file import FileOps
from sessionlog.core import facts as F


def ids_in_file(path: Path) -> list[str]:
    """The first fact id of every transaction line, in log order; asserts every line is whole."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), "a partial line at the end of the log"
    ids = []
    for raw in data.split(b"\n")[1:-1]:
        value = orjson.loads(raw)  # a torn or interleaved line would not parse
        ids.append((value[0] if isinstance(value, list) else value)["id"])
    return ids


class Held(FileOps):
    """Holds the next write in its worker thread until released."""

    def __init__(self) -> None:
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def write(self, fd: int, data: Any) -> int:
        gate = self.gate
        if gate is not None:
            self.entered.set()
            gate.wait(10)
        return super().write(fd, data)


@pytest.mark.parametrize("backend", ASYNC_BACKENDS)
def test_a_caller_cancelled_during_its_write_still_lands(tmp_path: Path, backend: str) -> None:
    ops = Held()
    path = tmp_path / "s.jsonl"

    async def main() -> None:
        store = await sessionlog.create_async(path, backend, ops=ops, **HEADER)
        ops.gate = threading.Event()
        prompt = F.user_message("in flight", id=new_id())
        writing = asyncio.create_task(store.commit([prompt]))
        assert await asyncio.to_thread(ops.entered.wait, 10)
        queued_fact = F.user_message("queued", id=new_id())
        queued = asyncio.create_task(store.commit([queued_fact]))
        never = asyncio.create_task(store.commit([F.user_message("never ran")]))
        never.cancel()  # cancelled before its task ran: never prepared, never lands
        await asyncio.sleep(0)
        writing.cancel()
        queued.cancel()
        for task in (writing, queued, never):
            with pytest.raises(asyncio.CancelledError):
                await task
        assert (await store.load()).last_seq == 0  # not acknowledged yet ...
        gate, ops.gate = ops.gate, None
        gate.set()
        await store.flush()  # ... and after the flush, load() tells: both landed
        state = await store.load()
        assert state.last_seq == 2
        assert [message["content"] for message in state.transcript] == ["in flight", "queued"]
        # seq continues after them, and a transaction may build on a cancelled caller's commit
        committed = await store.commit([F.run_started(queued_fact["id"])])
        assert committed[0]["seq"] == 3
        state = await store.load()
        await store.close()
        assert ids_in_file(path) == [prompt["id"], queued_fact["id"], committed[0]["id"]]
        assert sessionlog.reduce_bytes(path.read_bytes()) == state

    run(main)


def test_a_cancelled_open_releases_the_file(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"

    class SlowOpen(FileOps):
        def __init__(self) -> None:
            self.gate = threading.Event()
            self.entered = threading.Event()

        def open(self, *args: Any, **kwargs: Any) -> int:
            self.entered.set()
            self.gate.wait(10)
            return super().open(*args, **kwargs)

    async def main() -> None:
        await (await sessionlog.create_async(path, "jsonl-async", **HEADER)).close()
        ops = SlowOpen()
        opening = asyncio.create_task(sessionlog.open_async(path, "jsonl-group", ops=ops))
        assert await asyncio.to_thread(ops.entered.wait, 10)
        opening.cancel()
        ops.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await opening
        for _ in range(100):  # the worker thread finishes the open; the callback closes it
            try:
                store = await sessionlog.open_async(path, "jsonl-async")
                break
            except sessionlog.SessionLockedError:
                await asyncio.sleep(0.01)
        else:
            raise AssertionError("the cancelled open left the session claimed")
        await store.close()

    run(main)


# -- the stress test ---------------------------------------------------------------------------

ROUNDS = 30
COMMITTERS = 48


def _transaction(rng: random.Random, serial: int) -> list[dict[str, Any]]:
    size = rng.choice((40, 400, 450, 2_000, 20_000))
    transaction = [F.user_message(f"{serial} " + "x" * size, id=new_id())]
    if rng.random() < 0.2:
        transaction.append(F.user_message(f"{serial} second fact", id=new_id()))
    return transaction


async def _stress(path: Path, backend: str, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    store = await sessionlog.create_async(
        path,
        backend,
        max_batch_commits=rng.choice((8, 64, 1024)),
        max_batch_bytes=rng.choice((4_000, 1 << 20)),
        **HEADER,
    )
    submitted: set[str] = set()
    acknowledged: list[str] = []  # first fact id, in the order the awaits returned
    rejected = 0
    serial = 0

    async def caller(transaction: list[dict[str, Any]], delay: int) -> None:
        for _ in range(delay):
            await asyncio.sleep(0)
        committed = await store.commit(transaction)
        acknowledged.append(committed[0]["id"])

    async def bad_caller() -> None:
        nonlocal rejected
        with pytest.raises(sessionlog.ValidationError):
            await store.commit([F.user_message("bad", id="not-a-uuid")])
        rejected += 1

    async def reader() -> None:
        """load() while batches are in flight: the acknowledged state, never going back."""
        last = (await store.load()).last_seq
        for _ in range(rng.randrange(1, 40)):
            await asyncio.sleep(0 if rng.random() < 0.8 else 0.0002)
            seen = (await store.load()).last_seq
            assert seen >= last
            last = seen

    cancelled = 0
    for _ in range(ROUNDS):
        tasks: list[asyncio.Task[None]] = [asyncio.create_task(reader())]
        for _ in range(COMMITTERS):
            serial += 1
            transaction = _transaction(rng, serial)
            submitted.add(transaction[0]["id"])
            delay = rng.randrange(4)
            if rng.random() < 0.15:  # a caller that gives up through wait_for's timeout
                timeout = rng.uniform(0, 0.002)
                tasks.append(asyncio.create_task(_timed(caller, transaction, delay, timeout)))
            else:
                tasks.append(asyncio.create_task(caller(transaction, delay)))
            if rng.random() < 0.05:
                tasks.append(asyncio.create_task(bad_caller()))
        victims = [task for task in tasks[1:] if rng.random() < 0.5]
        for task in victims:
            how = rng.random()
            if how < 0.1:
                task.cancel()  # before it ran at all
            elif how < 0.6:
                asyncio.get_running_loop().call_soon(task.cancel)
            else:
                asyncio.get_running_loop().call_later(rng.uniform(0, 0.003), task.cancel)
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        cancelled += sum(isinstance(outcome, asyncio.CancelledError) for outcome in outcomes)
        assert not [o for o in outcomes if isinstance(o, BaseException) and not _cancel(o)], outcomes
        await store.flush()
        state = await store.load()
        logged = ids_in_file(path)
        assert sessionlog.reduce_bytes(path.read_bytes()) == state  # memory equals file
        assert len(logged) == len(set(logged)) == state.last_seq - _extra_facts(path)
        assert set(logged) <= submitted
        assert set(acknowledged) <= set(logged)  # every acknowledged commit is there ...
        assert [i for i in logged if i in set(acknowledged)] == acknowledged  # ... in the same order
    await store.close()
    assert sessionlog.reduce_bytes(path.read_bytes()) == state
    logged = ids_in_file(path)
    return {
        "cancelled": cancelled,
        "acknowledged": len(acknowledged),
        "landed_after_cancel": len(logged) - len(acknowledged),
        "never_landed": len(submitted) - len(logged),
        "rejected": rejected,
    }


async def _timed(
    caller: Callable[[list[dict[str, Any]], int], Coroutine[Any, Any, None]],
    transaction: list[dict[str, Any]],
    delay: int,
    timeout: float,
) -> None:
    try:
        await asyncio.wait_for(caller(transaction, delay), timeout)
    except TimeoutError:
        raise asyncio.CancelledError from None


def _cancel(outcome: BaseException) -> bool:
    return isinstance(outcome, asyncio.CancelledError)


def _extra_facts(path: Path) -> int:
    """Facts beyond the first of each line (multi-fact transactions)."""
    extra = 0
    for raw in path.read_bytes().split(b"\n")[1:-1]:
        value = orjson.loads(raw)
        if isinstance(value, list):
            extra += len(value) - 1
    return extra


def test_random_cancellations_never_tear_the_log(tmp_path: Path) -> None:
    totals: dict[str, int] = {}
    for index, backend in enumerate(ASYNC_BACKENDS * 2):
        path = tmp_path / f"{index}-{backend}.jsonl"
        figures = run(lambda path=path, backend=backend, seed=index: _stress(path, backend, seed))  # type: ignore[misc]
        assert figures["acknowledged"] > 0 and figures["landed_after_cancel"] > 0
        for key, value in figures.items():
            totals[key] = totals.get(key, 0) + value
    assert totals["cancelled"] >= 1_000, totals
    print(f"\ncancellation stress: {totals}")

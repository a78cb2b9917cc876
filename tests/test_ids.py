"""Fact ids: every one a UUIDv7 as uuid6 (the design's reference) reads it, in strictly increasing
order within a process and after a fork, the child never repeating the parent's random bits."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from typing import Any

import pytest
import uuid6

from conftest import budgets
from sessionlog.core import ids
from sessionlog.core.ids import new_id

CANONICAL = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def check_v7(text: str, earliest_ms: int, latest_ms: int) -> uuid6.UUID:
    """`text` is the canonical lowercase form of a version-7, RFC-variant UUID whose clock lies
    in [earliest_ms, latest_ms]."""
    assert type(text) is str and CANONICAL.fullmatch(text), text
    reference = uuid6.UUID(text)
    assert str(reference) == text and str(uuid.UUID(text)) == text
    assert reference.version == 7 and reference.variant == uuid.RFC_4122
    assert earliest_ms <= reference.time <= latest_ms, (text, earliest_ms, reference.time, latest_ms)
    assert reference.time == int(reference) >> 80
    return reference


@pytest.mark.parametrize("count", budgets(20_000, 500_000))
def test_every_id_is_a_uuid7_as_uuid6_reads_it_and_they_strictly_increase(count: int) -> None:
    before = time.time_ns() // 1_000_000
    made = [new_id() for _ in range(count)]
    after = time.time_ns() // 1_000_000
    # Within one millisecond the 12-bit counter leaves room for at least 2,048 ids before the
    # id's clock runs ahead of the real one; it can run ahead by at most count / 2,048 ms.
    for text in made:
        check_v7(text, before, after + count // 2048 + 1)
    assert made == sorted(made) and len(set(made)) == count
    as_ints = [int(uuid6.UUID(text)) for text in made]
    assert as_ints == sorted(as_ints)
    # Random bits: the 62 of rand_b are never repeated, and they are not all alike.
    rand_b = {value & ((1 << 62) - 1) for value in as_ints}
    assert len(rand_b) == count


def test_the_random_bits_come_in_blocks_not_a_system_call_per_id(monkeypatch: Any) -> None:
    calls: list[int] = []
    real = os.urandom

    def counting(size: int) -> bytes:
        calls.append(size)
        return real(size)

    monkeypatch.setattr(ids.os, "urandom", counting)
    for _ in range(4000):
        new_id()
    assert 1 <= len(calls) <= 4000 * ids._SLOT_BYTES // ids._BLOCK_BYTES + 1
    assert all(size == ids._BLOCK_BYTES for size in calls)


class FrozenClock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def time_ns(self) -> int:
        return self.ms * 1_000_000


def test_more_ids_in_one_millisecond_than_the_counter_holds_run_the_clock_ahead(monkeypatch: Any) -> None:
    now = uuid6.UUID(new_id()).time + 50  # ahead of every id made so far in this process
    monkeypatch.setattr(ids, "time", FrozenClock(now))
    made = [new_id() for _ in range(10_000)]
    assert made == sorted(made) and len(set(made)) == len(made)
    stamps = [check_v7(text, now, now + 10_000 // 2048 + 1).time for text in made]
    assert stamps[0] == now and stamps[-1] > now  # borrowed milliseconds, never reused ones


def test_a_clock_that_steps_back_does_not_make_an_id_sort_before_an_earlier_one(monkeypatch: Any) -> None:
    clock = FrozenClock(uuid6.UUID(new_id()).time + 50)
    monkeypatch.setattr(ids, "time", clock)
    first = [new_id() for _ in range(3)]
    clock.ms -= 5_000  # NTP stepped the clock back
    later = [new_id() for _ in range(3)]
    assert first + later == sorted(first + later)
    assert uuid6.UUID(later[-1]).time == clock.ms + 5_000


def test_ids_from_many_threads_are_distinct() -> None:
    results: list[list[str]] = [[] for _ in range(4)]

    def make(out: list[str]) -> None:
        out.extend(new_id() for _ in range(5_000))

    threads = [threading.Thread(target=make, args=(out,)) for out in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [text for out in results for text in out]
    assert len(set(every)) == len(every)
    for out in results:
        assert out == sorted(out)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_neither_reuses_the_parents_random_bits_nor_sorts_before_its_ids() -> None:
    new_id()  # the parent holds a random block, mostly unused
    before_fork = new_id()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its ids to the pipe, then out without running pytest's teardown
        try:
            os.close(read_end)
            made = "\n".join(new_id() for _ in range(200)).encode()
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(made)
        finally:
            os._exit(0)
    os.close(write_end)
    parent_ids = [new_id() for _ in range(200)]
    with os.fdopen(read_end, "rb") as pipe:
        child_ids = pipe.read().decode().split("\n")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and len(child_ids) == 200
    # (earlier tests froze the clock ahead: the ids may still run ahead of it)
    latest = max(time.time_ns() // 1_000_000, uuid6.UUID(before_fork).time) + 1
    for text in child_ids:
        check_v7(text, uuid6.UUID(before_fork).time, latest)
    assert child_ids == sorted(child_ids) and child_ids[0] > before_fork
    assert parent_ids == sorted(parent_ids) and parent_ids[0] > before_fork

    def rand_b(text: str) -> int:
        return int(uuid6.UUID(text)) & ((1 << 62) - 1)

    assert not {rand_b(text) for text in child_ids} & {rand_b(text) for text in parent_ids}
    assert not set(child_ids) & set(parent_ids)

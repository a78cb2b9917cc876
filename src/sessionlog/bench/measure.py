"""Measuring rows honestly: alternate rounds, medians with min-max, each row's ceiling measured in
the same run, interleaved with it.

A *job* runs one round of one row and returns how many commits (or operations) it did, how long
it took and the latency of each. `alternate` runs round 1 of every job, then round 2 of every
job, and so on: a disk whose sync latency drifts over minutes drifts for every row alike. A row's
throughput is the median of its rounds, with the slowest and fastest round beside it; its
ceiling's is the median of the ceiling's rounds of the same run, and `vs ceiling` is the median
over rounds of the row's round divided by the ceiling's round of the same round.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

Job = Callable[[], tuple[int, float, list[float]]]  # -> (operations, seconds, latencies in s)


class RowFailed(RuntimeError):
    """A row's round raised: the row and the error, in one line (the run stops, its scratch goes)."""

    def __init__(self, row: str, error: Exception) -> None:
        self.row = row
        self.error = error
        cause = error.__cause__ or error.__context__
        because = f" (because {_one_line(cause)})" if cause is not None else ""
        super().__init__(f"the row {row!r} failed: {_one_line(error)}{because}")

    def masking(self, location: str) -> RowFailed:
        """The same failure, its message with `location`'s password masked (a row's driver may
        quote it)."""
        from ..repositories.locations import mask_in

        masked = RowFailed(self.row, self.error)
        masked.args = (mask_in(str(self), location),)
        return masked


def _one_line(error: BaseException) -> str:
    detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {detail}" if detail else type(error).__name__


@dataclass
class Measured:
    """The rounds of one row."""

    rates: list[float] = field(default_factory=list)  # operations/s of each round
    latencies: list[float] = field(default_factory=list)  # seconds, every operation of every round
    operations: int = 0  # over every round
    flushes: int | None = None  # device flushes during its rounds (`flushes`), None: not counted
    seconds: float = 0.0  # the timed part of every round

    def add(
        self, operations: int, seconds: float, latencies: list[float], flushes: int | None = None
    ) -> None:
        self.rates.append(operations / seconds if seconds > 0 else 0.0)
        self.seconds += seconds
        self.latencies.extend(latencies)
        self.operations += operations
        if flushes is not None:
            self.flushes = (self.flushes or 0) + flushes

    def summary(self) -> dict[str, float]:
        counted = {} if self.flushes is None else {"flushes": self.flushes, "operations": self.operations}
        ordered = sorted(self.latencies)

        def percentile(q: float) -> float:
            return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1e6 if ordered else 0.0

        return {
            "per_s": statistics.median(self.rates) if self.rates else 0.0,
            "min_per_s": min(self.rates, default=0.0),
            "max_per_s": max(self.rates, default=0.0),
            "p50_us": percentile(0.50),
            "p99_us": percentile(0.99),
            **counted,
        }


class Window:
    """The device's flush counter read at the start and at the end of the timed part of a round
    (its commits, not the creation, closing and removal of its sessions around them): the
    shorter the window, the fewer flushes of other work on the machine fall into a row's count.
    The timing helpers (`timed`, `shapes.in_threads`, `shapes._in_tasks`) open and close it; a
    job that does not is counted from just before to just after the whole round."""

    def __init__(self) -> None:
        self.read: Callable[[], int | None] | None = None
        self.first: int | None = None
        self.last: int | None = None

    def begin(self, read: Callable[[], int | None] | None) -> None:
        self.read, self.first, self.last = read, None, None

    def start(self) -> None:
        if self.read is not None and self.first is None:
            self.first = self.read()

    def stop(self) -> None:
        if self.read is not None and self.first is not None:
            self.last = self.read()

    def counted(self) -> int | None:
        """The flushes between start and stop; None when the round never opened the window."""
        if self.first is None or self.last is None:
            return None
        return self.last - self.first


WINDOW = Window()  # the round being measured: one at a time (`alternate` runs rounds in turn)


def alternate(
    jobs: Mapping[str, Job], rounds: int, flushes: Callable[[], int | None] | None = None
) -> dict[str, Measured]:
    """Round r of every job before round r + 1 of any. `flushes`: the device's flush counter
    (`flushes.FlushCounter.read`), read at the start and the end of each round's timed part
    (`Window`)."""
    measured = {name: Measured() for name in jobs}
    for _ in range(rounds):
        for name, job in jobs.items():
            before = flushes() if flushes else None
            WINDOW.begin(flushes)
            try:
                done = job()
            except Exception as error:
                raise RowFailed(name, error) from error
            finally:
                windowed = WINDOW.counted()
                WINDOW.begin(None)
            after = flushes() if flushes else None
            whole = after - before if before is not None and after is not None else None
            measured[name].add(*done, flushes=windowed if windowed is not None else whole)
    return measured


def steady(
    jobs: Mapping[str, Job],
    ceilings: Collection[str],
    rounds: int,
    flushes: Callable[[], int | None] | None = None,
) -> tuple[dict[str, Measured], bool]:
    """`alternate`, and once more when a ceiling of `ceilings` moved by more than `trust.MOVED`
    between rounds: the measurement whose ceilings moved least is kept. (measured, whether it
    was measured again). The jobs are closed after it (`close_all`)."""
    from . import trust

    def worst(run: dict[str, Measured]) -> float:
        return trust.worst_spread({name: run[name].summary() for name in ceilings})

    try:
        measured = alternate(jobs, rounds, flushes)
        if rounds < 2 or worst(measured) <= trust.MOVED:
            return measured, False
        again = alternate(jobs, rounds, flushes)
        return (again if worst(again) < worst(measured) else measured), True
    finally:
        close_all(jobs)


def close_all(jobs: Mapping[str, Job]) -> None:
    """`close()` each job that has one (`shapes.Kept`: its sessions, opened before its first
    round), after its last round, also when a round failed; a close that raises is the row's
    `RowFailed` (the others are closed still)."""

    def closer(name: str, close: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            try:
                close()
            except Exception as error:
                raise RowFailed(name, error) from error

        return run

    with contextlib.ExitStack() as closing:
        for name, job in jobs.items():
            close = getattr(job, "close", None)
            if close is not None:
                closing.callback(closer(name, close))


def paired_ratio(row: Measured, ceiling: Measured) -> float:
    """The median, over rounds, of the row's rate over its ceiling's in the same round."""
    pairs = [mine / theirs for mine, theirs in zip(row.rates, ceiling.rates, strict=False) if theirs > 0]
    return statistics.median(pairs) if pairs else 0.0


def timed(
    operations: int, operation: Callable[[int], Any], window: bool = True
) -> tuple[int, float, list[float]]:
    """Run `operation(i)` for i in range(operations), each timed; `window`: this is the round's
    timed part (`Window`), not one thread's share of it."""
    import time

    clock = time.perf_counter
    latencies = []
    if window:
        WINDOW.start()
    start = clock()
    for index in range(operations):
        began = clock()
        operation(index)
        latencies.append(clock() - began)
    elapsed = clock() - start
    if window:
        WINDOW.stop()
    return operations, elapsed, latencies

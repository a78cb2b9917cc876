"""The async backends against the sync ones: group commit, and what a thread hop costs.

Every commit is a one-fact transaction, a user message entry whose line is ~500 bytes (the size
of the ceilings' lines; consecutive user entries are legal), into a freshly created session in
a temporary directory on the filesystem under test. A commit is timed from the call to its
return, i.e. until it is durable in its backend's class: `jsonl-group` and `jsonl-fsync`
acknowledge only after the fdatasync covering the line returned (power class); `jsonl` and
`jsonl-async` after the write (process class).

Shapes: one committer (sequential commits; for the async backends, awaits in one task) and 64
committers (64 asyncio tasks on one event loop, each committing in a loop). commits/s is the
number of commits over the time spent committing. The six rows run in interleaved rounds (the
order rotating) on open stores, so that a drift of the machine hits every row alike. `hop_us` is
the median round trip of `loop.run_in_executor(None, <no-op>)`, the floor under any one-committer
async commit here. Each row's note also gives the time spent in the cyclic garbage collector.

    python -m benchmarks.async_backends [--full] [--json]

Floors, measured in the same interleaved rounds, say how far this design can go on this machine:

* ``core 1x1``: the part every store shares, with no I/O: the fact builder, then
  ``CommitPipeline.prepare`` (seq, id, timestamp, encode, validate on the live reducer) and
  ``acknowledge``.
* ``floor asyncio 64x1`` (process) and ``floor asyncio+fdatasync 64x1`` (power): 64 tasks, each
  awaiting one future per commit, and one writer task that writes everything queued in one
  executor hop (plus one fdatasync): the async design with nothing of sessionlog in it (no
  validation, no encoding, a ready-made line).

So no async store that validates in the core and gives each committer a task can exceed
``ceiling = t(sync row) / (t(core) + t(floor))`` for the ratio to a sync row: ``async_64_ceiling``
(against ``jsonl 1x1``) and ``group_64_ceiling`` (against ``jsonl-fsync 1x1``). A ceiling below a
target means no implementation of that design reaches the target here.

Ratios come from one run; this is never a test.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson

import sessionlog
from benchmarks.ceilings import BenchRow, make_row, percentile, time_commits
from sessionlog.backends.jsonl_file import FileOps
from sessionlog.core import facts as F
from sessionlog.core.async_store import AsyncSessionStore
from sessionlog.core.commit import CommitPipeline, encode_header
from sessionlog.core.store import reduce_stored

COMMITTERS = 64
LINE = 500
WARMUP = 5  # commits before timing: thread pool start-up, first-call caches
SHAPES = (
    ("jsonl", 1),
    ("jsonl-fsync", 1),
    ("jsonl-async", 1),
    ("jsonl-async", COMMITTERS),
    ("jsonl-group", 1),
    ("jsonl-group", COMMITTERS),
)
TARGETS = {"group_64_ratio": 8.0, "group_1_ratio": 0.6, "async_64_ratio": 1.0}
_HEADER: dict[str, Any] = {
    "provider": "bench",
    "model": "bench-model",
    "cwd": "/bench",
    "environment_identity": "bench",
}
_TEXT = (
    "The user asked the agent to reconcile last quarter's invoices against the ledger, flag any "
    "duplicates, and draft a short summary for the finance channel. The agent listed the open "
    "items, called the accounting tool twice, and noted that two vendor credits had been applied "
    "to the wrong cost centre in March. Please keep the summary short and in plain words. "
) * 3


class CountingOps(FileOps):
    """Counts writes and fdatasyncs, to report how many commits one sync covered."""

    def __init__(self) -> None:
        self.writes = 0
        self.syncs = 0

    def write(self, fd: int, data: Any) -> int:
        self.writes += 1
        return os.write(fd, data)

    def fdatasync(self, fd: int) -> None:  # type: ignore[override]
        self.syncs += 1
        os.fdatasync(fd)


def _content() -> str:
    """User message content that makes a one-fact line `LINE` bytes long."""
    with tempfile.TemporaryDirectory() as tmp, sessionlog.create(pathlib.Path(tmp) / "p", **_HEADER) as store:
        fact = store.commit([F.user_message("x")])[0]  # seq, id and timestamp have fixed sizes here
    return _TEXT[: max(1, LINE - len(orjson.dumps(fact)))]


def _transaction(content: str) -> list[dict[str, Any]]:
    return [F.user_message(content)]


class Case:
    """One row: a store of `backend` with `committers` committers; samples add up over rounds."""

    def __init__(self, backend: str, committers: int) -> None:
        self.backend = backend
        self.committers = committers
        self.info = sessionlog.backends()[backend]
        self.ops = CountingOps()
        self.samples: list[int] = []
        self.seconds = 0.0
        self.gc_seconds = 0.0  # spent in the cyclic garbage collector during the timed rounds
        self.gc_runs = 0
        self.sync_store: sessionlog.SessionStore | None = None
        self.async_store: AsyncSessionStore | None = None
        self.path = pathlib.Path()

    @property
    def name(self) -> str:
        return f"{self.backend} {self.committers}x1"

    async def open(self, directory: pathlib.Path, content: str) -> None:
        self.path = directory / f"{self.backend}-{self.committers}.jsonl"
        if self.info.api == "sync":
            self.sync_store = sessionlog.create(self.path, self.backend, ops=self.ops, **_HEADER)
            for _ in range(WARMUP):
                self.sync_store.commit(_transaction(content))
        else:
            self.async_store = await sessionlog.create_async(self.path, self.backend, ops=self.ops, **_HEADER)
            for _ in range(WARMUP):
                await self.async_store.commit(_transaction(content))
        self.ops.writes = self.ops.syncs = 0

    async def round(self, commits: int, content: str) -> None:
        with GC_CLOCK.counting(self):
            if self.sync_store is not None:
                commit = self.sync_store.commit
                samples, seconds = time_commits(lambda _: commit(_transaction(content)), commits)
            else:
                samples, seconds = await self._async_round(commits, content)
        self.samples += samples
        self.seconds += seconds

    async def _async_round(self, commits: int, content: str) -> tuple[list[int], float]:
        assert self.async_store is not None
        commit = self.async_store.commit
        clock = time.perf_counter_ns
        samples: list[int] = []

        async def committer() -> None:
            for _ in range(commits // self.committers):
                started = clock()
                await commit(_transaction(content))
                samples.append(clock() - started)

        started = time.perf_counter()
        await asyncio.gather(*(committer() for _ in range(self.committers)))
        return samples, time.perf_counter() - started

    async def close(self) -> None:
        if self.sync_store is not None:
            state = self.sync_store.load()
            self.sync_store.close()
        else:
            assert self.async_store is not None
            state = await self.async_store.load()
            await self.async_store.close()
        if state.last_seq != len(self.samples) + WARMUP:
            raise RuntimeError(f"{self.name}: {state.last_seq} facts, expected {len(self.samples) + WARMUP}")

    def row(self, hop_us: float) -> BenchRow:
        note = f"{len(self.samples) / max(1, self.ops.writes):.1f} commits per write"
        if self.info.durability == "power":
            note += f" and per fdatasync ({self.ops.syncs} syncs)"
        if self.info.api == "async" and self.committers == 1:
            note += f"; includes one thread hop per commit (~{hop_us:.0f} us)"
        note += (
            f"; gc {self.gc_seconds / len(self.samples) * 1e6:.1f} us per commit ({self.gc_runs} collections)"
        )
        row = make_row(
            self.name,
            "backend",
            self.info.durability,
            self.samples,
            self.seconds,
            bytes_per_fact=_per_fact(self.path),
            note=note,
        )
        row["committers"] = self.committers
        return row


class FloorCase(Case):
    """The async design with nothing of sessionlog in it: `committers` tasks each await one
    future per commit; one writer task joins every queued line into one write (and, `sync`, one
    fdatasync) in one executor hop, then resolves their futures."""

    def __init__(self, sync: bool, committers: int) -> None:
        self.sync = sync
        self.backend = "floor asyncio+fdatasync" if sync else "floor asyncio"
        self.committers = committers
        self.samples = []
        self.seconds = self.gc_seconds = 0.0
        self.gc_runs = 0
        self.fd = -1
        self.path = pathlib.Path()
        self.line = b""

    async def open(self, directory: pathlib.Path, content: str) -> None:
        self.path = directory / f"floor-{self.sync}.jsonl"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self.line = orjson.dumps(_transaction(content)[0]) + b"\n"

    def _write(self, data: bytes) -> None:
        os.write(self.fd, data)
        if self.sync:
            os.fdatasync(self.fd)

    async def round(self, commits: int, content: str) -> None:
        loop = asyncio.get_running_loop()
        queue: list[tuple[bytes, asyncio.Future[None]]] = []
        writer: list[asyncio.Task[None]] = []
        clock = time.perf_counter_ns
        samples: list[int] = []

        async def drain() -> None:
            while queue:
                batch = queue[:]
                del queue[:]
                await loop.run_in_executor(None, self._write, b"".join(line for line, _ in batch))
                for _, future in batch:
                    future.set_result(None)
            writer.clear()

        async def commit() -> None:
            future = loop.create_future()
            queue.append((self.line, future))
            if not writer:
                writer.append(loop.create_task(drain()))
            await future

        async def committer() -> None:
            for _ in range(commits // self.committers):
                started = clock()
                await commit()
                samples.append(clock() - started)

        with GC_CLOCK.counting(self):
            started = time.perf_counter()
            await asyncio.gather(*(committer() for _ in range(self.committers)))
            self.seconds += time.perf_counter() - started
        self.samples += samples

    async def close(self) -> None:
        os.close(self.fd)

    def row(self, hop_us: float) -> BenchRow:
        row = make_row(
            f"{self.backend} {self.committers}x1",
            "floor",
            "power" if self.sync else "process",
            self.samples,
            self.seconds,
            note="no validation, no encoding: futures, task switches, one hop per batch"
            f"; gc {self.gc_seconds / len(self.samples) * 1e6:.1f} us per commit",
        )
        row["committers"] = self.committers
        return row


class CoreCase(Case):
    """What every store does per commit before its I/O: build the fact, prepare, acknowledge."""

    def __init__(self) -> None:
        super().__init__("jsonl", 1)
        self.backend = "core"
        self.pipeline: CommitPipeline | None = None

    async def open(self, directory: pathlib.Path, content: str) -> None:
        header = encode_header(**_HEADER)
        self.pipeline, _ = reduce_stored(header, directory / "core.jsonl")
        for _ in range(WARMUP):
            self.pipeline.acknowledge(self.pipeline.prepare(_transaction(content)))

    async def round(self, commits: int, content: str) -> None:
        pipeline = self.pipeline
        assert pipeline is not None
        with GC_CLOCK.counting(self):
            samples, seconds = time_commits(
                lambda _: pipeline.acknowledge(pipeline.prepare(_transaction(content))), commits
            )
        self.samples += samples
        self.seconds += seconds

    async def close(self) -> None:
        assert self.pipeline is not None
        if self.pipeline.reducer.next_seq != len(self.samples) + WARMUP + 1:
            raise RuntimeError("core: the pipeline lost a commit")

    def row(self, hop_us: float) -> BenchRow:
        row = make_row(
            "core 1x1",
            "floor",
            "none",
            self.samples,
            self.seconds,
            note="builder + prepare + acknowledge, no I/O"
            f"; gc {self.gc_seconds / len(self.samples) * 1e6:.1f} us per commit",
        )
        row["committers"] = 1
        return row


async def measure(directory: pathlib.Path, commits: int, rounds: int, content: str) -> list[Case]:
    """Every case, in `rounds` interleaved rounds (the order rotating), so that a drift of the
    machine (another process syncing the same disk) hits every row alike."""
    cases = [Case(backend, committers) for backend, committers in SHAPES]
    cases += [CoreCase(), FloorCase(False, COMMITTERS), FloorCase(True, COMMITTERS)]
    for case in cases:
        await case.open(directory, content)
    per_round = commits // rounds
    for index in range(rounds):
        for case in cases[index % len(cases) :] + cases[: index % len(cases)]:
            await case.round(per_round, content)
    for case in cases:
        await case.close()
    return cases


class GcClock:
    """Time spent in the cyclic garbage collector while a case runs (gc.callbacks)."""

    def __init__(self) -> None:
        self.case: Case | None = None
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if self.case is None:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.case.gc_seconds += time.perf_counter() - self._started
            self.case.gc_runs += 1

    @contextlib.contextmanager
    def counting(self, case: Case) -> Iterator[None]:
        self.case = case
        gc.callbacks.append(self._callback)
        try:
            yield
        finally:
            gc.callbacks.remove(self._callback)
            self.case = None


GC_CLOCK = GcClock()


def _per_fact(path: pathlib.Path) -> float:
    data = path.read_bytes()
    lines = data.split(b"\n")[1:-1]
    return sum(map(len, lines)) / len(lines) + 1


def hop_cost(rounds: int = 2_000) -> float:
    """Median microseconds of one `run_in_executor` round trip of a no-op."""

    async def measure() -> float:
        loop = asyncio.get_running_loop()
        noop: Callable[[], None] = lambda: None  # noqa: E731
        for _ in range(50):
            await loop.run_in_executor(None, noop)
        samples = []
        for _ in range(rounds):
            started = time.perf_counter_ns()
            await loop.run_in_executor(None, noop)
            samples.append(time.perf_counter_ns() - started)
        return percentile(samples, 50) / 1000

    return asyncio.run(measure())


def run(
    quick: bool = True, directory: pathlib.Path | None = None, *, commits: int = 0, rounds: int = 0
) -> dict[str, Any]:
    """Measure the rows and the issue's three ratios (plus the one-committer jsonl-async one) and
    this design's ceilings. `commits` and `rounds` override the mode's counts (tests use tiny ones)."""
    if directory is None:
        with tempfile.TemporaryDirectory(prefix="sessionlog-bench-") as tmp:
            return run(quick, pathlib.Path(tmp), commits=commits, rounds=rounds)
    default_commits, default_rounds = (2_048, 8) if quick else (12_800, 20)
    commits, rounds = commits or default_commits, rounds or default_rounds
    content = _content()
    hop_us = hop_cost(1_000 if quick else 5_000)
    cases = asyncio.run(measure(directory, commits, rounds, content))
    rows = {case.name: case.row(hop_us) for case in cases}
    rate = {name: row["commits_per_s"] for name, row in rows.items()}
    figures = {
        "group_64_ratio": rate["jsonl-group 64x1"] / rate["jsonl-fsync 1x1"],
        "group_1_ratio": rate["jsonl-group 1x1"] / rate["jsonl-fsync 1x1"],
        "async_64_ratio": rate["jsonl-async 64x1"] / rate["jsonl 1x1"],
        "async_1_ratio": rate["jsonl-async 1x1"] / rate["jsonl 1x1"],
    }
    per_commit = {name: 1 / commits_per_s for name, commits_per_s in rate.items()}
    core = per_commit["core 1x1"]
    ceilings = {
        "async_64_ceiling": per_commit["jsonl 1x1"] / (core + per_commit[f"floor asyncio {COMMITTERS}x1"]),
        "group_64_ceiling": per_commit["jsonl-fsync 1x1"]
        / (core + per_commit[f"floor asyncio+fdatasync {COMMITTERS}x1"]),
    }
    return {
        "commits": commits,
        "rounds": rounds,
        "committers": COMMITTERS,
        "line_bytes": rows["jsonl 1x1"]["bytes_per_fact"],
        "hop_us": hop_us,
        "rows": list(rows.values()),
        **figures,
        **ceilings,
        "targets": dict(TARGETS),
        "meets": {key: figures[key] >= bound for key, bound in TARGETS.items()},
    }


def _table(result: dict[str, Any]) -> str:
    out = [
        f"{result['commits']:,} one-fact commits per row in {result['rounds']} interleaved rounds, "
        f"~{result['line_bytes']:.0f}-byte lines; "
        f"thread hop (run_in_executor no-op) median {result['hop_us']:.0f} us",
        "",
        f"{'row':<20} {'class':<8} {'commits/s':>10} {'p50 us':>9} {'p99 us':>9}  note",
    ]
    for row in result["rows"]:
        out.append(
            f"{row['name']:<20} {row['durability']:<8} {row['commits_per_s']:>10,.0f} "
            f"{row['p50_us']:>9.1f} {row['p99_us']:>9.1f}  {row['note']}"
        )
    out += ["", f"{'figure':<44} {'measured':>9} {'target':>8}  ok"]
    labels = {
        "group_64_ratio": "jsonl-group 64 committers / jsonl-fsync 1",
        "group_1_ratio": "jsonl-group 1 committer / jsonl-fsync 1",
        "async_64_ratio": "jsonl-async 64 committers / jsonl 1",
    }
    ceiling_of = {"group_64_ratio": "group_64_ceiling", "async_64_ratio": "async_64_ceiling"}
    for key, label in labels.items():
        ok = "yes" if result["meets"][key] else "NO"
        line = f"{label:<44} {result[key]:>8.2f}x {'>= ' + str(result['targets'][key]):>8}  {ok}"
        if key in ceiling_of:
            line += f"  (this design's ceiling here: {result[ceiling_of[key]]:.2f}x)"
        out.append(line)
    out.append(
        f"{'jsonl-async 1 committer / jsonl 1 (no target)':<44} {result['async_1_ratio']:>8.2f}x"
        f"{'':>9}  (one hop per commit: {result['hop_us']:.0f} us)"
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    result = run(quick="--full" not in args)
    print(json.dumps(result, indent=1) if "--json" in args else _table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

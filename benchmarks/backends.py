"""Per-backend rows: what a commit costs through each registered backend, and how long a load takes.

Every backend in ``sessionlog.backends()`` (sync and async) commits ``user_message`` transactions
of ~500 bytes per fact (the size of the ceilings' lines) into a freshly created session, in four
shapes: 1 or 10 facts per transaction, 1 or 64 concurrent committers. Each commit is timed from
the call to its return, i.e. until it is durable in the backend's class.

64 committers are asyncio tasks on one event loop for async backends. A sync store serializes
its commits behind one lock (one transaction, one line, one write, in turn), so 64 threads would
measure lock hand-offs and the GIL, not the backend: those rows are reported as
``n/a: sync API serializes``.

Load time: a valid session of 10k / 100k facts written by ``sessionlog.testing.sessions``
(profile ``bulk``) is opened through the backend and ``load()``-ed (open reduces the whole file;
warm page cache); the best of the repeats.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson

import sessionlog
from benchmarks.ceilings import Progress, make_lines, make_row, sub_progress
from sessionlog.core import facts as F
from sessionlog.core.store import BackendInfo

Row = dict[str, Any]
Tick = Callable[[int, int], None] | None

SHAPES = ((1, 1), (1, 10), (64, 1), (64, 10))  # (committers, facts per transaction)
SYNC_64 = "n/a: sync API serializes (one lock per store; 64 threads would time the lock, not the backend)"
LINE = 500  # bytes per fact, as the ceilings' and the peers' lines
WARMUP = 5  # commits before timing: thread pool start-up, first-call caches
# A one-fact line is then ~500 bytes: 161 bytes of seq, id, timestamp and framing, plus this.
CONTENT = (
    "The user asked the agent to reconcile last quarter's invoices against the ledger, flag any "
    "duplicates, and draft a short summary for the finance channel. The agent listed the open "
    "items, called the accounting tool twice, and noted that two vendor credits had been applied "
    "to the wrong cost centre in March. Please keep the summary short and in plain words."
)[:339]
_HEADER: dict[str, Any] = {
    "provider": "bench",
    "model": "bench-model",
    "cwd": "/bench",
    "environment_identity": "bench",
}


def transaction(facts: int) -> list[dict[str, Any]]:
    return [F.user_message(CONTENT) for _ in range(facts)]


def shape_name(name: str, committers: int, facts: int) -> str:
    return f"{name} {committers}x{facts}"


def na_row(name: str, info: BackendInfo, committers: int, facts: int, note: str, status: str) -> Row:
    return {
        "name": shape_name(name, committers, facts),
        "backend": name,
        "kind": "backend",
        "durability": info.durability,
        "api": info.api,
        "status": status,
        "committers": committers,
        "facts_per_commit": facts,
        "commits_per_s": None,
        "p50_us": None,
        "p99_us": None,
        "bytes_per_fact": None,
        "load_s": None,
        "note": note,
    }


SYNC = "fdatasync" if hasattr(os, "fdatasync") else "fsync"
_sync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


def ceiling_name(durability: str, committers: int, facts: int) -> str:
    """The ceiling of a class at a shape: process -> os.write of the same line, power -> the same
    write + a sync, shared by 64 lines when 64 committers can share one."""
    size = "500 B" if facts == 1 else "5 KB"
    if durability == "process":
        return "os.write" if facts == 1 else f"os.write {size}"
    if committers == 1:
        return f"write+{SYNC}" if facts == 1 else f"write+{SYNC} {size}"
    return f"write 64x{size}+{SYNC}"


class CeilingFile:
    """The bare system calls of a ceiling: `batch` lines of `facts` x 500 bytes per os.write,
    then one sync if `sync`. commit(i) is one iteration."""

    def __init__(self, path: pathlib.Path, *, facts: int, batch: int, sync: bool) -> None:
        self.blob = b"".join(make_lines(batch, LINE * facts))
        self.batch = batch
        self.sync = sync
        self.path = path
        path.unlink(missing_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    @classmethod
    def for_shape(cls, path: pathlib.Path, durability: str, committers: int, facts: int) -> CeilingFile:
        batch = 64 if durability == "power" and committers > 1 else 1
        return cls(path, facts=facts, batch=batch, sync=durability == "power")

    def commit(self, _i: int) -> None:
        os.write(self.fd, self.blob)
        if self.sync:
            _sync(self.fd)

    def close(self) -> None:
        os.close(self.fd)
        self.path.unlink()


WINDOW = 20  # syncs per window of the best-sustained-rate figure


def best_window(samples: list[int], batch: int = 1, window: int = WINDOW) -> float:
    """The best rate (commits/s) over `window` consecutive iterations of `batch` commits each: the
    most a loop sustained for a while, the fairest ceiling on a disk whose latency swings."""
    if len(samples) <= window:
        return batch * len(samples) / (sum(samples) / 1e9)
    running = sum(samples[:window])
    best = running
    for i in range(window, len(samples)):
        running += samples[i] - samples[i - window]
        best = min(best, running)
    return batch * window / (best / 1e9)


class Paired:
    """A backend's commit samples and its ceiling's, taken in alternation (one each in turn, or
    chunk by chunk for 64 committers), so that a disk whose sync latency swings within seconds
    hits both alike."""

    def __init__(self, ceiling: CeilingFile) -> None:
        self.ceiling = ceiling
        self.samples: list[int] = []
        self.seconds = 0.0  # wall time of the backend's commits (64 committers: of each gather)
        self.ceiling_samples: list[int] = []
        self.written = 0

    @property
    def rate(self) -> float:
        return len(self.samples) / self.seconds

    @property
    def ceiling_rate(self) -> float:
        return self.ceiling.batch * len(self.ceiling_samples) / (sum(self.ceiling_samples) / 1e9)

    def ceiling_step(self) -> None:
        t0 = time.perf_counter_ns()
        self.ceiling.commit(0)
        self.ceiling_samples.append(time.perf_counter_ns() - t0)


def _sync_commits(
    name: str, path: pathlib.Path, paired: Paired, facts: int, commits: int, tick: Tick
) -> None:
    clock = time.perf_counter_ns
    step = max(1, commits // 10)
    store = sessionlog.create(path, backend=name, **_HEADER)
    try:
        for _ in range(WARMUP):
            store.commit(transaction(facts))
        before = path.stat().st_size
        for i in range(commits):
            paired.ceiling_step()
            t0 = clock()
            store.commit(transaction(facts))
            paired.samples.append(clock() - t0)
            if tick is not None and ((i + 1) % step == 0 or i + 1 == commits):
                tick(i + 1, commits)
        paired.seconds = sum(paired.samples) / 1e9
        paired.written = path.stat().st_size - before
    finally:
        store.close()


async def _async_commits(
    name: str, path: pathlib.Path, paired: Paired, committers: int, facts: int, commits: int, tick: Tick
) -> None:
    clock = time.perf_counter_ns
    chunks = 5 if committers > 1 else commits
    per_task = max(1, commits // (committers * chunks))
    total = per_task * committers * chunks
    step = max(1, chunks // 10)
    store = await sessionlog.create_async(path, backend=name, **_HEADER)
    try:
        for _ in range(WARMUP):
            await store.commit(transaction(facts))
        before = path.stat().st_size

        async def committer() -> None:
            for _ in range(per_task):
                t0 = clock()
                await store.commit(transaction(facts))
                paired.samples.append(clock() - t0)

        for chunk in range(chunks):
            for _ in range(max(1, per_task * committers // paired.ceiling.batch)):
                paired.ceiling_step()
            start = time.perf_counter()
            if committers == 1:
                await committer()
            else:
                await asyncio.gather(*(committer() for _ in range(committers)))
            paired.seconds += time.perf_counter() - start
            if tick is not None and ((chunk + 1) % step == 0 or chunk + 1 == chunks):
                tick(len(paired.samples), total)
        paired.written = path.stat().st_size - before
    finally:
        await store.close()


def commit_row(
    name: str,
    info: BackendInfo,
    directory: pathlib.Path,
    committers: int,
    facts: int,
    commits: int,
    rounds: int = 1,
    progress: Progress | None = None,
) -> Row:
    """One shape through one backend, paired with its ceiling; with several rounds, the round of
    median throughput."""
    if info.api == "sync" and committers > 1:
        return na_row(name, info, committers, facts, SYNC_64, "n/a")
    label = shape_name(name, committers, facts)
    results = []
    for index in range(rounds):
        path = directory / f"{name}-{committers}x{facts}-{index}.jsonl"
        ceiling = CeilingFile.for_shape(directory / "paired-ceiling.log", info.durability, committers, facts)
        paired = Paired(ceiling)
        tick = sub_progress(progress, label)
        try:
            if info.api == "sync":
                _sync_commits(name, path, paired, facts, commits, tick)
            else:
                asyncio.run(_async_commits(name, path, paired, committers, facts, commits, tick))
        finally:
            ceiling.close()
            path.unlink(missing_ok=True)
        results.append(paired)
    results.sort(key=lambda paired: paired.rate)
    paired = results[len(results) // 2]
    how = "asyncio tasks" if info.api == "async" else "thread"
    against = ceiling_name(info.durability, committers, facts)
    turns = "one commit each in turn" if committers == 1 else "in 5 chunks each in turn"
    note = (
        f"{info.description}; {committers} {how}, {facts} x ~500 B user_message per transaction, "
        f"{len(paired.samples)} timed commits into a fresh session"
        + (f", median of {rounds} rounds" if rounds > 1 else "")
        + f"; latency = call to acknowledgement; vs_ceiling = against {against} run {turns} with this row"
    )
    row: Row = dict(
        make_row(
            label,
            "backend",
            info.durability,
            paired.samples,
            paired.seconds,
            facts_per_commit=facts,
            bytes_per_fact=paired.written / (len(paired.samples) * facts),
            note=note,
        )
    )
    row.update(
        backend=name,
        api=info.api,
        status="ok",
        committers=committers,
        ceiling=against,
        ceiling_commits_per_s=paired.ceiling_rate,
        ceiling_best_window=best_window(paired.ceiling_samples, paired.ceiling.batch),
        vs_ceiling=paired.rate / paired.ceiling_rate,
    )
    return row


def _open_and_load(name: str, info: BackendInfo, path: pathlib.Path) -> tuple[float, int]:
    if info.api == "sync":
        t0 = time.perf_counter()
        store = sessionlog.open(path, backend=name)
        try:
            last = store.load().last_seq
            return time.perf_counter() - t0, last
        finally:
            store.close()

    async def run() -> tuple[float, int]:
        t0 = time.perf_counter()
        store = await sessionlog.open_async(path, backend=name)
        try:
            last = (await store.load()).last_seq
            return time.perf_counter() - t0, last
        finally:
            await store.close()

    return asyncio.run(run())


def load_seconds(name: str, info: BackendInfo, path: pathlib.Path, facts: int, repeats: int) -> float:
    """Best of `repeats`: open the session at `path` through the backend and load() it."""
    best = float("inf")
    for _ in range(max(1, repeats)):
        seconds, last = _open_and_load(name, info, path)
        if last != facts:
            raise RuntimeError(f"{name}: loaded a session of {facts} facts, got last seq {last}")
        best = min(best, seconds)
    return best


def write_session(directory: pathlib.Path, facts: int) -> pathlib.Path | str:
    """A generated valid `bulk` session of `facts` facts on disk, or why there is none."""
    try:
        from sessionlog.testing.sessions import generate_session
    except ImportError as error:
        return f"no session generator (sessionlog.testing.sessions): {error}"
    path = directory / f"generated-{facts}.jsonl"
    data = generate_session(7, facts, profile="bulk").to_bytes()
    path.write_bytes(data)
    os.chmod(path, 0o600)
    return path


def size_key(facts: int) -> str:
    return f"load_{facts // 1000}k_s" if facts % 1000 == 0 else f"load_{facts}_s"


def parse_seconds(path: pathlib.Path, repeats: int) -> float:
    """Best of `repeats`: read the file, split it into lines and orjson.loads each (the floor of
    any JSON-lines load, on the very bytes the backends load)."""
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        for line in path.read_bytes().splitlines():
            orjson.loads(line)
        best = min(best, time.perf_counter() - t0)
    return best


def run_loads(
    registered: Mapping[str, BackendInfo],
    directory: pathlib.Path,
    loads: Mapping[int, int],
    progress: Progress | None = None,
) -> tuple[dict[str, Row], dict[int, Row]]:
    """backend -> {load_<n>k_s: best seconds, or None} for each session size in `loads` (facts ->
    repeats), plus a note saying why a figure is missing; and per size the session's bytes and
    its bare parse time. Each session is generated once."""
    out: dict[str, Row] = {name: {"load_note": ""} for name in registered}
    sessions: dict[int, Row] = {}
    for facts, repeats in sorted(loads.items()):
        key = size_key(facts)
        label = f"load {facts:,} facts"
        if progress is not None:
            progress(label, 0, len(registered))
        made = write_session(directory, facts)
        if isinstance(made, pathlib.Path):
            sessions[facts] = {"bytes": made.stat().st_size, "parse_s": parse_seconds(made, repeats)}
        for done, (name, info) in enumerate(registered.items(), 1):
            if isinstance(made, str):
                out[name][key] = None
                out[name]["load_note"] = made
            else:
                try:
                    out[name][key] = load_seconds(name, info, made, facts, repeats)
                except Exception as error:  # a broken backend is a row with a reason, not a crash
                    out[name][key] = None
                    out[name]["load_note"] += f"{key}: {type(error).__name__}: {error}; "
            if progress is not None:
                progress(label, done, len(registered))
        if isinstance(made, pathlib.Path):
            made.unlink()
    for name in registered:
        out[name]["load_note"] += (
            "load = open (reduces the whole file) + load() of a generated bulk session, warm page cache, "
            "best of " + ", ".join(f"{n} for {facts:,} facts" for facts, n in sorted(loads.items()))
        )
    return out, sessions

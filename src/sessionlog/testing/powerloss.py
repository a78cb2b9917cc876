"""Power-loss simulation: record the file operations of a workload (`disk_model.TraceOps`), then
check every crash state `disk_model.crash_states` enumerates.

Checks. Every state that reduces must hold a line prefix of what the workload wrote (else it
is *misread*: a violation in either class). Power class (read with the backend's NUL rule,
`BackendInfo.nul_rule()`): every
state opens, except a missing file before `create` returned, and holds every commit whose sync
returned (acknowledged before the crash point). Process class: the states that lose an
acknowledged commit (refused, missing, or shorter) are counted: the class promises kill -9, not
power loss, and the count is the trade-off it makes.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..backends.side_files import remove_snapshot, snapshot_path
from ..core.errors import CorruptionError
from ..core.framing import committed_length
from ..core.loading import load, reduce_bytes
from ..core.snapshot import encode
from ..opening import backends, create, create_async, open, open_async
from ..plugins.registry import Registry
from .disk_model import PAGE, CrashState, Op, Trace, TraceOps, crash_states
from .stream import Stream, registry_for, verify_log

__all__ = [
    "PAGE",
    "CrashState",
    "Op",
    "PowerLossReport",
    "Trace",
    "TraceOps",
    "check_trace",
    "crash_states",
    "record_trace",
    "run_powerloss",
]

PROVIDER = "openrouter"
MODEL = "powerloss/model"
CWD = "/powerloss"


# -- checking ----------------------------------------------------------------------------------


@dataclass
class PowerLossReport:
    """Totals over traces. `states` counts every crash state (byte prefixes included);
    `reductions` the distinct images actually reduced. `lost_states`: states in which opening
    does not give back every acknowledged commit (refused, missing or shorter); `lost_commits`:
    the acknowledged commits they withhold, summed; `max_lost`: the most in one state.
    `refused_intact`: refused states whose error lies after every acknowledged line (those
    bytes are intact; truncating at the error would recover them). `nul_in_batch`: power-class
    states refused for a NUL-bearing line that is not the last one, after every acknowledged
    line: a page lost inside a multi-line unacknowledged write (group commit) that the
    backend's NUL rule did not cover (its `nul_window` too small)."""

    backend: str
    durability: str
    traces: int = 0
    states: int = 0
    reductions: int = 0
    opened: int = 0
    refused: int = 0
    missing: int = 0
    nul_tails: int = 0
    lost_states: int = 0
    lost_commits: int = 0
    max_lost: int = 0
    refused_intact: int = 0
    nul_in_batch: int = 0
    misread: int = 0
    outside_model: int = 0
    outside_refused: int = 0
    reopened: int = 0
    violations: list[str] = field(default_factory=list)

    def merge(self, other: PowerLossReport) -> None:
        for name in (
            "traces",
            "states",
            "reductions",
            "opened",
            "refused",
            "missing",
            "nul_tails",
            "lost_states",
            "lost_commits",
            "refused_intact",
            "nul_in_batch",
            "misread",
            "outside_model",
            "outside_refused",
            "reopened",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_lost = max(self.max_lost, other.max_lost)
        self.violations.extend(other.violations)

    @property
    def ok(self) -> bool:
        if self.violations or self.misread:
            return False
        return self.durability != "power" or self.lost_states == 0


@dataclass(frozen=True)
class _Outcome:
    transactions: int  # -1: refused
    repaired_length: int
    nul_tail: bool
    misread: str | None
    error: str | None
    error_line: int = 0
    nul_line: bool = False  # the refused line holds a NUL byte


def _reduce(image: bytes, final: bytes, rule: Mapping[str, Any]) -> _Outcome:
    try:
        state = reduce_bytes(image, **rule)
    except CorruptionError as error:
        start = error.offset or 0
        stop = image.find(b"\n", start)
        nul_line = image.find(b"\0", start, len(image) if stop < 0 else stop) >= 0
        return _Outcome(-1, 0, False, None, f"{error.code} at line {error.line}", error.line, nul_line)
    end = state.repaired_length
    misread = None
    if end > len(final) or image[:end] != final[:end] or final[end - 1 : end] != b"\n":
        misread = f"reduced {end} bytes that are not a line prefix of what was written"
    lines = image.count(b"\n", 0, end) - 1
    return _Outcome(lines, end, end < committed_length(image), misread, None)


def check_trace(
    trace: Trace,
    *,
    reopen_directory: Path | None = None,
    registry: Registry | None = None,
    snapshots: bool = True,
) -> PowerLossReport:
    """Check every crash state of one trace (see the module docstring). With
    `reopen_directory`, a few states per trace are also written to a real file, opened with the
    backend, appended to and checked again; with `snapshots`, beside a snapshot (`core.snapshot`)
    of the workload's final log, or of its first half: what a snapshot that outlived the log's
    tail, or an older one, leaves. The reopen must use it only where it matches the image."""
    power = trace.durability == "power"
    report = PowerLossReport(trace.backend, trace.durability, traces=1)
    cache: dict[bytes, _Outcome] = {}
    samples: dict[str, CrashState] = {}
    for state in crash_states(trace):
        report.states += state.weight
        outside = state.fate == "stale-lf"
        if outside:
            report.outside_model += 1
        where = f"{trace.backend} seed {trace.seed} op {state.point} ({state.fate})"
        if state.image is None:
            report.missing += 1
            if state.acknowledged or state.created:
                _lose(report, state.acknowledged, power, f"{where}: the session file is missing")
            continue
        digest = hashlib.blake2b(state.image, digest_size=16).digest()
        outcome = cache.get(digest)
        if outcome is None:
            outcome = cache[digest] = _reduce(state.image, trace.final, trace.rule)
            report.reductions += 1
        if outcome.misread is not None:
            report.misread += state.weight
            report.violations.append(f"{where}: misread: {outcome.misread}")
            continue
        if outcome.transactions < 0:
            if outside:
                report.outside_refused += 1
                continue
            report.refused += state.weight
            if state.acknowledged or state.created:
                intact = outcome.error_line > state.acknowledged + 1
                report.refused_intact += intact
                message = f"{where}: refused: {outcome.error}"
                if power and intact and outcome.nul_line:
                    report.nul_in_batch += 1
                    message = f"{where}: refused, a NUL-bearing line that is not the last: {outcome.error}"
                _lose(report, state.acknowledged, power, message)
            continue
        report.opened += state.weight
        if outcome.nul_tail:
            report.nul_tails += 1
            samples.setdefault("nul", state)
        elif state.fate == "prefix" and outcome.repaired_length < len(state.image):
            samples.setdefault("torn", state)
        elif state.fate == "dropped":
            samples.setdefault("dropped", state)
        if outcome.transactions < state.acknowledged:
            missing = state.acknowledged - outcome.transactions
            _lose(
                report,
                missing,
                power,
                f"{where}: holds {outcome.transactions} of {state.acknowledged} acknowledged",
            )
    if reopen_directory is not None:
        for name, state in samples.items():
            path = reopen_directory / f"{trace.seed}-{name}.jsonl"
            _reopen(trace, state, path, registry, report, snapshots)
    return report


def _lose(report: PowerLossReport, commits: int, power: bool, message: str) -> None:
    report.lost_states += 1
    report.lost_commits += commits
    report.max_lost = max(report.max_lost, commits)
    if power:
        report.violations.append(message)


def _reopen(
    trace: Trace,
    state: CrashState,
    path: Path,
    registry: Registry | None,
    report: PowerLossReport,
    snapshots: bool = False,
) -> None:
    """Put a crash state on disk (and a snapshot beside it), open it with the backend, commit,
    and check the log again."""
    assert state.image is not None
    path.write_bytes(state.image)
    if snapshots:
        _snapshot_beside(path, trace.final, half=state.point % 2 == 0)
    stream = _workload_stream(trace.seed)
    before = verify_log(state.image, stream, rule=trace.rule)
    try:
        if backends(registry)[trace.backend].api == "sync":
            with open(path, trace.backend, registry=registry) as store:
                store.commit(stream.transaction(before.transactions))
        else:

            async def append() -> None:
                store = await open_async(path, trace.backend, registry=registry)
                try:
                    await store.commit(stream.transaction(before.transactions))
                finally:
                    await store.close()

            asyncio.run(append())
        after = verify_log(path.read_bytes(), stream, rule=trace.rule)
    except Exception as error:  # the finding itself
        report.violations.append(
            f"{trace.backend} seed {trace.seed} op {state.point}: reopen failed: {error!r}"
        )
        return
    finally:
        path.unlink(missing_ok=True)
        remove_snapshot(path)
    if after.mismatch or after.transactions != before.transactions + 1 or after.torn_bytes:
        report.violations.append(f"{trace.backend} seed {trace.seed} op {state.point}: after reopen: {after}")
    else:
        report.reopened += 1


def _snapshot_beside(path: Path, final: bytes, *, half: bool) -> None:
    """A snapshot of `final`'s committed lines (or of their first half) where a store at `path`
    looks for one, as a file backend writes it."""
    end = committed_length(final)
    if half:
        end = final.rfind(b"\n", 0, max(1, end // 2)) + 1 or end
    reducer, end = load(final[:end])
    fd = os.open(snapshot_path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, encode(reducer, final, end))
    finally:
        os.close(fd)


# -- the workload ------------------------------------------------------------------------------


def _workload_stream(seed: int) -> Stream:
    # Lines from ~150 B to ~12 KiB: many cross a page boundary, some span several pages.
    return Stream(
        seed, small=(100, 2 << 10), medium=(2 << 10, 12 << 10), medium_fraction=0.4, huge_fraction=0
    )


def record_trace(
    backend: str, seed: int, directory: str | os.PathLike[str], *, registry: Registry | None = None
) -> Trace:
    """Run the workload on `backend` in `directory` through `TraceOps` and return the trace:
    create; commit 2..6 transactions (async: several in flight, so batches form); close; leave a
    torn tail as an earlier crash would; reopen (the backend truncates it); commit 1..4 more;
    close."""
    rng = random.Random(f"workload:{backend}:{seed}")
    stream = _workload_stream(seed)
    path = Path(directory) / f"trace-{seed}.jsonl"
    ops = TraceOps()
    info = backends(registry)[backend]
    first, second = rng.randint(2, 6), rng.randint(1, 4)
    torn = _torn_tail(seed, rng)
    if info.api == "sync":
        store = create(path, backend, provider=PROVIDER, model=MODEL, cwd=CWD, registry=registry, ops=ops)
        ops.mark("created")
        for index in range(first):
            store.commit(stream.transaction(index))
            ops.mark("ack", index + 1)
        store.close()
        _leave_torn_tail(ops, path, torn)
        store = open(path, backend, registry=registry, ops=ops)
        for index in range(first, first + second):
            store.commit(stream.transaction(index))
            ops.mark("ack", index + 1)
        store.close()
    else:
        asyncio.run(_async_workload(path, backend, registry, ops, stream, rng, first, second, torn))
    final = path.read_bytes()
    path.unlink()
    return Trace(
        backend,
        info.durability,
        seed,
        str(path),
        ops.ops,
        final,
        first + second,
        info.nul_rule()["nul_window"],
    )


def _torn_tail(seed: int, rng: random.Random) -> bytes:
    """The front of a line of another stream: what a crash mid-write leaves behind."""
    facts = _workload_stream(seed + 10_000_000).transaction(0)
    line = orjson.dumps([{**fact, "seq": 99, "timestamp": 0} for fact in facts])
    return line[: rng.randint(1, len(line) - 1)]


def _leave_torn_tail(ops: TraceOps, path: Path, torn: bytes) -> None:
    fd = ops.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        ops.write(fd, torn)
    finally:
        ops.close(fd)


async def _async_workload(
    path: Path,
    backend: str,
    registry: Registry | None,
    ops: TraceOps,
    stream: Stream,
    rng: random.Random,
    first: int,
    second: int,
    torn: bytes,
) -> None:
    async def commit_range(store: Any, start: int, stop: int) -> None:
        index = start
        while index < stop:
            group = range(index, min(stop, index + rng.randint(1, 4)))
            tasks = [asyncio.ensure_future(store.commit(stream.transaction(i))) for i in group]
            for i, task in zip(group, tasks, strict=True):
                await task
                ops.mark("ack", i + 1)
            index = group.stop

    store = await create_async(
        path, backend, provider=PROVIDER, model=MODEL, cwd=CWD, registry=registry, ops=ops
    )
    ops.mark("created")
    await commit_range(store, 0, first)
    await store.close()
    _leave_torn_tail(ops, path, torn)
    store = await open_async(path, backend, registry=registry, ops=ops)
    await commit_range(store, first, first + second)
    await store.close()


def run_powerloss(
    backend: str,
    traces: int = 25,
    *,
    seed: int = 0,
    directory: str | os.PathLike[str] | None = None,
    plugins: Sequence[str] = (),
    reopen: bool = True,
) -> PowerLossReport:
    """Record `traces` workloads on `backend` and check every crash state of each."""
    registry = registry_for(plugins)
    info = backends(registry)[backend]
    total = PowerLossReport(backend, info.durability)
    owned = directory is None
    root = Path(tempfile.mkdtemp(prefix="sessionlog-power-")) if directory is None else Path(directory)
    try:
        for number in range(traces):
            trace = record_trace(backend, seed * 100_000 + number, root, registry=registry)
            total.merge(check_trace(trace, reopen_directory=root if reopen else None, registry=registry))
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)
    return total

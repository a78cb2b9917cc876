"""Power-loss simulation: record the file operations of a workload, then check every crash state.

`TraceOps` is a `FileOps` that performs each operation and records it with its data (the
workload runs for real, in a temporary directory). `crash_states` then replays the trace on a
model of a filesystem and yields, after every prefix of the operations, each state the disk may
be in if power fails at that point. The model (per file, for the bytes changed since its last
fsync/fdatasync, in 4 KiB pages on file offsets; directories by their last directory fsync; a
syncfs syncs every file and every name):

* ``synced``: nothing since the last sync reached the disk (a lost truncate included);
* ``prefix``: the recorded size stops at any byte of the unsynced part, everything before it
  arrived (every byte prefix; states whose committed part is equal reduce the same way, so one
  reduction of the shortest and one of the longest member checks each such class);
* ``zeroed``: one unsynced page reads as NUL bytes, the rest arrived (the size was recorded,
  that page's data was not: a hole or an unwritten extent after out-of-order writeback);
* ``zero-tail``: from one unsynced page to the end, NUL bytes (size recorded, data missing);
* ``dropped``: one unsynced page's write was lost: it holds what the disk held there at the last
  sync (stale bytes after a lost truncate; NULs past the old end);
* ``garbage``: the file ends in one unsynced page full of stale bytes containing no LF (a
  block allocated but never written);
* ``missing``: a name linked since the last directory fsync is absent.

Outside the model, and counted apart (``stale-lf``): the file ends in a page of stale bytes that
does contain an LF. Such a line cannot be told from a committed one without a checksum; it is
refused as corruption (never misread). A filesystem that can show it (no ordered data, e.g. ext4
data=writeback) is outside what the power class assumes.

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
import itertools
import os
import random
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..backends.jsonl_file import FileOps
from ..core.errors import CorruptionError
from ..core.framing import committed_length
from ..core.loading import reduce_bytes
from ..opening import backends, create, create_async, open, open_async
from ..plugins.registry import Registry
from .crash import Stream, registry_for, verify_log

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

PAGE = 4096
PROVIDER = "openrouter"
MODEL = "powerloss/model"
CWD = "/powerloss"


@dataclass(frozen=True)
class Op:
    """One recorded operation. `kind` is a FileOps name, or a workload mark: ``ack`` (the
    workload's `length`-th transaction was acknowledged) or ``created`` (create returned)."""

    kind: str
    fd: int = -1
    path: str = ""
    target: str = ""
    data: bytes = b""
    length: int = 0
    flags: int = 0


class TraceOps(FileOps):
    """Performs every file operation and records it (after it returned), with the bytes written."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._lock = threading.Lock()

    def _record(self, op: Op) -> None:
        with self._lock:
            self.ops.append(op)

    def mark(self, kind: str, length: int = 0) -> None:
        self._record(Op(kind, length=length))

    def open(self, path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        fd = os.open(path, flags, mode, dir_fd=dir_fd)
        self._record(Op("open", fd=fd, path=os.fspath(path), flags=flags))
        return fd

    def write(self, fd: int, data: Any) -> int:
        written = os.write(fd, data)
        self._record(Op("write", fd=fd, data=bytes(memoryview(data)[:written])))
        return written

    def fsync(self, fd: Any) -> None:
        os.fsync(fd)
        self._record(Op("fsync", fd=fd))

    def fdatasync(self, fd: Any) -> None:
        os.fdatasync(fd)
        self._record(Op("fdatasync", fd=fd))

    def syncfs(self, fd: int) -> None:
        super().syncfs(fd)
        self._record(Op("syncfs", fd=fd))

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)
        self._record(Op("ftruncate", fd=fd, length=length))

    def link(self, src: Any, dst: Any, **kwargs: Any) -> None:
        os.link(src, dst, **kwargs)
        self._record(Op("link", path=os.fspath(src), target=os.fspath(dst)))

    def unlink(self, path: Any, **kwargs: Any) -> None:
        os.unlink(path, **kwargs)
        self._record(Op("unlink", path=os.fspath(path)))

    def close(self, fd: int) -> None:
        os.close(fd)
        self._record(Op("close", fd=fd))

    def fsync_directory(self, directory: Path) -> None:
        super().fsync_directory(directory)
        self._record(Op("fsync_directory", path=os.fspath(directory)))


@dataclass
class Trace:
    """A recorded workload: its operations, the session path, and the session's bytes at the
    end (every line the workload committed, in order: what any state must be a prefix of)."""

    backend: str
    durability: str
    seed: int
    path: str
    ops: list[Op]
    final: bytes
    commits: int
    nul_window: int = 0  # the backend's group-commit window (BackendInfo.nul_rule)

    @property
    def rule(self) -> dict[str, Any]:
        """How the backend reads this log after power loss (the NUL rule, core.loading)."""
        power = self.durability == "power"
        return {"nul_tail": power, "nul_window": self.nul_window if power else 0}


# -- the filesystem model ----------------------------------------------------------------------


class _Inode:
    __slots__ = ("data", "durable", "low")

    def __init__(self) -> None:
        self.data = bytearray()  # what a reader sees now (the page cache)
        self.durable = b""  # what the disk holds since the last sync
        self.low = 0  # the lowest offset changed since the last sync


class _Model:
    def __init__(self) -> None:
        self.names: dict[str, _Inode] = {}
        self.durable_names: dict[str, _Inode] = {}
        self.fds: dict[int, _Inode] = {}
        self.acknowledged = 0
        self.created = False

    def apply(self, op: Op) -> None:
        kind = op.kind
        if kind == "open":
            inode = self.names.get(op.path)
            if inode is None or op.flags & os.O_TRUNC:
                inode = _Inode()
                self.names[op.path] = inode
            self.fds[op.fd] = inode
        elif kind == "write":
            self.fds[op.fd].data += op.data  # the writer core opens with O_APPEND
        elif kind in ("fsync", "fdatasync"):
            inode = self.fds[op.fd]
            inode.durable = bytes(inode.data)
            inode.low = len(inode.data)
        elif kind == "syncfs":  # every file and every name of the filesystem
            for inode in self.names.values():
                inode.durable = bytes(inode.data)
                inode.low = len(inode.data)
            self.durable_names = dict(self.names)
        elif kind == "ftruncate":
            inode = self.fds[op.fd]
            del inode.data[op.length :]
            inode.low = min(inode.low, op.length)
        elif kind == "link":
            self.names[op.target] = self.names[op.path]
        elif kind == "unlink":
            self.names.pop(op.path, None)
        elif kind == "close":
            self.fds.pop(op.fd, None)
        elif kind == "fsync_directory":
            directory = op.path
            kept = {
                name: inode
                for name, inode in self.durable_names.items()
                if os.path.dirname(name) != directory
            }
            kept.update(
                (name, inode) for name, inode in self.names.items() if os.path.dirname(name) == directory
            )
            self.durable_names = kept
        elif kind == "ack":
            self.acknowledged = max(self.acknowledged, op.length)
        elif kind == "created":
            self.created = True
        else:
            raise ValueError(f"unknown operation {kind!r}")


@dataclass(frozen=True)
class CrashState:
    """One state of the session file after power loss at operation `point`. `image` is None
    when the file is missing; `weight` is how many byte-prefix states this one stands for (its
    equivalence class: the same committed part)."""

    point: int
    fate: str
    image: bytes | None
    acknowledged: int
    created: bool
    weight: int = 1


def _garbage(rng: random.Random, size: int, *, newline: bool) -> bytes:
    data = rng.randbytes(size)
    if not newline:
        return data.replace(b"\n", b"#")
    return data if b"\n" in data else data[: size // 2] + b"\n" + data[size // 2 + 1 :]


def _images(inode: _Inode, rng: random.Random) -> Iterator[tuple[str, bytes, int]]:
    data = bytes(inode.data)
    durable = inode.durable
    low = min(inode.low, len(data))
    yield "synced", durable, 1
    # Every byte prefix of the unsynced part, as classes of equal committed length.
    edges = [low]
    position = data.find(b"\n", low)
    while position >= 0:
        edges.append(position + 1)
        position = data.find(b"\n", position + 1)
    edges.append(len(data) + 1)
    for first, stop in itertools.pairwise(edges):
        if first >= stop:
            continue
        count = stop - first
        if count == 1:
            yield "prefix", data[:first], 1
        else:
            yield "prefix", data[:first], 1
            yield "prefix", data[: stop - 1], count - 1
    if low >= len(data):
        return
    for page in range(low // PAGE, (len(data) - 1) // PAGE + 1):
        start = max(low, page * PAGE)
        end = min(len(data), (page + 1) * PAGE)
        size = end - start
        zeroed = data[:start] + bytes(size) + data[end:]
        yield "zeroed", zeroed, 1
        yield "zero-tail", data[:start] + bytes(len(data) - start), 1
        stale = durable[start:end].ljust(size, b"\0")
        if stale != bytes(size):
            yield "dropped", data[:start] + stale + data[end:], 1
        yield "garbage", data[:start] + _garbage(rng, size, newline=False), 1
        yield "stale-lf", data[:start] + _garbage(rng, size, newline=True), 1


def crash_states(trace: Trace) -> Iterator[CrashState]:
    """Every crash state of the session file, after every prefix of the trace's operations."""
    model = _Model()
    rng = random.Random(f"powerloss:{trace.backend}:{trace.seed}")
    path = trace.path
    last: tuple[Any, ...] | None = None
    for point in range(len(trace.ops) + 1):
        if point:
            model.apply(trace.ops[point - 1])
        inode = model.names.get(path)
        durable_inode = model.durable_names.get(path)
        key = (
            id(inode),
            id(durable_inode),
            None if inode is None else (len(inode.data), inode.low, len(inode.durable)),
            model.acknowledged,
            model.created,
        )
        if key == last:  # nothing that matters changed (a close, a pread, another file)
            continue
        last = key
        ack, created = model.acknowledged, model.created
        if durable_inode is None and inode is not None:  # linked, but not durably yet
            yield CrashState(point, "missing", None, ack, created)
        chosen = durable_inode if durable_inode is not None else inode
        if chosen is None:
            continue
        for fate, image, weight in _images(chosen, rng):
            yield CrashState(point, fate, image, ack, created, weight)


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
    trace: Trace, *, reopen_directory: Path | None = None, registry: Registry | None = None
) -> PowerLossReport:
    """Check every crash state of one trace (see the module docstring). With
    `reopen_directory`, a few states per trace are also written to a real file, opened with the
    backend, appended to and checked again."""
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
            _reopen(trace, state, reopen_directory / f"{trace.seed}-{name}.jsonl", registry, report)
    return report


def _lose(report: PowerLossReport, commits: int, power: bool, message: str) -> None:
    report.lost_states += 1
    report.lost_commits += commits
    report.max_lost = max(report.max_lost, commits)
    if power:
        report.violations.append(message)


def _reopen(
    trace: Trace, state: CrashState, path: Path, registry: Registry | None, report: PowerLossReport
) -> None:
    """Put a crash state on disk, open it with the backend, commit, and check the log again."""
    assert state.image is not None
    path.write_bytes(state.image)
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
    if after.mismatch or after.transactions != before.transactions + 1 or after.torn_bytes:
        report.violations.append(f"{trace.backend} seed {trace.seed} op {state.point}: after reopen: {after}")
    else:
        report.reopened += 1


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

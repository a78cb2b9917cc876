"""The disk after a power loss: record a workload's file operations, then enumerate what the disk
may hold if power fails after any of them (`powerloss` checks each state).

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
"""

from __future__ import annotations

import itertools
import os
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..backends.jsonl_file import FileOps

__all__ = ["PAGE", "CrashState", "Op", "Trace", "TraceOps", "crash_states"]

PAGE = 4096


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

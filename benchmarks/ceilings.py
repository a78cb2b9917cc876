"""Ceilings: what the machine itself allows, with no session library in the way.

Every sessionlog backend appends a small JSON record per commit and reads the whole
session back on load. Whatever it does, it cannot beat the raw system calls it is built
on, so this module measures them on the filesystem under test:

* ``os.write`` of one ~500-byte JSON line per commit (durability "process": the data is
  in the OS page cache, it survives ``kill -9`` but not power loss);
* ``os.write`` + ``os.fdatasync`` per line (durability "power");
* one line per iteration with one ``fdatasync`` every 10 / 100 lines (group commit: only
  every 10th / 100th line is acknowledged durable);
* splitting a JSONL file into lines and ``orjson.loads``-ing each one (durability "none":
  pure CPU, the floor for any load of a JSON-lines session).

It also holds the helpers the rest of the benchmark suite shares: the row format
(:class:`BenchRow`), the realistic message (:func:`make_messages`), the per-commit timer
(:func:`time_commits`) and :func:`percentile`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pathlib
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypedDict

import orjson

Durability = Literal["process", "power", "none"]
Progress = Callable[[str, int, int], None]

_TEXT = (
    "The user asked the agent to reconcile last quarter's invoices against the ledger, "
    "flag any duplicates, and draft a short summary for the finance channel. The agent "
    "listed the open items, called the accounting tool twice, and noted that two vendor "
    "credits had been applied to the wrong cost centre in March. "
)
# fdatasync is Linux-only; elsewhere fsync is the closest honest equivalent.
_SYNC_NAME = "fdatasync" if hasattr(os, "fdatasync") else "fsync"
_sync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


class BenchRow(TypedDict):
    """One result row; every benchmark function returns a list of these."""

    name: str
    kind: str  # "ceiling" | "peer" (our own backends add their own kind)
    durability: Durability
    committers: int
    facts_per_commit: int
    commits_per_s: float
    p50_us: float
    p99_us: float
    bytes_per_fact: float | None
    load_s: float | None
    note: str


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) of samples, linearly interpolated on the sorted list."""
    if not samples:
        raise ValueError("percentile of an empty sample")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within [0, 100], got {q}")
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def time_commits(
    fn: Callable[[int], object],
    n: int,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[int], float]:
    """Call ``fn(i)`` for i in range(n); return (per-call nanoseconds, total wall seconds).

    ``progress(done, n)`` is called about ten times, outside the per-call samples.
    """
    if n < 1:
        raise ValueError(f"need at least one commit, got {n}")
    step = max(1, n // 10)
    samples = [0] * n
    clock = time.perf_counter_ns
    start = time.perf_counter()
    for i in range(n):
        t0 = clock()
        fn(i)
        samples[i] = clock() - t0
        if progress is not None and ((i + 1) % step == 0 or i + 1 == n):
            progress(i + 1, n)
    return samples, time.perf_counter() - start


def sub_progress(progress: Progress | None, name: str) -> Callable[[int, int], None] | None:
    """Adapt a suite-level progress(name, done, total) callback to time_commits' progress(done, total)."""
    if progress is None:
        return None
    return lambda done, total: progress(name, done, total)


def make_row(
    name: str,
    kind: str,
    durability: Durability,
    samples_ns: Sequence[int],
    total_s: float,
    *,
    facts_per_commit: int = 1,
    commits_per_s: float | None = None,
    bytes_per_fact: float | None = None,
    load_s: float | None = None,
    note: str = "",
) -> BenchRow:
    """Build a row from time_commits output; commits_per_s defaults to len(samples)/total_s."""
    return BenchRow(
        name=name,
        kind=kind,
        durability=durability,
        committers=1,
        facts_per_commit=facts_per_commit,
        commits_per_s=commits_per_s if commits_per_s is not None else len(samples_ns) / total_s,
        p50_us=percentile(samples_ns, 50) / 1000,
        p99_us=percentile(samples_ns, 99) / 1000,
        bytes_per_fact=bytes_per_fact,
        load_s=load_s,
        note=note,
    )


def make_messages(n: int, line_bytes: int = 500) -> list[dict[str, Any]]:
    """n realistic chat messages (uuid id, seq, ISO timestamp, role, prose content).

    The content is sized so that ``orjson.dumps(message) + b"\\n"`` is line_bytes long
    (as long as line_bytes leaves room for the other fields, ~120 bytes).
    """
    base = dt.datetime.now(dt.UTC)
    text = _TEXT * (line_bytes // len(_TEXT) + 2)
    out: list[dict[str, Any]] = []
    for seq in range(n):
        msg: dict[str, Any] = {
            "id": str(uuid.uuid4()),
            "seq": seq,
            "ts": (base + dt.timedelta(milliseconds=seq)).isoformat(),
            "role": "user" if seq % 2 == 0 else "assistant",
            "content": "",
        }
        room = max(0, line_bytes - 1 - len(orjson.dumps(msg)))
        offset = (seq * 7) % len(_TEXT)
        msg["content"] = text[offset : offset + room]
        out.append(msg)
    return out


def make_lines(n: int, line_bytes: int = 500) -> list[bytes]:
    """make_messages encoded as newline-terminated orjson lines."""
    return [orjson.dumps(m) + b"\n" for m in make_messages(n, line_bytes)]


def _fresh(path: pathlib.Path) -> int:
    path.unlink(missing_ok=True)
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def _write_ceiling(
    path: pathlib.Path, lines: Sequence[bytes], sync_every: int, progress: Callable[[int, int], None] | None
) -> tuple[list[int], float, int]:
    """Append lines one per iteration, syncing every sync_every lines (0 = never)."""
    fd = _fresh(path)
    last = len(lines) - 1
    try:

        def commit(i: int) -> None:
            os.write(fd, lines[i])
            if sync_every and ((i + 1) % sync_every == 0 or i == last):
                _sync(fd)

        samples, total = time_commits(commit, len(lines), progress=progress)
    finally:
        os.close(fd)
    size = path.stat().st_size
    path.unlink()
    return samples, total, size


def _write_jsonl(path: pathlib.Path, n_lines: int, line_bytes: int) -> None:
    path.write_bytes(b"".join(make_lines(n_lines, line_bytes)))


def _load_jsonl(path: pathlib.Path) -> int:
    """Read the file, split it into lines and orjson.loads each; return the line count."""
    data = path.read_bytes()
    loads = orjson.loads
    count = 0
    for line in data.splitlines():
        loads(line)
        count += 1
    return count


def _best_load(path: pathlib.Path, n_lines: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        count = _load_jsonl(path)
        best = min(best, time.perf_counter() - t0)
        if count != n_lines:
            raise RuntimeError(f"parsed {count} lines, expected {n_lines}")
    return best


def parse_ceiling(
    n_lines: int, directory: pathlib.Path | None = None, *, line_bytes: int = 500, repeats: int = 3
) -> float:
    """Seconds (best of repeats) to read, split and orjson.loads a file of n_lines JSON lines.

    The file is written to directory (a temporary one if None) and removed afterwards; it is
    read from a warm page cache, so this is the CPU floor of loading a JSONL session.
    """
    if directory is None:
        with tempfile.TemporaryDirectory() as tmp:
            return parse_ceiling(n_lines, pathlib.Path(tmp), line_bytes=line_bytes, repeats=repeats)
    path = directory / f"ceiling-parse-{n_lines}.jsonl"
    _write_jsonl(path, n_lines, line_bytes)
    try:
        return _best_load(path, n_lines, repeats)
    finally:
        path.unlink()


def _parse_row(directory: pathlib.Path, n_lines: int, line_bytes: int, progress: Progress | None) -> BenchRow:
    name = f"split+orjson.loads ({n_lines} lines)"
    path = directory / f"ceiling-parse-{n_lines}.jsonl"
    _write_jsonl(path, n_lines, line_bytes)
    try:
        load_s = _best_load(path, n_lines, 3)
        lines = path.read_bytes().splitlines()
        size = path.stat().st_size
    finally:
        path.unlink()
    loads = orjson.loads
    samples, _ = time_commits(
        lambda i: loads(lines[i]),
        n_lines,
        progress=sub_progress(progress, name),
    )
    return make_row(
        name,
        "ceiling",
        "none",
        samples,
        load_s,
        commits_per_s=n_lines / load_s,
        bytes_per_fact=size / n_lines,
        load_s=load_s,
        note="pure CPU: read whole file (warm page cache) + splitlines + orjson.loads per line, "
        "best of 3; commits_per_s = lines/s; p50/p99 = one orjson.loads timed alone",
    )


def run_ceilings(
    directory: pathlib.Path,
    commits: int,
    *,
    line_bytes: int = 500,
    progress: Progress | None = None,
    parse_sizes: Sequence[int] = (10_000, 100_000),
) -> list[BenchRow]:
    """Measure the write and parse ceilings on fresh files in directory.

    commits lines are written per write ceiling; the parse ceiling is measured for a file of
    commits lines and for each size in parse_sizes.
    """
    directory.mkdir(parents=True, exist_ok=True)
    lines = make_lines(commits, line_bytes)
    rows: list[BenchRow] = []
    cases: list[tuple[str, int, Durability, str]] = [
        (
            "os.write",
            0,
            "process",
            "os.write of one line per commit (O_APPEND); acknowledged = handed to the OS page "
            "cache: survives kill -9, not power loss",
        ),
        (
            f"write+{_SYNC_NAME}",
            1,
            "power",
            f"os.write + os.{_SYNC_NAME} per line: every acknowledged line survives power loss",
        ),
    ]
    for every in (10, 100):
        cases.append(
            (
                f"write+{_SYNC_NAME}/{every} lines",
                every,
                "power",
                f"one line per commit, {_SYNC_NAME} every {every} lines: only every {every}th line is "
                f"acknowledged durable; facts_per_commit = lines per sync, commits_per_s = lines/s",
            )
        )
    for name, every, durability, note in cases:
        samples, total, size = _write_ceiling(
            directory / f"ceiling-{every}.log",
            lines,
            every,
            sub_progress(progress, name),
        )
        rows.append(
            make_row(
                name,
                "ceiling",
                durability,
                samples,
                total,
                facts_per_commit=max(1, every),
                bytes_per_fact=size / commits,
                note=note,
            )
        )
    for n_lines in dict.fromkeys((commits, *parse_sizes)):
        rows.append(_parse_row(directory, n_lines, line_bytes, progress))
    return rows


if __name__ == "__main__":
    import sys

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run_ceilings(pathlib.Path(tmp), n), indent=1))

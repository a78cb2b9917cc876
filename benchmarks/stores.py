"""The stores' performance targets (issue 3), as ratios measured in one run.

    python -m benchmarks.stores [--full] [--dir DIR]

(a) `jsonl`: the median latency of a one-fact ~500-byte commit (a user message) into a session
    already holding ~10,000 facts, against a bare loop of `str(uuid6.uuid7())` + `orjson.dumps` of
    a comparable fact + `os.write` (target: <= 4x).
(b) flatness: that median at ~100,000 facts over the median at ~1,000 facts (target: <= 1.2x).
(c) `jsonl-fsync`: commits/s against a bare `os.write` + `os.fdatasync` loop of the same line on
    the same filesystem (target: >= 0.9x).

The pre-filled sessions are one `sessionlog.testing.sessions` session (profile `bulk`: runs with
tool calls, usage facts, compactions) cut at the last finished operation below each size, so a
user message may follow. The loops being compared run alternately, in chunks, so drift of the
machine (page cache, CPU frequency, other load) hits them alike. Timing is not a test: this
script only reports.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import tempfile
import time
from collections.abc import Callable, Mapping
from statistics import median
from typing import Any

import orjson
import uuid6

import sessionlog
from benchmarks.ceilings import BenchRow, make_row, time_commits
from sessionlog.testing.sessions import generate_session

TARGET_LATENCY = 4.0
TARGET_FLATNESS = 1.2
TARGET_FSYNC = 0.9
SIZES = (1_000, 10_000, 100_000)
CHUNK = 10  # commits per loop before switching to the next loop
WARMUP = 20
# A one-fact user-message line is ~500 bytes: ~160 bytes of kind, seq, id, timestamp and framing.
CONTENT = (
    "Reconcile last quarter's invoices against the ledger, flag any duplicates and draft a short "
    "summary for the finance channel; two vendor credits look misapplied in March and the cost "
    "centre codes changed mid-quarter, so check the mapping table before trusting the totals, and "
    "say which rows you could not match."
)
ENTRY = {"type": "message", "message": {"role": "user", "content": CONTENT}}
FACT = {"kind": "entry", "entry": ENTRY}  # no id: the store assigns it, as the bare loop does


def prefilled(
    directory: pathlib.Path, sizes: tuple[int, ...], seed: int = 3
) -> dict[int, tuple[pathlib.Path, int]]:
    """Session files of about each size: size -> (path, facts in it)."""
    session = generate_session(seed, max(sizes) + 500, profile="bulk")
    cuts: dict[int, tuple[int, int]] = {}  # size -> (lines, facts) of the last finish below it
    count = 0
    for index, transaction in enumerate(session.transactions):
        count += len(transaction)
        finished = any(fact.get("record", {}).get("type") == "operationFinished" for fact in transaction)
        for size in sizes:
            if finished and count <= size:
                cuts[size] = (index + 2, count)
    lines = session.lines()
    out = {}
    for size in sizes:
        line_count, facts = cuts[size]
        path = directory / f"prefilled-{size}.jsonl"
        path.write_bytes(b"".join(lines[:line_count]))
        out[size] = (path, facts)
    return out


def alternate(
    loops: Mapping[str, Callable[[int], object]], n: int, chunk: int = CHUNK
) -> dict[str, list[int]]:
    """Run every loop n times, `chunk` calls of one then `chunk` of the next; nanoseconds per call."""
    samples: dict[str, list[int]] = {name: [] for name in loops}
    done = 0
    while done < n:
        k = min(chunk, n - done)
        for name, loop in loops.items():
            taken, _ = time_commits(lambda i, loop=loop, base=done: loop(base + i), k)  # type: ignore[misc]
            samples[name].extend(taken)
        done += k
    return samples


def _commit(store: sessionlog.SessionStore) -> Callable[[int], object]:
    return lambda _: store.commit([FACT])


def _bare_fd(path: pathlib.Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o600)


def _bare_loop(fd: int) -> Callable[[int], object]:
    dumps, write, uuid7 = orjson.dumps, os.write, uuid6.uuid7

    def bare(i: int) -> None:
        fact = {"kind": "entry", "seq": i + 1, "id": str(uuid7()), "timestamp": time.time_ns() // 1_000_000}
        fact["entry"] = ENTRY
        write(fd, dumps(fact) + b"\n")

    return bare


def _write_sync(fd: int, line: bytes) -> Callable[[int], object]:
    def write_sync(_: int) -> None:
        os.write(fd, line)
        os.fdatasync(fd)

    return write_sync


def _row(name: str, samples: list[int], durability: Any, note: str) -> BenchRow:
    return make_row(name, "store", durability, samples, sum(samples) / 1e9, note=note)


def _commit_latencies(
    files: Mapping[int, tuple[pathlib.Path, int]], bare_path: pathlib.Path, commits: int
) -> dict[str, list[int]]:
    """(a) and (b): one-fact commits into each pre-filled session, alternating with the bare loop."""
    stores = {size: sessionlog.open(path) for size, (path, _) in files.items()}
    bare_fd = _bare_fd(bare_path)
    try:
        loops: dict[str, Callable[[int], object]] = {f"jsonl@{size}": _commit(stores[size]) for size in files}
        loops["bare"] = _bare_loop(bare_fd)
        alternate(loops, WARMUP, WARMUP)
        return alternate(loops, commits)
    finally:
        for store in stores.values():
            store.close()
        os.close(bare_fd)


def run(quick: bool = True, directory: pathlib.Path | None = None) -> dict[str, Any]:
    """Measure the three ratios; return them with the figures behind them and the rows."""
    if directory is None:
        with tempfile.TemporaryDirectory(prefix="sessionlog-bench-") as scratch:
            return run(quick, pathlib.Path(scratch))
    directory.mkdir(parents=True, exist_ok=True)
    commits = 3_000 if quick else 20_000
    syncs = 500 if quick else 3_000
    files = prefilled(directory, SIZES)
    samples = _commit_latencies(files, directory / "bare.log", commits)
    rows: list[BenchRow] = []
    # The pre-filled sessions are gone now: their millions of objects would make the collector's
    # full passes (tenths of a second each) land on the fsync loops below.
    gc.collect()
    p50 = {name: median(taken) / 1000 for name, taken in samples.items()}
    for size in SIZES:
        name = f"jsonl@{size}"
        note = f"one-fact ~500-byte user message into a session of {files[size][1]} facts"
        rows.append(_row(name, samples[name], "process", note))
    rows.append(_row("bare uuid7+orjson.dumps+os.write", samples["bare"], "process", "the floor of (a)"))

    fsync_path = directory / "fsync.jsonl"
    line = orjson.dumps({"kind": "entry", "seq": 1, "id": str(uuid6.uuid7()), "timestamp": 0, "entry": ENTRY})
    line += b"\n"
    store = sessionlog.create(fsync_path, backend="jsonl-fsync", provider="openrouter", model="bench")
    bare_fds = [_bare_fd(directory / "bare-sync.log"), _bare_fd(directory / "bare-sync-control.log")]
    try:
        sync_loops = {
            "jsonl-fsync": _commit(store),
            "bare write+fdatasync": _write_sync(bare_fds[0], line),
            "control": _write_sync(bare_fds[1], line),
        }
        alternate(sync_loops, WARMUP, 1)
        # One call of each in turn: a virtual disk's sync latency swings by 2x within seconds.
        sync_samples = alternate(sync_loops, syncs, chunk=1)
    finally:
        store.close()
        for fd in bare_fds:
            os.close(fd)
    per_second = {name: len(taken) / (sum(taken) / 1e9) for name, taken in sync_samples.items()}
    rows.append(_row("jsonl-fsync", sync_samples["jsonl-fsync"], "power", "commit + fdatasync"))
    rows.append(
        _row("bare write+fdatasync", sync_samples["bare write+fdatasync"], "power", "the floor of (c)")
    )

    latency = p50["jsonl@10000"] / p50["bare"]
    flatness = p50["jsonl@100000"] / p50["jsonl@1000"]
    fsync = per_second["jsonl-fsync"] / per_second["bare write+fdatasync"]
    return {
        "quick": quick,
        "directory": str(directory),
        "line_bytes": len(line),
        "latency": {
            "jsonl_p50_us_at_10k": p50["jsonl@10000"],
            "bare_p50_us": p50["bare"],
            "facts_in_session": files[10_000][1],
            "ratio": latency,
            "target": f"<= {TARGET_LATENCY}",
            "met": latency <= TARGET_LATENCY,
        },
        "flatness": {
            "jsonl_p50_us_at_1k": p50["jsonl@1000"],
            "jsonl_p50_us_at_10k": p50["jsonl@10000"],
            "jsonl_p50_us_at_100k": p50["jsonl@100000"],
            "facts_in_sessions": [files[size][1] for size in SIZES],
            "ratio": flatness,
            "target": f"<= {TARGET_FLATNESS}",
            "met": flatness <= TARGET_FLATNESS,
        },
        "fsync": {
            "jsonl_fsync_commits_per_s": per_second["jsonl-fsync"],
            "bare_write_fdatasync_per_s": per_second["bare write+fdatasync"],
            "control_ratio": per_second["control"] / per_second["bare write+fdatasync"],
            "p50_ratio": median(sync_samples["bare write+fdatasync"]) / median(sync_samples["jsonl-fsync"]),
            "ratio": fsync,
            "target": f">= {TARGET_FSYNC}",
            "met": fsync >= TARGET_FSYNC,
        },
        "rows": rows,
    }


def report(result: Mapping[str, Any]) -> str:
    a, b, c = result["latency"], result["flatness"], result["fsync"]

    def verdict(part: Mapping[str, Any]) -> str:
        return "met" if part["met"] else "MISSED"

    return "\n".join(
        [
            f"(a) jsonl commit at {a['facts_in_session']} facts: p50 {a['jsonl_p50_us_at_10k']:.1f} us; "
            f"bare uuid7+dumps+write: p50 {a['bare_p50_us']:.1f} us -> {a['ratio']:.2f}x "
            f"(target {a['target']}: {verdict(a)})",
            f"(b) flatness: p50 {b['jsonl_p50_us_at_100k']:.1f} us at {b['facts_in_sessions'][2]} facts / "
            f"{b['jsonl_p50_us_at_1k']:.1f} us at {b['facts_in_sessions'][0]} facts -> {b['ratio']:.2f}x "
            f"(target {b['target']}: {verdict(b)})",
            f"(c) jsonl-fsync {c['jsonl_fsync_commits_per_s']:.0f} commits/s; bare write+fdatasync "
            f"{c['bare_write_fdatasync_per_s']:.0f}/s -> {c['ratio']:.2f}x "
            f"(target {c['target']}: {verdict(c)}; by medians {c['p50_ratio']:.2f}x; "
            f"a second bare loop, the noise floor: {c['control_ratio']:.2f}x)",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stores", description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="more commits per loop")
    parser.add_argument("--dir", type=pathlib.Path, default=None, help="the filesystem under test")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    result = run(quick=not args.full, directory=args.dir)
    print(report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

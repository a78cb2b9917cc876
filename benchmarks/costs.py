"""Costs that must not grow with the session: the four figures, as ratios measured in one run.

    python -m benchmarks.costs [--full]

1. A commit at 8,000 tool calls in one run / at 10 (sync `jsonl` and async `jsonl-async`, one
   committer): a snapshot must not copy the run. Bound: <= 1.5x.
2. Loading a 100k-fact session with 50 compactions / the same without: each message is hashed
   once, not once per compaction. Bound: <= 1.5x (the compacted session is larger: each
   compaction lists every message id so far; the ratio per byte is printed too).
3. Peak memory of verify, inspect and open, less the state they build, / the file's size, for a
   bulk session, many tiny lines and one large line. Bound: <= 2x. Measured in a fresh process
   each (the peak resident size over the interpreter's, less what an open store retains).
4. Load throughput (`reduce_bytes`) vs a bare split + `orjson.loads`, with the floor every exact
   reducer pays (parse, duplicate-key proof, the five every-fact checks): printed.

Rounds alternate between the things compared; medians are reported. Timing is never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sessionlog
from benchmarks.reduce import _bare_parse, _floor
from sessionlog.testing.sessions import generate_session, tool_run

HEADER = {"provider": "p", "model": "m", "cwd": "/bench", "environment_identity": "bench"}


def _median(samples: list[float]) -> float:
    return statistics.median(samples)


# -- 1. commits deep into a run ----------------------------------------------------------------


def _prefilled(path: Path, steps: int) -> list[list[dict[str, Any]]]:
    """A session holding a run of `steps` tool calls; returns the next steps' transactions."""
    transactions = list(tool_run(steps + 200))
    with sessionlog.create(path, "jsonl", **HEADER) as store:  # type: ignore[arg-type]
        for transaction in transactions[: 1 + 4 * steps]:
            store.commit(transaction)
    return transactions[1 + 4 * steps :]


def _sync_commits(path: Path, transactions: list[list[dict[str, Any]]]) -> float:
    with sessionlog.open(path, "jsonl") as store:
        start = time.perf_counter()
        for transaction in transactions:
            store.commit(transaction)
        return (time.perf_counter() - start) / len(transactions)


def _async_commits(path: Path, transactions: list[list[dict[str, Any]]]) -> float:
    async def main() -> float:
        async with await sessionlog.open_async(path, "jsonl-async") as store:
            start = time.perf_counter()
            for transaction in transactions:
                await store.commit(transaction)
            return (time.perf_counter() - start) / len(transactions)

    return asyncio.run(main())


def deep_run(directory: Path, rounds: int) -> dict[str, Any]:
    """Per-commit time at 8,000 and at 10 tool calls in the run, alternating, fresh copies."""
    sources = {calls: directory / f"run-{calls}.jsonl" for calls in (10, 8000)}
    nexts = {calls: _prefilled(path, calls) for calls, path in sources.items()}
    samples: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for api, commit in (("sync", _sync_commits), ("async", _async_commits)):
            for calls, source in sources.items():
                copy = directory / f"copy-{calls}.jsonl"
                copy.write_bytes(source.read_bytes())
                samples.setdefault((api, calls), []).append(commit(copy, nexts[calls][:400]))
                copy.unlink()
    out = {}
    for api in ("sync", "async"):
        deep, shallow = _median(samples[(api, 8000)]), _median(samples[(api, 10)])
        out[api] = {"at_8000_us": deep * 1e6, "at_10_us": shallow * 1e6, "ratio": deep / shallow}
    return out


# -- 2. compactions ----------------------------------------------------------------------------


def compactions(facts: int, rounds: int) -> dict[str, Any]:
    plain = generate_session(5, facts, profile="bulk", compactions=0).to_bytes()
    compacted = generate_session(5, facts, profile="bulk", compactions=50).to_bytes()
    times: dict[str, list[float]] = {"plain": [], "compacted": []}
    for _ in range(rounds):
        for name, data in (("plain", plain), ("compacted", compacted)):
            gc.collect()
            start = time.perf_counter()
            sessionlog.reduce_bytes(data)
            times[name].append(time.perf_counter() - start)
    ratio = _median(times["compacted"]) / _median(times["plain"])
    return {
        "facts": facts,
        "plain_s": _median(times["plain"]),
        "compacted_s": _median(times["compacted"]),
        "ratio": ratio,
        "bytes_ratio": len(compacted) / len(plain),
        "per_byte_ratio": ratio / (len(compacted) / len(plain)),
    }


# -- 3. memory -----------------------------------------------------------------------------------

_PROBE = """
import contextlib, io, json, sys, gc
import sessionlog
from sessionlog.cli import main
def status(field):  # VmHWM, not ru_maxrss: that one keeps the parent's peak across exec
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
rss = lambda: status("VmRSS")
peak = lambda: status("VmHWM")
command, path = sys.argv[1], sys.argv[2]
base = rss()
if command == "open":
    store = sessionlog.open(path, "jsonl")
    gc.collect()
    retained = rss() - base
else:
    with contextlib.redirect_stdout(io.StringIO()):
        main([command, path])
    retained = 0
print(json.dumps({"peak": peak() - base, "retained": retained}))
"""


def _shape(name: str, path: Path, tiny_lines: int) -> None:
    if name == "bulk":
        path.write_bytes(generate_session(5, 60_000, profile="bulk").to_bytes())
        return
    with sessionlog.create(path, "jsonl", **HEADER) as store:  # type: ignore[arg-type]
        if name == "large-line":
            store.commit([_user("é" * 20_000_000)])
            return
        for _ in range(tiny_lines):
            store.commit([_user("x")])


def _user(text: str) -> dict[str, Any]:
    return {"kind": "entry", "entry": {"type": "message", "message": {"role": "user", "content": text}}}


def memory(directory: Path, tiny_lines: int) -> list[dict[str, Any]]:
    rows = []
    for shape in ("bulk", "tiny-lines", "large-line"):
        path = directory / f"{shape}.jsonl"
        _shape(shape, path, tiny_lines)
        size = path.stat().st_size
        probe: dict[str, dict[str, int]] = {}
        for command in ("open", "verify", "inspect"):
            done = subprocess.run(
                [sys.executable, "-c", _PROBE, command, str(path)], capture_output=True, text=True, check=True
            )
            probe[command] = json.loads(done.stdout)
        state = probe["open"]["retained"]
        row: dict[str, Any] = {"shape": shape, "file_mb": size / 1e6, "state_mb": state / 1e6}
        for command, figures in probe.items():
            row[command] = (figures["peak"] - state) / size
        rows.append(row)
        path.unlink()
    return rows


# -- 4. load throughput ----------------------------------------------------------------------------


def throughput(facts: int, rounds: int) -> dict[str, Any]:
    data = generate_session(5, facts, profile="bulk").to_bytes()
    runs: dict[str, Callable[[bytes], object]] = {
        "bare": _bare_parse,
        "floor": _floor,
        "reduce_bytes": sessionlog.reduce_bytes,
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, function in runs.items():
            gc.collect()
            start = time.perf_counter()
            function(data)
            times[name].append(time.perf_counter() - start)
    bare = _median(times["bare"])
    return {
        "mb": len(data) / 1e6,
        "reduce_mb_s": len(data) / 1e6 / _median(times["reduce_bytes"]),
        "reduce_vs_bare": bare / _median(times["reduce_bytes"]),
        "floor_vs_bare": bare / _median(times["floor"]),
    }


# -- 5. garbage collection (printed, no bound: see the README) -----------------------------------------


def gc_pause(rounds: int) -> dict[str, Any]:
    """A full collection's pause with a loaded session alive, by session size: the state's
    containers stay tracked by the collector (nothing is frozen behind the host's back)."""
    out = {}
    for facts in (10_000, 100_000):
        state = sessionlog.reduce_bytes(generate_session(5, facts, profile="bulk").to_bytes())
        pauses = []
        for _ in range(rounds):
            start = time.perf_counter()
            gc.collect()
            pauses.append(time.perf_counter() - start)
        out[facts] = _median(pauses) * 1e3
        del state
    return out


def run(full: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sessionlog-costs-") as folder:
        directory = Path(folder)
        return {
            "deep_run": deep_run(directory, 5 if full else 3),
            "compactions": compactions(100_000, 5 if full else 3),
            "memory": memory(directory, 1_000_000 if full else 300_000),
            "throughput": throughput(100_000 if full else 30_000, 5 if full else 3),
            "gc_pause_ms": gc_pause(5),
        }


def report(result: dict[str, Any]) -> str:
    deep, compact, speed = result["deep_run"], result["compactions"], result["throughput"]
    lines = ["Costs that must not grow with the session (medians of alternating rounds; bounds beside)", ""]
    for api in ("sync", "async"):
        row = deep[api]
        lines.append(
            f"1. {api:5} commit at 8,000 tool calls {row['at_8000_us']:7.1f} us, "
            f"at 10 {row['at_10_us']:7.1f} us: {row['ratio']:.2f}x (bound <= 1.5x)"
        )
    lines.append(
        f"2. load of {compact['facts']:,} facts, 50 compactions {compact['compacted_s']:.2f} s / none "
        f"{compact['plain_s']:.2f} s: {compact['ratio']:.2f}x (bound <= 1.5x; the file is "
        f"{compact['bytes_ratio']:.2f}x larger, {compact['per_byte_ratio']:.2f}x per byte)"
    )
    for row in result["memory"]:
        lines.append(
            f"3. {row['shape']:10} ({row['file_mb']:.0f} MB, state {row['state_mb']:.0f} MB): peak less "
            f"state / file: open {row['open']:.2f}x, verify {row['verify']:.2f}x, "
            f"inspect {row['inspect']:.2f}x (bound <= 2x)"
        )
    lines.append(
        f"4. reduce_bytes {speed['reduce_mb_s']:.0f} MB/s = {speed['reduce_vs_bare']:.2f}x a bare split "
        f"+ orjson.loads; the floor of parse + mandatory checks: {speed['floor_vs_bare']:.2f}x"
    )
    pause = result["gc_pause_ms"]
    lines.append(
        f"5. a full garbage collection with the session's state alive: {pause[10_000]:.1f} ms at 10k facts, "
        f"{pause[100_000]:.1f} ms at 100k (the state's containers stay tracked; nothing is frozen)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.costs", description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="more rounds, 1M tiny lines")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    result = run(args.full)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

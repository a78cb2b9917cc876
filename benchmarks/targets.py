"""The issues' performance targets, measured in this run, each with PASS or MISS.

The reducer and store figures come from the other benchmark modules' ``run(quick) -> dict``
(``benchmarks.reduce``, ``benchmarks.stores``, ``benchmarks.async_backends``); the backend ratios
fall back to this suite's own rows when a module is missing. A figure that nobody measured is
"—", never a guess.
"""

from __future__ import annotations

import importlib
import operator
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from benchmarks.ceilings import Progress

Row = dict[str, Any]
Result = dict[str, Any]
MODULES = ("reduce", "stores", "async_backends")
Fallback = Callable[[list[Row], Mapping[int, Row]], float | None]


@dataclass(frozen=True)
class Target:
    issue: int
    label: str
    op: str  # ">=" or "<="
    bound: float
    module: str
    figure: Callable[[Result], float | None]  # from the module's run() result
    fallback: Fallback | None = None  # the same figure from this suite's own rows
    how: str = ""  # what the fallback compares
    # the best this design can reach here, from floors measured in the same run (module result)
    ceiling: Callable[[Result], float | None] | None = None


def run_others(full: bool, progress: Progress | None = None) -> dict[str, Result]:
    """module -> its run(quick) result, or {"error": why} when it is missing or fails."""
    out: dict[str, Result] = {}
    for name in MODULES:
        label = f"benchmarks.{name}.run(quick={not full})"
        if progress is not None:
            progress(label, 0, 1)
        try:
            module = importlib.import_module(f"benchmarks.{name}")
        except ImportError as error:
            out[name] = {"error": f"missing: {error}"}
            if progress is not None:
                progress(label, 1, 1)
            continue
        started = time.perf_counter()
        try:
            result = module.run(quick=not full)
        except Exception as error:  # one broken module must not sink the whole run
            out[name] = {"error": f"failed: {type(error).__name__}: {error}"}
            if progress is not None:
                progress(label, 1, 1)
            continue
        out[name] = dict(result) if isinstance(result, Mapping) else {"error": f"returned {type(result)}"}
        out[name]["_seconds"] = time.perf_counter() - started
        if progress is not None:
            progress(label, 1, 1)
    return out


def not_run(reason: str) -> dict[str, Result]:
    return {name: {"error": reason} for name in MODULES}


def _rate(rows: list[Row], name: str) -> float | None:
    for row in rows:
        if row["name"] == name and row.get("commits_per_s") is not None:
            return float(row["commits_per_s"])
    return None


def _ratio(rows: list[Row], top: str, bottom: str) -> float | None:
    a, b = _rate(rows, top), _rate(rows, bottom)
    return None if a is None or b is None else a / b


def _paired(rows: list[Row], name: str) -> float | None:
    """A backend row's ratio to its own ceiling, measured in alternation with it."""
    for row in rows:
        if row["name"] == name and row.get("vs_ceiling") is not None:
            return float(row["vs_ceiling"])
    return None


def _load(rows: list[Row], facts: int) -> float | None:
    for row in rows:
        if row.get("backend") == "jsonl" and row.get(f"load_{facts // 1000}k_s") is not None:
            return float(row[f"load_{facts // 1000}k_s"])
    return None


def _throughput(rows: list[Row], sessions: Mapping[int, Row]) -> float | None:
    load = _load(rows, 100_000)
    return None if load is None or 100_000 not in sessions else sessions[100_000]["parse_s"] / load


def _linearity(rows: list[Row], _sessions: Mapping[int, Row]) -> float | None:
    big, small = _load(rows, 100_000), _load(rows, 10_000)
    return None if big is None or small is None else big / small


def _get(*path: str) -> Callable[[Result], float | None]:
    def figure(result: Result) -> float | None:
        value: Any = result
        for key in path:
            if not isinstance(value, Mapping) or key not in value:
                return None
            value = value[key]
        return float(value) if isinstance(value, int | float) else None

    return figure


def _normalized(top: str, bottom: str) -> Fallback:
    """Two rows with the same ceiling, each as a ratio to that ceiling run in alternation with it:
    robust to a disk whose speed changed between the two rows (a plain ratio of rows is not)."""

    def figure(rows: list[Row], _sessions: Mapping[int, Row]) -> float | None:
        a, b = _paired(rows, top), _paired(rows, bottom)
        return None if a is None or b is None else a / b

    return figure


def _rows_ratio(top: str, bottom: str) -> Fallback:
    return lambda rows, _sessions: _ratio(rows, top, bottom)


TARGETS = (
    Target(2, "reducer throughput / bare split+orjson.loads", ">=", 0.3, "reduce", _get("throughput_ratio"),
           _throughput, "split+orjson.loads / jsonl open+load() of the same 100k-fact session"),
    Target(2, "reduce 100k facts / 10k facts (time)", "<=", 12.0, "reduce", _get("linearity"),
           _linearity, "jsonl open+load() of 100k / of 10k facts"),
    Target(2, "peak memory reducing 100k / file size", "<=", 6.0, "reduce", _get("memory_ratio")),
    Target(3, "jsonl commit at 10k facts / bare uuid7+dumps+write", "<=", 4.0, "stores",
           _get("latency", "ratio")),
    Target(3, "jsonl median commit at 100k / at 1k facts", "<=", 1.2, "stores", _get("flatness", "ratio")),
    Target(3, "jsonl-fsync / bare write+fdatasync (commits/s)", ">=", 0.9, "stores", _get("fsync", "ratio"),
           lambda rows, _sessions: _paired(rows, "jsonl-fsync 1x1"), "jsonl-fsync 1x1 vs its paired ceiling"),
    Target(4, "jsonl-group 64 committers / jsonl-fsync 1", ">=", 8.0, "async_backends",
           _get("group_64_ratio"), _rows_ratio("jsonl-group 64x1", "jsonl-fsync 1x1"),
           "rows jsonl-group 64x1 / jsonl-fsync 1x1", _get("group_64_ceiling")),
    Target(4, "jsonl-group 1 committer / jsonl-fsync 1", ">=", 0.6, "async_backends", _get("group_1_ratio"),
           _normalized("jsonl-group 1x1", "jsonl-fsync 1x1"),
           "jsonl-group 1x1 / jsonl-fsync 1x1, each against its paired write+fdatasync"),
    Target(4, "jsonl-async 64 committers / jsonl 1", ">=", 1.0, "async_backends", _get("async_64_ratio"),
           _rows_ratio("jsonl-async 64x1", "jsonl 1x1"), "rows jsonl-async 64x1 / jsonl 1x1",
           _get("async_64_ceiling")),
)  # fmt: skip

_OPS = {">=": operator.ge, "<=": operator.le}


def evaluate(
    rows: list[Row], others: Mapping[str, Result], sessions: Mapping[int, Row] | None = None
) -> list[Row]:
    """One line per target: measured value, bound, PASS / MISS / —, and where the figure came from."""
    out = []
    for target in TARGETS:
        result = others.get(target.module, {})
        value = None if "error" in result else target.figure(result)
        source = f"benchmarks.{target.module}.run()"
        own = None if target.fallback is None else target.fallback(rows, sessions or {})
        if value is None and own is not None:
            value, own = own, None
            source = f"this suite: {target.how}"
        elif value is not None and own is not None:
            source += f" (this suite, {target.how}: {own:.2f}x)"
        if value is None:
            why = result.get("error") or "no such figure in its result"
            source = f"benchmarks.{target.module}: {why}"
        verdict = "—" if value is None else "PASS" if _OPS[target.op](value, target.bound) else "MISS"
        ceiling = None if target.ceiling is None or "error" in result else target.ceiling(result)
        if ceiling is not None:
            source += f"; this design's ceiling here (core + asyncio floor): {ceiling:.2f}x"
        out.append(
            {
                "issue": target.issue,
                "target": target.label,
                "bound": f"{target.op} {target.bound:g}x",
                "measured": value,
                "verdict": verdict,
                "source": source,
            }
        )
    return out

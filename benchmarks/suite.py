"""The whole benchmark in one run: ceilings, every registered backend, the peers, the checks.

A virtual disk's sync latency swings by several times within seconds, so every backend row is
measured in alternation with its own ceiling (`backends.Paired`) and its `vs_ceiling` is that
paired ratio. The hard check needs one bound for the whole run: the fsync ceiling row reports
the best rate the bare write+fdatasync loop sustained over 20 syncs in a row, across all its
runs (with the other ceilings, before and after the backends, and paired with each power-class
one-committer row). A syncing backend cannot beat that; one that skips its syncs beats it by an
order of magnitude.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import pathlib
import platform
import shutil
import sqlite3
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import sessionlog
from benchmarks import backends as B
from benchmarks import reliability, targets
from benchmarks.ceilings import Durability, Progress, make_row, run_ceilings, sub_progress, time_commits
from benchmarks.peers import run_peers

Row = dict[str, Any]
SYNC = B.SYNC
FSYNC_CEILING = B.ceiling_name("power", 1, 1)


@dataclass(frozen=True)
class Plan:
    """How much to measure. `quick` is the default (< 90 s on 2 cores); `full` has more rounds
    and larger sessions; `tiny` is for the smoke test."""

    mode: str
    commits: int  # per shape, process class and 64 committers
    power_commits: int  # per shape, power class with one committer
    rounds: int  # rounds per shape; the median round is reported
    ceiling_commits: int
    sync_batches: int  # iterations of the batched (64 lines per sync) ceilings
    peer_commits: int
    loads: dict[int, int] = field(default_factory=dict)  # session facts -> repeats (best of)
    parse_sizes: tuple[int, ...] = (10_000, 100_000)
    others: bool = True  # the other benchmark modules' run() for the issue targets
    kills: int = 8  # kill -9 harness: kills per backend (0: not run)
    traces: int = 20  # power-loss harness: traces per backend (0: not run)


# The other modules' run(quick) take minutes together (pre-filled 100k sessions, tracemalloc):
# quick leaves them to --targets so that it stays under 90 s; its own rows still give six targets.
QUICK = Plan("quick", 2000, 200, 1, 300, 40, 200, {10_000: 3, 100_000: 1}, others=False)
FULL = Plan(
    "full", 10_000, 1000, 3, 2000, 200, 1000, {10_000: 5, 100_000: 3, 300_000: 1}, kills=40, traces=100
)
TINY = Plan("tiny", 64, 4, 1, 8, 2, 4, {200: 1, 1000: 1}, (1000,), others=False, kills=0, traces=0)


def with_targets(plan: Plan) -> Plan:
    return replace(plan, others=True)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _filesystem(directory: pathlib.Path) -> str:
    """The mount (device, type) holding `directory`, from /proc/mounts when there is one."""
    try:
        mounts = [line.split() for line in pathlib.Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return "unknown"
    target = str(directory.resolve())
    best = max(
        (m for m in mounts if len(m) > 2 and (target == m[1] or target.startswith(m[1].rstrip("/") + "/"))),
        key=lambda m: len(m[1]),
        default=None,
    )
    return f"{best[2]} on {best[0]} ({best[1]})" if best else "unknown"


def metadata(plan: Plan, directory: pathlib.Path) -> dict[str, Any]:
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "mode": plan.mode,
        "plan": asdict(plan) | {"loads": {str(k): v for k, v in plan.loads.items()}},
        "machine": {
            "cpu": _cpu(),
            "cores": os.cpu_count(),
            "system": f"{platform.system()} {platform.release()} {platform.machine()}",
            "filesystem": _filesystem(directory),
        },
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "versions": {
            dist: _version(dist)
            for dist in (
                "sessionlog",
                "orjson",
                "aiofiles",
                "eventsourcing",
                "langgraph-checkpoint-sqlite",
                "openai-agents",
                "rich",
                "matplotlib",
            )
        }
        | {"sqlite": sqlite3.sqlite_version},
    }


# -- ceilings ------------------------------------------------------------------------------------


def shape_ceiling(
    directory: pathlib.Path,
    name: str,
    *,
    facts: int,
    batch: int,
    sync: bool,
    iterations: int,
    note: str,
    progress: Progress | None = None,
) -> Row:
    """One os.write of `batch` lines of facts x 500 bytes per iteration (+ one sync if `sync`)."""
    ceiling = B.CeilingFile(directory / "ceiling-shape.log", facts=facts, batch=batch, sync=sync)
    try:
        samples, total = time_commits(ceiling.commit, iterations, progress=sub_progress(progress, name))
    finally:
        ceiling.close()
    durability: Durability = "power" if sync else "process"
    row: Row = dict(
        make_row(
            name,
            "ceiling",
            durability,
            samples,
            total,
            facts_per_commit=facts,
            commits_per_s=iterations * batch / total,
            bytes_per_fact=len(ceiling.blob) / (batch * facts),
            note=note,
        )
    )
    row.update(committers=batch, status="ok", best_window=B.best_window(samples, batch))
    return row


def extra_ceilings(directory: pathlib.Path, plan: Plan, progress: Progress | None) -> list[Row]:
    """Ceilings at the backends' other shapes: 10-fact (5 KB) lines, and 64 commits per sync."""
    rows = [
        shape_ceiling(
            directory,
            B.ceiling_name("process", 1, 10),
            facts=10,
            batch=1,
            sync=False,
            iterations=plan.ceiling_commits,
            note="os.write of one 5,000-byte line per commit (a 10-fact transaction)",
            progress=progress,
        ),
        shape_ceiling(
            directory,
            B.ceiling_name("power", 1, 10),
            facts=10,
            batch=1,
            sync=True,
            iterations=plan.ceiling_commits,
            note=f"os.write of one 5,000-byte line + os.{SYNC} per commit",
            progress=progress,
        ),
    ]
    for facts in (1, 10):
        size = "500 B" if facts == 1 else "5 KB"
        rows.append(
            shape_ceiling(
                directory,
                B.ceiling_name("power", 64, facts),
                facts=facts,
                batch=64,
                sync=True,
                iterations=plan.sync_batches,
                note=f"one os.write of 64 {size} lines + one os.{SYNC}: the best 64 committers sharing "
                "a sync can do; commits_per_s = lines/s, p50/p99 = one batch",
                progress=progress,
            )
        )
    return rows


def add_ratios(rows: list[Row], near: dict[str, float]) -> None:
    """Peers are not paired with a ceiling while they run (peers.py times them alone): their
    ratio is against the 1x1 ceiling of their class measured just before and just after them
    (the mean of the two), `near`."""
    for row in rows:
        row.setdefault("ceiling", None)
        row.setdefault("vs_ceiling", None)
        if row["kind"] != "peer" or row.get("commits_per_s") is None or row["durability"] == "none":
            continue
        name = B.ceiling_name(row["durability"], row["committers"], row["facts_per_commit"])
        if name in near:
            row.update(
                ceiling=name, ceiling_commits_per_s=near[name], vs_ceiling=row["commits_per_s"] / near[name]
            )
            row["note"] += f"; vs_ceiling: against {name} measured just before and after the peers (mean)"


def hard_check(rows: list[Row], bound: float) -> dict[str, Any]:
    """No power-class backend or peer row with one committer may beat the fsync ceiling."""
    rows = [
        row
        for row in rows
        if row["kind"] != "ceiling"
        and row["durability"] == "power"
        and row["committers"] == 1
        and row.get("commits_per_s") is not None
    ]
    violations = [row["name"] for row in rows if row["commits_per_s"] > bound]
    highest = max(rows, key=lambda row: row["commits_per_s"], default=None)
    return {
        "rule": f"no power-class row with 1 committer may exceed the {FSYNC_CEILING} ceiling",
        "bound_commits_per_s": bound,
        "checked": [row["name"] for row in rows],
        "highest": None if highest is None else highest["name"],
        "highest_ratio": None if highest is None else highest["commits_per_s"] / bound,
        "violations": violations,
        "passed": not violations,
    }


# -- the run -------------------------------------------------------------------------------------


def run(plan: Plan, directory: pathlib.Path, progress: Progress | None = None) -> dict[str, Any]:
    """Every row of one run, with metadata, ratios, the hard check and the issue targets."""
    directory.mkdir(parents=True, exist_ok=True)
    meta = metadata(plan, directory)
    started = last = time.perf_counter()
    stages: dict[str, float] = {}
    rows: list[Row] = []

    def stage(name: str) -> None:
        nonlocal last
        now = time.perf_counter()
        stages[name] = round(now - last, 1)
        last = now

    for ceiling in run_ceilings(
        directory / "ceilings", plan.ceiling_commits, progress=progress, parse_sizes=plan.parse_sizes
    ):
        rows.append(dict(ceiling) | {"status": "ok"})
    rows += extra_ceilings(directory, plan, progress)
    fsync = next(row for row in rows if row["name"] == FSYNC_CEILING)
    stage("ceilings")

    def fsync_again(when: str) -> float:
        again = shape_ceiling(
            directory,
            f"{FSYNC_CEILING} ({when})",
            facts=1,
            batch=1,
            sync=True,
            iterations=plan.ceiling_commits,
            note="",
            progress=progress,
        )
        return float(again["best_window"])

    windows = [fsync["commits_per_s"], fsync_again("before backends")]
    registered = sessionlog.backends()
    for name, info in registered.items():
        for committers, facts in B.SHAPES:
            power_single = info.durability == "power" and committers == 1
            commits = plan.power_commits if power_single else plan.commits
            try:
                row = B.commit_row(
                    name, info, directory, committers, facts, commits, rounds=plan.rounds, progress=progress
                )
            except Exception as error:  # a broken backend is a row with its reason, not a crash
                row = B.na_row(
                    name, info, committers, facts, f"failed: {type(error).__name__}: {error}", "skipped"
                )
            rows.append(row)
    windows.append(fsync_again("after backends"))
    stage("backends: commits")
    windows += [row["ceiling_best_window"] for row in rows if row.get("ceiling") == FSYNC_CEILING]

    per_backend, sessions = B.run_loads(registered, directory, plan.loads, progress)
    stage("backends: loads")
    lost = reliability.measure(list(registered), directory, progress, kills=plan.kills, traces=plan.traces)
    stage("crash harnesses")
    for row in rows:
        if row["kind"] == "backend":
            row.update(per_backend[row["backend"]])
            row.update(lost[row["backend"]])
            row["load_s"] = row.get(B.size_key(min(plan.loads))) if plan.loads else None

    def adjacent(when: str) -> dict[str, Row]:
        """The 1x1 ceilings the peers are compared with, measured just before and after them."""
        names = {"process": B.ceiling_name("process", 1, 1), FSYNC_CEILING: FSYNC_CEILING}
        return {
            name: shape_ceiling(
                directory,
                f"{name} ({when} peers)",
                facts=1,
                batch=1,
                sync=name == FSYNC_CEILING,
                iterations=max(1, plan.ceiling_commits // 2),
                note="",
                progress=progress,
            )
            for name in names.values()
        }

    before = adjacent("before")
    peer_rows, skipped = run_peers(directory / "peers", plan.peer_commits, progress=progress)
    after = adjacent("after")
    windows += [before[FSYNC_CEILING]["best_window"], after[FSYNC_CEILING]["best_window"]]
    near = {name: (before[name]["commits_per_s"] + after[name]["commits_per_s"]) / 2 for name in before}
    rows += [dict(row) | {"status": "ok"} for row in peer_rows]
    for skip in skipped:
        rows.append(
            {
                "name": skip["name"],
                "kind": "peer",
                "durability": "none",
                "status": "skipped",
                "committers": 1,
                "facts_per_commit": 1,
                "commits_per_s": None,
                "p50_us": None,
                "p99_us": None,
                "bytes_per_fact": None,
                "load_s": None,
                "note": f"skipped: {skip['reason']}",
            }
        )

    stage("peers")
    fsync["measurements"] = windows
    fsync["commits_per_s"] = max(windows)
    fsync["note"] += (
        f"; commits_per_s = the best sustained rate ({B.WINDOW} syncs in a row) of {len(windows)} runs "
        "spread over the suite (this one's average, before and after the backends, paired with each "
        "power-class 1x1 row, before and after the peers): the bound of the hard check; p50/p99 are "
        "this run's"
    )
    add_ratios(rows, near)
    check = hard_check(rows, fsync["commits_per_s"])
    others = (
        targets.run_others(plan.mode == "full", progress)
        if plan.others
        else targets.not_run("not run: add --targets (or --full)")
    )
    stage("other benchmark modules (targets)")
    meta["seconds"] = round(time.perf_counter() - started, 1)
    meta["stage_seconds"] = stages
    return {
        "meta": meta,
        "rows": rows,
        "check": check,
        "sessions": {str(facts): figures for facts, figures in sessions.items()},
        "targets": targets.evaluate(rows, others, sessions),
        "modules": others,  # the other benchmark modules' own results, or why there are none
    }


def scratch(directory: pathlib.Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)

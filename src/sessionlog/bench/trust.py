"""Which figures of a run hold on a busy machine, and how long a `--full` run would take.

* The machine's load (`os.getloadavg`, the 1-minute figure) is recorded at the start and the end
  of the run, beside its CPU count, and the share of the CPUs other work took during the run
  (`other_work`: the load average counts the run's own threads too).
* A shape whose ceiling moved between rounds by more than `MOVED` (its (max - min) / median) is
  measured once more (`runner.measure`), and the measurement whose ceilings moved least is kept.
* `unreliable(result)` names the figures that still do not hold, and why: a row whose own rounds
  spread by more than `MOVED`, a row whose ceiling did, every figure of a run in which other work
  took more than `BUSY` of the CPUs (where that cannot be read: whose load at the start was above
  the CPU count).
* `full_estimate`: each shape's seconds in this run, scaled by what `--full` does more of.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MOVED = 0.5  # a ceiling whose rounds spread by more than half its median moved
BUSY = 0.25  # other work that took more than a quarter of the machine's CPUs during a run
# Shape h at --full (10,000 sessions, 5 rounds) over its quick time (1,000 sessions, 3 rounds):
# measured, not derived: 517 s over 13.8 s on 2 CPUs at load 5-7 (2026-12-02). Each open of a
# directory's session lists the directory, so claiming 10x the sessions in a 10x larger
# directory costs far more than 10x.
RESTART_FULL = 37.0


def spread(row: Mapping[str, Any]) -> float:
    """(max - min) / median of a row's rounds; 0 for a row of one round."""
    median = row.get("per_s", 0.0)
    return (row.get("max_per_s", 0.0) - row.get("min_per_s", 0.0)) / median if median > 0 else 0.0


def moved(ceilings: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The ceilings (name -> summary) that moved by more than MOVED between rounds."""
    return [name for name, row in ceilings.items() if spread(row) > MOVED]


def worst_spread(ceilings: Mapping[str, Mapping[str, Any]]) -> float:
    return max((spread(row) for row in ceilings.values()), default=0.0)


def machine_wide(result: Mapping[str, Any]) -> str | None:
    """Why no figure of this run holds (a busy machine), None when the machine was not."""
    load = result.get("load") or {}
    cpus, others, start = load.get("cpus") or 0, load.get("others"), load.get("start")
    hold = "ratios to the ceilings measured in the same rounds hold better than rates"
    if others is not None and others > BUSY:
        return f"every figure: other work took {others:.0%} of the {cpus} CPUs during the run ({hold})"
    if others is None and cpus and start is not None and start > cpus:
        return f"every figure: the machine's load was {start:.1f} on {cpus} CPUs at the start ({hold})"
    return None


def doubts(result: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """(shape, name) -> why that row's (or ceiling's) own figure does not hold: its rounds
    spread by more than MOVED, or (a row) its ceiling's did. The one place the verdict of a row
    is made: `unreliable` prints it, `unreliable_rows` and the JSON rows (`report.said`) carry it."""
    ceilings = {(row["shape"], row["name"]): row for row in result["rows"] if row["kind"] == "ceiling"}
    found = {}
    for row in result["rows"]:
        key = (row["shape"], row["name"])
        if row["kind"] == "ceiling":
            if spread(row) > MOVED:
                again = " even measured again" if row.get("remeasured") else ""
                found[key] = f"the ceiling moved {spread(row):.0%} between rounds{again}"
            continue
        ceiling = ceilings.get((row["shape"], row.get("ceiling")))
        if spread(row) > MOVED:
            low, high = row["min_per_s"], row["max_per_s"]
            found[key] = f"its rounds spread {spread(row):.0%}: {low:,.0f}-{high:,.0f}/s"
        elif ceiling is not None and spread(ceiling) > MOVED:
            found[key] = "vs ceiling: the ceiling moved"
    return found


def unreliable(result: Mapping[str, Any]) -> list[str]:
    """The figures of this run that do not hold, each with why."""
    every = machine_wide(result)
    lines = [every] if every else []
    found = doubts(result)
    shapes: dict[str, tuple[list[str], list[str]]] = {}  # shape -> (its moved ceilings, its rows)
    for row in result["rows"]:
        moved_ceilings, rows = shapes.setdefault(row["shape"], ([], []))
        why = found.get((row["shape"], row["name"]))
        if why is None:
            continue
        if row["kind"] == "ceiling":
            moved_ceilings.append(why.replace("the ceiling", f"the ceiling {row['name']}", 1))
        else:
            rows.append(f"{row['name']} ({why})")
    for shape, (moved_ceilings, rows) in shapes.items():
        if moved_ceilings or rows:
            parts = moved_ceilings + ([f"unreliable rows: {', '.join(rows)}"] if rows else [])
            lines.append(f"{shape}: {'; '.join(parts)}")
    return lines


def unreliable_rows(result: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(shape, name) of the rows whose figure does not hold (their spread, or their ceiling's)."""
    kinds = {(row["shape"], row["name"]): row["kind"] for row in result["rows"]}
    return {key for key in doubts(result) if kinds[key] != "ceiling"}


def full_estimate(
    seconds: Mapping[str, float], mode: str, timed: Mapping[str, float] | None = None
) -> float | None:
    """How long `--full` would take, from each shape's seconds in a quick run (`shape label ->
    seconds`): 5 rounds instead of 3 and 3x the commits a round (a, b, f: 5x); shape c's commits
    (`timed`: shape -> the seconds of its rounds' commits) 10x, as quick halves them
    (`runner.Plan.session_commits`), and the rest of its time, the opening of its sessions, 5/3
    at most (without `timed`: the whole shape 10x); 16 and 256 sessions beside the quick run's
    64 (the 64-session figure, and a quarter and 4x of it);
    100k-fact loads beside 1k and 10k, and the compacted loads at 100k facts instead of 10k (10x,
    5/3); 10,000 sessions listed instead of 1,000 (mostly their filling: 10x, 5/3); a session of
    100,000 facts beside 10,000 (mostly its filling: 10x, 5/3); resumes of 100,000 messages beside
    1,000 and 10,000 (the 10,000-message time, 10x, 5/3 again); a restart of 10,000 sessions
    instead of 1,000 (`RESTART_FULL`: the directory's claims grow faster than its sessions).
    None for a mode other than quick (a tiny run is all overhead, a full one is its own answer)."""
    if mode != "quick":
        return None
    total = 0.0
    for shape, took in seconds.items():
        if shape[0] in "ab":
            total += took * 5
        elif shape[0] == "c":
            commits = min(took, (timed or {}).get(shape, took))
            at_full = commits * 10 + (took - commits) * 5 / 3
            total += at_full * (1 + 1 / 4 + 4) if shape.startswith("c: 64 ") else at_full
        elif shape[0] == "e" or (shape.startswith("d: ") and "compactions" in shape):
            total += took * 10 * 5 / 3  # 10,000 sessions instead of 1,000; 100,000 facts instead of 10,000
        elif shape[0] == "d":
            total += took * 5 / 3
            if shape == "d: load 10,000 facts":
                total += took * 10 * 5 / 3
        elif shape[0] == "f":
            total += took * 5 / 3 + took * 10 * 5 / 3
        elif shape[0] == "g":
            total += took * 5 / 3
            if shape == "g: resume a session of 10,000 messages":
                total += took * 10 * 5 / 3
        elif shape[0] == "h":
            total += took * RESTART_FULL
    return total

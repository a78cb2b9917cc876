"""What a run prints: a table per shape, every row beside the ceiling measured with it, the
recommendation computed from the rows, the same as Markdown, and the plot."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import tempfile
from collections import defaultdict
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from . import trust
from .runner import SHAPES
from .shapes import KEPT_OPEN

CLASSES = ("process", "power", "replicated")
ABOVE = {  # why a row that syncs is above a ceiling that syncs, per shape
    "b": "commits queued at once share one write and one sync (group commit), which the ceiling "
    "(one sync per line) does not",
    "c": "jsonl-syncfs covers the commits of many sessions with one syncfs, a repository puts them "
    "in one transaction (one sync), and ext4 merges concurrent syncs of different files",
}
ABOVE_WRITE = {  # why a row is above a ceiling that does not sync (os.write), per shape
    "b": "commits queued at once share one write, which the ceiling (one write per line) does not",
}
SAME_ROUNDS = "measured in the same rounds; the ceiling's rounds were slower"
AGREE = 0.1  # a ceiling kept open and its twin on fresh files agree within 10% (their paired ratio)


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _shapes(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        grouped[row["shape"]].append(row)
    return grouped


def _above(row: Mapping[str, Any]) -> bool:
    return row.get("vs_ceiling", 0) > 1.0 and not row.get("versus")  # versus: beside another row


def _why_above(row: Mapping[str, Any], unsynced: bool = False) -> str:
    """Why a row stands above its ceiling ("" when it does not). A row that makes no sync (its
    class, process; or its counted flushes: `unsynced`) beside a ceiling that syncs is said not
    to sync, never explained by how syncs are shared."""
    if not _above(row):
        return ""
    if "sync" not in row.get("ceiling", ""):
        return ABOVE_WRITE.get(row["shape"][0], SAME_ROUNDS)
    if row.get("durability") == "process":
        return (
            "it does not sync (process class: its commits reach the operating system, not the disk), "
            f"and its ceiling ({row['ceiling']}) syncs every line"
        )
    if unsynced:
        return (
            f"it does not sync: {row['flushes']:,} flushes for {row['operations']:,} commits (see NOT "
            f"SYNCING), and its ceiling ({row['ceiling']}) syncs every line"
        )
    return ABOVE.get(row["shape"][0], SAME_ROUNDS)


def _two_ceilings(row: Mapping[str, Any], moved: bool) -> str:
    """How a ceiling kept open across rounds (the rows' sessions are) compares with its twin on
    fresh files each round, measured in the same rounds ("" for another row); `moved`: either
    one's rounds spread by more than `trust.MOVED` (then the run cannot tell)."""
    if "vs_fresh" not in row:
        return ""
    fresh = row["name"].removesuffix(KEPT_OPEN)
    ratio = row["vs_fresh"]
    beside = "the rows whose sessions are kept open are set beside this one (their work)"
    if row.get("rounds", 2) < 2:
        verdict = f"this run cannot tell whether they agree (one round); {beside}"
    elif moved:
        verdict = (
            f"this run cannot tell whether they agree (a ceiling of the two moved between rounds); {beside}"
        )
    elif abs(ratio - 1) <= AGREE:
        verdict = f"the two agree (within {AGREE:.0%})"
    else:
        verdict = f"they differ; {beside}"
    return (
        f"{row['name']} (its files kept open across rounds, as the rows' sessions are) is {ratio:.2f}x "
        f"{fresh} (fresh files each round), the median of their per-round ratios in the same rounds: "
        f"{verdict}"
    )


def said(result: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """What the run says of each row, (shape, name) -> its `note` (why it is above its ceiling,
    what a restart's claims did; None), whether its figure holds (`reliable`, and why not:
    `reliability_reason`, `trust.doubts` and a busy machine's `trust.machine_wide`) and the
    spread of its rounds (`spread_pct`, (max - min) / median). The one place these are made: the
    text, the Markdown and the JSON (`annotated`) print them."""
    every = trust.machine_wide(result)
    doubts = trust.doubts(result)
    unsynced = caught(result)
    found = {}
    for row in result["rows"]:
        key = (row["shape"], row["name"])
        why = _why_above(row, key in unsynced)
        notes = [f"{row['name']} is above its ceiling: {why}"] if why else []
        twin = (row["shape"], row["name"].removesuffix(KEPT_OPEN))
        notes += [two] if (two := _two_ceilings(row, key in doubts or twin in doubts)) else []
        notes += [f"{row['name']}: {row['claim_stopped']}"] if row.get("claim_stopped") else []
        reasons = [reason for reason in (every, doubts.get(key)) if reason]
        found[key] = {
            "note": "; ".join(notes) or None,
            "reliable": not reasons,
            "reliability_reason": "; ".join(reasons) or None,
            "spread_pct": round(trust.spread(row) * 100, 1),
        }
    return found


def annotated(result: dict[str, Any]) -> dict[str, Any]:
    """The run with what it says of each row (`said`) in the row, and its unreliable figures
    (`trust.unreliable`) beside them: what `--json` writes."""
    found = said(result)
    rows = [{**row, **found[(row["shape"], row["name"])]} for row in result["rows"]]
    return {**result, "rows": rows, "unreliable": trust.unreliable(result)}


def as_json(result: dict[str, Any]) -> str:
    return json.dumps(annotated(result), indent=1)


def table(shape: str, rows: list[dict[str, Any]]) -> list[list[str]]:
    """Header and cells of one shape's table: ceilings first, then rows fastest first. A shape
    whose rows are set beside one of its rows (`versus`: shape g's, beside sessionlog's) says so
    in the last two columns' names."""
    unit = next((row.get("unit") for row in rows if row.get("unit")), "commits/s")
    versus = next((row["versus"] for row in rows if row.get("versus")), None)
    cells = [
        [
            "row",
            "class",
            f"{unit} median (min-max)",
            "p50 us",
            "p99 us",
            f"{versus}'s row, same run" if versus else "its ceiling, same run",
            f"vs {versus}" if versus else "vs ceiling",
        ]
    ]
    ordered = sorted(rows, key=lambda row: (row["kind"] != "ceiling", -row["per_s"]))
    for row in ordered:
        ratio = f"{row['vs_ceiling']:.2f}x" if "vs_ceiling" in row else ""
        if _above(row) and row["kind"] != "ceiling":
            ratio += " (above: see note)"
        ceiling = f"{row['ceiling']} {_rate(row['ceiling_per_s'])}" if "ceiling_per_s" in row else ""
        cells.append(
            [
                ("ceiling: " if row["kind"] == "ceiling" else "") + row["name"],
                row.get("durability", "-") if row["kind"] != "ceiling" else "-",
                f"{_rate(row['per_s'])} ({_rate(row['min_per_s'])}-{_rate(row['max_per_s'])})",
                f"{row['p50_us']:,.0f}",
                f"{row['p99_us']:,.0f}",
                ceiling,
                ratio,
            ]
        )
    return cells


def _notes(rows: list[dict[str, Any]], found: Mapping[tuple[str, str], Mapping[str, Any]]) -> list[str]:
    notes = (found[(row["shape"], row["name"])]["note"] for row in rows)
    return [f"  note: {note}" for note in notes if note]


def recommend(
    rows: list[dict[str, Any]],
    unsynced: Collection[tuple[str, str]] = (),
    unreliable: Collection[tuple[str, str]] = (),
) -> list[str]:
    """Per shape and durability class, the fastest sessionlog backend or repository of this run
    (the peers are there to compare with, not to recommend). Never a row caught not syncing in
    that shape (`unsynced`: (shape, name)); a best whose slowest round is below the runner-up's
    fastest is named with it ("or"), as the run cannot tell them apart; a best whose figure does
    not hold (`unreliable`, `trust.unreliable_rows`) says so."""
    advice = []
    for shape, members in _shapes(rows).items():
        if shape[0] not in "abcf":
            continue
        for durability in CLASSES:
            candidates = sorted(
                (
                    row
                    for row in members
                    if row["kind"] in ("backend", "repository")
                    and row.get("durability") == durability
                    and (shape, row["name"]) not in unsynced
                ),
                key=lambda row: -row["per_s"],
            )
            if not candidates:
                continue
            best = candidates[0]
            p99 = (
                f"{best['p99_us'] / 1000:,.1f} ms" if best["p99_us"] >= 1000 else f"{best['p99_us']:,.0f} µs"
            )
            rate = _rate(best["per_s"])
            line = f"{shape}, {durability} class: {best['name']} ({rate} commits/s, p99 {p99})"
            close = [row for row in candidates[1:] if row["max_per_s"] >= best["min_per_s"]]
            if close:
                names = ", ".join(f"{row['name']} ({_rate(row['per_s'])})" for row in close)
                line += f" or {names}: their rounds overlap"
            if (shape, best["name"]) in unreliable:
                line += " (unreliable in this run: see above)"
            advice.append(line)
    return advice


def _power_one_committer(row: dict[str, Any]) -> bool:
    return _judged(row) and committers(row["shape"]) == 1


def committers(shape: str) -> int | None:
    """The committers of a commit-rate shape, each waiting for its commit's sync before its
    next one (so one flush makes at most one commit of each durable); None for other shapes."""
    if shape[:2] in ("a:", "f:"):
        return 1
    found = re.match(r"b: 1 session, ([\d,]+) committers|c: ([\d,]+) sessions", shape)
    return int((found.group(1) or found.group(2)).replace(",", "")) if found else None


def _judged(row: dict[str, Any]) -> bool:
    """A row whose syncs the flush counter sees: sessionlog's, of a class that syncs, keeping its
    data under --dir (not a server's, such as PostgreSQL's: its disk need not be that one)."""
    return (
        committers(row["shape"]) is not None
        and row["kind"] in ("backend", "repository")
        and row.get("durability") in ("power", "replicated")
        and not row.get("on_server")
    )


def _evidence(result: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """(the rows that did not sync, why the evidence is missing): `flush_evidence`."""
    if not result.get("flush_device"):
        return [], [result.get("flushes", "flushes not counted")]
    unsynced, missing = [], []
    for shape, members in _shapes(result["rows"]).items():
        most = committers(shape)
        if most is None or not any(_judged(row) for row in members):
            continue
        ceiling = next((row for row in members if row["name"].endswith("write+fdatasync")), None)
        if ceiling is None or ceiling.get("flushes", 0) < ceiling.get("operations", 1) / most / 2:
            missing.append(f"{shape}: the write+fdatasync ceiling made no flushes the counter saw")
            continue
        unsynced += [
            row
            for row in members
            if _judged(row) and "flushes" in row and row["flushes"] < row["operations"] / most / 2
        ]
    return unsynced, missing


def flush_evidence(result: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(rows that did not sync, why the evidence is missing). A power-class row's committers
    each wait for a sync at each commit, so the device under --dir flushes at least once per
    commit of each committer (once a commit with one committer; with N, one flush makes at most
    N commits durable): a row with fewer than half that many flushes did not sync. Asked only
    when the counter exists and the shape's `write+fdatasync` ceiling showed it works (its own
    flushes at least half that bound). Timing alone never accuses a row."""
    unsynced, missing = _evidence(result)
    return [
        f"{row['name']} ({row['flushes']} flushes of /dev/{result['flush_device']} for "
        f"{row['operations']} commits, {row['shape']})"
        for row in unsynced
    ], missing


def advise(result: dict[str, Any]) -> list[str]:
    """`recommend` for a run: without the rows caught not syncing, marking unreliable figures
    (and why there is none, when the run has no commit-rate shape: `--shape d`, say)."""
    if not {row["shape"][0] for row in result["rows"]} & set(PLOTTED):
        return ["none: it compares the commit rates of shapes a, b, c and f, and this run has none of them"]
    return recommend(result["rows"], caught(result), trust.unreliable_rows(result))


def caught(result: dict[str, Any]) -> set[tuple[str, str]]:
    """(shape, name) of the rows the flush counter shows did not sync (for `recommend`)."""
    return {(row["shape"], row["name"]) for row in _evidence(result)[0]}


def not_syncing(result: dict[str, Any]) -> list[str]:
    """The rows the flush counter shows did not sync (`flush_evidence`)."""
    return flush_evidence(result)[0]


def above_ceiling(result: dict[str, Any]) -> list[str]:
    """Power-class one-committer rows whose median beat their sync ceiling by more than 10%:
    reported with the spread of the ceiling, never an exit on its own (on a busy machine the
    ceiling's rounds swing: other work's syncs share the device's queue, and ext4 merges
    concurrent syncs)."""
    ceilings = {(row["shape"], row["name"]): row for row in result["rows"] if row["kind"] == "ceiling"}
    lines = []
    for row in result["rows"]:
        if _power_one_committer(row) and row.get("vs_ceiling", 0) > 1.1:
            ceiling = ceilings.get((row["shape"], row["ceiling"]), {})
            spread = (
                f", ceiling {_rate(ceiling['min_per_s'])}-{_rate(ceiling['max_per_s'])}/s over rounds"
                if "min_per_s" in ceiling
                else ""
            )
            lines.append(f"{row['name']} {row['vs_ceiling']:.2f}x {row['ceiling']}{spread} ({row['shape']})")
    return lines


def checks(result: dict[str, Any]) -> list[str]:
    """The bounds a run is held to, each with its figure from this run (printed, not enforced)."""
    lines = []
    full = result.get("full_estimate_s")
    estimate = f"; --full would take about {full / 60:.0f} min (from this run's shapes)" if full else ""
    chosen = result.get("shapes", SHAPES)
    if result["mode"] == "quick" and chosen != SHAPES:
        lines.append(f"the quick run of shapes {chosen} took {result['seconds']:.0f} s")
    elif result["mode"] == "quick":
        lines.append(f"the quick run took {result['seconds']:.0f} s (bound: 120 s){estimate}")
    else:
        lines.append(f"the {result['mode']} run took {result['seconds']:.0f} s")
    load = result.get("load") or {}
    if load.get("start") is not None:
        others = load.get("others")
        lines.append(
            f"the machine's load (1 min): {load['start']:.2f} at the start, {load.get('end') or 0:.2f} "
            f"at the end (this run's own threads count in it), on {load.get('cpus')} CPUs; "
            + (
                "other work's CPU not readable here"
                if others is None
                else f"other work took {others:.0%} of them"
            )
        )
    again = sorted({row["shape"] for row in result["rows"] if row.get("remeasured")})
    for shape in again:
        lines.append(f"{shape}: measured twice, its ceiling moved by over {trust.MOVED:.0%} between rounds")
    doubtful = trust.unreliable(result)
    lines += [f"unreliable in this run: {line}" for line in doubtful]
    if not doubtful:
        lines.append(f"every figure held: no ceiling nor row moved by over {trust.MOVED:.0%} between rounds")
    many = [row for row in result["rows"] if row["shape"].startswith("c: 64 ") and row["kind"] != "ceiling"]
    power = [row for row in many if row.get("durability") == "power" and "vs_ceiling" in row]
    if power:
        best = max(power, key=lambda row: row["vs_ceiling"])
        lines.append(
            f"64 sessions, power class: the best row ({best['name']}) reaches {best['vs_ceiling']:.2f}x "
            f"64 threads each writing and fdatasyncing its own file ({best['ceiling']}; bound: 0.6x)"
        )
    unsynced, missing = flush_evidence(result)
    lines.append(result.get("flushes", "flushes not counted"))
    judged = [row for row in result["rows"] if _judged(row) and "flushes" in row]
    for row in judged:
        line = f"{row['name']}, {row['shape']}: {row['flushes']} flushes for {row['operations']} commits"
        most = committers(row["shape"]) or 1
        if most > 1:
            line += f" ({row['operations'] / max(row['flushes'], 1):,.0f} a flush, {most} at most)"
        lines.append(line)
    if unsynced:
        lines.append(
            "NOT SYNCING (fewer flushes than half their commits over their committers): "
            + ", ".join(unsynced)
        )
    elif not judged:
        lines.append(
            "no power-class row to judge by its flushes in this run (shapes a, b, c and f have them)"
        )
    elif not missing:
        lines.append("every power-class row made at least half the flushes its commits need")
    for reason in missing:
        lines.append(f"no verdict on syncing: {reason} (timing alone proves nothing)")
    for line in above_ceiling(result):
        lines.append(f"above its ceiling (not a verdict; its flushes are the evidence): {line}")
    return lines


def _libraries(machine: dict[str, Any]) -> list[str]:
    """The versions of the peers installed and of the PostgreSQL server, as one line (none: no line)."""
    found = machine.get("libraries") or {}
    return [f"With {', '.join(f'{name} {version}' for name, version in found.items())}."] if found else []


def text(result: dict[str, Any]) -> str:
    machine = result["machine"]
    found = said(result)
    out = [
        f"sessionlog bench ({result['mode']}, {result['seconds']} s): {machine['date']}, "
        f"{machine['platform']}, "
        f"{machine['cpus']} CPUs, Python {machine['python']}, sessionlog {machine['sessionlog']}, "
        f"SQLite {machine['sqlite']}; scratch in {machine['directory']} ({machine['filesystem']})",
        *_libraries(machine),
        "Throughput is the median over alternating rounds, min-max beside it; each row's ceiling was "
        "measured in the same rounds, and 'vs ceiling' is the median of the per-round ratios.",
    ]
    for shape, members in _shapes(result["rows"]).items():
        cells = table(shape, members)
        widths = [max(len(row[column]) for row in cells) for column in range(len(cells[0]))]
        out += ["", shape]
        for cell_row in cells:
            out.append(
                "  "
                + "  ".join(cell.ljust(width) for cell, width in zip(cell_row, widths, strict=True)).rstrip()
            )
        out += _notes(members, found)
    for peer in result.get("skipped", []):
        out.append(f"skipped: {peer['name']}: {peer['reason']}")
    out += ["", "Bounds and evidence (figures of this run):"] + [f"  * {line}" for line in checks(result)]
    out += ["", "Recommendation (computed from this run: the fastest here, and its p99):"]
    out += [f"  * {line}" for line in result.get("recommendation") or advise(result)]
    return "\n".join(out)


def markdown(result: dict[str, Any]) -> str:
    machine = result["machine"]
    found = said(result)
    out = [
        "# sessionlog bench",
        "",
        f"{machine['date']}; {machine['platform']}, {machine['cpus']} CPUs; Python {machine['python']}, "
        f"sessionlog {machine['sessionlog']}, SQLite {machine['sqlite']}; {machine['filesystem']}; "
        f"{result['mode']} mode, {result['seconds']} s.",
        *(["", *_libraries(machine)] if machine.get("libraries") else []),
    ]
    for shape, members in _shapes(result["rows"]).items():
        cells = table(shape, members)
        out += ["", f"## {shape}", "", "| " + " | ".join(cells[0]) + " |", "|" + " --- |" * len(cells[0])]
        out += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in cells[1:]]
        out += [line.strip() for line in _notes(members, found)]
    out += ["", "## Bounds", ""] + [f"* {line}" for line in checks(result)]
    out += ["", "## Recommendation", ""] + [f"* {line}" for line in result.get("recommendation") or []]
    return "\n".join(out) + "\n"


PLOTTED = "abcf"  # the shapes `plot` draws a panel of (commit rates beside their ceilings)


def plotting() -> str | None:
    """Why `plot` cannot draw here, None when it can (matplotlib is the bench extra's)."""
    # Found, not imported: matplotlib's first import picks (and makes) its folders (`plot`).
    if importlib.util.find_spec("matplotlib") is None:
        return "needs matplotlib, which is not installed (pip install 'sessionlog[bench]')"
    return None


@contextlib.contextmanager
def _matplotlib_kept_out_of_home() -> Iterator[None]:
    """matplotlib's config and font cache in a folder removed after, not in the user's HOME
    (~/.config/matplotlib, ~/.cache/matplotlib/fontlist-*.json): it reads MPLCONFIGDIR at its
    first import in the process (one before this one keeps its own folders)."""
    before = os.environ.get("MPLCONFIGDIR")
    with tempfile.TemporaryDirectory(prefix="sessionlog-bench-matplotlib-") as folder:
        os.environ["MPLCONFIGDIR"] = folder
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("MPLCONFIGDIR", None)
            else:
                os.environ["MPLCONFIGDIR"] = before


def plot(result: dict[str, Any], path: Path) -> None:
    """One panel per shape; bars grouped by durability class, each class's ceiling a dashed line
    over its own group."""
    with _matplotlib_kept_out_of_home():
        _plot(result, path)


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = [shape for shape in _shapes(result["rows"]) if shape[0] in PLOTTED]
    figure, axes = plt.subplots(len(shapes), 1, figsize=(11, 3.2 * len(shapes)), squeeze=False)
    colours = {"process": "#4c78a8", "power": "#f58518", "replicated": "#54a24b"}
    for axis, shape in zip(axes[:, 0], shapes, strict=True):
        members = _shapes(result["rows"])[shape]
        position, ticks, labels = 0.0, [], []
        for durability in CLASSES:
            group = sorted(
                (row for row in members if row["kind"] != "ceiling" and row.get("durability") == durability),
                key=lambda row: -row["per_s"],
            )
            if not group:
                continue
            start = position
            for row in group:
                peer = row["kind"] == "peer"  # another library: hatched
                axis.bar(
                    position,
                    row["per_s"],
                    color=colours[durability],
                    width=0.8,
                    hatch="//" if peer else None,
                    alpha=0.55 if peer else 1.0,
                )
                axis.errorbar(
                    position,
                    row["per_s"],
                    yerr=[[row["per_s"] - row["min_per_s"]], [row["max_per_s"] - row["per_s"]]],
                    color="black",
                    capsize=2,
                    linewidth=0.8,
                )
                ticks.append(position)
                labels.append(row["name"])
                position += 1
            ceilings = {row.get("ceiling_per_s") for row in group if row.get("ceiling_per_s")}
            for value in ceilings:
                axis.hlines(
                    value, start - 0.45, position - 0.55, colors="black", linestyles="dashed", linewidth=1
                )
            axis.text(
                (start + position - 1) / 2,
                0.97,
                durability,
                transform=axis.get_xaxis_transform(),
                ha="center",
                va="top",
                fontsize=8,
            )
            position += 0.8
        axis.set_yscale("log")
        axis.set_title(
            f"{shape} (dashed: the class's ceiling, same run; hatched: other libraries)", fontsize=9
        )
        axis.set_ylabel("commits/s")
        axis.set_xticks(ticks, labels, rotation=25, ha="right", fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)

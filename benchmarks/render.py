"""Showing a run: rich progress and tables on the terminal, markdown tables, the JSON, the PNG."""

from __future__ import annotations

import json
import math
import pathlib
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from benchmarks.backends import size_key

Row = dict[str, Any]
Run = dict[str, Any]
COLOURS = {"process": "#1f77b4", "power": "#d62728", "none": "#7f7f7f"}
_ORDER = {"backend": 0, "peer": 1, "ceiling": 2}


# -- numbers -------------------------------------------------------------------------------------


def rate(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def micros(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x" if value < 100 else f"{value:,.0f}x"


def seconds(value: float | None) -> str:
    return "—" if value is None else f"{value * 1000:,.0f} ms" if value < 10 else f"{value:.1f} s"


def kill9(row: Row) -> str:
    if row.get("lost_kill9") is None:
        return "—"
    k = row["kill9"]
    return f"{row['lost_kill9']} of {k['acknowledged']:,} acked, {k['kills']} kills" + (
        "" if k["ok"] else " FAILED"
    )


def power(row: Row) -> str:
    if row.get("lost_power") is None:
        return "—"
    p = row["power"]
    return f"{row['lost_power']} max; {p['lost_states']:,} of {p['states']:,} states" + (
        "" if p["ok"] else " FAILED"
    )


def ordered(rows: list[Row]) -> list[Row]:
    return sorted(rows, key=lambda row: _ORDER.get(row["kind"], 9))


# -- tables (one set of cells, rendered as rich or as markdown) -----------------------------------


def commit_cells(run: Run, kinds: bool = False) -> tuple[list[str], list[list[str]], list[int]]:
    """Cells of the commit table, and the indexes where a new kind of row (a section) starts;
    `kinds` adds a column naming the kind (markdown has no sections)."""
    head = ["name", "class", "committers", "facts", "commits/s", "p50 µs", "p99 µs", "vs ceiling", "ceiling"]
    body: list[list[str]] = []
    sections: list[int] = []
    kind = None
    for row in ordered(run["rows"]):
        if row["kind"] != kind:
            kind = row["kind"]
            sections.append(len(body))
        shape = [row["name"], row["durability"], str(row["committers"]), str(row["facts_per_commit"])]
        if row.get("status") in ("n/a", "skipped"):
            body.append([*shape, row["note"].split(" (")[0], "", "", "", ""])
            continue
        body.append(
            [
                *shape,
                rate(row["commits_per_s"]),
                micros(row["p50_us"]),
                micros(row["p99_us"]),
                ratio(row.get("vs_ceiling")),
                row.get("ceiling") or "",
            ]
        )
    if kinds:
        kind_of = [row["kind"] for row in ordered(run["rows"])]
        head.insert(1, "kind")
        body = [[cells[0], kind, *cells[1:]] for cells, kind in zip(body, kind_of, strict=True)]
    return head, body, sections


def backend_cells(run: Run) -> tuple[list[str], list[list[str]]]:
    rows = [row for row in run["rows"] if row["kind"] == "backend"]
    loads = [size_key(int(facts)) for facts in sorted(run["meta"]["plan"]["loads"], key=int)]
    head = ["backend", "api", "class", "bytes/fact"] + [f"load {key[5:-2]}" for key in loads]
    head += ["acked commits lost: kill -9", "lost: simulated power loss (worst state)"]
    body = []
    seen: set[str] = set()
    for row in rows:
        if row["backend"] in seen:
            continue
        seen.add(row["backend"])
        sizes = [
            r["bytes_per_fact"] for r in rows if r["backend"] == row["backend"] and r.get("bytes_per_fact")
        ]
        body.append(
            [row["backend"], row["api"], row["durability"], f"{sizes[0]:.0f}" if sizes else "—"]
            + [seconds(row.get(key)) for key in loads]
            + [kill9(row), power(row)]
        )
    return head, body


def target_cells(run: Run) -> tuple[list[str], list[list[str]]]:
    head = ["issue", "target", "bound", "measured", "result", "source"]
    body = [
        [f"#{t['issue']}", t["target"], t["bound"], ratio(t["measured"]), t["verdict"], t["source"]]
        for t in run["targets"]
    ]
    return head, body


def check_line(run: Run) -> str:
    check = run["check"]
    bound = rate(check["bound_commits_per_s"])
    if check["passed"]:
        top = f"; highest {check['highest']} at {ratio(check['highest_ratio'])}" if check["highest"] else ""
        return (
            "PASS: no power-class row with 1 committer exceeds the fsync ceiling (the best "
            f"write+fdatasync rate sustained in this run: {bound} commits/s){top}"
        )
    return (
        f"VIOLATED: {', '.join(check['violations'])} claim more commits/s than the fsync ceiling "
        f"({bound} commits/s) with one committer: that backend is not syncing"
    )


def markdown(head: list[str], body: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(head), line(["---"] * len(head)), *map(line, body)])


def _rich(
    title: str,
    head: list[str],
    body: list[list[str]],
    numeric: range = range(0),
    sections: tuple[int, ...] | list[int] = (),
) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    for index, name in enumerate(head):
        table.add_column(name, justify="right" if index in numeric else "left", no_wrap=index == 0)
    for index, cells in enumerate(body):
        if index and index in sections:
            table.add_section()
        table.add_row(*cells)
    return table


def show(console: Console, run: Run) -> None:
    meta = run["meta"]
    machine = meta["machine"]
    console.print(
        f"\n[bold]sessionlog benchmark[/] {meta['mode']} — {meta['date']} — {machine['cpu']}, "
        f"{machine['cores']} cores, {machine['system']}, {machine['filesystem']}, {meta['python']}, "
        f"{meta['seconds']} s"
    )
    head, body, sections = commit_cells(run)
    console.print(_rich("Commits (backends, peers, ceilings)", head, body, range(2, 8), sections))
    console.print(_rich("Backends: size, load, crash figures", *backend_cells(run), numeric=range(3, 10)))
    style = "bold green" if run["check"]["passed"] else "bold white on red"
    console.print(f"[{style}]Hard check: {check_line(run)}[/]")
    console.print(_rich("Issue targets (this run)", *target_cells(run), numeric=range(2, 4)))
    verdicts = [t["verdict"] for t in run["targets"]]
    console.print(
        f"targets: {verdicts.count('PASS')} PASS, {verdicts.count('MISS')} MISS, "
        f"{verdicts.count('—')} not measured. The machine is shared and noisy: single runs vary."
    )
    skipped = [row for row in run["rows"] if row.get("status") == "skipped"]
    for row in skipped:
        console.print(f"skipped: {row['name']}: {row['note']}")


def markdown_report(run: Run) -> str:
    """The run as markdown: machine line, the three tables and the hard check."""
    meta = run["meta"]
    machine = meta["machine"]
    versions = ", ".join(f"{name} {version}" for name, version in meta["versions"].items())
    head, body, _ = commit_cells(run, kinds=True)
    return "\n\n".join(
        [
            f"Run: `{meta['mode']}` mode, {meta['date']}, {machine['cpu']} ({machine['cores']} cores), "
            f"{machine['system']}, {machine['filesystem']}, {meta['python']}; {versions}; "
            f"{meta['seconds']} s.",
            markdown(head, body),
            markdown(*backend_cells(run)),
            f"**Hard check**: {check_line(run)}.",
            markdown(*target_cells(run)),
        ]
    )


# -- progress ------------------------------------------------------------------------------------


@contextmanager
def progress_bars(console: Console) -> Iterator[Any]:
    """A `Progress` callback (name, done, total) drawing one rich bar per name."""
    bars = Progress(
        TextColumn("{task.description}", style="cyan"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    tasks: dict[str, TaskID] = {}

    def update(name: str, done: int, total: int) -> None:
        if name not in tasks:
            tasks[name] = bars.add_task(name, total=total)
        bars.update(tasks[name], completed=done, total=total)

    with bars:
        yield update


# -- files ---------------------------------------------------------------------------------------


def write_json(run: Run, path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run, indent=1, default=str) + "\n")


def plot(run: Run, path: pathlib.Path) -> None:
    """commits/s on a log scale: a bar per backend and peer row, coloured by durability class; the
    ceilings as horizontal lines, labelled on the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    bars = [r for r in ordered(run["rows"]) if r["kind"] != "ceiling" and r.get("commits_per_s")]
    ceilings = [r for r in run["rows"] if r["kind"] == "ceiling" and r.get("commits_per_s")]
    fig, ax = plt.subplots(figsize=(14, 7.5), layout="constrained")
    xs = range(len(bars))
    drawn = ax.bar(xs, [r["commits_per_s"] for r in bars], color=[COLOURS[r["durability"]] for r in bars])
    ax.bar_label(drawn, labels=[rate(r["commits_per_s"]) for r in bars], fontsize=7, padding=2)
    ax.set_yscale("log")
    ax.set_xticks(list(xs), [r["name"] for r in bars], rotation=55, ha="right", fontsize=8)
    ax.set_ylabel("commits/s (log scale)")
    ax.set_xlim(-0.6, len(bars) - 0.4)
    values = [r["commits_per_s"] for r in bars + ceilings]
    ax.set_ylim(min(values) / 2, max(values) * 2)
    for r in ceilings:
        ax.axhline(r["commits_per_s"], color=COLOURS[r["durability"]], linestyle="--", linewidth=0.8)
    # Labels at the right edge, nudged apart on the log axis so that close ceilings stay legible.
    last = -math.inf
    for r in sorted(ceilings, key=lambda r: r["commits_per_s"]):
        y = max(math.log10(r["commits_per_s"]), last + 0.075)
        last = y
        ax.annotate(
            f"{r['name']} ({rate(r['commits_per_s'])})",
            xy=(1, r["commits_per_s"]),
            xycoords=("axes fraction", "data"),
            xytext=(1.01, 10**y),
            textcoords=("axes fraction", "data"),
            fontsize=7,
            color=COLOURS[r["durability"]],
            va="center",
            arrowprops={"arrowstyle": "-", "color": "#bbbbbb", "linewidth": 0.5},
        )
    meta = run["meta"]
    ax.set_title(
        f"sessionlog {meta['versions']['sessionlog']}: commits/s per backend and peer, ceilings dashed "
        f"({meta['mode']}, {meta['date'][:10]}, {meta['machine']['cpu']}, {meta['machine']['cores']} cores)",
        fontsize=10,
    )
    ax.legend(
        handles=[Patch(color=c, label=f"{k} class") for k, c in COLOURS.items() if k != "none"]
        + [Patch(color=COLOURS["none"], label="no durability (CPU only)")],
        loc="upper left",
        fontsize=8,
    )
    ax.grid(axis="y", which="major", alpha=0.3)
    peers = [i for i, r in enumerate(bars) if r["kind"] == "peer"]
    if peers and peers[0] > 0:
        ax.axvline(peers[0] - 0.5, color="#999999", linewidth=0.8)
        ax.text(peers[0] - 0.4, 0.98, "peers →", transform=ax.get_xaxis_transform(), fontsize=8, va="top")
    missing = [r["name"] for r in run["rows"] if r["kind"] != "ceiling" and not r.get("commits_per_s")]
    if missing:
        why = "not plotted (n/a or skipped, see the table): " + ", ".join(missing)
        ax.set_xlabel(textwrap.fill(why, 220), fontsize=7, color="#555555")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)

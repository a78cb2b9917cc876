"""The rules that turn a run's figures into a recommendation and into "unreliable", tested on
recorded figures (no timing here): a row caught not syncing is never recommended, rows whose
rounds overlap are named together, a figure whose ceiling moved is marked, a busy machine is
said, and the time `--full` would take is estimated from the shapes' seconds."""

from __future__ import annotations

from typing import Any

import pytest

from sessionlog.bench import report, trust

SHAPE = "a: 1 session, 1 committer, 1 fact"


def row_of(shape: str, name: str, per_s: float, low: float, high: float, **more: Any) -> dict[str, Any]:
    """A recorded row of a run's result (a power-class backend unless `more` says otherwise)."""
    return {
        "shape": shape,
        "name": name,
        "kind": "backend",
        "durability": "power",
        "per_s": per_s,
        "min_per_s": low,
        "max_per_s": high,
        "p50_us": 200.0,
        "p99_us": 400.0,
        **more,
    }


def _row(name: str, per_s: float, low: float, high: float, **more: Any) -> dict[str, Any]:
    return row_of(SHAPE, name, per_s, low, high, **{"ceiling": "write+fdatasync", **more})


def _ceiling(per_s: float, low: float, high: float, **more: Any) -> dict[str, Any]:
    return {
        "shape": SHAPE,
        "name": "write+fdatasync",
        "kind": "ceiling",
        "per_s": per_s,
        "min_per_s": low,
        "max_per_s": high,
        "p50_us": 0.0,
        "p99_us": 0.0,
        "flushes": 180,
        "operations": 180,
        **more,
    }


def result_of(rows: list[dict[str, Any]], load: dict[str, Any] | None = None) -> dict[str, Any]:
    """A recorded run's result holding `rows`."""
    return {
        "mode": "quick",
        "seconds": 100.0,
        "rows": rows,
        "flush_device": "vda",
        "flushes": "flushes counted on /dev/vda",
        "load": load or {"cpus": 2, "start": 0.1, "end": 0.4},
    }


def test_a_row_caught_not_syncing_is_never_recommended() -> None:
    # the run: the fastest power row was the one accused, and it was recommended
    rows = [
        _ceiling(300, 280, 320),
        _row("jsonl-syncfs", 1200, 1100, 1300, flushes=3, operations=180),
        _row("jsonl-fsync", 290, 280, 300, flushes=181, operations=180),
    ]
    result = result_of(rows)
    assert report.caught(result) == {(SHAPE, "jsonl-syncfs")}
    (advice,) = report.advise(result)
    assert "jsonl-fsync" in advice and "jsonl-syncfs" not in advice


def test_rows_whose_rounds_overlap_are_recommended_together() -> None:
    rows = [
        _ceiling(300, 290, 310),
        _row("jsonl-fsync", 290, 250, 300, flushes=180, operations=180),
        _row("sqlite", 280, 270, 295, flushes=200, operations=180),  # its fastest round beats 250
        _row("jsonl-group", 150, 140, 160, flushes=180, operations=180),
    ]
    (advice,) = report.advise(result_of(rows))
    assert advice.startswith(f"{SHAPE}, power class: jsonl-fsync (290 commits/s")
    assert "or sqlite (280): their rounds overlap" in advice and "jsonl-group" not in advice
    (apart,) = report.advise(result_of([rows[0], rows[1], rows[3]]))
    assert " or " not in apart


def test_a_moved_ceiling_makes_its_rows_unreliable_and_a_busy_machine_every_figure() -> None:
    steady = [_ceiling(300, 290, 310), _row("jsonl-fsync", 290, 280, 300, flushes=180, operations=180)]
    assert trust.unreliable(result_of(steady)) == []
    assert report.advise(result_of(steady))[0].endswith("p99 400 µs)")
    moved = [_ceiling(300, 73, 341, remeasured=True), steady[1]]  # 89% apart, even measured again
    (line,) = trust.unreliable(result_of(moved))
    assert line == (
        f"{SHAPE}: the ceiling write+fdatasync moved 89% between rounds even measured again; "
        "unreliable rows: jsonl-fsync (vs ceiling: the ceiling moved)"
    )
    assert trust.unreliable_rows(result_of(moved)) == {(SHAPE, "jsonl-fsync")}
    assert report.advise(result_of(moved))[0].endswith("(unreliable in this run: see above)")
    # The load at the end counts the run's own threads: only other work's CPU makes a run busy
    idle = trust.unreliable(result_of(steady, {"cpus": 2, "start": 0.2, "end": 5.5, "others": 0.04}))
    assert idle == []
    busy = trust.unreliable(result_of(steady, {"cpus": 2, "start": 0.2, "end": 5.5, "others": 0.5}))
    assert busy and busy[0].startswith("every figure: other work took 50% of the 2 CPUs during the run")
    unread = trust.unreliable(result_of(steady, {"cpus": 2, "start": 3.5, "end": 0.2, "others": None}))
    assert unread and unread[0].startswith("every figure: the machine's load was 3.5 on 2 CPUs at the start")
    spread_out = [steady[0], _row("jsonl-fsync", 100, 40, 300)]
    assert trust.unreliable(result_of(spread_out)) == [
        f"{SHAPE}: unreliable rows: jsonl-fsync (its rounds spread 260%: 40-300/s)"
    ]


def test_the_printed_checks_say_what_was_measured_again_and_what_is_unreliable() -> None:
    moved = [
        _ceiling(300, 73, 341, remeasured=True),
        _row("jsonl-fsync", 290, 280, 300, flushes=180, operations=180),
    ]
    result = {**result_of(moved), "full_estimate_s": 900.0}
    lines = report.checks(result)
    assert (
        lines[0]
        == "the quick run took 100 s (bound: 120 s); --full would take about 15 min (from this run's shapes)"
    )
    assert (
        "the machine's load (1 min): 0.10 at the start, 0.40 at the end (this run's own threads count "
        "in it), on 2 CPUs; other work's CPU not readable here"
    ) in lines
    assert f"{SHAPE}: measured twice, its ceiling moved by over 50% between rounds" in lines
    assert any(line.startswith("unreliable in this run: ") for line in lines)
    some = report.checks({**result, "shapes": "a", "full_estimate_s": None})
    assert some[0] == "the quick run of shapes a took 100 s"  # the bound is the whole run's


def test_the_full_estimate_scales_each_shape_by_what_full_does_more_of() -> None:
    seconds = {
        "a: 1 session, 1 committer, 1 fact": 10.0,  # 5 rounds of 3x the commits: 5x
        "c: 64 sessions, one writer each": 4.0,  # 10x (6x the commits); 16 and 256 sessions: 1/4, 4x of it
        "d: load 10,000 facts": 3.0,  # 5/3, and 100,000 facts beside it: 10x of 5/3
        "d: load 10,000 facts, 10 compactions": 3.0,  # at 100,000 facts instead: 10x of 5/3
        "e: list and unfinished over 1,000 sessions": 6.0,  # 10,000 sessions instead: 10x of 5/3
        "f: 1 committer, a session of 10,000 facts": 3.0,  # 5/3, and 100,000 facts: 10x of 5/3
        "g: resume a session of 1,000 messages": 3.0,  # 5/3
        "g: resume a session of 10,000 messages": 3.0,  # 5/3, and 100,000 messages: 10x of 5/3
        "h: restart: 1,000 sessions, 100 unfinished": 2.0,  # RESTART_FULL
    }
    expected = 50 + (40 + 10 + 160) + (5 + 50) + 50 + 100 + (5 + 50) + 5 + (5 + 50) + 2 * trust.RESTART_FULL
    assert trust.full_estimate(seconds, "quick") == pytest.approx(expected)
    assert trust.full_estimate(seconds, "tiny") is None


def _job(seconds: list[float]) -> Any:
    """A job of 100 operations a round, taking the recorded seconds in turn (no clock)."""
    left = iter(seconds)

    def run() -> tuple[int, float, list[float]]:
        took = next(left)
        return 100, took, [took / 100] * 100

    return run


def test_a_shape_whose_ceiling_moved_is_measured_again_and_the_steadier_measurement_kept() -> None:
    from sessionlog.bench.measure import steady

    # the ceiling's rounds: 100, 400, 250 ops/s (moved 120%), then 250, 240, 260 (8%)
    ceiling = _job([1.0, 0.25, 0.4, 0.4, 1 / 2.4, 1 / 2.6])
    row = _job([0.5] * 6)
    measured, again = steady({"ceiling": ceiling, "row": row}, ["ceiling"], 3)
    assert again and measured["ceiling"].summary()["min_per_s"] == pytest.approx(240)
    calm, again = steady({"ceiling": _job([0.4, 0.41, 0.39]), "row": _job([0.5] * 3)}, ["ceiling"], 3)
    assert not again and len(calm["ceiling"].rates) == 3


def test_the_full_estimate_of_shape_c_scales_its_commits_and_its_opening_apart() -> None:
    """Quick opens a row's sessions once and commits 5 a session; --full commits 30 a session
    over 5 rounds (10x the commits' seconds) and opens as often at most 5/3 as much (its
    per-round peers); 16 and 256 sessions beside 64 add a quarter and 4x of that."""
    seconds = {"c: 64 sessions, one writer each": 30.0}
    timed = {"c: 64 sessions, one writer each": 12.0}  # the commits' seconds of its rounds
    expected = (12.0 * 10 + 18.0 * 5 / 3) * (1 + 1 / 4 + 4)
    assert trust.full_estimate(seconds, "quick", timed) == pytest.approx(expected)
    assert trust.full_estimate(seconds, "quick") == pytest.approx(30.0 * 10 * (1 + 1 / 4 + 4))


def test_a_run_without_a_commit_rate_shape_says_why_it_recommends_nothing() -> None:
    # `--shape d` (loads) gave an empty "Recommendation" heading: nothing said, not why
    loads = [dict(_row("jsonl", 900, 850, 950), shape="d: load 1,000 facts", unit="loads/s")]
    assert report.advise(result_of(loads)) == [
        "none: it compares the commit rates of shapes a, b, c and f, and this run has none of them"
    ]

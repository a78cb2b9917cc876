"""What the JSON of a run says of each row: the same note and reliability as the printed text,
from one place (`report.said`), and a note that never explains a row that does not sync by a
group commit. Tested on recorded figures and on a `--tiny` run's structure (no timing here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sessionlog.bench import report
from test_bench_trust import result_of, row_of

B = "b: 1 session, 64 committers"
A = "a: 1 session, 1 committer, 1 fact"


def _row(shape: str, name: str, per_s: float, low: float, high: float, **more: Any) -> dict[str, Any]:
    return row_of(shape, name, per_s, low, high, **more)


def _ceiling(shape: str, name: str, per_s: float, low: float, high: float, **more: Any) -> dict[str, Any]:
    return {**_row(shape, name, per_s, low, high, kind="ceiling"), **more}


def _result(rows: list[dict[str, Any]], load: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        **result_of(rows, load or {"cpus": 2, "start": 0.1, "end": 0.4, "others": 0.02}),
        "machine": {
            "date": "2026-12-08 00:00 UTC",
            "platform": "Linux",
            "cpus": 2,
            "python": "3.11",
            "sessionlog": "0",
            "sqlite": "3",
            "directory": "/tmp",
            "filesystem": "ext4 on /",
        },
    }


def _shape_b() -> list[dict[str, Any]]:
    fdatasync, write = "64 threads: write+fdatasync", "64 threads: os.write"
    return [
        _ceiling(B, fdatasync, 1000, 900, 1100, flushes=1900, operations=1920),
        _ceiling(B, write, 50000, 20000, 80000),  # moved 120%
        _row(
            B, "jsonl-group", 1500, 1400, 1600, ceiling=fdatasync, vs_ceiling=1.5, flushes=30, operations=1920
        ),
        _row(
            B, "sqlite-async", 800, 300, 1200, ceiling=fdatasync, vs_ceiling=0.8, flushes=40, operations=1920
        ),
        _row(B, "jsonl-async", 3300, 3200, 3400, durability="process", ceiling=write, vs_ceiling=0.07),
    ]


def test_each_json_row_carries_the_note_reliability_and_spread_the_text_prints() -> None:
    result = _result(_shape_b())
    said = json.loads(report.as_json(result))
    rows = {row["name"]: row for row in said["rows"]}
    group = rows["jsonl-group"]
    assert group["reliable"] is True and group["reliability_reason"] is None
    assert group["spread_pct"] == 13.3  # (1600 - 1400) / 1500
    assert group["note"].startswith("jsonl-group is above its ceiling: commits queued at once share")
    spread = rows["sqlite-async"]
    assert spread["reliable"] is False and spread["spread_pct"] == 112.5
    assert spread["reliability_reason"] == "its rounds spread 112%: 300-1,200/s"
    assert spread["note"] is None
    moved = rows["64 threads: os.write"]
    assert (
        moved["reliable"] is False and moved["reliability_reason"] == "the ceiling moved 120% between rounds"
    )
    beside_moved = rows["jsonl-async"]
    assert beside_moved["reliable"] is False
    assert beside_moved["reliability_reason"] == "vs ceiling: the ceiling moved"
    # the text says the same of each, from the same place
    printed = report.text(result)
    for row in said["rows"]:
        if row["note"]:
            assert f"note: {row['note']}" in printed
        if not row["reliable"] and row["kind"] != "ceiling":
            assert f"{row['name']} ({row['reliability_reason']})" in printed
    assert said["unreliable"] == report.trust.unreliable(result)


def test_on_a_busy_machine_every_json_row_is_unreliable_and_says_why() -> None:
    busy = _result(_shape_b(), {"cpus": 2, "start": 0.2, "end": 5.5, "others": 0.5})
    rows = json.loads(report.as_json(busy))["rows"]
    assert all(row["reliable"] is False for row in rows)
    assert rows[2]["reliability_reason"].startswith("every figure: other work took 50% of the 2 CPUs")


def test_a_row_that_does_not_sync_is_never_explained_by_a_group_commit() -> None:
    # the run: jsonl-async (process class) 3.3x above the write+fdatasync ceiling of shape b
    fdatasync = "64 threads: write+fdatasync"
    rows = [
        _ceiling(B, fdatasync, 1000, 900, 1100, flushes=1900, operations=1920),
        _row(B, "jsonl-async", 3300, 3200, 3400, durability="process", ceiling=fdatasync, vs_ceiling=3.3),
        # a power row whose counted flushes show it made no sync
        _row(
            B, "liar-async", 3000, 2900, 3100, ceiling=fdatasync, vs_ceiling=3.0, flushes=0, operations=1920
        ),
    ]
    printed = report.text(_result(rows))
    for name in ("jsonl-async", "liar-async"):
        (line,) = [line for line in printed.splitlines() if line.startswith(f"  note: {name} ")]
        assert "group commit" not in line and "does not sync" in line, line
    said = {row["name"]: row for row in json.loads(report.as_json(_result(rows)))["rows"]}
    for name in ("jsonl-async", "liar-async"):
        note = said[name]["note"]
        assert "group commit" not in note and "does not sync" in note, note
    assert "process class" in said["jsonl-async"]["note"]
    assert "0 flushes for 1,920 commits" in said["liar-async"]["note"]
    # in shape a, a process row above a sync ceiling is said alike
    one = [
        _ceiling(A, "write+fdatasync", 300, 290, 310, flushes=180, operations=180),
        _row(A, "jsonl", 9000, 8900, 9100, durability="process", ceiling="write+fdatasync", vs_ceiling=30.0),
    ]
    (_, row) = json.loads(report.as_json(_result(one)))["rows"]
    assert "does not sync" in row["note"]


def test_a_tiny_run_of_shape_b_sets_each_row_beside_a_ceiling_of_its_class(tmp_path: Path, cli: Any) -> None:
    out = tmp_path / "run.json"
    run = cli("bench", "--tiny", "--shape", "b", "--dir", str(tmp_path), "--json", out)
    assert run.code == 0, run.err
    said = json.loads(out.read_text())
    for row in said["rows"]:
        assert {"note", "reliable", "reliability_reason", "spread_pct"} <= set(row), row
    ceilings = {row["name"] for row in said["rows"] if row["kind"] == "ceiling"}
    assert ceilings == {"64 threads: write+fdatasync", "64 threads: os.write"}
    rows = [row for row in said["rows"] if row["kind"] != "ceiling"]
    assert {row["name"] for row in rows} >= {"jsonl-async", "sqlite-normal-async", "jsonl-group"}
    for row in rows:
        syncs = row["durability"] != "process"
        assert row["ceiling"] == ("64 threads: write+fdatasync" if syncs else "64 threads: os.write"), row


def test_both_kinds_of_ceiling_are_measured_and_the_rows_set_beside_the_one_doing_their_work(
    tmp_path: Path, cli: Any
) -> None:
    out = tmp_path / "run.json"
    run = cli(
        "bench",
        "--tiny",
        "--shape",
        "acd",  # d: a ceiling of parsing, measured one way only
        "--backends",
        "jsonl,jsonl-fsync",
        "--dir",
        tmp_path,
        "--json",
        out,
    )
    assert run.code == 0, run.err
    said = json.loads(out.read_text())
    for shape in {row["shape"] for row in said["rows"]}:
        if shape.startswith("d"):
            assert all("files" not in row for row in said["rows"] if row["shape"] == shape)
            continue
        ceilings = {
            row["name"]: row for row in said["rows"] if row["shape"] == shape and row["kind"] == "ceiling"
        }
        kept = {name for name, row in ceilings.items() if row.get("files") == "kept open across rounds"}
        fresh = {name for name, row in ceilings.items() if row.get("files") == "fresh each round"}
        assert kept and {name.removesuffix(", kept open") for name in kept} == fresh, ceilings
        # a ceiling measured one way only (a server's INSERT+COMMIT, a parse) says nothing of files
        assert all("files" not in ceilings[name] for name in set(ceilings) - kept - fresh)
        for name in kept:  # side by side, in the same rounds
            assert (
                ceilings[name]["vs_fresh"] > 0 and name.removesuffix(", kept open") in ceilings[name]["note"]
            )
        for row in said["rows"]:  # the rows' sessions are kept open across rounds: so is their ceiling
            if row["shape"] == shape and row["kind"] == "backend":
                assert row["ceiling"] in kept, row


def test_the_note_of_a_kept_open_ceiling_says_whether_it_agrees_with_fresh_files() -> None:
    def kept(ratio: float) -> dict[str, Any]:
        return _ceiling(A, "write+fdatasync, kept open", 300, 290, 310, vs_fresh=ratio)

    agree = report.said(_result([_ceiling(A, "write+fdatasync", 300, 290, 310), kept(1.04)]))
    assert agree[(A, "write+fdatasync")]["note"] is None
    note = agree[(A, "write+fdatasync, kept open")]["note"]
    assert "1.04x write+fdatasync (fresh files each round)" in note and "the two agree (within 10%)" in note
    differ = report.said(_result([_ceiling(A, "write+fdatasync", 300, 290, 310), kept(0.51)]))
    assert "they differ" in differ[(A, "write+fdatasync, kept open")]["note"]
    moved = report.said(_result([_ceiling(A, "write+fdatasync", 300, 100, 310), kept(0.51)]))
    note = moved[(A, "write+fdatasync, kept open")]["note"]
    assert "cannot tell whether they agree" in note and "differ" not in note
    # one round (a --tiny run): one ratio, no spread, and no verdict (found by a review of #38)
    once = {**kept(0.88), "rounds": 1}
    one = report.said(_result([_ceiling(A, "write+fdatasync", 300, 300, 300), once]))
    note = one[(A, "write+fdatasync, kept open")]["note"]
    assert "cannot tell whether they agree (one round)" in note and "differ" not in note

"""Smoke test of `python -m benchmarks.edition1`: the suite runs end to end with tiny counts and writes its
JSON and PNG. No timing is asserted; timing lives in the benchmark itself."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

pytest.importorskip("rich")
pytest.importorskip("matplotlib")

from benchmarks import async_backends, reduce, suite, targets
from benchmarks.edition1 import main

import sessionlog
from sessionlog.testing.sessions import generate_session

ROW_KEYS = {
    "name",
    "kind",
    "durability",
    "committers",
    "facts_per_commit",
    "commits_per_s",
    "p50_us",
    "p99_us",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("bench")
    with pytest.MonkeyPatch.context() as patch:
        # One peer made missing: it must be listed as skipped (and its 5 s import is saved).
        patch.setitem(sys.modules, "agents", None)
        code = main(
            ["--json", str(out / "run.json"), "--plot", str(out / "run.png"), "--dir", str(out / "work")],
            plan=suite.TINY,
        )
    return code, json.loads((out / "run.json").read_text()), out


def test_writes_json_and_png(run: tuple[int, dict[str, Any], Path]) -> None:
    code, data, out = run
    assert code == (0 if data["check"]["passed"] else 3)
    png = (out / "run.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert not (out / "work" / "run").exists()  # the scratch sessions are gone
    meta = data["meta"]
    assert {"date", "machine", "python", "versions", "mode"} <= set(meta)
    assert meta["mode"] == "tiny" and {"sessionlog", "orjson"} <= set(meta["versions"])


def test_rows_follow_the_schema(run: tuple[int, dict[str, Any], Path]) -> None:
    _, data, _ = run
    rows = data["rows"]
    for row in rows:
        assert set(row) >= ROW_KEYS, row["name"]
        assert row["kind"] in ("backend", "peer", "ceiling")
        assert row["durability"] in ("process", "power", "none")
        if row["status"] == "ok":
            assert row["commits_per_s"] > 0 and row["p99_us"] >= row["p50_us"] >= 0
        else:
            assert row["status"] in ("n/a", "skipped") and row["commits_per_s"] is None and row["note"]
    names = {row["name"] for row in rows}
    assert {"os.write", "write+fdatasync", "write+fdatasync/10 lines", "write+fdatasync/100 lines"} <= names
    for backend, info in sessionlog.backends().items():
        shapes = {(r["committers"], r["facts_per_commit"]) for r in rows if r.get("backend") == backend}
        assert shapes == {(1, 1), (1, 10), (64, 1), (64, 10)}, backend
        row = next(r for r in rows if r.get("backend") == backend and r["status"] == "ok")
        assert row["durability"] == info.durability and row["ceiling"] and row["vs_ceiling"] > 0
        assert {"load_200_s", "load_1k_s", "lost_kill9", "lost_power"} <= set(row)
    peers = {row["name"]: row for row in rows if row["kind"] == "peer"}
    measured = [row for row in peers.values() if row["status"] == "ok"]
    assert measured and all(row["ceiling"] and row["vs_ceiling"] > 0 for row in measured)
    missing = peers["openai-agents SQLiteSession"]
    assert missing["status"] == "skipped" and "not installed" in missing["note"]


def test_hard_check_and_targets_are_reported(run: tuple[int, dict[str, Any], Path]) -> None:
    _, data, _ = run
    assert data["check"]["checked"] and isinstance(data["check"]["passed"], bool)
    assert len(data["targets"]) == len(targets.TARGETS)
    assert {t["verdict"] for t in data["targets"]} <= {"PASS", "MISS", "—"}


def test_hard_check_flags_a_power_row_faster_than_fsync() -> None:
    rows = [
        {"name": "liar", "kind": "backend", "durability": "power", "committers": 1, "commits_per_s": 9e4},
        {"name": "honest", "kind": "backend", "durability": "power", "committers": 1, "commits_per_s": 900.0},
        {"name": "group", "kind": "backend", "durability": "power", "committers": 64, "commits_per_s": 9e4},
    ]
    check = suite.hard_check(rows, 1000.0)
    assert not check["passed"] and check["violations"] == ["liar"]
    assert suite.hard_check(rows[1:], 1000.0)["passed"]


def test_targets_use_module_figures_then_suite_rows() -> None:
    rows = [
        {"name": "jsonl-fsync 1x1", "commits_per_s": 90.0, "vs_ceiling": 0.9},  # paired with its ceiling
        {"name": "jsonl-group 1x1", "commits_per_s": 450.0, "vs_ceiling": 0.45},  # on a faster moment
    ]
    others: dict[str, dict[str, Any]] = {"reduce": {"throughput_ratio": 0.5}, "stores": {"error": "missing"}}
    result = {t["target"]: t for t in targets.evaluate(rows, others)}
    assert result["reducer throughput / bare split+orjson.loads"]["verdict"] == "PASS"
    fsync = result["jsonl-fsync / bare write+fdatasync (commits/s)"]
    assert fsync["verdict"] == "PASS" and fsync["measured"] == pytest.approx(0.9)
    group = result["jsonl-group 1 committer / jsonl-fsync 1"]
    assert group["verdict"] == "MISS" and group["measured"] == pytest.approx(0.5)
    assert result["peak memory reducing 100k / file size"]["verdict"] == "—"


def test_async_benchmark_measures_floors_and_ceilings(tmp_path: Path) -> None:
    result = async_backends.run(directory=tmp_path, commits=256, rounds=2)
    rows = {row["name"]: row for row in result["rows"]}
    floors = {"core 1x1", "floor asyncio 64x1", "floor asyncio+fdatasync 64x1"}
    assert floors <= set(rows) and all(rows[name]["kind"] == "floor" for name in floors)
    assert all(rows[name]["commits_per_s"] > 0 for name in floors)
    # ceiling = t(sync row) / (t(core) + t(floor)), from the rows of the same run
    seconds = {name: 1 / row["commits_per_s"] for name, row in rows.items()}
    expected = seconds["jsonl 1x1"] / (seconds["core 1x1"] + seconds["floor asyncio 64x1"])
    assert result["async_64_ceiling"] == pytest.approx(expected)
    assert result["group_64_ceiling"] > 0
    shown = {t["target"]: t["source"] for t in targets.evaluate([], {"async_backends": result})}
    assert "ceiling here" in shown["jsonl-async 64 committers / jsonl 1"]


def test_reduce_floor_counts_facts_and_refuses_what_every_fact_needs() -> None:
    session = generate_session(5, 300, profile="bulk")
    data = session.to_bytes()
    assert reduce._floor(data) == 300
    lines = data.split(b"\n")
    first = orjson.loads(lines[1])
    first = first[0] if isinstance(first, list) else first
    for bad in (
        data.replace(first["id"].encode(), first["id"].upper().encode(), 1),  # not a lowercase UUIDv7
        b"\n".join([lines[0], lines[1], lines[1], *lines[2:]]),  # a repeated line: seq and id
        data.replace(b'"seq":1,', b'"seq":1 ,', 1),  # not compact: the strict path would decide
    ):
        with pytest.raises(ValueError):
            reduce._floor(bad)

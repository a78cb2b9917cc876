"""The quick run's sizes and how a row's sessions live: opened before its first round, kept
across the rounds, closed after the last (`shapes.Kept`); what the docs and `--help` say of the
quick sizes is what `Plan` measures. No timing: counts, files and text only."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

import sessionlog
from sessionlog.bench import Plan, command, measure, peers, shapes

ROOT = Path(__file__).resolve().parent.parent


def _counting(scratch: shapes.Scratch, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The folders `scratch` makes from now on (one a row when its sessions are kept)."""
    made: list[Path] = []
    fresh = scratch.fresh

    def counted() -> Path:
        made.append(fresh())
        return made[-1]

    monkeypatch.setattr(scratch, "fresh", counted)
    return made


def test_a_kept_row_opens_its_sessions_once_and_closes_them_after_its_last_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = shapes.Scratch(str(tmp_path))
    made = _counting(scratch, monkeypatch)
    row = shapes.sessions_job(scratch, "jsonl-fsync", 3, 4)
    peer = shapes.peer_job(scratch, peers.sqlite3_peer("full"), 2, 5)  # its key: (session, line)
    measured, _ = measure.steady({"row": row, "peer": peer}, [], 3)
    assert measured["row"].operations == 3 * 3 * 4 and measured["peer"].operations == 3 * 2 * 5
    assert list(scratch.root.iterdir()) == []  # closed and removed after the last round
    assert len(made) == 2  # one folder a row, not one a round
    scratch.remove()


def test_a_kept_session_holds_every_rounds_commits(tmp_path: Path) -> None:
    scratch = shapes.Scratch(str(tmp_path))
    kept = shapes.sessions_job(scratch, "jsonl", 1, 7)
    for _ in range(3):
        kept()
    (path,) = [path for path in scratch.root.rglob("*.session")]
    assert sessionlog.reduce_bytes(path.read_bytes()).last_seq >= 3 * 7  # one session, 21 commits
    kept.close()  # type: ignore[attr-defined]
    assert not path.exists()
    scratch.remove()


def test_a_peer_kept_open_commits_new_keys_each_round(tmp_path: Path) -> None:
    scratch = shapes.Scratch(str(tmp_path))
    peer = shapes.peer_job(scratch, peers.sqlite3_peer("normal"), 2, 3)
    for _ in range(2):
        peer()
    (database,) = list(scratch.root.rglob("peer.db"))
    with sqlite3.connect(database) as connection:
        assert connection.execute("select count(*) from lines").fetchone() == (2 * 2 * 3,)
    connection.close()
    peer.close()  # type: ignore[attr-defined]
    scratch.remove()


def test_a_row_whose_close_fails_is_named() -> None:
    class Failing:
        def __call__(self) -> tuple[int, float, list[float]]:
            return 1, 0.1, [0.1]

        def close(self) -> None:
            raise OSError("disk gone")

    with pytest.raises(measure.RowFailed, match="'broken' failed: OSError: disk gone"):
        measure.steady({"broken": Failing()}, [], 2)


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_the_quick_sizes_are_the_ones_the_docs_and_the_help_quote() -> None:
    quick, full = Plan("quick"), Plan("full")
    assert (quick.rounds, quick.sessions, quick.listed, quick.held, quick.restarted) == (
        3,
        (64,),
        1_000,
        (10_000,),
        1_000,
    )
    assert quick.resumed == (1_000, 10_000) and quick.loads == (1_000, 10_000)
    assert [quick.session_commits(durability, "sync", 64) for durability in ("power", "process")] == [5, 15]
    assert (full.sessions, full.listed, full.session_commits("power", "sync", 64)) == (
        (16, 64, 256),
        10_000,
        30,
    )
    benchmarks = _flat((ROOT / "docs" / "benchmarks.md").read_text())
    assert "(c) 64 sessions at once, one writer each (16 and 256 too with `--full`)" in benchmarks
    assert "`unfinished` over 1,000 sessions (10,000 with `--full`)" in benchmarks
    assert "quick (the default: 3 rounds, 64 sessions at once, 1,000 sessions listed)" in benchmarks
    choosing = _flat((ROOT / "docs" / "choosing.md").read_text())
    assert "c: 64 sessions at once with one writer each, 16 and 256 too with `--full`" in choosing
    assert "e: `list` and `unfinished` over 1,000 sessions, 10,000 with `--full`" in choosing
    described = _flat(sessionlog.bench.__doc__ or "")
    assert "(N = 64; 16 and 256 with `--full`)" in described
    assert "over 1,000 sessions (10,000 with `--full`)" in described
    helped = _flat(command.parser().format_help())
    assert "under 2 minutes on 2 idle cores (64 sessions at once, 1,000 listed)" in helped


def test_a_row_of_more_sessions_than_kept_opens_and_closes_them_around_each_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hundreds of held sessions idle through the other rows' rounds outlived their leases on a
    busy machine (`--full`'s 256 SQLite sessions were poisoned): past KEPT_UP_TO they are made
    again each round, and nothing of a round is left open after it."""
    monkeypatch.setattr(shapes, "KEPT_UP_TO", 2)
    scratch = shapes.Scratch(str(tmp_path))
    made = _counting(scratch, monkeypatch)
    row = shapes.sessions_job(scratch, "jsonl", 3, 2)
    for _ in range(3):
        assert row()[0] == 3 * 2
        assert list(scratch.root.iterdir()) == []  # closed and removed after its round
    assert len(made) == 3
    kept = shapes.sessions_job(scratch, "jsonl", 2, 2)
    kept()
    kept()
    assert len(made) == 4  # at the bound: kept
    kept.close()  # type: ignore[attr-defined]
    scratch.remove()

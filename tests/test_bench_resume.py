"""Shapes g (a resume: open, load and list a session, beside the peers' read paths) and h (a
platform's restart: reopen a repository, list it, claim its unfinished sessions), at `--tiny`
size: they run, give a row for sessionlog and for each peer that is installed (the others are
skipped, with the reason), every read gives back every message, and the report shows them. No
timing is asserted: figures are the bench's business."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from sessionlog.bench import report, restart, resume
from sessionlog.bench import run as bench_run
from sessionlog.bench.measure import RowFailed
from sessionlog.bench.shapes import Peer

MODULES = {  # the module each peer's read path needs
    "openai-agents SQLiteSession.get_items": "agents",
    "LangGraph SqliteSaver.get_tuple, messages as pending writes": "langgraph.checkpoint.sqlite",
    "LangGraph SqliteSaver.get_tuple, messages in one checkpoint": "langgraph.checkpoint.sqlite",
    "eventsourcing (SQLite) repository.get": "eventsourcing",
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def test_resume_and_restart_run_beside_the_installed_peers_and_the_report_shows_them(tmp_path: Path) -> None:
    result = bench_run(str(tmp_path), None, None, "tiny", progress=False, only="gh", readers=resume.readers())
    assert list(tmp_path.iterdir()) == []  # no scratch left
    shapes = {row["shape"] for row in result["rows"]}
    assert shapes == {"g: resume a session of 100 messages", "h: restart: 100 sessions, 10 unfinished"}
    assert set(result["shape_seconds"]) == shapes  # each with its building or filling
    resumed = {row["name"]: row for row in result["rows"] if row["shape"].startswith("g:")}
    skipped = {peer["name"]: peer["reason"] for peer in result["skipped"]}
    assert set(MODULES) == {reader.name for reader in resume.readers()}
    for name, module in MODULES.items():
        if _installed(module):
            assert f"peer: {name}" in resumed, skipped.get(name)
        else:
            assert name in skipped and f"peer: {name}" not in resumed
    assert {"jsonl", "sqlite"} <= set(resumed)  # sessionlog's rows when --backends names none
    assert resume.NO_SNAPSHOT in resumed  # beside jsonl: what its snapshot saves
    for name, row in resumed.items():
        assert row["operations"] == 100  # one round, every message given back
        assert row["unit"] == "messages/s" and row["per_s"] > 0
        if name != "jsonl":  # every other row beside sessionlog's first, in the same rounds
            assert row["ceiling"] == "jsonl" and row["vs_ceiling"] > 0
    restarted = {row["name"]: row for row in result["rows"] if row["shape"].startswith("h:")}
    assert set(restarted) == {
        "directory repository: reopen, list, claim the unfinished",
        "sqlite repository: reopen, list, claim the unfinished",
    }
    for row in restarted.values():
        assert (row["listed"], row["unfinished"], row["claimed"]) == (100, 10, 10)
        assert row["unit"] == "sessions/s" and "claim_stopped" not in row
    result["recommendation"] = report.advise(result)
    text = report.text(result)
    assert "g: resume a session of 100 messages" in text and "vs sessionlog" in text
    assert "h: restart: 100 sessions, 10 unfinished" in text
    markdown = report.markdown(result)
    assert "## g: resume a session of 100 messages" in markdown
    assert "| row | class | messages/s median (min-max) |" in markdown
    assert "sessionlog's row, same run | vs sessionlog |" in markdown


def test_backends_named_are_the_resumed_ones_and_a_failing_peer_is_skipped(tmp_path: Path) -> None:
    def broken(folder: Path, items: list[dict[str, Any]]) -> resume.Built:
        raise ImportError("No module named 'nowhere'")

    def absent(folder: Path, session: int) -> Any:
        raise ImportError("No module named 'elsewhere'")

    readers = [resume.Reader("a peer that is not installed", broken)]
    appending = [Peer("an append peer, not installed", "power", absent)]  # shapes a and c only
    result = bench_run(
        str(tmp_path),
        ["jsonl-fsync"],
        None,
        "tiny",
        False,
        lambda server: appending,
        only="g",
        readers=readers,
    )
    assert {row["name"] for row in result["rows"]} == {"jsonl-fsync"}  # no jsonl: no no-snapshot row
    assert result["skipped"] == [  # not the append peer: no shape of this run would have used it
        {"name": "a peer that is not installed", "reason": "ImportError: No module named 'nowhere'"}
    ]


def test_a_read_that_gives_back_fewer_messages_fails_its_row(tmp_path: Path) -> None:
    def forgetful(folder: Path, items: list[dict[str, Any]]) -> resume.Built:
        return (lambda: min(len(items), 2)), (lambda: None)  # passes the probe, drops the rest

    readers = [resume.Reader("forgetful", forgetful)]
    with pytest.raises(
        RowFailed, match=r"'peer: forgetful' failed: ValueError: .* gave back 2 messages of 100"
    ):
        bench_run(str(tmp_path), ["jsonl"], None, "tiny", progress=False, only="g", readers=readers)
    assert list(tmp_path.iterdir()) == []


class _Repository:
    """A repository whose `claim_unfinished` stops after `gives` claims (as PostgreSQL's does
    once this host holds the 64 sessions it looks at)."""

    def __init__(self, sessions: int, gives: int) -> None:
        self.ids = [f"s{number}" for number in range(sessions)]
        self.unfinished_ids = self.ids[:: restart.UNFINISHED_EVERY]
        self.gives = gives
        self.opened: list[str] = []

    def list(self, limit: Any = None) -> list[Any]:
        return [type("Info", (), {"session_id": name})() for name in self.ids]

    def unfinished(self) -> list[Any]:
        return [type("Info", (), {"session_id": name})() for name in self.unfinished_ids]

    def claim_unfinished(self) -> Any:
        if len(self.opened) >= min(self.gives, len(self.unfinished_ids)):
            return None
        return self.open(self.unfinished_ids[len(self.opened)])

    def open(self, session_id: str) -> Any:
        self.opened.append(session_id)
        return type("Store", (), {"header": {"id": session_id}, "close": lambda self: None})()

    def close(self) -> None:
        pass


def test_a_restart_claims_every_unfinished_session_and_says_where_claiming_stopped() -> None:
    repo = _Repository(1000, gives=64)
    meta: dict[str, Any] = {}
    operations, _, _ = restart.restart_job(lambda: repo, 1000, meta)()
    assert operations == 1000 and sorted(repo.opened) == sorted(repo.unfinished_ids)
    assert meta["claimed"] == 100 and meta["claim_stopped"].startswith(
        "claim_unfinished() gave None after 64 claims of 100 unfinished sessions"
    )
    whole: dict[str, Any] = {}
    restart.restart_job(lambda: _Repository(1000, gives=1000), 1000, whole)()
    assert whole["claimed"] == 100 and "claim_stopped" not in whole
    with pytest.raises(ValueError, match="found 1000 sessions, 100 unfinished, claimed 100; filled 2000"):
        restart.restart_job(lambda: _Repository(1000, gives=1000), 2000, {})()


def test_the_filling_makes_one_unfinished_session_in_ten_each_with_ids_of_its_own(tmp_path: Path) -> None:
    import sessionlog

    made = restart.Sessions()
    first, second = made.make(0), made.make(10)
    assert first[0] != second[0] and first[1] != second[1].replace(second[0].encode(), first[0].encode())
    for kind, location in {
        "directory": str(tmp_path / "sessions"),
        "sqlite": f"sqlite:///{tmp_path / 'sessions.db'}",
    }.items():
        restart.fill(kind, location, 30)
        with sessionlog.repository(location) as repo:
            assert len(repo.list(limit=None)) == 30 and len(repo.unfinished()) == 3


@pytest.mark.parametrize("backend", ["jsonl", "jsonl-async"])
def test_shape_g_resumes_a_session_as_its_writers_close_leaves_it_and_leaves_no_other_file(
    backend: str, tmp_path: Path
) -> None:
    # Its rounds timed the first resume (a full reduction, the snapshot written at its close)
    # among the later ones (from that snapshot), and the source's snapshot stayed in the scratch
    from sessionlog.backends.side_files import snapshot_path
    from sessionlog.core.snapshot import MIN_LINES

    data = resume.session_bytes(tmp_path, [{"content": f"message {n}"} for n in range(MIN_LINES)])
    assert list(tmp_path.iterdir()) == []  # the source session and its snapshot are gone
    read, close = resume.sessionlog_build(backend)(tmp_path, data)
    try:
        assert snapshot_path(tmp_path / f"{backend}.session").exists()  # read once, untimed
        assert read() == MIN_LINES
    finally:
        close()


def test_a_bench_run_signs_its_snapshots_with_a_key_of_its_scratch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shape g's sessions are snapshotted at their close, and a snapshot is signed with the
    user's key (core/snapshot_key.py): the bench made one in the user's HOME, which outlived its
    run (and with a read-only HOME, none: its snapshot row timed a full reduction). A run's key
    is its scratch's, removed with it (found by a review of #38)."""
    from sessionlog.bench.shapes import Scratch
    from sessionlog.core.snapshot import MIN_LINES

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.delenv("SESSIONLOG_STATE_DIR")
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(home))
    scratch = Scratch(str(tmp_path))
    try:
        data = resume.session_bytes(scratch.fresh(), [{"content": f"m {n}"} for n in range(MIN_LINES)])
        _, close = resume.sessionlog_build("jsonl")(scratch.fresh(), data)  # its snapshot made
        close()
    finally:
        scratch.remove()
    assert list(home.iterdir()) == [] and list(tmp_path.iterdir()) == [home]
    assert "SESSIONLOG_STATE_DIR" not in os.environ  # given back as it was


def test_shape_g_fails_its_row_when_the_snapshot_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sessionlog.core import snapshot_key
    from sessionlog.core.snapshot import MIN_LINES

    def unusable() -> bytes:
        raise snapshot_key.SnapshotKeyError("no key here")

    monkeypatch.setattr(snapshot_key, "make_key", unusable)
    monkeypatch.setattr("sessionlog.core.store.make_key", unusable)
    data = resume.session_bytes(tmp_path, [{"content": f"message {n}"} for n in range(MIN_LINES)])
    with pytest.raises(RuntimeError, match="no snapshot"):
        resume.sessionlog_build("jsonl")(tmp_path, data)

"""The CLI's writing commands (repair, repair --quarantine, recover, convert) next to a live
writer, on a corrupt log, and when they go wrong: they take the writer lock, refuse with exit 3
while the session is in use, and never leave a partial copy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from sessionlog.cli import convert as convert_module
from sessionlog.cli import new_database
from sessionlog.cli import sessions as sessions_module
from sessionlog.core import facts as F
from test_cli import mid_crash, torn
from test_recovery import CURRENT

_HOLDER = """
import os, sys, sessionlog
store = sessionlog.open(sys.argv[1], "jsonl")
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
os.write(fd, b'{"kind":"entry","entry":{"type":"mes')  # the agent, in the middle of a short write
print("writing", flush=True)
sys.stdin.read()
"""


def test_writing_commands_refuse_a_session_held_by_a_live_writer(cli: Any, tmp_path: Path) -> None:
    path = mid_crash(tmp_path / "s.jsonl")
    current = tmp_path / "current.json"
    current.write_text(json.dumps(CURRENT))
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "writing"
        in_progress = path.read_bytes()
        for argv in (
            ["repair", path],
            ["repair", path, "--quarantine"],
            ["recover", path, "--current", current],
        ):
            run = cli(*argv)
            assert run.code == 3, (argv, run.err)
            assert "in use" in run.err and str(path) in run.err
            assert path.read_bytes() == in_progress  # the write in progress is left alone
    finally:
        holder.communicate("", timeout=30)


def test_repair_reports_what_it_cut_under_the_lock_never_a_negative_count(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = torn(mid_crash(tmp_path / "s.jsonl"))
    stale = path.read_bytes()[:-10]  # what a read saw before the torn write grew the file
    real = sessions_module.read_session

    def stale_first(*args: Any) -> tuple[bytes, dict[str, Any]]:
        monkeypatch.setattr(sessions_module, "read_session", real)
        return stale, {}

    monkeypatch.setattr(sessions_module, "read_session", stale_first)
    size = path.stat().st_size
    run = cli("repair", path)
    assert run.code == 0, run.err
    dropped = size - path.stat().st_size
    assert dropped > 0 and f"dropped a torn tail of {dropped:,} bytes" in run.out


# -- quarantine --------------------------------------------------------------------------------


def _corrupt_line(path: Path, line: int) -> bytes:
    data = path.read_bytes()
    starts = [0, *[index + 1 for index, byte in enumerate(data) if byte == 0x0A]]
    at = starts[line - 1] + 2
    path.write_bytes(data[:at] + b"#" + data[at + 1 :])
    return data


def test_quarantine_moves_the_bad_tail_aside_and_the_session_opens_again(cli: Any, tmp_path: Path) -> None:
    path = mid_crash(tmp_path / "s.jsonl")
    original = _corrupt_line(path, 4)
    corrupt = path.read_bytes()
    lines = corrupt.count(b"\n")
    assert cli("repair", path).code == 1  # the plain repair refuses corruption
    dry = cli("repair", path, "--quarantine", "--dry-run")
    assert dry.code == 0 and "would move" in dry.out
    assert path.read_bytes() == corrupt
    run = cli("repair", path, "--quarantine")
    assert run.code == 0, run.err
    starts = [0, *[index + 1 for index, byte in enumerate(corrupt) if byte == 0x0A]]
    side = path.with_name(f"{path.name}.quarantine.{starts[3]}")
    assert side.read_bytes() == corrupt[starts[3] :]  # everything from the bad line, unchanged
    assert path.read_bytes() == corrupt[: starts[3]]
    assert f"moved {lines - 3} lines from line 4" in run.out and str(side) in run.out
    assert "seq 4-" in run.out or "seq 3-" in run.out  # the seqs of the lines that still parse
    assert f"{len(corrupt) - starts[3]:,} bytes" in run.out
    with sessionlog.open(path) as store:
        assert store.load().repaired_length == starts[3]
    assert original[: starts[3]] == path.read_bytes()
    again = cli("repair", path, "--quarantine")
    assert again.code == 0 and "nothing to quarantine" in again.out


def test_a_quarantine_dry_run_takes_no_writer_lock(cli: Any, tmp_path: Path) -> None:
    """Like every dry run (docs/cli.md), it reads without the writer lock: next to a live writer
    it answers, and it removes nothing, not even a dead process's temporary (#38, item 14's class:
    a read must never make a writer fail)."""
    path = mid_crash(tmp_path / "s.jsonl")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDING, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    debris = tmp_path / f".{path.name}.999999999.0123456789ab.creating"  # of a pid that is no more
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        debris.write_bytes(b"partial")  # after the writer's open, which removes such debris
        dry = cli("repair", path, "--quarantine", "--dry-run")
        assert dry.code == 0 and "valid, nothing to quarantine" in dry.out, dry.err
        assert debris.exists()
    finally:
        holder.communicate("")
    assert cli("repair", path, "--quarantine").code == 0 and not debris.exists()  # the real run does


_HOLDING = """
import sys, sessionlog
store = sessionlog.open(sys.argv[1], "jsonl")
print("holding", flush=True)
sys.stdin.read()
"""


def test_quarantine_refuses_a_bad_header(cli: Any, tmp_path: Path) -> None:
    path = mid_crash(tmp_path / "s.jsonl")
    _corrupt_line(path, 1)
    before = path.read_bytes()
    assert cli("repair", path, "--quarantine").code == 1
    assert path.read_bytes() == before and list(tmp_path.iterdir()) == [path]


# -- convert -----------------------------------------------------------------------------------


def test_a_failed_convert_leaves_no_copy_and_no_temporary(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = mid_crash(tmp_path / "s.jsonl")
    copy = tmp_path / "copy.jsonl"

    def broken(*args: Any) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(new_database, "sync_file", broken)
    assert cli("convert", path, copy, "--to", "jsonl-fsync").code == 1
    assert sorted(item.name for item in tmp_path.iterdir()) == ["s.jsonl"]
    monkeypatch.undo()
    assert cli("convert", path, copy, "--to", "jsonl-fsync").code == 0
    assert copy.read_bytes() == path.read_bytes()
    run = cli("convert", path, copy, "--to", "jsonl")
    assert run.code == 2 and "already exists" in run.err  # never overwrites


def test_verify_refuses_a_damaged_line_end_that_a_store_would_not_cut(cli: Any, tmp_path: Path) -> None:
    path = mid_crash(tmp_path / "s.jsonl")
    data = path.read_bytes()
    path.write_bytes(data[:-1] + b"\x0b")  # one flipped bit turned the last LF into VT
    run = cli("verify", path)
    assert run.code == 1 and "damaged line end" in run.err
    assert cli("repair", path).code == 1
    assert path.read_bytes() == data[:-1] + b"\x0b"


# -- temporaries and partial copies -------------------------------------------------------------

_STOPPED_IN_FSYNC = """
import os, sys, time
from sessionlog.cli import main
def stopped(fd):
    print("syncing", flush=True)  # the temporary is written: now the operator kills us
    time.sleep(3600)
os.fsync = stopped
main(sys.argv[1:])
"""


def _temporaries(folder: Path) -> list[str]:
    return sorted(item.name for item in folder.iterdir() if item.name.startswith("."))


def _repository_session(tmp_path: Path) -> str:
    repository = sessionlog.repository(tmp_path / "repo")
    with repository.create(provider="p", model="m", cwd="/w", environment_identity="env") as store:
        store.commit(F.accept_prompt("x" * 100_000))
        session_id = store.load().session_id
    repository.close()
    return f"{tmp_path / 'repo'}#{session_id}"


def test_a_killed_export_leaves_a_temporary_that_the_next_export_removes(cli: Any, tmp_path: Path) -> None:
    name = _repository_session(tmp_path)
    out = tmp_path / "out" / "exported.jsonl"
    out.parent.mkdir()
    for _ in range(3):  # each kill leaves its temporary; the next run removes the dead one's
        child = subprocess.Popen(
            [sys.executable, "-c", _STOPPED_IN_FSYNC, "export", name, "-o", str(out)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdout.readline() == "syncing\n"
        child.kill()
        child.wait()
        assert len(_temporaries(out.parent)) == 1 and not out.exists()
    assert cli("export", name, "-o", out).code == 0
    assert _temporaries(out.parent) == [] and out.is_file()


def test_an_export_that_fails_on_a_full_disk_leaves_no_temporary(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import os

    from sessionlog import maintenance

    name = _repository_session(tmp_path)
    out = tmp_path / "out" / "exported.jsonl"
    out.parent.mkdir()
    real_write = os.write

    def full(fd: int, data: Any) -> int:
        if len(data) > 1000:
            real_write(fd, bytes(data[:1000]))  # part of it lands, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(maintenance.os, "write", full)
    run = cli("export", name, "-o", out)
    monkeypatch.undo()
    assert run.code == 1 and "No space left on device" in run.err and len(run.err.splitlines()) == 1
    assert os.listdir(out.parent) == []


@pytest.mark.parametrize("backend", ["sqlite", "sqlite-async"])
def test_a_convert_to_sqlite_is_all_or_nothing_and_its_retry_works(
    backend: str, cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = mid_crash(tmp_path / "agent.jsonl")
    database = tmp_path / "out.db"
    written = []

    def failing(*args: Any) -> None:
        written.append(args)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(convert_module, "_write_sync", failing)
    monkeypatch.setattr(convert_module, "_write_async", failing)
    assert cli("convert", path, database, "--to", backend).code == 1
    assert written  # it failed after the header was stored, while copying the lines
    assert sorted(item.name for item in tmp_path.iterdir()) == ["agent.jsonl"]  # no partial session
    monkeypatch.undo()
    run = cli("convert", path, database, "--to", backend)
    assert run.code == 0, run.err
    assert sessionlog.reduce_bytes(path.read_bytes()) == sessionlog.repository(
        f"sqlite:///{database}", create=False
    ).load(sessionlog.reduce_bytes(path.read_bytes()).session_id)


def test_a_convert_into_an_existing_database_that_fails_leaves_it_as_it_was(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = mid_crash(tmp_path / "agent.jsonl")
    session_id = sessionlog.reduce_bytes(path.read_bytes()).session_id
    database = tmp_path / "many.db"
    repository = sessionlog.repository(f"sqlite:///{database}")
    with repository.create(provider="p", model="m", cwd="/w", environment_identity="env"):
        pass
    before = [info.session_id for info in repository.list()]
    repository.close()

    def failing(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(convert_module, "_write_sync", failing)
    assert cli("convert", path, f"{database}#{session_id}", "--to", "sqlite").code == 1
    repository = sessionlog.repository(f"sqlite:///{database}", create=False)
    assert [info.session_id for info in repository.list()] == before  # the partial session removed
    repository.close()
    monkeypatch.undo()
    run = cli("convert", path, f"{database}#{session_id}", "--to", "sqlite")
    assert run.code == 0, run.err


def test_a_killed_convert_to_sqlite_leaves_nothing_under_its_name_and_the_next_one_cleans_up(
    cli: Any, tmp_path: Path
) -> None:
    path = mid_crash(tmp_path / "agent.jsonl")
    database = tmp_path / "out.db"
    child = subprocess.Popen(
        [sys.executable, "-c", _STOPPED_IN_FSYNC, "convert", str(path), str(database), "--to", "sqlite"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline() == "syncing\n"  # copied, not yet linked
    child.kill()
    child.wait()
    assert not database.exists() and _temporaries(tmp_path)
    run = cli("convert", path, database, "--to", "sqlite")
    assert run.code == 0, run.err
    assert _temporaries(tmp_path) == [] and sorted(item.name for item in tmp_path.iterdir()) == [
        "agent.jsonl",
        "out.db",
    ]


def test_a_convert_into_a_repository_that_does_not_read_back_leaves_no_session(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sessionlog.repositories.directory import DirectoryRepository

    path = mid_crash(tmp_path / "agent.jsonl")
    repository = tmp_path / "repo"
    repository.mkdir()
    monkeypatch.setattr(DirectoryRepository, "load", lambda self, session_id: None)  # reads back wrong
    run = cli("convert", path, repository)
    monkeypatch.undo()
    assert run.code == 1 and "does not reduce to the state" in run.err
    assert sessionlog.repository(repository, create=False).list() == []
    assert cli("convert", path, repository).code == 0


def test_a_convert_refused_by_a_new_database_leaves_no_database(cli: Any, tmp_path: Path) -> None:
    path = mid_crash(tmp_path / "agent.jsonl")
    other_id = "0190a1b2-0000-7000-8000-000000000000"  # not the session's own id: refused
    run = cli("convert", path, f"{tmp_path / 'new.db'}#{other_id}", "--to", "sqlite")
    assert run.code != 0 and len(run.err.splitlines()) == 1
    assert sorted(item.name for item in tmp_path.iterdir()) == ["agent.jsonl"]


def test_rm_of_a_held_session_says_once_that_nothing_changed(cli: Any, tmp_path: Path) -> None:
    """It said "nothing was deleted; nothing was changed (try again when it is closed)"."""
    repo = sessionlog.repository(str(tmp_path / "repo"))
    store = repo.create(provider="p", model="m", cwd="/w")
    session_id = store.load().session_id
    try:
        run = cli("rm", f"{tmp_path / 'repo'}#{session_id}")
        assert run.code == 3, run.err
        assert run.err.count("nothing was") == 1 and "try again when it is closed" in run.err, run.err
    finally:
        store.close()
    assert cli("rm", f"{tmp_path / 'repo'}#{session_id}").code == 0

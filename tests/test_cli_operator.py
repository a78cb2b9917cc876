"""The CLI at 3 a.m.: what a model put in a session cannot drive the terminal, special files
cannot hang it, and every outcome has its own exit status."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from sessionlog.core import facts as F
from test_cli import mid_crash
from test_recovery import CURRENT, accept, attempt, new_store, pending_tools

ESCAPES = "\x1b[2K\x1b[1A\r"  # erase the line, go up: hides what was printed before


def test_inspect_escapes_control_characters_from_the_session(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with new_store(path) as store:
        call = F.tool_call(f"call{ESCAPES}", "write", json.dumps({"path": "deploy.sh --prod"}))
        pending_tools(store, [call])
    run = cli("inspect", path)
    assert run.code == 0, run.err
    assert "\x1b" not in run.out and "\r" not in run.out
    assert "\\x1b[2K\\x1b[1A\\x0d" in run.out and "deploy.sh --prod" in run.out
    as_json = cli("inspect", path, "--json")
    assert as_json.json()["pendingIntents"][0]["toolCallId"] == f"call{ESCAPES}"  # JSON keeps the data


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "directory"])
def test_a_special_file_is_refused_without_hanging_or_reading_it(
    cli: Any, tmp_path: Path, special: str
) -> None:
    if special == "fifo":
        target = tmp_path / "fifo"
        os.mkfifo(target)
    elif special == "directory":
        target = tmp_path
    else:
        target = Path(special)
    for argv in (["verify", target], ["inspect", target], ["reduce", target]):
        run = cli(*argv)
        assert run.code == 2 and ("not a regular file" in run.err or "directory" in run.err), run.err
    session = mid_crash(tmp_path / "s.jsonl")
    run = cli("plan", session, "--current", target)
    assert run.code == 2 and "--current" in run.err


def test_a_huge_current_file_is_refused(cli: Any, tmp_path: Path) -> None:
    session = mid_crash(tmp_path / "s.jsonl")
    current = tmp_path / "current.json"
    with open(current, "wb") as file:
        file.truncate(64 << 20)
    run = cli("plan", session, "--current", current)
    assert run.code == 2 and "more than" in run.err


def _current(tmp_path: Path) -> Path:
    current = tmp_path / "current.json"
    current.write_text(json.dumps(CURRENT))
    return current


# -- exit 4 for a blocked plan, abort, the valid prefix, the NUL hint ---------------------------


def test_a_blocked_plan_has_its_own_exit_status_and_abort_ends_the_run(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with new_store(path) as store:
        attempt(store, accept(store))  # an open attempt: the retry needs the same configuration
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps({**CURRENT, "configurationDigest": "sha256:" + "9" * 64}))
    run = cli("plan", path, "--current", changed)
    assert run.code == 4 and "blocked: configuration_changed" in run.out and "abort" in run.out
    assert cli("plan", path, "--current", changed, "--json").json()["type"] == "blocked"
    assert cli("recover", path, "--current", changed).code == 4
    run = cli("abort", path, "--current", changed)
    assert run.code == 0, run.err
    assert "abortRequested" in run.out and "finish aborted" in run.out
    state = sessionlog.reduce_bytes(path.read_bytes())
    assert state.is_idle
    assert cli("abort", path, "--current", changed).code == 2  # idle: nothing to abort


def test_abort_names_its_phases_in_its_help(cli: Any) -> None:
    run = cli("abort", "--help")
    assert run.code == 0 and all(phase in run.out for phase in ("model", "tool", "compact"))
    run = cli("plan", "--help")
    assert "definitionDigest" in run.out and "replayKey" in run.out  # --current documents its shape


def test_inspect_shows_where_a_refused_log_stops_being_valid(cli: Any, tmp_path: Path) -> None:
    path = mid_crash(tmp_path / "s.jsonl")
    data = path.read_bytes()
    starts = [0, *[index + 1 for index, byte in enumerate(data) if byte == 0x0A]]
    path.write_bytes(data[: starts[4] + 1] + b"#" + data[starts[4] + 2 :])
    run = cli("inspect", path)
    assert run.code == 1
    assert (
        f"valid prefix is {starts[4]:,} bytes (lines 1-4, last seq 4)" in run.out
        and "--quarantine" in run.out
    )
    as_json = cli("inspect", path, "--json").json()
    assert as_json["validPrefix"] == {"bytes": starts[4], "lines": 4, "lastSeq": 4}


def test_a_power_class_log_read_as_process_class_names_the_option(cli: Any, tmp_path: Path) -> None:
    path = mid_crash(tmp_path / "s.jsonl")
    good = path.read_bytes()
    path.write_bytes(good + bytes(-len(good) % 512 or 512) + b"\n")  # a power loss's hole
    run = cli("verify", path)
    assert run.code == 1 and "--backend jsonl-fsync" in run.err and "power loss" in run.err
    assert cli("verify", path, "--backend", "jsonl-fsync").code == 0


def test_the_planner_validates_current_and_names_the_bad_key() -> None:
    state = sessionlog.reduce_bytes(
        sessionlog.encode_header(cwd="/", provider="p", model="m", environment_identity="e")
    )
    tool = {key: value for key, value in CURRENT["tools"][0].items() if key != "definitionDigest"}
    with pytest.raises(sessionlog.ConfigurationError) as caught:
        sessionlog.plan_recovery(state, {**CURRENT, "tools": [tool]})
    assert caught.value.key == "tools[0].definitionDigest" and isinstance(caught.value, ValueError)


def _hole_in_the_last_batch(path: Path) -> Path:
    """A group-commit session after a power loss: its last write held two lines, and the sectors
    of the first one never arrived (NULs from its start to a sector boundary); the last is whole."""
    with new_store(path) as store:
        ids = accept(store, "x" * 3000)
        attempt(store, ids)
    data = path.read_bytes()
    starts = [0] + [index + 1 for index, byte in enumerate(data) if byte == 0x0A]
    first = starts[-3]  # the second-to-last line: the batch's first
    boundary = (first // 512 + 2) * 512
    assert boundary < starts[-2] - 1  # inside that line: its LF and the last line are intact
    path.write_bytes(data[:first] + bytes(boundary - first) + data[boundary:])
    return path


def test_a_hole_inside_a_group_commit_batch_is_hinted_with_the_backend_that_reads_it(
    cli: Any, tmp_path: Path
) -> None:
    path = _hole_in_the_last_batch(tmp_path / "s.jsonl")
    run = cli("verify", path)
    assert run.code == 1 and "power loss" in run.err and "--backend jsonl-group" in run.err
    assert "--backend jsonl-fsync" not in run.err
    assert cli("verify", path, "--backend", "jsonl-fsync").code == 1  # its rule refuses it: a batch's hole
    for backend in ("jsonl-group", "jsonl-syncfs"):
        assert cli("verify", path, "--backend", backend).code == 0


def test_a_directory_repository_session_is_read_with_the_backend_named(cli: Any, tmp_path: Path) -> None:
    repository = sessionlog.repository(tmp_path / "repo")
    with repository.create(provider="p", model="m", cwd="/w", environment_identity="env") as store:
        session_id = store.load().session_id
    repository.close()
    _hole_in_the_last_batch(tmp_path / "s.jsonl")
    (tmp_path / "repo" / f"{session_id}.jsonl").unlink()
    data = (tmp_path / "s.jsonl").read_bytes()
    session_id = sessionlog.reduce_bytes(data, nul_tail=True, nul_window=4 << 20).session_id
    (tmp_path / "repo" / f"{session_id}.jsonl").write_bytes(data)
    name = f"{tmp_path / 'repo'}#{session_id}"
    run = cli("verify", name)
    assert run.code == 1 and "--backend jsonl-group" in run.err
    assert cli("verify", name, "--backend", "jsonl-group").code == 0


def test_ls_reads_a_directory_of_group_commit_sessions_with_the_backend_named(
    cli: Any, tmp_path: Path
) -> None:
    data = _hole_in_the_last_batch(tmp_path / "s.jsonl").read_bytes()
    session_id = json.loads(data.split(b"\n", 1)[0])["id"]
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / f"{session_id}.jsonl").write_bytes(data)
    assert "corrupt" in cli("ls", tmp_path / "repo").out  # read as jsonl-fsync, the default
    for backend in ("jsonl-group", "jsonl-syncfs"):
        run = cli("ls", tmp_path / "repo", "--backend", backend, "--json")
        assert run.code == 0 and [row["status"] for row in run.json()] == ["idle"], (
            run.out
        )  # torn, not corrupt
    run = cli("ls", tmp_path / "repo", "--backend", "sqlite")
    assert run.code == 2 and "file backend" in run.err

"""The `sessionlog` command line: every command and exit code on valid, torn, corrupted and
mid-crash sessions; read-only commands never write or take the writer lock."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from conftest import FIXTURES, PLANNER_FIXTURES, shared_manifest
from sessionlog.core import facts as F
from sessionlog.core.store import BackendInfo
from sessionlog.plugins.hookspecs import hookimpl
from sessionlog.plugins.registry import Registry, plugin_manager
from test_recovery import CURRENT, READ, WRITE, accept, attempt, new_store, pending_tools, settle

TORN = b'{"kind":"entry","seq":99,"id":"0'


@pytest.fixture
def current(tmp_path: Path) -> Path:
    path = tmp_path / "current.json"
    path.write_text(json.dumps(CURRENT))
    return path


def finished(path: Path) -> Path:
    """A session whose run completed: idle."""
    with new_store(path) as store:
        ids = accept(store)
        attempt(store, ids)
        settle(store, ids, [], content="done")
        sessionlog.recover(store, CURRENT)
        store.commit([F.usage(ids["operation"], {"input": 10, "output": 3}, attempt_id=ids["attempt"])])
    return path


def mid_crash(path: Path) -> Path:
    """A crash in the middle of a tool batch: two intents (write, read), no result."""
    with new_store(path) as store:
        pending_tools(store, [WRITE, READ])
    return path


def torn(path: Path) -> Path:
    with path.open("ab") as file:
        file.write(TORN)
    return path


def corrupted(path: Path) -> tuple[Path, int, int]:
    """Appends a complete line that is not a fact; returns the path, its line and byte offset."""
    data = path.read_bytes()
    line = data.count(b"\n") + 1
    path.write_bytes(data + b'{"kind":"nonsense"}\n')
    return path, line, len(data)


def one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


# -- backends, usage -----------------------------------------------------------------------------


def test_backends_lists_every_registered_backend(cli: Any) -> None:
    run = cli("backends")
    assert run.code == 0
    assert run.out.split()[0] == "jsonl"
    rows = cli("backends", "--json").json()
    assert {"name": "jsonl", "api": "sync", "durability": "process"}.items() <= rows[0].items()
    assert [row["name"] for row in rows] == sorted(sessionlog.backends())


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nope"],
        ["verify"],
        ["plan"],
        ["convert", "a"],
        ["inspect", "x", "--progress", "maybe"],
    ],
)
def test_usage_errors_exit_2(cli: Any, argv: list[str]) -> None:
    run = cli(*argv)
    assert run.code == 2
    assert "error:" in run.err


def test_help_exits_0(cli: Any) -> None:
    run = cli("--help")
    assert run.code == 0
    assert "recover" in run.out


def test_a_missing_file_or_backend_is_a_usage_error(cli: Any, tmp_path: Path) -> None:
    run = cli("verify", tmp_path / "none.jsonl")
    assert run.code == 2
    assert "no session at" in one_line(run.err)
    path = finished(tmp_path / "s.jsonl")
    run = cli("verify", path, "--backend", "nope")
    assert run.code == 2
    assert "unknown backend 'nope'" in one_line(run.err)  # the user's own argument, as typed
    run = cli("verify", tmp_path)
    assert run.code == 2
    assert "is a directory: a directory repository?" in one_line(run.err)  # and how to name a session
    assert f"{tmp_path}#SESSION_ID" in one_line(run.err)
    os.symlink(path, tmp_path / "link.jsonl")
    run = cli("inspect", tmp_path / "link.jsonl")
    assert run.code == 2
    assert "symlink" in one_line(run.err)


# -- inspect -----------------------------------------------------------------------------------


def test_inspect_a_finished_session(cli: Any, tmp_path: Path) -> None:
    path = finished(tmp_path / "s.jsonl")
    run = cli("inspect", path)
    assert run.code == 0
    state = sessionlog.reduce_bytes(path.read_bytes())
    assert state.session_id in run.out
    assert "operation    idle" in run.out
    assert "pending      0 tool intents" in run.out
    report = cli("inspect", path, "--json").json()
    assert report["ok"] is True
    assert report["header"] == state.header
    counts = report["counts"]
    assert (counts["lines"], counts["transactions"], counts["facts"]) == (6, 5, 6)
    assert (counts["entries"], counts["records"], counts["usage"]) == (2, 3, 1)
    assert counts["entryKinds"] == {"assistant": 1, "user": 1}
    assert counts["recordTypes"] == {"operationFinished": 1, "runStarted": 1, "stepAttempt": 1}
    assert report["usageTotals"] == {"input": 10, "output": 3, "cacheRead": 0, "cacheWrite": 0}
    assert report["operation"] == {"kind": "idle"}
    assert report["bytes"] == {
        "size": len(path.read_bytes()),
        "committed": state.repaired_length,
        "tornTail": 0,
    }
    assert report["lastSeq"] == 6


def test_inspect_a_mid_crash_session_shows_the_pending_intents(cli: Any, tmp_path: Path) -> None:
    path = mid_crash(tmp_path / "s.jsonl")
    run = cli("inspect", path)
    assert run.code == 0
    assert "pending      2 tool intents without a result" in run.out
    assert "[0] write call_write (replay never, write:v1)" in run.out
    assert "[1] read call_read (replay safe, read:v1)" in run.out
    report = cli("inspect", path, "--json").json()
    assert [tool["toolName"] for tool in report["pendingIntents"]] == ["write", "read"]
    assert report["operation"]["kind"] == "run"
    assert report["openAttempt"] is None


def test_inspect_shows_an_open_attempt_and_a_torn_tail(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with new_store(path) as store:
        record = attempt(store, accept(store))
    torn(path)
    run = cli("inspect", path)
    assert run.code == 0
    assert f"open attempt {record['attemptId']}" in run.out
    assert f"torn tail of {len(TORN)} bytes" in run.out
    report = cli("inspect", path, "--json").json()
    assert report["openAttempt"]["attemptId"] == record["attemptId"]
    assert report["bytes"]["tornTail"] == len(TORN)


def test_inspect_a_corrupted_session_exits_1_naming_file_line_and_offset(cli: Any, tmp_path: Path) -> None:
    path, line, offset = corrupted(finished(tmp_path / "s.jsonl"))
    run = cli("inspect", path)
    assert run.code == 1
    error = one_line(run.err)
    assert str(path) in error
    assert f"line {line}" in error
    assert f"byte offset {offset}" in error
    assert "INVALID_FACT" in error
    report = cli("inspect", path, "--json").json()
    assert report["ok"] is False
    assert report["error"] == {"code": "INVALID_FACT", "line": line, "offset": offset}


# -- verify ------------------------------------------------------------------------------------


def test_verify(cli: Any, tmp_path: Path) -> None:
    path = finished(tmp_path / "s.jsonl")
    run = cli("verify", path)
    assert (run.code, run.err) == (0, "")
    assert "valid" in run.out
    torn(path)
    run = cli("verify", path)
    assert run.code == 0
    assert f"torn tail of {len(TORN)} bytes" in run.out
    crash = mid_crash(tmp_path / "crash.jsonl")
    run = cli("verify", crash)
    assert run.code == 0
    assert "run unfinished" in run.out


def test_verify_a_corrupted_session_exits_1_with_the_error_line(cli: Any, tmp_path: Path) -> None:
    path, line, offset = corrupted(mid_crash(tmp_path / "s.jsonl"))
    torn(path)  # a torn tail after corruption changes nothing
    run = cli("verify", path)
    assert (run.code, run.out) == (1, "")
    error = one_line(run.err)
    assert error.startswith("sessionlog verify: INVALID_FACT at ")
    assert f"{path}: line {line} (byte offset {offset})" in error


@pytest.mark.parametrize(
    ("data", "code", "line"),
    [
        (b"", "MISSING_HEADER", 1),
        (b"\n", "MISSING_HEADER", 1),
        (b'{"kind":"head","version":2}\n', "INVALID_HEADER", 1),
        (b"\xff\n", "INVALID_UTF8", 1),
    ],
)
def test_verify_broken_headers(cli: Any, tmp_path: Path, data: bytes, code: str, line: int) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(data)
    run = cli("verify", path)
    assert run.code == 1
    assert f"{code} at {path}: line {line} (byte offset 0)" in one_line(run.err)


# -- repair ------------------------------------------------------------------------------------


def test_repair_drops_a_torn_tail_only(cli: Any, tmp_path: Path) -> None:
    path = mid_crash(tmp_path / "s.jsonl")
    good = path.read_bytes()
    torn(path)
    run = cli("repair", path, "--dry-run")
    assert run.code == 0
    assert f"would drop a torn tail of {len(TORN)} bytes" in run.out
    assert path.read_bytes() == good + TORN
    run = cli("repair", path)
    assert run.code == 0
    assert f"dropped a torn tail of {len(TORN)} bytes" in run.out
    assert path.read_bytes() == good
    run = cli("repair", path)
    assert run.code == 0
    assert "nothing to repair" in run.out
    assert path.read_bytes() == good


@pytest.mark.parametrize("with_tail", [False, True])
def test_repair_refuses_corruption_and_leaves_the_file_byte_for_byte(
    cli: Any, tmp_path: Path, with_tail: bool
) -> None:
    path, line, _ = corrupted(mid_crash(tmp_path / "s.jsonl"))
    if with_tail:
        torn(path)
    before = path.read_bytes()
    for argv in (["repair", path], ["repair", path, "--dry-run"]):
        run = cli(*argv)
        assert run.code == 1
        assert f"line {line}" in one_line(run.err)
        assert path.read_bytes() == before


def test_repair_through_an_async_backend(cli: Any, tmp_path: Path) -> None:
    if "jsonl-group" not in sessionlog.backends():
        pytest.skip("no jsonl-group backend in this build")
    path = mid_crash(tmp_path / "s.jsonl")
    good = path.read_bytes()
    torn(path)
    run = cli("repair", path, "--backend", "jsonl-group")
    assert run.code == 0, run.err
    assert path.read_bytes() == good


def test_a_nul_bearing_last_line_is_torn_for_the_power_class_only(cli: Any, tmp_path: Path) -> None:
    """Read-only commands read as the named backend's store does (contract §1, power class)."""
    if "jsonl-fsync" not in sessionlog.backends():
        pytest.skip("no jsonl-fsync backend in this build")
    path = mid_crash(tmp_path / "s.jsonl")
    good = path.read_bytes()
    hole = -len(good) % 512 or 512  # sectors that never arrived before power loss
    path.write_bytes(good + b"\0" * hole + b"\n")
    refused = cli("verify", path)
    assert refused.code == 1
    assert "jsonl-syncfs wrote it, read it with --backend" in refused.out + refused.err  # the hint
    run = cli("verify", path, "--backend", "jsonl-fsync")
    assert run.code == 0, run.err
    assert f"torn tail of {hole + 1} bytes" in run.out
    assert cli("repair", path).code == 1
    assert cli("repair", path, "--backend", "jsonl-fsync").code == 0
    assert path.read_bytes() == good


# -- reduce ------------------------------------------------------------------------------------


def test_reduce_prints_the_expected_state_form(cli: Any, tmp_path: Path) -> None:
    path = torn(mid_crash(tmp_path / "s.jsonl"))
    run = cli("reduce", path)
    assert run.code == 0
    assert run.json() == {"ok": True, "state": sessionlog.reduce_bytes(path.read_bytes()).to_json()}
    corrupted(path)  # after the torn tail: the tail becomes part of a complete bad line
    run = cli("reduce", path)
    assert run.code == 1
    output = run.json()
    assert output["ok"] is False
    assert output["error"]["code"] == "MALFORMED_JSON"
    assert one_line(run.err)


@pytest.mark.parametrize("case", shared_manifest(FIXTURES), ids=lambda case: case["name"])
def test_reduce_matches_every_shared_fixture(cli: Any, case: dict[str, Any]) -> None:
    run = cli("reduce", FIXTURES / case["file"])
    expected = json.loads((FIXTURES / case["expected"]).read_text())
    assert run.json() == expected
    assert run.code == (0 if expected["ok"] else 1)


# -- plan --------------------------------------------------------------------------------------


def test_plan_prints_the_recovery_plan(cli: Any, tmp_path: Path, current: Path) -> None:
    path = mid_crash(tmp_path / "s.jsonl")
    before = path.read_bytes()
    run = cli("plan", path, "--current", current, "--json")
    assert run.code == 0
    plan = run.json()
    assert plan == sessionlog.plan_recovery(sessionlog.reduce_bytes(before), CURRENT)
    assert (plan["type"], plan["results"][0]["reason"]) == ("appendSynthetic", "interrupted")
    assert path.read_bytes() == before


@pytest.mark.parametrize("case", shared_manifest(PLANNER_FIXTURES), ids=lambda case: case["name"])
def test_plan_matches_every_shared_planner_fixture(cli: Any, tmp_path: Path, case: dict[str, Any]) -> None:
    given = json.loads((PLANNER_FIXTURES / case["input"]).read_text())
    current = tmp_path / "current.json"
    current.write_text(json.dumps(given["current"]))
    run = cli("plan", FIXTURES / given["sessionFile"], "--current", current, "--json")
    expected = json.loads((PLANNER_FIXTURES / case["expected"]).read_text())
    assert run.code == (4 if expected["type"] == "blocked" else 0)
    assert run.json() == json.loads((PLANNER_FIXTURES / case["expected"]).read_text())


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "not JSON"),
        ("[]", "not an object"),
        (
            json.dumps({**CURRENT, "extra": 1}),
            "a string of 5 characters starting 'e' is not a key of the current configuration",
        ),
        (json.dumps({**CURRENT, "configurationDigest": "md5:x"}), "configurationDigest"),
        (json.dumps({**CURRENT, "tools": [{"name": "read"}]}), "tools[0].definitionDigest is missing"),
        (json.dumps({**CURRENT, "tools": [{**CURRENT["tools"][0], "replay": "maybe"}]}), "replay"),
    ],
)
def test_a_bad_current_configuration_is_a_usage_error(
    cli: Any, tmp_path: Path, text: str, problem: str
) -> None:
    path = mid_crash(tmp_path / "s.jsonl")
    current = tmp_path / "current.json"
    current.write_text(text)
    for command in ("plan", "recover"):
        run = cli(command, path, "--current", current)
        assert run.code == 2
        assert problem in one_line(run.err)
    run = cli("plan", path, "--current", tmp_path / "absent.json")
    assert run.code == 2
    assert "cannot read" in one_line(run.err)


def test_plan_of_a_corrupted_session_exits_1(cli: Any, tmp_path: Path, current: Path) -> None:
    path, line, _ = corrupted(mid_crash(tmp_path / "s.jsonl"))
    run = cli("plan", path, "--current", current)
    assert (run.code, run.out) == (1, "")
    assert f"line {line}" in one_line(run.err)


# -- recover -----------------------------------------------------------------------------------


def test_recover_commits_what_needs_no_effect_and_prints_the_plan_left(
    cli: Any, tmp_path: Path, current: Path
) -> None:
    path = torn(mid_crash(tmp_path / "s.jsonl"))
    before = path.read_bytes()
    dry = cli("recover", path, "--current", current, "--dry-run")
    assert dry.code == 0
    assert "would commit seq 7: appendSynthetic interrupted write (call 0)" in dry.out
    assert path.read_bytes() == before
    run = cli("recover", path, "--current", current)
    assert run.code == 0, run.err
    assert "committed seq 7: appendSynthetic interrupted write (call 0)" in run.out
    assert "plan left: startTool replay read (call 1)" in run.out
    state = sessionlog.reduce_bytes(path.read_bytes())
    assert state.last_seq == 7
    assert [tool["toolName"] for tool in state.pending_tools] == ["read"]
    assert state.transcript[-1]["content"].startswith("Operation interrupted")
    again = cli("recover", path, "--current", current, "--json").json()
    assert again["committed"] == []
    assert again["plan"]["type"] == "startTool"
    assert again["plan"]["mode"] == "replay"


def test_recover_json_lists_the_committed_transactions(cli: Any, tmp_path: Path, current: Path) -> None:
    path = tmp_path / "s.jsonl"
    with new_store(path) as store:
        ids = accept(store)
        attempt(store, ids)
        store.commit([F.abort_requested(ids["operation"], "run", "model")])
    output = cli("recover", path, "--current", current, "--json").json()
    assert [item["plan"]["type"] for item in output["committed"]] == ["closeAttempt", "finish"]
    assert output["committed"][0]["facts"][0]["record"]["type"] == "stepFailed"
    assert output["plan"] is None  # idle once finished: no plan left
    run = cli("recover", path, "--current", current)
    assert "committed nothing" in run.out
    assert "plan left: nothing to do: the session is idle" in run.out


def test_recover_of_a_corrupted_session_exits_1_and_writes_nothing(
    cli: Any, tmp_path: Path, current: Path
) -> None:
    path, line, _ = corrupted(mid_crash(tmp_path / "s.jsonl"))
    before = path.read_bytes()
    run = cli("recover", path, "--current", current)
    assert run.code == 1
    assert f"line {line}" in one_line(run.err)
    assert path.read_bytes() == before


def test_recover_exits_1_when_the_reducer_refuses_the_plan(cli: Any, tmp_path: Path, current: Path) -> None:
    path = tmp_path / "s.jsonl"
    with new_store(path) as store:
        ids = accept(store)
        attempt(store, ids)
        settle(store, ids, [], content=" ")
    before = path.read_bytes()
    run = cli("recover", path, "--current", current)
    assert run.code == 1
    error = one_line(run.err)
    assert "refused" in error
    assert "INVALID_TRANSCRIPT" in error
    assert path.read_bytes() == before


def test_recover_through_an_async_backend(cli: Any, tmp_path: Path, current: Path) -> None:
    if "jsonl-async" not in sessionlog.backends():
        pytest.skip("no jsonl-async backend in this build")
    path = mid_crash(tmp_path / "s.jsonl")
    run = cli("recover", path, "--current", current, "--backend", "jsonl-async")
    assert run.code == 0, run.err
    assert "committed seq 7" in run.out
    assert sessionlog.reduce_bytes(path.read_bytes()).last_seq == 7


# -- read-only means read-only -----------------------------------------------------------------


def test_read_only_commands_take_no_writer_lock(cli: Any, tmp_path: Path, current: Path) -> None:
    path = mid_crash(tmp_path / "s.jsonl")
    with sessionlog.open(path) as store:  # this process's writer, with the flock
        before = path.read_bytes()
        stat = path.stat()
        for argv in (
            ["inspect", path],
            ["inspect", path, "--json"],
            ["verify", path],
            ["reduce", path],
            ["plan", path, "--current", current],
            ["recover", path, "--current", current, "--dry-run"],
            ["repair", path, "--dry-run"],
            ["verify", path, "--backend", "jsonl-fsync"],
        ):
            run = cli(*argv)
            assert run.code == 0, (argv, run.err)
        assert path.read_bytes() == before
        assert path.stat().st_mtime_ns == stat.st_mtime_ns
        run = cli("recover", path, "--current", current)  # a writer: refused while another writes
        assert run.code == 3
        assert "already open for writing" in one_line(run.err)
        assert store.load().last_seq == 6
    assert path.read_bytes() == before


# -- convert -----------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["jsonl", "jsonl-fsync", "jsonl-async", "jsonl-group"])
def test_convert_keeps_every_transaction_exactly(cli: Any, tmp_path: Path, target: str) -> None:
    if target not in sessionlog.backends():
        pytest.skip(f"no {target} backend in this build")
    source = torn(mid_crash(tmp_path / "s.jsonl"))
    committed = source.read_bytes()[: -len(TORN)]
    destination = tmp_path / "d.jsonl"
    run = cli("convert", source, destination, "--to", target)
    assert run.code == 0, run.err
    assert f"dropped a torn tail of {len(TORN)} bytes" in run.out
    assert destination.read_bytes() == committed
    assert sessionlog.reduce_bytes(destination.read_bytes()) == sessionlog.reduce_bytes(committed)
    assert cli("verify", destination, "--backend", target).code == 0


def test_convert_refuses_bad_input_and_leaves_nothing_behind(cli: Any, tmp_path: Path) -> None:
    source = mid_crash(tmp_path / "s.jsonl")
    existing = finished(tmp_path / "existing.jsonl")
    kept = existing.read_bytes()
    run = cli("convert", source, existing, "--to", "jsonl")
    assert run.code == 2
    assert "already exists" in one_line(run.err)
    assert existing.read_bytes() == kept
    run = cli("convert", source, tmp_path / "d.jsonl")
    assert run.code == 2 and "--to BACKEND is needed" in run.err
    run = cli("convert", source, tmp_path / "d.jsonl", "--to", "nope")
    assert run.code == 2
    assert "unknown backend 'nope'" in one_line(run.err)  # the user's own argument, as typed
    corrupted(source)
    run = cli("convert", source, tmp_path / "d.jsonl", "--to", "jsonl")
    assert run.code == 1
    assert not (tmp_path / "d.jsonl").exists()


def test_convert_a_large_session_with_progress(cli: Any, tmp_path: Path) -> None:
    source = tmp_path / "s.jsonl"
    with new_store(source) as store:
        for number in range(3000):
            store.commit([F.user_message(f"message {number}")])
    destination = tmp_path / "d.jsonl"
    run = cli("convert", source, destination, "--to", "jsonl", "--progress", "always")
    assert run.code == 0
    assert "writing" in run.err  # plain progress lines: stderr is no terminal here
    assert destination.read_bytes() == source.read_bytes()


# -- a backend that is not a plain file --------------------------------------------------------


class Memory:
    """A third-party backend keeping sessions in a dict: the CLI must use its read path."""

    def __init__(self) -> None:
        self.sessions: dict[str, bytearray] = {}
        self.calls: list[str] = []

    @hookimpl
    def register_backends(self, register: Any) -> None:
        register("memory", self.open, BackendInfo("memory", "process", "sync", "sessions in a dict"))

    def open(self, path: Path, *, create: bytes | None = None, **options: Any) -> Any:
        key = str(path)
        if create is not None:
            if key in self.sessions:
                raise sessionlog.SessionExistsError(17, f"a session already exists: {key}", key)
            self.sessions[key] = bytearray(create)
        elif key not in self.sessions:
            raise sessionlog.SessionNotFoundError(2, f"no session at {key}", key)
        memory = self

        class Opened:
            def read(self) -> bytes:
                memory.calls.append("read")
                return bytes(memory.sessions[key])

            def truncate(self, length: int) -> None:
                memory.calls.append("truncate")
                del memory.sessions[key][length:]

            def append(self, line: bytes) -> None:
                memory.calls.append("append")
                memory.sessions[key] += line

            def close(self) -> None:
                memory.calls.append("close")

        return Opened()


def test_a_backend_that_is_not_a_file_is_read_through_its_read_path(
    cli: Any, tmp_path: Path, current: Path
) -> None:
    memory = Memory()
    registry = Registry(plugin_manager(entry_points=False, plugins=[memory]))
    source = torn(mid_crash(tmp_path / "s.jsonl"))
    run = cli("convert", source, "mem:one", "--to", "memory", registry=registry)
    assert run.code == 0, run.err
    assert "truncate" not in memory.calls
    assert bytes(memory.sessions["mem:one"]) == source.read_bytes()[: -len(TORN)]
    memory.sessions["mem:one"] += TORN
    memory.calls.clear()
    for argv in (
        ["inspect", "mem:one"],
        ["verify", "mem:one"],
        ["reduce", "mem:one"],
        ["plan", "mem:one", "--current", current],
        ["recover", "mem:one", "--current", current, "--dry-run"],
        ["repair", "mem:one", "--dry-run"],
    ):
        run = cli(*argv, "--backend", "memory", registry=registry)
        assert run.code == 0, (argv, run.err)
    assert set(memory.calls) == {"read", "close"}
    assert cli("repair", "mem:one", "--backend", "memory", registry=registry).code == 0
    assert "truncate" in memory.calls
    run = cli("recover", "mem:one", "--backend", "memory", "--current", current, registry=registry)
    assert run.code == 0
    assert "committed seq 7" in run.out
    back = tmp_path / "back.jsonl"
    assert (
        cli("convert", "mem:one", back, "--backend", "memory", "--to", "jsonl", registry=registry).code == 0
    )
    assert back.read_bytes() == bytes(memory.sessions["mem:one"])


# -- as a program ------------------------------------------------------------------------------


def test_the_cli_runs_as_a_module_and_as_the_console_script(tmp_path: Path) -> None:
    path = mid_crash(tmp_path / "s.jsonl")
    ok = subprocess.run(
        [sys.executable, "-m", "sessionlog.cli", "verify", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (ok.returncode, ok.stderr) == (0, "")
    assert "valid" in ok.stdout
    corrupted(path)
    bad = subprocess.run(
        [sys.executable, "-m", "sessionlog.cli", "inspect", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 1
    assert "byte offset" in one_line(bad.stderr)
    script = shutil.which("sessionlog")
    if script is None:
        pytest.skip("the console script is not on PATH")
    usage = subprocess.run([script, "verify"], capture_output=True, text=True, check=False)
    assert usage.returncode == 2
    listed = subprocess.run([script, "backends"], capture_output=True, text=True, check=False)
    assert listed.returncode == 0
    assert "jsonl" in listed.stdout


HEADER_ARGS = {"provider": "p", "model": "m", "cwd": "/", "environment_identity": "e"}


def test_an_unknown_header_key_is_named_when_it_is_a_short_word(cli: Any, tmp_path: Path) -> None:
    secret = "sk-proj-" + "Q7x9" * 12  # a key-shaped string as a key: never shown whole
    for key, named in (("x", "['x']"), ("enviroment_identity", "['enviroment_identity']"), (secret, None)):
        path = tmp_path / "s.jsonl"
        header = json.loads(sessionlog.encode_header(**HEADER_ARGS))
        header[key] = 1
        path.write_text(json.dumps(header) + "\n")
        run = cli("verify", path)
        assert run.code == 1, run.err
        assert "unknown header keys" in run.err, run.err
        if named is None:
            assert secret not in run.err and secret[:20] not in run.err, run.err
        else:
            assert f"unknown header keys {named}" in run.err, run.err

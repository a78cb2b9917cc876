"""The file backends' specifics, beyond the generic suite: atomic create, paths, modes, syncs,
short writes, one write per transaction, torn-tail repair only after a clean prefix, and the
examples of the README (its ```python blocks must run; ```py blocks are sketches)."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

import sessionlog
from sessionlog.core import facts
from sessionlog.testing import SNAPSHOT, RecordingOps, Script, agent_turn, committed_lines

FILE_BACKENDS = ["jsonl", "jsonl-fsync"]
DOCS = Path(__file__).resolve().parents[1] / "README.md"


def create(path: Path, backend: str = "jsonl", **options: Any) -> sessionlog.SessionStore:
    return sessionlog.create(path, backend=backend, provider="openrouter", model="test/model", **options)


def listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


# -- atomic create -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_create_links_a_complete_temp_file_into_place(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "s.jsonl"
    seen: dict[str, Any] = {}

    class Watching(RecordingOps):
        def link(self, source: Any, target: Any) -> None:
            seen["temp"] = Path(source).read_bytes()
            seen["existed"] = os.path.lexists(target)
            super().link(source, target)

    ops = Watching()
    with create(path, backend, ops=ops) as store:
        header = path.read_bytes()
        assert seen == {"temp": header, "existed": False}  # the name appears holding the whole header
        assert listing(tmp_path) == ["s.jsonl"]  # no temp file left
        assert store.load().last_seq == 0
    sync = ["fsync"] if backend == "jsonl-fsync" else []
    directory = ["fsync_directory"] if backend == "jsonl-fsync" else []
    expected = ["open", "write", *sync, "link", "unlink", *directory]
    assert ops.log[: len(expected)] == expected


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_create_refuses_an_existing_session_and_leaves_it_alone(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "s.jsonl"
    with create(path, backend) as store:
        store.commit([facts.user_message("mine")])
    before = path.read_bytes()
    with pytest.raises(sessionlog.SessionExistsError) as caught:
        create(path, backend)
    assert isinstance(caught.value, FileExistsError) and str(path) in str(caught.value)
    assert path.read_bytes() == before and listing(tmp_path) == ["s.jsonl"]


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_create_that_loses_the_race_at_link_is_an_exists_error(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "s.jsonl"

    class Racing(RecordingOps):
        def link(self, source: Any, target: Any) -> None:
            Path(target).write_bytes(b"the other writer's session\n")  # created meanwhile
            super().link(source, target)

    with pytest.raises(sessionlog.SessionExistsError):
        create(path, backend, ops=Racing())
    assert path.read_bytes() == b"the other writer's session\n" and listing(tmp_path) == ["s.jsonl"]


@pytest.mark.parametrize(
    ("backend", "failing"),
    [("jsonl", "write"), ("jsonl", "link"), ("jsonl-fsync", "write"), ("jsonl-fsync", "fsync")],
)
def test_a_failed_create_leaves_nothing_behind(tmp_path: Path, backend: str, failing: str) -> None:
    ops = RecordingOps()
    ops.fail(failing)
    with pytest.raises(OSError, match=f"injected {failing} failure") as caught:
        create(tmp_path / "s.jsonl", backend, ops=ops)
    assert not isinstance(caught.value, sessionlog.SessionExistsError)
    assert listing(tmp_path) == []  # neither the session nor its temp file
    assert ops.calls["close"] == 1  # and the temp file's descriptor is closed


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_the_session_file_is_mode_0600(tmp_path: Path, backend: str) -> None:
    old = os.umask(0)
    try:
        with create(tmp_path / "s.jsonl", backend):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "s.jsonl").stat().st_mode) == 0o600


# -- paths ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_a_symlink_is_refused(tmp_path: Path, backend: str) -> None:
    target = tmp_path / "real.jsonl"
    with create(target, backend):
        pass
    before = target.read_bytes()
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    with pytest.raises(sessionlog.SessionPathError) as caught:
        sessionlog.open(link, backend=backend)
    assert caught.value.errno == errno.ELOOP and "symlink" in str(caught.value)
    with pytest.raises(sessionlog.SessionPathError, match="symlink"):
        create(link, backend)
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(tmp_path / "nowhere.jsonl")
    with pytest.raises(sessionlog.SessionPathError):
        create(dangling, backend)
    assert not (tmp_path / "nowhere.jsonl").exists() and target.read_bytes() == before


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_a_directory_is_refused(tmp_path: Path, backend: str) -> None:
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    with pytest.raises(sessionlog.SessionPathError, match="directory"):
        sessionlog.open(folder, backend=backend)
    with pytest.raises(sessionlog.SessionPathError, match="directory"):
        create(folder, backend)
    assert listing(folder) == []


def test_a_fifo_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(sessionlog.SessionPathError, match="not a regular file"):
        sessionlog.open(fifo)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file: permissions cannot be tested")
def test_an_unreadable_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with create(path):
        pass
    path.chmod(0)
    with pytest.raises(sessionlog.SessionPathError) as caught:
        sessionlog.open(path)
    assert caught.value.errno == errno.EACCES


def test_a_permission_error_is_a_path_error(tmp_path: Path) -> None:
    """The same refusal as above, reached as root too (root opens every file)."""
    path = tmp_path / "s.jsonl"
    with create(path):
        pass

    class Denied(RecordingOps):
        def open(self, path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))

    with pytest.raises(sessionlog.SessionPathError, match="Permission denied") as caught:
        sessionlog.open(path, ops=Denied())
    assert caught.value.errno == errno.EACCES and isinstance(caught.value.__cause__, PermissionError)


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_missing_files_and_folders_are_not_found(tmp_path: Path, backend: str) -> None:
    for call in (
        lambda: sessionlog.open(tmp_path / "missing.jsonl", backend=backend),
        lambda: sessionlog.open(tmp_path / "no-folder" / "s.jsonl", backend=backend),
        lambda: create(tmp_path / "no-folder" / "s.jsonl", backend),
    ):
        with pytest.raises(sessionlog.SessionNotFoundError) as caught:
            call()
        assert isinstance(caught.value, FileNotFoundError)
    assert listing(tmp_path) == []


def test_unknown_backend_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="bogus"):
        create(tmp_path / "s.jsonl", bogus=True)
    assert listing(tmp_path) == []


# -- syncs ---------------------------------------------------------------------------------------


def test_jsonl_fsync_syncs_the_file_and_the_directory_at_create_and_fdatasyncs_each_commit(
    tmp_path: Path,
) -> None:
    ops = RecordingOps()
    with create(tmp_path / "s.jsonl", "jsonl-fsync", ops=ops) as store:
        assert (ops.calls["fsync"], ops.calls["fsync_directory"], ops.calls["fdatasync"]) == (1, 1, 0)
        assert ops.synced_directories == [tmp_path]
        for index in range(5):
            store.commit([facts.user_message(f"m{index}")])
            assert ops.log[-2:] == ["write", "fdatasync"]  # synced before the commit returned
        assert (ops.calls["fsync"], ops.calls["fsync_directory"], ops.calls["fdatasync"]) == (1, 1, 5)


def test_jsonl_never_syncs(tmp_path: Path) -> None:
    ops = RecordingOps()
    path = tmp_path / "s.jsonl"
    with create(path, "jsonl", ops=ops) as store:
        Script(agent_turn()).run(store)
    with path.open("ab") as file:
        file.write(b'{"torn')
    with sessionlog.open(path, ops=ops) as store:
        store.commit([facts.user_message("after the repair")])
    assert ops.calls["ftruncate"] == 1 and ops.syncs() == 0


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_torn_tail_cut_is_synced_in_the_power_class(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "s.jsonl"
    with create(path, backend) as store:
        store.commit([facts.user_message("kept")])
    committed = path.read_bytes()
    path.write_bytes(committed + b'{"kind":"entry","se')
    ops = RecordingOps()
    with sessionlog.open(path, backend=backend, ops=ops):
        assert path.read_bytes() == committed  # cut before any append
        expected = ["ftruncate", "fsync"] if backend == "jsonl-fsync" else ["ftruncate"]
        assert [name for name in ops.log if name in ("ftruncate", "fsync", "fdatasync")] == expected


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_torn_tail_of_a_corrupted_file_is_left_byte_for_byte(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "s.jsonl"
    with create(path, backend) as store:
        store.commit([facts.user_message("kept")])
    broken = path.read_bytes() + b"not json\n" + b'{"kind":"entry","se'
    path.write_bytes(broken)
    ops = RecordingOps()
    with pytest.raises(sessionlog.CorruptionError) as caught:
        sessionlog.open(path, backend=backend, ops=ops)
    assert (caught.value.code, caught.value.line) == ("MALFORMED_JSON", 3)
    assert path.read_bytes() == broken and ops.calls["ftruncate"] == 0 and ops.calls["write"] == 0
    assert ops.calls["close"] == 1  # the refused file is not held open


# -- writes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_short_writes_are_looped(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "s.jsonl"
    ops = RecordingOps(max_write=1)  # the kernel takes one byte per call
    with create(path, backend, ops=ops) as store:
        header_writes = ops.calls["write"]
        assert header_writes == len(path.read_bytes())
        committed = store.commit([facts.user_message("é ✓ 漢字"), facts.user_message("two")])
        line = committed_lines(path.read_bytes())[1] + b"\n"
        assert ops.calls["write"] - header_writes == len(line)
        assert orjson.loads(line) == committed
        state = store.load()
    assert sessionlog.reduce_bytes(path.read_bytes()) == state


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_one_write_per_transaction(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "s.jsonl"
    ops = RecordingOps()
    with create(path, backend, ops=ops) as store:
        for size in (1, 2, 7):
            before = len(ops.writes)
            store.commit([facts.user_message(f"{size}:{index}") for index in range(size)])
            assert len(ops.writes) == before + 1
            (written,) = ops.writes[before:]
            assert written.endswith(b"\n") and written.count(b"\n") == 1  # the record and its LF together
            assert path.read_bytes().endswith(written)


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_the_store_closes_its_file_once(tmp_path: Path, backend: str) -> None:
    ops = RecordingOps()
    store = create(tmp_path / "s.jsonl", backend, ops=ops)
    store.close()
    store.close()
    assert ops.calls["close"] == 1


def test_a_poisoned_store_names_the_failure(tmp_path: Path) -> None:
    ops = RecordingOps()
    store = create(tmp_path / "s.jsonl", "jsonl-fsync", ops=ops)
    ops.fail("fdatasync")
    with pytest.raises(sessionlog.StorePoisonedError) as caught:
        store.commit([facts.user_message("maybe")])
    assert isinstance(caught.value.__cause__, OSError) and "seq 1" in str(caught.value)
    assert store.poisoned
    store.close()


# -- the cross-process lock is the default ----------------------------------------------------------

_HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("holding", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("backend", FILE_BACKENDS)
def test_the_lock_is_taken_by_default_and_skipping_it_is_named_unsafe(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "s.jsonl"
    with create(path, backend):
        pass
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        with pytest.raises(sessionlog.SessionLockedError, match=re.escape(str(path))):
            sessionlog.open(path, backend=backend)
        with pytest.raises(TypeError, match="unsafe_no_lock"):
            sessionlog.open(path, backend=backend, lock=False)
        with sessionlog.open(path, backend=backend, unsafe_no_lock=True) as store:  # at the caller's risk
            store.commit([facts.user_message("unlocked writer")])
    finally:
        holder.communicate("", timeout=30)
    with sessionlog.open(path, backend=backend) as store:  # released with the holder
        assert store.load().last_seq == 1


# -- the chapter's hands-on check, and the docs' examples ------------------------------------------


def test_hands_on_only_lf_terminated_lines_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # The same code as "Try it" in docs/stores.md.
    header = sessionlog.encode_header(
        cwd="/workspace", provider="openrouter", model="test/model", environment_identity="demo"
    )
    fact = facts.user_message("hello") | {"seq": 1, "timestamp": 1710000000001}
    transaction = orjson.dumps(fact) + b"\n"
    torn = orjson.dumps(facts.user_message("lost") | {"seq": 2, "timestamp": 1710000000002})
    session = Path("demo.jsonl")
    session.write_bytes(header + transaction + torn[: len(torn) // 2])  # the crash cut the last line

    state = sessionlog.reduce_bytes(session.read_bytes())
    assert state.last_seq == 1  # the half line is not a fact
    assert state.repaired_length == len(header + transaction)  # everything after the last LF is torn
    with sessionlog.open(session) as store:  # opening cuts the torn tail...
        (next_fact,) = store.commit([facts.user_message("next")])  # ...and appends continue
    assert next_fact["seq"] == 2
    assert session.read_bytes().startswith(header + transaction)
    assert [message["content"] for message in sessionlog.reduce_bytes(session.read_bytes()).transcript] == [
        "hello",
        "next",
    ]


def agent_loop_example() -> sessionlog.SessionState:
    """The same code as the agent-loop example of docs/stores.md."""
    zero = "sha256:" + "0" * 64
    snapshot = {  # what the model attempt runs under; its digest goes into the log
        "adapterIdentity": "openrouter:chat-completions:v1",
        "model": "test/model",
        "outputOptionsDigest": zero,
        "routingIdentity": "openrouter:test/model",
        "systemPromptDigest": zero,
        "tools": [{"name": "read", "definitionDigest": zero}],
    }

    def call_model(context: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
        if context[-1]["role"] == "user":  # a stand-in for the provider request
            return None, [facts.tool_call("call_1", "read", '{"path": "README.md"}')]
        return "README.md starts with a title.", []

    def run_tool(name: str, arguments: dict[str, Any]) -> str:  # a stand-in for the tool
        return "# sessionlog"

    with sessionlog.create(
        "session.jsonl", backend="jsonl-fsync", provider="openrouter", model="test/model"
    ) as store:
        # 1. Accept the prompt: once this line is durable, the work is accepted.
        user, run = store.commit(facts.accept_prompt("What does README.md start with?"))
        operation_id, context_id = run["record"]["operationId"], user["id"]
        environment = store.load().header["environmentIdentity"]
        while True:
            # 2. The attempt is durable before the request is sent.
            (attempt,) = store.commit([facts.step_attempt(operation_id, context_id, snapshot)])
            step_id, attempt_id = attempt["record"]["stepId"], attempt["record"]["attemptId"]
            content, calls = call_model(store.load().active_context)
            # 3. The answer settles the attempt; its usage goes in the same transaction.
            assistant, _ = store.commit(
                [
                    facts.assistant_message(step_id, attempt_id, content, tool_calls=calls),
                    facts.usage(operation_id, {"input": 812, "output": 40}, attempt_id=attempt_id),
                ]
            )
            if not calls:
                break
            for index, call in enumerate(calls):
                arguments = json.loads(call["function"]["arguments"])
                # 4. The intent is durable before the tool runs; it reserves the result's id.
                (started,) = store.commit(
                    [
                        facts.tool_started(
                            operation_id, step_id, assistant["id"], index, call, arguments,
                            replay="safe", replay_key="builtin:read:v1", environment_identity=environment,
                        )
                    ]
                )  # fmt: skip
                output = run_tool(call["function"]["name"], arguments)
                # 5. The result, under the reserved id.
                (result,) = store.commit([facts.tool_result(started, output)])
                context_id = result["id"]
        # 6. Finish the run.
        store.commit(
            [
                facts.operation_finished(
                    operation_id, "run", "completed", completion="normal", final_entry_id=assistant["id"]
                )
            ]
        )
        return store.load()


def test_agent_loop_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    state = agent_loop_example()
    assert state.is_idle and state.usage.input == 2 * 812
    assert [message["role"] for message in state.transcript] == ["user", "assistant", "tool", "assistant"]
    assert state.transcript[-1]["content"] == "README.md starts with a title."
    assert sessionlog.plan_recovery(
        sessionlog.reduce_bytes(Path("session.jsonl").read_bytes()),
        {
            "configurationDigest": sessionlog.configuration_digest(SNAPSHOT),
            "environmentIdentity": ".",
            "tools": [],
        },
    ) == {"type": "finish", "outcome": "completed", "completion": "normal"}


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


PAGES = [page for page in sorted((DOCS.parent / "docs").glob("*.md")) if "```python" in page.read_text()]


@pytest.mark.parametrize("page", [DOCS, *PAGES], ids=lambda page: page.name)
def test_the_documented_python_examples_run_in_any_directory(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every ```python block of the README and of each docs/ page runs, from a directory of its
    own, and writes nothing outside it (no `sqlite:///` example lands at the filesystem root)."""
    blocks = [block for block in _python_blocks(page.read_text()) if "class TestMine" not in block]
    root_before = set(os.listdir("/"))
    for number, block in enumerate(blocks):
        here = tmp_path / f"block-{number}"
        here.mkdir()
        monkeypatch.chdir(here)
        exec(compile(block, str(page), "exec"), {"__name__": "docs_example"})
    assert set(os.listdir("/")) == root_before
    if page == DOCS:
        assert len(blocks) >= 1  # the quick start; the rest is in docs/, run here too
    for database in tmp_path.glob("block-*/*.db"):
        assert database.stat().st_mode & 0o077 == 0, f"{database} is readable by others"

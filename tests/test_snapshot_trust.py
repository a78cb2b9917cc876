"""Issue 38, items 1 and 2: a snapshot is trusted only when this user's key signed it and the
state it restores ends where the log's covered part does; its file is opened without waiting.

* (1a) A snapshot whose body was edited (a prompt changed to another of the same length, the
  pickle's framing intact) and signed again by someone without this user's key loaded the edited
  prompt, while `verify`, `list()` and `export()` showed the log's: now it is ignored.
* (1b) A snapshot whose state had `next_seq` two lower (made with `core.snapshot.encode`, signed
  with this user's own key: a bug, not a forgery) made a commit write seq 4 where 6 was due,
  which every full load then refused (SEQ_MISMATCH): now such a state is never restored.
* (2) A FIFO where the snapshot goes hung `open()` for ever (its open(2) waited for a writer).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest

import sessionlog
from sessionlog.backends.side_files import snapshot_path
from sessionlog.core import facts as F
from sessionlog.core import snapshot, snapshot_key
from sessionlog.core import store as store_module
from sessionlog.core.loading import load
from test_snapshots import resigned

HEADER = {"provider": "p", "model": "m", "cwd": "/w"}
PROMPT = "deploy v1 to staging"
EDITED = "deploy v9 to prod!!!"  # the same length: the pickle's framing stays intact


def session(directory: Path) -> tuple[Path, str]:
    """A directory repository's session with a prompt and a few messages, and a snapshot of it
    made by its writer (this user's key)."""
    repo = sessionlog.repository(directory)
    store = repo.create(**HEADER)
    session_id = store.header["id"]
    store.commit([F.user_message(PROMPT)])
    for index in range(4):
        store.commit([F.user_message(f"message {index}")])
    assert store.write_snapshot()
    store.close()
    return directory / f"{session_id}.jsonl", session_id


def prompts(state: sessionlog.SessionState) -> list[str]:
    return [message["content"] for message in state.transcript]


def test_a_snapshot_signed_with_another_key_is_ignored(tmp_path: Path) -> None:
    path, session_id = session(tmp_path)
    blob = snapshot_path(path).read_bytes()
    assert PROMPT.encode() in blob
    edited = blob.replace(PROMPT.encode(), EDITED.encode())
    foreign = resigned(edited, key=os.urandom(snapshot_key.KEY_BYTES))  # a valid MAC, another key
    snapshot_path(path).write_bytes(foreign)
    with sessionlog.open(path) as store:
        assert store.snapshot_lines == 0  # not used
        assert prompts(store.load())[0] == PROMPT
    assert prompts(sessionlog.repository(tmp_path).load(session_id))[0] == PROMPT
    # the same edit signed with this user's key is restored: the key is what is trusted
    snapshot_path(path).write_bytes(resigned(edited))
    assert prompts(sessionlog.repository(tmp_path).load(session_id))[0] == EDITED


def test_an_unsigned_snapshot_of_the_earlier_format_is_ignored(tmp_path: Path) -> None:
    """Format 1 had no MAC: its body's sha256 in the meta line, which anyone can recompute."""
    path, _ = session(tmp_path)
    signed = snapshot_path(path).read_bytes().split(b"\n", 2)[2]
    meta, _, body = signed.partition(b"\n")
    old = {**orjson.loads(meta), "format": 1, "body": hashlib.sha256(body).hexdigest()}
    snapshot_path(path).write_bytes(snapshot.MAGIC + orjson.dumps(old) + b"\n" + body)
    with sessionlog.open(path) as store:
        assert store.snapshot_lines == 0


def test_a_signed_state_that_does_not_end_where_the_log_does_is_never_restored(tmp_path: Path) -> None:
    path, _ = session(tmp_path)
    data = path.read_bytes()
    reducer = load(data)[0]
    assert reducer.next_seq == 6
    reducer.next_seq -= 2  # a bug's snapshot, signed with this user's own key
    snapshot_path(path).write_bytes(snapshot.encode(reducer, data, len(data)))
    with sessionlog.open(path) as store:
        assert store.snapshot_lines == 0  # not used: its state ends at seq 3, the log at 5
        (fact,) = store.commit([F.user_message("after")])
    assert fact["seq"] == 6
    assert sessionlog.reduce_bytes(path.read_bytes()).last_seq == 6  # the full load agrees


def test_a_forgotten_fact_id_is_never_restored_either(tmp_path: Path) -> None:
    path, _ = session(tmp_path)
    data = path.read_bytes()
    reducer = load(data)[0]
    last_id = orjson.loads(data.rstrip(b"\n").rpartition(b"\n")[2])["id"]
    reducer.ids.discard(last_id)  # the id would be accepted again: a duplicate written
    snapshot_path(path).write_bytes(snapshot.encode(reducer, data, len(data)))
    with sessionlog.open(path) as store:
        assert store.snapshot_lines == 0


def test_the_key_is_made_by_the_first_snapshot_0600_in_a_0700_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("SESSIONLOG_STATE_DIR", str(state))
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    with sessionlog.create(sessions / "a.jsonl", **HEADER) as store:
        store.commit([F.user_message(PROMPT)])
        assert not state.exists()  # nothing made by opening or committing
        assert store.write_snapshot()
    key = state / snapshot_key.KEY_FILE
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert len(bytes.fromhex(key.read_text().strip())) == snapshot_key.KEY_BYTES
    assert sorted(os.listdir(state)) == [snapshot_key.KEY_FILE]  # no temporary left
    with sessionlog.open(sessions / "a.jsonl") as store:
        assert store.snapshot_lines == 2


def test_a_read_never_makes_a_key_and_trusts_no_snapshot_without_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, session_id = session(tmp_path / "sessions")
    state = tmp_path / "elsewhere"
    monkeypatch.setenv("SESSIONLOG_STATE_DIR", str(state))  # another user: no key yet
    assert prompts(sessionlog.repository(tmp_path / "sessions").load(session_id))[0] == PROMPT
    assert not state.exists()
    with sessionlog.open(path) as store:
        assert store.snapshot_lines == 0  # made with a key this user does not have


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o666], ids=["0640", "0604", "0666"])
def test_a_key_others_may_read_or_write_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, mode: int
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("SESSIONLOG_STATE_DIR", str(state))
    path, _ = session(tmp_path / "sessions")
    (state / snapshot_key.KEY_FILE).chmod(mode)
    with caplog.at_level(logging.WARNING, logger="sessionlog.snapshot"), sessionlog.open(path) as store:
        assert store.snapshot_lines == 0
        assert not store.write_snapshot() and store.snapshot_failures == 1
    assert f"mode {mode:04o}" in caplog.text and "snapshots are not used" in caplog.text


def test_a_key_file_that_holds_no_key_is_never_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setenv("SESSIONLOG_STATE_DIR", str(state))
    key = state / snapshot_key.KEY_FILE
    key.write_text("not a key\n")
    key.chmod(0o600)
    with (
        caplog.at_level(logging.WARNING, logger="sessionlog.snapshot"),
        sessionlog.create(tmp_path / "a.jsonl", **HEADER) as store,
    ):
        assert not store.write_snapshot()
    assert key.read_text() == "not a key\n"
    assert "does not hold 32 bytes in hex" in caplog.text


def test_two_processes_making_the_key_at_once_agree_on_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key is linked into place: the second maker reads the first's (the race is forced by
    making the second's temporary after the first linked)."""
    monkeypatch.setenv("SESSIONLOG_STATE_DIR", str(tmp_path))
    real_link = os.link
    made: list[bytes] = []

    def link_after_another(source: str, target: str) -> None:
        if not made:
            made.append(b"")
            made[0] = snapshot_key.make_key()  # another process wins meanwhile
        real_link(source, target)

    monkeypatch.setattr(snapshot_key.os, "link", link_after_another)
    assert snapshot_key.make_key() == made[0]
    assert sorted(os.listdir(tmp_path)) == [snapshot_key.KEY_FILE]


# -- item 2: a snapshot path that blocks on open ---------------------------------------------------


def test_a_fifo_where_the_snapshot_goes_never_blocks_an_open(tmp_path: Path) -> None:
    path, session_id = session(tmp_path)
    snapshot_path(path).unlink()
    os.mkfifo(snapshot_path(path))
    script = textwrap.dedent(
        f"""
        import sessionlog
        with sessionlog.open({str(path)!r}) as store:
            print(len(store.load().transcript))
        print(len(sessionlog.repository({str(tmp_path)!r}).load({session_id!r}).transcript))
        """
    )
    # a bound for the failure (before the fix it waited for ever), never a measure of time
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["5", "5"]
    assert stat.S_ISFIFO(os.lstat(snapshot_path(path)).st_mode)  # left as it was


# -- found by a review: a log changed under its open writer ------------------------------------------


def _written_under(path: Path, change: Any) -> sessionlog.SessionStore:
    """A store of a long session at `path` (its close writes a snapshot), whose log `change`
    edits in place while the store is open (the same length: its appends do not notice)."""
    store = sessionlog.create(path, **HEADER)
    store.commit([F.user_message(PROMPT)])
    for index in range(snapshot.MIN_LINES + 100):
        store.commit([F.user_message(f"message {index}")])
    data = path.read_bytes()
    changed = change(data)
    assert len(changed) == len(data)
    fd = os.open(path, os.O_WRONLY)
    os.pwrite(fd, changed, 0)
    os.close(fd)
    return store


def test_no_snapshot_is_written_of_a_log_changed_under_its_writer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer's memory still held the old prompt: a snapshot of it, signed, made every later
    load disagree with the log. A snapshot is written only of the bytes its writer knows (read
    at open, then appended: their sha256, checked at the close)."""
    path = tmp_path / "a.jsonl"
    store = _written_under(path, lambda data: data.replace(PROMPT.encode(), EDITED.encode()))
    with caplog.at_level(logging.WARNING, logger="sessionlog.snapshot"):
        store.close()
    assert store.snapshot_failures == 1 and "the log changed under its writer" in caplog.text
    assert not snapshot_path(path).exists()
    assert prompts(sessionlog.reduce_bytes(path.read_bytes()))[0] == EDITED
    with sessionlog.open(path) as store:
        assert prompts(store.load())[0] == EDITED  # what every full load says
    with sessionlog.open(path) as store:  # the close above wrote a snapshot of the log as it is
        assert store.snapshot_lines > 0 and prompts(store.load())[0] == EDITED


def test_a_log_damaged_under_its_writer_gets_no_snapshot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "a.jsonl"
    first = PROMPT.encode()
    store = _written_under(path, lambda data: data.replace(first, b"\x00" + first[1:], 1))
    with caplog.at_level(logging.WARNING, logger="sessionlog.snapshot"):
        store.close()
    assert store.snapshot_failures == 1 and "could not be written" in caplog.text
    assert not snapshot_path(path).exists()
    with pytest.raises(sessionlog.CorruptionError):  # as every full load says
        sessionlog.open(path)


def test_without_a_usable_key_no_snapshot_work_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every close of a long session pickled its state, then failed to sign it; and warned of
    the same key on every open and close."""
    state = tmp_path / "state"
    state.write_text("a file where the key's folder goes")
    monkeypatch.setenv("SESSIONLOG_STATE_DIR", str(state))

    encoded: list[Any] = []
    monkeypatch.setattr(store_module, "encode", lambda *args, **kwargs: encoded.append(args))
    path = tmp_path / "a.jsonl"
    with caplog.at_level(logging.WARNING, logger="sessionlog.snapshot"):
        for _ in range(3):
            with sessionlog.create(path, **HEADER, exist_ok=True) as store:
                for index in range(snapshot.MIN_LINES + 10):
                    store.commit([F.user_message(f"message {index}")])
    warned = [record.getMessage() for record in caplog.records if "snapshot key" in record.getMessage()]
    assert len(warned) == 1 and str(state) in warned[0]  # once a process, naming the place
    assert encoded == []  # nothing pickled for a snapshot no key could sign


@pytest.mark.parametrize("variable", ["XDG_STATE_HOME", "HOME"])
def test_a_relative_or_empty_state_folder_is_never_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    """A relative XDG_STATE_HOME (the XDG spec says to ignore it) or an empty HOME would put the
    key in the current folder (a session folder, which travels) or at /."""
    monkeypatch.delenv("SESSIONLOG_STATE_DIR")
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", "" if variable == "HOME" else str(tmp_path / "home"))
    if variable == "XDG_STATE_HOME":
        monkeypatch.setenv("XDG_STATE_HOME", "relative/state")
    monkeypatch.chdir(tmp_path)
    found = snapshot_key.key_path()
    if variable == "HOME":
        assert found is None
        with pytest.raises(snapshot_key.SnapshotKeyError, match="no folder for the snapshot key"):
            snapshot_key.make_key()
    else:
        assert found == tmp_path / "home" / ".local" / "state" / "sessionlog" / snapshot_key.KEY_FILE
        snapshot_key.make_key()
        assert found.exists() and not (tmp_path / "relative").exists()

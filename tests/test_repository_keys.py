"""Caller keys, where each kind keeps them (the shared semantics: testing/repository_keys.py, run
for every kind by the repository contract): a directory's key records outlive its index, a lost
race discards only its own session, a SQLite file of the schema before keys migrates, the agent
loop and the CLI take keys."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from sessionlog.repositories import directory_keys
from sessionlog.repositories.index import INDEX_NAME
from sessionlog.repositories.keys import KeySessions
from sessionlog.repositories.schema import migrate
from sessionlog.repositories.sqlite import SCHEMA_VERSION, STEPS

HEADER: dict[str, Any] = {"provider": "openrouter", "model": "test/model", "cwd": "/w"}


def _id(store: Any) -> str:
    return str(store.load().session_id)


def test_a_directorys_keys_outlive_its_index(tmp_path: Path) -> None:
    with sessionlog.repository(tmp_path) as repo:
        with repo.create(**HEADER, key="user-42") as store:
            first = _id(store)
        with repo.replace("user-42", **HEADER) as store:
            second = _id(store)
    for leftover in tmp_path.glob(f"{INDEX_NAME}*"):
        leftover.unlink()  # the index is a cache: gone, it is made again
    with sessionlog.repository(tmp_path) as repo:
        assert repo.key_sessions("user-42") == KeySessions("user-42", second, (first,))
        assert {row.session_id: (row.key, row.replaced) for row in repo.list()} == {
            first: ("user-42", True),
            second: ("user-42", False),
        }
        with repo.create(**HEADER, key="user-42") as store:
            assert _id(store) == second


def test_a_directorys_key_records_are_private_whole_files(tmp_path: Path) -> None:
    with sessionlog.repository(tmp_path) as repo, repo.create(**HEADER, key="k") as store:
        session_id = _id(store)
    folder = tmp_path / directory_keys.KEYS_DIRECTORY
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    (record,) = folder.iterdir()
    assert record.name == f"{directory_keys.digest('k')}.1"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert json.loads(record.read_bytes()) | {"created_at": 0} == {
        "key": "k",
        "session_id": session_id,
        "generation": 1,
        "created_at": 0,
    }


def test_a_process_that_loses_the_race_keeps_only_the_winners_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process links the key's first record between this one's look and its link: this
    one's new session is discarded and the winner's opened (no second session of the key)."""
    with sessionlog.repository(tmp_path) as repo:
        with repo.create(**HEADER) as store:
            winner = _id(store)
        real = directory_keys.KeyRecords.link
        calls = []

        def racing(records: Any, key: str, generation: int, session_id: str) -> bool:
            if not calls:  # the other process links first
                calls.append(session_id)
                assert real(records, key, generation, winner)
            return real(records, key, generation, session_id)

        monkeypatch.setattr(directory_keys.KeyRecords, "link", racing)
        with repo.create(**HEADER, key="raced") as store:
            assert _id(store) == winner
        assert [row.session_id for row in repo.list()] == [winner]
        assert not repo.path(calls[0]).exists()


def test_debris_of_a_killed_bind_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    sessionlog.repository(tmp_path).close()
    folder = tmp_path / directory_keys.KEYS_DIRECTORY
    folder.mkdir()
    name = directory_keys.digest("k") + ".1"
    dead = folder / f".{name}.999999999.0123456789ab.linking"
    live = folder / f".{name}.{os.getpid()}.0123456789ab.linking"
    dead.write_text("{}")
    live.write_text("{}")
    with sessionlog.repository(tmp_path) as repo:
        assert not dead.exists() and live.exists()
        assert repo.key_sessions("k") is None


def test_a_sqlite_file_of_the_schema_before_keys_migrates(tmp_path: Path) -> None:
    """A database at schema version 3 (the last before keys), made here by its own steps with a
    session in it, opens at the current version; its session has no key, new ones take keys."""
    path = tmp_path / "old.db"
    with sessionlog.repository(f"sqlite:///{path}") as repo, repo.create(**HEADER) as store:
        old = _id(store)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as connection:
        connection.executescript("drop table session_keys; update schema_version set version = 3;")
        assert migrate(_transaction(connection), STEPS[:3], path) == 3  # already at 3: nothing run
    with sessionlog.repository(f"sqlite:///{path}") as repo:
        with repo.create(**HEADER, key="new") as store:
            keyed = _id(store)
        assert {row.session_id: row.key for row in repo.list()} == {old: None, keyed: "new"}
    with contextlib.closing(sqlite3.connect(path)) as connection:
        assert connection.execute("select version from schema_version").fetchall() == [(SCHEMA_VERSION,)]


def _transaction(connection: sqlite3.Connection) -> Any:
    @contextlib.contextmanager
    def transaction() -> Any:
        connection.execute("begin immediate")
        yield connection
        connection.execute("commit")

    return transaction


@pytest.mark.parametrize("kind", ["directory", "sqlite"])
def test_the_agent_loop_by_key(tmp_path: Path, kind: str) -> None:
    location = str(tmp_path / "d") if kind == "directory" else f"sqlite:///{tmp_path / 's.db'}"
    with sessionlog.repository(location) as repo:
        first = repo.session(key="thread-7", tools=[], model="m")
        session_id = first.store.load().session_id
        first.store.close()
        again = repo.session(key="thread-7", tools=[], model="m")
        assert again.store.load().session_id == session_id
        again.store.close()
        with pytest.raises(TypeError, match="not both"):
            repo.session(session_id, key="thread-7", tools=[], model="m")
        assert repo.list(key="thread-7")[0].key == "thread-7"


def test_ls_by_key(tmp_path: Path, cli: Any) -> None:
    with sessionlog.repository(tmp_path) as repo:
        with repo.create(**HEADER, key="user-\x1b[31m42") as store:
            old = _id(store)
        with repo.replace("user-\x1b[31m42", **HEADER) as store:
            new = _id(store)
        with repo.create(**HEADER):
            pass
    run = cli("ls", tmp_path, "--key", "user-\x1b[31m42")
    assert run.code == 0, run.err
    lines = run.out.splitlines()
    assert [line.split()[0] for line in lines] == [new, old]
    assert lines[0].endswith("key 'user-\\x1b[31m42'") and lines[1].endswith("(replaced)")
    assert "\x1b" not in run.out  # a key is shown escaped
    rows = cli("ls", tmp_path, "--json").json()
    assert {row["session_id"]: (row["key"], row["replaced"]) for row in rows if row["key"]} == {
        old: ("user-\x1b[31m42", True),
        new: ("user-\x1b[31m42", False),
    }
    refused = cli("ls", tmp_path, "--key", "e\u0301")
    assert refused.code == 2 and "not in NFC" in refused.err and refused.out == ""


def test_a_damaged_key_record_is_ignored_and_never_blocks_a_bind(tmp_path: Path) -> None:
    """A record file that is not one sessionlog wrote (truncated, another key's text) names no
    session; the key's next session takes the generation after it (a link there would fail
    forever)."""
    sessionlog.repository(tmp_path).close()
    folder = tmp_path / directory_keys.KEYS_DIRECTORY
    folder.mkdir()
    (folder / f"{directory_keys.digest('k')}.1").write_text('{"key": "k", "sess')
    with sessionlog.repository(tmp_path) as repo:
        assert repo.key_sessions("k") is None
        with repo.create(**HEADER, key="k") as store:
            session_id = _id(store)
        assert repo.key_sessions("k") == KeySessions("k", session_id, ())
        assert (folder / f"{directory_keys.digest('k')}.2").exists()
        assert [row.key for row in repo.list()] == ["k"]


def test_a_symlink_in_place_of_the_key_records_folder_is_never_followed(tmp_path: Path) -> None:
    """Key records stay inside the repository: a `.sessionlog-keys` that is a symlink (to a
    folder anywhere) is refused with a typed error, nothing written or removed through it."""
    outside, repository = tmp_path / "outside", tmp_path / "repository"
    outside.mkdir()
    bait = outside / f".{directory_keys.digest('k')}.1.1.{'0' * 12}.linking"  # a dead bind's debris
    bait.write_text("not yours")
    sessionlog.repository(repository).close()
    (repository / directory_keys.KEYS_DIRECTORY).symlink_to(outside)
    with sessionlog.repository(repository) as repo:
        with pytest.raises(sessionlog.RepositoryError, match="no directory"):
            repo.create(**HEADER, key="k")
        with pytest.raises(sessionlog.RepositoryError, match="no directory"):
            repo.list()
        with pytest.raises(sessionlog.RepositoryError, match="no directory"):
            repo.key_sessions("k")
    assert sorted(path.name for path in outside.iterdir()) == [bait.name]  # nothing through it


def test_hostile_record_names_and_bodies_neither_crash_nor_wedge_a_key(tmp_path: Path) -> None:
    """A record nested past any parser's depth is ignored; a generation beyond nine digits is no
    record name (ignored); one at the highest generation is a typed error, never a session made
    and lost."""
    sessionlog.repository(tmp_path).close()
    folder = tmp_path / directory_keys.KEYS_DIRECTORY
    folder.mkdir()
    name = directory_keys.digest("k")
    (folder / f"{name}.1").write_text("[" * 4000 + "]" * 4000)
    (folder / f"{name}.9999999999999999999").write_text("{}")
    with sessionlog.repository(tmp_path) as repo:
        assert repo.key_sessions("k") is None and repo.list() == []
        with repo.create(**HEADER, key="k") as store:
            session_id = _id(store)
        assert repo.key_sessions("k") == KeySessions("k", session_id, ())  # generation 2, read back
        (folder / f"{directory_keys.digest('j')}.{directory_keys.MAX_GENERATION}").write_text("{}")
        with pytest.raises(sessionlog.RepositoryError, match="generations"):
            repo.create(**HEADER, key="j")
        assert [row.session_id for row in repo.list()] == [session_id]  # no session made for j


def test_a_long_key_is_never_echoed_whole_and_a_short_one_is(tmp_path: Path) -> None:
    """An API key passed as a key by mistake stays out of the message (its length and first 8
    characters); a name of at most 16 characters is shown; the error's `key` has it whole."""
    secret = "sk-proj-" + "Q7x_" * 10
    with sessionlog.repository(tmp_path) as repo:
        for wrong in (secret, secret + "\x00", "e\u0301" + secret):
            with pytest.raises((sessionlog.KeyNotFoundError, sessionlog.InvalidKeyError)) as caught:
                repo.open(key=wrong)
            assert "Q7x" not in str(caught.value) and caught.value.key == wrong, str(caught.value)
            assert f"a key of {len(wrong)} characters starting" in str(caught.value)
        with pytest.raises(sessionlog.KeyNotFoundError, match="'user-42'"):
            repo.open(key="user-42")
        with pytest.raises(TypeError, match=r"^replace\(\) needs"):
            repo.replace("user-42", provider="p")

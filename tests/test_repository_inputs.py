"""Locations and inputs checked at the door, for the built-in repositories: SQLite URLs (their
query, a `#SESSION_ID`, `:memory:`), `file:` URLs (a host, no `//`), and the small debris of
failures (a second damaged index, a fork on a full disk). The checks every kind meets are in
the conformance suite (`RepositoryContract`)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import sessionlog
from sessionlog.core import facts as build
from sessionlog.repositories import directory as directory_module
from sessionlog.repositories.index import INDEX_NAME, Index

HEADER = {"provider": "p", "model": "m"}


@pytest.fixture(autouse=True)
def _here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


# -- SQLite URLs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("foo=1", "foo"),
        ("DURABILITY=process", "DURABILITY"),
        ("mode=ro", "mode"),
        ("durability=", "durability"),
        ("durability=process&durability=power", "durability"),
        ("durability", "durability"),
    ],
)
def test_a_sqlite_url_query_is_checked(tmp_path: Path, query: str, named: str) -> None:
    """An unknown key, a key in another case, an empty value or a repeated key is a ValueError
    naming the key and the known ones, never a raw TypeError about a keyword, never a guess."""
    with pytest.raises(ValueError, match=named) as caught:
        sessionlog.repository(f"sqlite:///q.db?{query}")
    assert "durability" in str(caught.value)
    assert not (tmp_path / "q.db").exists()


def test_a_sqlite_url_query_that_is_right_is_taken(tmp_path: Path) -> None:
    with sessionlog.repository("sqlite:///q.db?durability=process") as repo:
        assert repo.info.durability == "process"


def test_a_sqlite_url_naming_a_session_is_refused(tmp_path: Path) -> None:
    """`DB#SESSION_ID` is the command line's form; in Python the session is `repo.open(ID)`. A
    `#` in the file's name is written `%23`."""
    with pytest.raises(ValueError, match=r"repo\.open"):
        sessionlog.repository("sqlite:///r.db#0190a6b2-0000-7000-8000-000000000000")
    assert os.listdir(tmp_path) == []
    with sessionlog.repository("sqlite:///r%23x.db") as repo:
        assert Path(repo.path).name == "r#x.db"
    assert (tmp_path / "r#x.db").is_file()


def test_a_sqlite_url_in_memory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="persist"):
        sessionlog.repository("sqlite:///:memory:")
    assert os.listdir(tmp_path) == []


# -- file: URLs and directories ------------------------------------------------------------------


def test_a_file_url_with_a_host_is_refused(tmp_path: Path) -> None:
    for location in ("file://host/y", "file://example.com/tmp/y"):
        with pytest.raises(ValueError, match="file:///"):
            sessionlog.repository(location)
    assert os.listdir(tmp_path) == []
    with sessionlog.repository(f"file://localhost{tmp_path}/a") as repo:
        assert repo.directory == tmp_path / "a"
    with sessionlog.repository(f"file://{tmp_path}/b") as repo:
        assert repo.directory == tmp_path / "b"


def test_a_directory_named_with_a_colon_is_a_repository(tmp_path: Path) -> None:
    """`file:nope3` (no `//`) is a relative path like any other: its index too (SQLite must not
    read `file:...` as a URI of its own)."""
    with sessionlog.repository("file:nope3") as repo:
        with repo.create(**HEADER, labels=["a"]) as store:
            store.commit(build.accept_prompt("x"))
        assert [row.labels for row in repo.list()] == [("a",)]
    assert (tmp_path / "file:nope3" / INDEX_NAME).is_file()


def test_a_directory_made_by_a_failing_open_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directories this call made are removed when the repository cannot be opened after
    all; one that was there stays."""

    def failing(self: Index, *, create: bool) -> bool:
        raise sessionlog.RepositoryError("open", str(self.path.parent), "the index cannot be made")

    monkeypatch.setattr(Index, "open", failing)
    with pytest.raises(sessionlog.RepositoryError, match="cannot be made"):
        sessionlog.repository("new/deeper/repo")
    assert os.listdir(tmp_path) == []
    (tmp_path / "there").mkdir()
    with pytest.raises(sessionlog.RepositoryError):
        sessionlog.repository("there/repo")
    assert os.listdir(tmp_path) == ["there"]
    assert os.listdir(tmp_path / "there") == []


# -- debris ---------------------------------------------------------------------------------------


def test_a_second_damaged_index_keeps_the_first(tmp_path: Path) -> None:
    """Each damaged index is set aside under a name of its own: the labels of the first can
    still be read after a second one was damaged too."""
    index = tmp_path / "repo" / INDEX_NAME
    with sessionlog.repository("repo"):
        pass
    index.write_bytes(b"first damaged index " * 100)
    with sessionlog.repository("repo"):
        pass
    index.write_bytes(b"second damaged index " * 100)
    with sessionlog.repository("repo"):
        pass
    aside = sorted(path for path in os.listdir(tmp_path / "repo") if ".damaged" in path)
    assert len(aside) == 2, aside
    contents = {(tmp_path / "repo" / name).read_bytes()[:22] for name in aside}
    assert contents == {b"first damaged index fi", b"second damaged index s"}


def test_a_fork_failing_on_a_full_disk_names_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sessionlog.repository("repo") as repo:
        with repo.create(**HEADER) as store:
            store.commit(build.accept_prompt("x"))
            source = store.load().session_id
            at_seq = store.load().last_seq

        def full(path: object, data: bytes) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(directory_module, "write_into_place", full)
        with pytest.raises(sessionlog.RepositoryError) as caught:
            repo.fork(source, at_seq)
        assert caught.value.session_id == source
        assert f"fork of session {source}" in str(caught.value)
        assert "No space left on device" in str(caught.value)
        assert [row.session_id for row in repo.list()] == [source]


# -- PostgreSQL DSN problems -----------------------------------------------------------------------


def test_a_bad_dsn_is_no_errno() -> None:
    """libpq refuses `sslmode=bogus` before connecting: the message is its words, not `[Errno 111]`."""
    pytest.importorskip("psycopg", reason="the PostgreSQL driver is not installed")
    with pytest.raises(sessionlog.SessionLogError) as caught:
        sessionlog.repository("postgresql://u@127.0.0.1:1/db?sslmode=bogus")
    assert "Errno" not in str(caught.value)
    assert "sslmode" in str(caught.value)


def test_file_errors_read_as_their_message(tmp_path: Path) -> None:
    """A repository's OSError subclasses keep errno and path as attributes; their str is the
    message alone, never `[Errno 2] ...: 'path'`."""
    with pytest.raises(sessionlog.RepositoryNotFoundError) as missing:
        sessionlog.repository("nothing-here", create=False)
    assert str(missing.value).startswith("no repository at nothing-here")
    assert missing.value.errno == errno.ENOENT and missing.value.filename == "nothing-here"
    with sessionlog.repository("sqlite:///a.db") as repo:
        with repo.create(**HEADER) as store:
            data = repo.export(store.load().session_id)
        with pytest.raises(sessionlog.SessionExistsError) as exists:
            repo.import_(data)
        assert "Errno" not in str(exists.value) and str(exists.value).startswith("session ")

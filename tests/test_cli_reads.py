"""The read-only commands read a location for what it is, without the user naming the backend:
a SQLite database is read as one (it was refused as "not even the header is valid"), a
directory is answered with how to name one of its sessions, a repository's session is labelled
with the repository's kind (a SQLite repository's said "(jsonl)"), and nothing that is not a
regular file is read (a FIFO would block the reader for good)."""

from __future__ import annotations

import json
import os
import threading
import urllib.parse
from pathlib import Path
from typing import Any

import sessionlog


def _sqlite_repository(path: Path, sessions: int) -> list[str]:
    repo = sessionlog.repository(f"sqlite:///{urllib.parse.quote(str(path))}")
    ids = []
    for _ in range(sessions):
        with repo.create(provider="p", model="m", cwd="/w") as store:
            ids.append(store.load().session_id)
    repo.close()
    return ids


def test_a_sqlite_database_is_read_as_one_without_its_backend_named(cli: Any, tmp_path: Path) -> None:
    database = tmp_path / "sessions.db"
    (session_id,) = _sqlite_repository(database, 1)
    run = cli("inspect", database)
    assert run.code == 0, run.err
    assert f"{database} (sqlite)" in run.out and session_id in run.out
    assert cli("verify", database).code == 0
    run = cli("inspect", database, "--json")
    assert json.loads(run.out)["backend"] == "sqlite"
    run = cli("inspect", f"{database}#{session_id}")  # one session of it, by the backend's own path
    assert run.code == 0 and session_id in run.out


def test_a_database_of_many_sessions_says_how_to_name_one(cli: Any, tmp_path: Path) -> None:
    database = tmp_path / "sessions.db"
    first, _ = _sqlite_repository(database, 2)
    run = cli("verify", database)
    assert run.code != 0 and f"{database}#SESSION_ID" in run.err, run.err
    assert cli("verify", f"{database}#{first}").code == 0


def test_a_repository_session_is_labelled_with_the_repository_kind(cli: Any, tmp_path: Path) -> None:
    database = tmp_path / "sessions.db"
    (session_id,) = _sqlite_repository(database, 1)
    location = f"sqlite:///{database}#{session_id}"
    run = cli("inspect", location)
    assert run.code == 0, run.err
    assert run.out.splitlines()[0] == f"{location} (SQLite repository)"
    assert json.loads(cli("inspect", location, "--json").out)["backend"] == "SQLite repository"
    folder = tmp_path / "folder"
    repo = sessionlog.repository(str(folder))
    with repo.create(provider="p", model="m", cwd="/w") as store:
        other = store.load().session_id
    repo.close()
    assert cli("inspect", f"{folder}#{other}").out.splitlines()[0].endswith("(directory repository)")


def test_a_directory_is_answered_with_how_to_name_a_session(cli: Any, tmp_path: Path) -> None:
    run = cli("inspect", tmp_path)
    assert run.code == 2
    assert f"{tmp_path}#SESSION_ID" in run.err and f"ls {tmp_path}" in run.err


def test_a_fifo_is_refused_not_read(cli: Any, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    done: list[Any] = []
    worker = threading.Thread(target=lambda: done.append(cli("inspect", fifo)), daemon=True)
    worker.start()
    worker.join(20)
    if not done:  # unblock the reader that opened it, so the test ends either way
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert done, "inspect blocked on a FIFO"
    assert done[0].code == 2 and "not a regular file" in done[0].err


def test_a_hash_inside_a_url_is_refused_and_no_part_of_a_password_shown(cli: Any) -> None:
    """Found by review: a '#' inside a password split the URL there, and the suggestion showed
    the password's first part unmasked (`postgresql://bob:pa#SESSION_ID`)."""
    for command in ("inspect", "verify", "plan", "export", "rm"):
        run = cli(command, "postgresql://bob:pa#ssWORD@127.0.0.1:1/db")
        assert run.code == 2, (command, run.err)
        assert "bob:pa" not in run.out + run.err and "ssWORD" not in run.out + run.err, run.err


def test_ls_reads_a_sqlite_database_given_as_a_path(cli: Any, tmp_path: Path) -> None:
    database = tmp_path / "odd#name.db"
    (session_id,) = _sqlite_repository(database, 1)
    run = cli("ls", database)
    assert run.code == 0, run.err
    assert session_id in run.out


def test_a_corrupt_sqlite_database_is_a_bad_session_not_a_usage_error(cli: Any, tmp_path: Path) -> None:
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(b"SQLite format 3\x00" + b"\x07" * 3000)
    run = cli("verify", damaged)
    assert run.code == 1 and "not a usable SQLite database" in run.err, (run.code, run.err)


def test_convert_labels_a_repository_session_by_its_repository(cli: Any, tmp_path: Path) -> None:
    database = tmp_path / "sessions.db"
    (session_id,) = _sqlite_repository(database, 1)
    run = cli("convert", f"sqlite:///{database}#{session_id}", tmp_path / "copy.jsonl", "--to", "jsonl")
    assert run.code == 0, run.err
    assert "(SQLite repository) ->" in run.out


def test_export_into_a_missing_folder_is_a_usage_error_naming_the_file(cli: Any, tmp_path: Path) -> None:
    database = tmp_path / "sessions.db"
    (session_id,) = _sqlite_repository(database, 1)
    target = tmp_path / "nowhere" / "x.jsonl"
    run = cli("export", f"sqlite:///{database}#{session_id}", "-o", target)
    assert run.code == 2 and str(target) in run.err and ".converting" not in run.err, run.err
    assert not target.parent.exists()


def test_import_names_the_file_a_bad_session_came_from(cli: Any, tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    repository = tmp_path / "repo"
    repository.mkdir()
    run = cli("import", repository, empty)
    assert run.code == 1 and str(empty) in run.err and "<bytes>" not in run.err, run.err


def test_inspect_shows_a_long_pending_argument_shortened_and_says_where_it_is_whole(
    cli: Any, tmp_path: Path
) -> None:
    """A tool call's arguments can be megabytes (a file to write): `inspect` is a summary, so it
    shows their start and their size, and names the command that shows them whole."""
    path = tmp_path / "s.jsonl"
    store = sessionlog.create(path, "jsonl", provider="p", model="m", cwd="/w")
    session = sessionlog.Session(store, tools=[sessionlog.Tool("write", lambda arguments: "ok")], model="m")
    run = session.start("go")
    body = "x" * 100_000
    run.attempt().settle(None, [{"id": "1", "name": "write", "arguments": {"body": body}}])
    run.start_tools()[0].begin()  # ... and the process dies
    store.close()
    shown = cli("inspect", path)
    assert shown.code == 0, shown.err
    (line,) = [text for text in shown.out.splitlines() if "write" in text and "arguments" in text]
    assert len(line) < 400 and "100,011 bytes" in line and "sessionlog reduce" in line, line
    assert body in cli("reduce", path).out  # whole there
    assert body in cli("inspect", path, "--json").out


def test_a_database_whose_name_holds_a_hash_is_read_as_itself(cli: Any, tmp_path: Path) -> None:
    """`d#b.db` is a file of that name when one exists (it was read as session `b.db` of `d`);
    `DATABASE#SESSION` still names a session of a database."""
    database = tmp_path / "d#b.db"
    (session_id,) = _sqlite_repository(database, 1)
    for command in ("verify", "inspect"):
        run = cli(command, database)
        assert run.code == 0, run.err
    run = cli("inspect", f"{database}#{session_id}")
    assert run.code == 0 and session_id in run.out, run.err


def test_a_missing_sqlite_repository_names_the_file_it_looked_for(
    cli: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """`sqlite:///tmp/x.db` is relative (three slashes): the error says which file it looked for."""
    monkeypatch.chdir(tmp_path)
    run = cli("ls", "sqlite:///tmp/x.db")
    assert run.code == 2
    assert "tmp/x.db" in run.err and "sqlite:////" in run.err and "nothing was created" in run.err, run.err
    assert list(tmp_path.iterdir()) == []

"""Locations on the command line: every location the CLI prints is masked (a password in a URL's
userinfo, in `?password=`, in a malformed URL, in a keyword DSN never appears on stdout or
stderr, on success or failure); a command that only reads, or works on one existing session,
creates nothing for a missing location and says that it does not exist; locations are printed as
given; hostile arguments get a one-line error and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from sessionlog.core import facts as F
from sessionlog.repositories.locations import masked
from test_recovery import CURRENT

PASSWORD = "Pw-h4-s3cr3t-Zq"
ID = "0190a1b2-0000-7000-8000-000000000000"  # a well-formed session id that no repository holds
HEADER = {"provider": "p", "model": "m", "cwd": "/w", "environment_identity": "env"}


def _no_traceback(run: Any) -> None:
    errors = [line for line in run.err.splitlines() if line.startswith("sessionlog ")]  # not progress
    assert "Traceback" not in run.err and len(errors) <= 1, run.err


def _quiet(run: Any, password: str = PASSWORD) -> None:
    assert password not in run.out + run.err, run.out + run.err
    _no_traceback(run)


def _session_in(location: str) -> str:
    repository = sessionlog.repository(location)
    try:
        with repository.create(provider="p", model="m", cwd="/w", environment_identity="env") as store:
            store.commit(F.accept_prompt("do it"))
            return store.load().session_id
    finally:
        repository.close()


@pytest.fixture
def current(tmp_path: Path) -> Path:
    path = tmp_path / "current.json"
    path.write_text(json.dumps(CURRENT))
    return path


def _every_command(location: str, session_id: str, current: Path, tmp_path: Path) -> list[list[Any]]:
    """Every command that takes a location, on the session `session_id` of `location`."""
    name = f"{location}#{session_id}"
    exported = tmp_path / "exported.jsonl"
    return [
        ["ls", location],
        ["ls", location, "--json"],
        ["inspect", name],
        ["inspect", name, "--json"],
        ["verify", name],
        ["verify", name, "--progress", "always"],  # the progress line names it too
        ["reduce", name, "--progress", "always"],
        ["plan", name, "--current", current],
        ["plan", name, "--current", current, "--json"],
        ["recover", name, "--current", current, "--dry-run"],
        ["repair", name, "--dry-run"],
        ["export", name, "-o", exported],
        ["import", location, exported],
        ["fork", name, "--at", "2"],
        ["fork", name, "--at", "1"],  # refused: seq 1 does not end a transaction
        ["recover", name, "--current", current],
        ["abort", name, "--current", current],
        ["repair", name],
        ["convert", exported, location],  # refused: the id is there already
        ["convert", name, tmp_path / "copy.jsonl", "--to", "jsonl", "--progress", "always"],
        ["rm", name],
        ["rm", name],  # refused: gone
        ["inspect", name],  # refused: gone
        ["verify", location],  # a repository, not a session
        ["inspect", location],
        ["migrate", location],
        ["ls", location, "--status", location],  # argparse quotes a bad choice back
    ]


# -- passwords ---------------------------------------------------------------------------------


def _with_query_password(url: str, password: str) -> str:
    """`postgresql://user:PW@host/db` as `postgresql://user@host/db?password=PW`."""
    scheme, rest = url.split("://", 1)
    userinfo, where = rest.split("@", 1)
    return f"{scheme}://{userinfo.split(':', 1)[0]}@{where}?password={password}"


@pytest.mark.parametrize("shape", ["userinfo", "query"])
def test_no_command_prints_the_password_of_a_postgresql_location(
    shape: str, postgres_server: Any, cli: Any, current: Path, tmp_path: Path
) -> None:
    url = postgres_server.new_database()
    password = postgres_server.password
    location = url if shape == "userinfo" else _with_query_password(url, password)
    session_id = _session_in(location)
    outcomes = {}
    for argv in _every_command(location, session_id, current, tmp_path):
        run = cli(*argv)
        _quiet(run, password)
        outcomes[" ".join(str(arg) for arg in argv[:2])] = run.code
        if run.code == 0 and argv[0] in ("inspect", "verify", "fork", "rm", "migrate", "convert"):
            assert masked(location) in run.out, run.out  # named as given, masked
    assert outcomes[f"verify {location}#{session_id}"] == 0  # the commands did run against it


@pytest.mark.parametrize(
    "location",
    [
        f"postgresql://agent:{PASSWORD}@127.0.0.1:1/agent",  # nothing listens on port 1
        f"postgresql://agent@127.0.0.1:1/agent?password={PASSWORD}",
        f"postgresql://agent:{PASSWORD}@[127.0.0.1:1/agent",  # malformed: libpq echoes the URL
        f"postgres://agent:{PASSWORD}@db.invalid/agent",
        f"host=127.0.0.1 port=1 password={PASSWORD} dbname=agent",  # a keyword DSN (not a URL)
    ],
)
def test_a_location_that_cannot_be_reached_is_refused_without_its_password(
    location: str, cli: Any, current: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exported.jsonl").write_bytes(sessionlog.encode_header(**HEADER))
    for argv in _every_command(location, ID, current, tmp_path):
        run = cli(*argv)
        assert run.code != 0, argv
        _quiet(run)
    assert sorted(os.listdir(tmp_path)) == ["current.json", "exported.jsonl"]  # a DSN is no directory


# -- missing locations -------------------------------------------------------------------------


READ_ONLY = [
    ["ls", "{location}"],
    ["ls", "{location}", "--json"],
    ["inspect", "{session}"],
    ["verify", "{session}"],
    ["reduce", "{session}"],
    ["plan", "{session}", "--current", "{current}"],
    ["recover", "{session}", "--current", "{current}", "--dry-run"],
    ["repair", "{session}", "--dry-run"],
    ["export", "{session}"],
]
ON_ONE_SESSION = [  # writers, but of a session that must exist
    ["fork", "{session}", "--at", "1"],
    ["rm", "{session}"],
    ["recover", "{session}", "--current", "{current}"],
    ["abort", "{session}", "--current", "{current}"],
    ["repair", "{session}"],
]


@pytest.mark.parametrize("argv", READ_ONLY + ON_ONE_SESSION, ids=lambda argv: " ".join(argv[:1] + argv[2:]))
@pytest.mark.parametrize("kind", ["directory", "sqlite-relative", "sqlite-absolute"])
def test_a_missing_location_is_said_to_be_missing_and_nothing_is_created(
    kind: str, argv: list[str], cli: Any, current: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    location = {
        "directory": "sesions",
        "sqlite-relative": "sqlite:///sesions.db",
        "sqlite-absolute": f"sqlite:///{work / 'sesions.db'}",
    }[kind]
    words = {"location": location, "session": f"{location}#{ID}", "current": str(current)}
    run = cli(*(word.format(**words) for word in argv))
    assert run.code == 2, run.out + run.err
    looked = {
        "directory": "",
        "sqlite-relative": f"no file sesions.db relative to {work}; an absolute path takes four slashes: "
        "sqlite:////abs/path.db; ",
        "sqlite-absolute": f"no file {work / 'sesions.db'}; ",
    }[kind]
    assert run.err == f"sessionlog {argv[0]}: {location}: no such repository ({looked}nothing was created)\n"
    assert run.out == "" or run.out.startswith("{")  # --json may print its refusal, never "no sessions"
    assert "no sessions" not in run.out
    assert os.listdir(work) == []


def test_import_and_convert_make_the_repository_they_write_into(cli: Any, tmp_path: Path) -> None:
    source = tmp_path / "s.jsonl"
    with sessionlog.create(source, **HEADER) as store:
        store.commit(F.accept_prompt("hi"))
    assert cli("import", tmp_path / "new", source).code == 0
    assert cli("convert", source, f"sqlite:///{tmp_path / 'new.db'}").code == 0
    assert len(sessionlog.repository(tmp_path / "new", create=False).list()) == 1


# -- locations as given ------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["absolute", "relative"])
def test_a_repository_without_a_session_id_is_named_as_given(
    form: str, cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    location = f"sqlite:///{tmp_path / 'agent.db'}" if form == "absolute" else "sqlite:///agent.db"
    session_id = _session_in(location)
    for command in ("verify", "inspect", "reduce", "repair"):
        run = cli(command, location)
        assert run.code == 2
        assert run.err == (
            f"sessionlog {command}: {location} is a repository: name one of its sessions as "
            f"{location}#SESSION_ID (sessionlog ls {location} lists them)\n"
        )
    run = cli("verify", f"{location}#{session_id}")
    assert run.code == 0 and run.out.startswith(f"{location}#{session_id}: valid")


def test_the_sqlite_url_forms_name_the_files_sqlalchemy_names(
    cli: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    session_id = _session_in("sqlite:///relative.db")
    assert (tmp_path / "relative.db").is_file()
    assert cli("verify", f"sqlite:////{str(tmp_path / 'relative.db').lstrip('/')}#{session_id}").code == 0
    assert cli("ls", "sqlite:///relative.db").out.startswith(session_id)


# -- hostile arguments -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["ls", "{repo}", "--limit", str(2**70)],
        ["ls", "{repo}", "--limit", "-5"],
        ["ls", "{repo}", "--limit", "0"],
        ["ls", "{repo}", "--limit", "many"],
        ["ls", "{repo}", "--label", ""],
        ["ls", "{repo}", "--label", "x" * 10_000],
        ["ls", "{file}"],
        ["ls", "{sqlite_repo}", "--limit", str(2**63)],
        ["ls", "{sqlite_repo}", "--limit", "-1"],
        ["fork", "{session}", "--at", "-1"],
        ["fork", "{session}", "--at", str(2**64)],
        ["fork", "{session}", "--at", "99"],
        ["fork", "{sqlite_session}", "--at", str(2**64)],
        ["fork", "{sqlite_session}", "--at", "-1"],
        ["fork", "{repo}#not-an-id", "--at", "1"],
        ["rm", "{repo}#" + "0" * 5000],
        ["rm", "{repo}"],
        ["export", "{session}", "-o", "{repo}"],  # a directory in place of the file
        ["export", "{session}", "-o", "{missing}/out.jsonl"],
        ["export", "{session}", "-o", "{file}/out.jsonl"],  # a file in place of a directory
        ["import", "{repo}", "{missing}"],
        ["import", "{repo}", "{repo}"],  # a directory in place of a file
        ["import", "{file}", "{file}"],  # a file in place of the repository
        ["import", "{repo}", "{garbage}"],
        ["import", "{sqlite_repo}", "{garbage}"],
        ["import", "{repo}", "{file}", "--label", ""],
        ["convert", "{file}", "{repo}", "--to", "jsonl"],
        ["convert", "{garbage}", "{repo}"],
        ["convert", "{file}", "{missing}/x.jsonl", "--to", "jsonl"],
        ["inspect", "{repo}#" + ID],
        ["verify", "{sqlite_repo}#" + ID],
        ["inspect", "{file}#" + ID],  # a file in place of the repository
        ["migrate", "{repo}"],
        ["migrate", "sqlite:///{missing}.db"],
        ["ls", "nope://x"],
        ["ls", ""],  # not the current directory
        ["import", "", "{file}"],
        ["ls", "sqlite://relative.db"],  # two slashes: neither form
        ["ls", "sqlite:///"],
        ["inspect", "{sqlite_repo}#" + ID + "#" + ID],
    ],
)
def test_hostile_arguments_get_one_line_and_a_non_zero_exit(
    argv: list[str], cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a location taken for the current directory would write here
    repo = tmp_path / "repo"
    session_id = _session_in(str(repo))
    sqlite_repo = f"sqlite:///{tmp_path / 'agent.db'}"
    sqlite_id = _session_in(sqlite_repo)
    (tmp_path / "garbage").write_bytes(b"\x00\xff not a session\n")
    file = tmp_path / "s.jsonl"
    file.write_bytes(sessionlog.repository(repo).export(session_id))
    words = {
        "repo": str(repo),
        "sqlite_repo": sqlite_repo,
        "session": f"{repo}#{session_id}",
        "sqlite_session": f"{sqlite_repo}#{sqlite_id}",
        "file": str(file),
        "garbage": str(tmp_path / "garbage"),
        "missing": str(tmp_path / "missing"),
    }
    before = sorted(os.listdir(tmp_path))
    run = cli(*(word.format(**words) for word in argv))
    assert run.code != 0, run.out
    _no_traceback(run)
    assert sorted(os.listdir(tmp_path)) == before
    assert run.err.startswith(f"sessionlog {argv[0]}: "), run.err


@pytest.mark.parametrize("limit", ["-5", "0", str(2**63), str(2**70), "many"])
def test_ls_limit_out_of_range_is_said_in_the_cli_s_words(limit: str, cli: Any, tmp_path: Path) -> None:
    run = cli("ls", tmp_path, "--limit", limit)
    assert run.code == 2 and run.err.startswith(
        "sessionlog ls: error: argument --limit: a whole number from 1 to "
    )
    assert len(run.err.splitlines()) == 1 and "None" not in run.err


# -- messages that quote the user's own argument ----------------------------------------------


def test_a_repository_named_with_a_bad_session_id_is_suggested_once(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _session_in("sqlite:///r.db")
    for name in ("sqlite:///r.db#", "sqlite:///r.db#abc"):
        run = cli("inspect", name)
        assert run.code == 2
        assert "##" not in run.err and "#abc#" not in run.err, run.err
        assert "sqlite:///r.db#SESSION_ID" in run.err, run.err
    run = cli("inspect", "sqlite:///nosuch.db#abc")
    assert run.code == 2
    assert run.err == "sessionlog inspect: sqlite:///nosuch.db does not exist (nothing was created)\n"
    assert sorted(os.listdir(tmp_path)) == ["r.db"]


def test_a_non_secret_argument_of_the_user_is_shown_as_typed(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run = cli("ls", "sqlite://host/x.db")
    assert run.code == 2 and "sqlite://host/x.db" in run.err, run.err
    run = cli("inspect", "x.jsonl", "--backend", "bogus")
    assert run.code == 2 and "unknown backend 'bogus'" in run.err, run.err
    _session_in("sqlite:///r.db")
    run = cli("ls", "sqlite:///r.db", "--cursor", "bogus")
    assert run.code == 2 and "'bogus'" in run.err, run.err
    run = cli("ls", "sqlite:///r.db#x")
    assert run.code == 2 and "sqlite:///r.db#x" in run.err and "a string of" not in run.err, run.err
    run = cli("ls", f"sqlite://u:{PASSWORD}@host/x.db")
    assert run.code == 2 and PASSWORD not in run.err and "sqlite://u:***@host/x.db" in run.err, run.err


# -- ls pages ----------------------------------------------------------------------------------


def test_ls_says_when_there_are_more_sessions_and_continues_from_the_cursor(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    made = {_session_in("sqlite:///r.db") for _ in range(5)}
    first = cli("ls", "sqlite:///r.db", "--limit", "3")
    assert first.code == 0 and len(first.out.splitlines()) == 3
    note = first.err.strip()
    assert note.startswith("sessionlog ls: more sessions than --limit 3; continue with --cursor "), note
    cursor = note.rsplit(" ", 1)[1]
    second = cli("ls", "sqlite:///r.db", "--limit", "3", "--cursor", cursor, "--json")
    assert second.code == 0 and second.err == "", second.err
    shown_ids = {line.split()[0] for line in first.out.splitlines()} | {
        row["session_id"] for row in second.json()
    }
    assert shown_ids == made
    everything = cli("ls", "sqlite:///r.db")
    assert everything.err == "" and len(everything.out.splitlines()) == 5
    paged_json = cli("ls", "sqlite:///r.db", "--limit", "2", "--json")
    assert len(paged_json.json()) == 2 and "--cursor" in paged_json.err
    assert "--cursor" in cli("ls", "--help").out


# -- a killed write into a new SQLite database leaves nothing -----------------------------------

_KILLED = """
import os, signal, sys
from sessionlog.repositories.sqlite import SQLiteRepository
def killed(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
SQLiteRepository.import_ = killed
from sessionlog.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", ["import", "convert"])
def test_a_killed_write_into_a_new_sqlite_database_leaves_no_database(command: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    source = tmp_path / "s.jsonl"
    with sessionlog.create(source, **HEADER) as store:
        store.commit(F.accept_prompt("hi"))
    work = tmp_path / "work"
    work.mkdir()
    argv = (
        ["import", "sqlite:///x.db", str(source)]
        if command == "import"
        else ["convert", str(source), "sqlite:///x.db"]
    )
    run = subprocess.run([sys.executable, "-c", _KILLED, *argv], cwd=work, capture_output=True, text=True)
    assert run.returncode == -9, run.stderr
    assert not any(name == "x.db" or name.startswith("x.db-") for name in os.listdir(work)), os.listdir(work)
    # and the next run completes, clearing what the killed one left
    assert (
        subprocess.run(
            [sys.executable, "-m", "sessionlog.cli", *argv], cwd=work, capture_output=True
        ).returncode
        == 0
    )
    assert os.listdir(work) == ["x.db"]

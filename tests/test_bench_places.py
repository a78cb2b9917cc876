"""`sessionlog bench` never writes into the user's data: `--dir` only through a scratch folder it
makes and removes, `--postgres` only in a scratch database it creates and drops, also when
interrupted (Ctrl-C) or when a row fails; an unusable `--dir` or `--postgres` is exit 2 with one
line, no traceback. The bench's smallest settings (`--tiny`, shapes c, e and h)."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sessionlog import bench
from sessionlog.bench import places, restart, shapes
from sessionlog.bench.measure import RowFailed
from sessionlog.bench.places import PlaceError


def _bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = bench.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("case", ["missing", "a regular file", "under a regular file"])
def test_an_unusable_dir_is_a_usage_error_without_a_traceback(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    where = {"missing": tmp_path / "nope", "a regular file": file, "under a regular file": file / "sub"}[case]
    code, _, err = _bench(capsys, "--dir", str(where), "--shape", "a", "--tiny", "--backends", "jsonl")
    assert code == bench.EXIT_USAGE == 2
    assert f"--dir {where}:" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file"]


def test_a_read_only_dir_is_a_usage_error(
    tiny_disk: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tiny_disk("64k", "ro")
    done = subprocess.run(["mount", "-o", "remount,ro", str(folder)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot remount a tmpfs read-only here: {done.stderr.strip()}")
    code, _, err = _bench(capsys, "--dir", str(folder), "--shape", "a", "--tiny", "--backends", "jsonl")
    assert code == 2 and "not writable" in err and "Traceback" not in err


def _left(server: Any, database: str) -> dict[str, list[str]]:
    """What is in the server besides its own: scratch databases, and the user's database's
    schemas and tables."""
    scratch = server.psql("select datname from pg_database where datname like 'sessionlog_bench_%'")
    schemas = server.psql(
        "select nspname from pg_namespace where nspname not like 'pg_%' "
        "and nspname not in ('information_schema', 'public')",
        database,
    )
    tables = server.psql("select tablename from pg_tables where schemaname = 'public'", database)
    return {"scratch databases": scratch.split(), "schemas": schemas.split(), "tables": tables.split()}


NOTHING: dict[str, list[str]] = {"scratch databases": [], "schemas": [], "tables": []}


def _argv(folder: Path, url: str) -> list[str]:
    smallest = ["--backends", "postgresql-repository", "--shape", "aceh", "--tiny"]
    return ["--dir", str(folder), "--postgres", url, *smallest]


def test_postgres_rows_run_in_a_scratch_database_that_is_dropped(
    postgres_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = postgres_server.new_database()  # the user's database
    code, out, err = _bench(capsys, *_argv(tmp_path, url))
    assert code == 0, err
    assert "postgresql repository, async (power)" in out and "postgresql: list" in out  # the rows ran
    one_committer = out.split("\na: 1 session, 1 committer, 1 fact\n")[1].split("\n\n")[0]
    assert "postgresql repository (power)" in one_committer  # shape a, beside its peers: sync
    assert "postgresql repository, async (power)" in one_committer  # and async
    assert "ceiling: PostgreSQL: INSERT+COMMIT" in one_committer  # and the server's bare ceiling
    row = next(line for line in one_committer.splitlines() if "postgresql repository" in line)
    assert "PostgreSQL: INSERT+COMMIT" in row  # measured against it, in the same rounds
    assert "postgresql repository: reopen, list, claim the unfinished" in out  # in a second scratch database
    version = postgres_server.psql("show server_version").strip("(),'\n ").split()[0]
    assert f"PostgreSQL server {version}" in out.splitlines()[1]  # the run names the server it measured
    assert _left(postgres_server, url.rsplit("/", 1)[1]) == NOTHING
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("stop", ["Ctrl-C", "a row fails"])
def test_an_interrupted_or_failed_run_leaves_nothing(
    stop: str, postgres_server: Any, tmp_path: Path, monkeypatch: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url = postgres_server.new_database()
    real_fill, real_listing = restart.fill, shapes.listing_job

    def fill_then_interrupt(kind: str, location: str, sessions: int) -> None:
        real_fill(kind, location, sessions)  # the scratch database holds sessions now
        raise KeyboardInterrupt

    def failing_listing(repo: Any, call: str) -> Any:
        real_listing(repo, call)

        def job() -> Any:
            raise RuntimeError("the listing broke")

        return job

    if stop == "Ctrl-C":
        monkeypatch.setattr(restart, "fill", fill_then_interrupt)
    else:
        monkeypatch.setattr(shapes, "listing_job", failing_listing)
    code, _, err = _bench(capsys, *_argv(tmp_path, url))
    if stop == "Ctrl-C":
        assert code == bench.EXIT_INTERRUPTED == 130 and "interrupted" in err
    else:
        assert code == bench.EXIT_ROW_FAILED and "'postgresql: list' failed: RuntimeError" in err
    assert "Traceback" not in err
    assert _left(postgres_server, url.rsplit("/", 1)[1]) == NOTHING
    assert list(tmp_path.iterdir()) == []


def test_a_role_that_cannot_create_a_database_is_a_usage_error_and_nothing_is_written(
    postgres_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    database = postgres_server.new_database().rsplit("/", 1)[1]
    role, password = f"bench_{secrets.token_hex(4)}", secrets.token_hex(12)
    postgres_server.psql(f"create role {role} login password '{password}' nocreatedb")
    postgres_server.psql(f"grant all on schema public to {role}", database)
    url = postgres_server.url_for(database).replace(
        postgres_server.url.split("://", 1)[1].split("@", 1)[0], f"{role}:{password}"
    )
    code, _, err = _bench(capsys, *_argv(tmp_path, url))
    assert code == bench.EXIT_USAGE
    assert "cannot create the scratch database" in err and password not in err and "Traceback" not in err
    assert _left(postgres_server, database) == NOTHING
    assert list(tmp_path.iterdir()) == []


def test_a_scratch_database_that_cannot_be_dropped_is_named_not_a_traceback(
    monkeypatch: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from sessionlog.bench.places import ScratchDatabase

    scratch = ScratchDatabase("postgresql://u:secret@db.example:5433/app")
    assert scratch.scratch_url == f"postgresql://u:secret@db.example:5433/{scratch.name}"

    def gone(sql: str) -> None:
        raise OSError("connection refused")

    monkeypatch.setattr(scratch, "_execute", gone)
    scratch.__exit__(None, None, None)  # the server went away after the run
    err = capsys.readouterr().err
    assert f"{scratch.name} on db.example:5433/app is left" in err and "secret" not in err


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:Sekr3t@[::1/app",  # an unclosed IPv6 host
        "postgresql://u:Sekr3t@db.example:99999/app",  # a port out of range
        "postgresql://u:Sekr3t@db.example:port/app",  # a port that is no number
        "postgresql://u:Sekr3t@db.example:5432x/app",  # a port and more
        # a password holding an unencoded '?' or '/' ends the host early; the message quoted its
        # rest, or libpq did (found by a review of #38)
        "postgresql://alice:?Sekr3t@db.invalid:5432/prod",
        "postgresql://alice:1234?Sekr3t@db.example.com:5432/prod",
        "postgresql://alice:1234/Sekr3t?x@db.invalid:5432/prod",
    ],
)
@pytest.mark.parametrize("caller", ["command line", "run()"])
def test_a_malformed_postgres_url_is_a_usage_error_that_never_echoes_it(
    url: str, caller: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Found trying --postgres as a careless user: each was a traceback (ValueError from urlsplit,
    # or from `.port` while the error message was being made), exit 1; from run(), a traceback
    # after the peers were tried
    if caller == "command line":
        argv = ["--dir", str(tmp_path), "--postgres", url, "--backends", "postgresql-repository"]
        code, out, err = _bench(capsys, *argv, "--shape", "e", "--tiny")
        assert code == bench.EXIT_USAGE and "Traceback" not in err and out == ""
    else:
        with pytest.raises(PlaceError) as refused:
            bench.run(str(tmp_path), ["postgresql-repository"], url, "tiny", progress=True, only="ae")
        err = f"sessionlog bench: error: {refused.value}\n" + capsys.readouterr().err  # nothing measured
    assert err.startswith("sessionlog bench: error: --postgres: not a valid URL")
    assert len(err.strip().splitlines()) == 1 and "Sekr3t" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("password", ["pw%zzSekr3t", "Sekr3t"])
def test_a_driver_message_that_quotes_the_password_is_masked(
    password: str, postgres_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found trying --postgres as a hostile user: libpq refuses a password with a bad percent
    escape by quoting it ('invalid percent-encoded token: "pw%zzSekr3t"'), and the bench passed
    the message on. A wrong password is refused without it; both are exit 2, one line."""
    url = postgres_server.new_database().replace("://", f"://nobody:{password}@", 1)
    argv = ["--dir", str(tmp_path), "--postgres", url, "--backends", "postgresql-repository"]
    code, out, err = _bench(capsys, *argv, "--shape", "e", "--tiny")
    assert code == bench.EXIT_USAGE and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and "Sekr3t" not in out + err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("parameter", ["dbname=appdb", "db%6Eame=appdb", "sslmode=disable&dbname="])
def test_a_dbname_in_the_query_is_refused_before_anything(
    parameter: str, postgres_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Found trying --postgres as a careless user: libpq's dbname parameter (its key decoded too)
    # overrides the URL's path, where the scratch database is named, so every PostgreSQL row ran
    # in the URL's own database and left the schema sessionlog there, exit 0
    url = postgres_server.new_database()
    database = url.rsplit("/", 1)[1]
    code, out, err = _bench(capsys, *_argv(tmp_path, f"{url}?{parameter.replace('appdb', database)}"))
    assert code == bench.EXIT_USAGE and "Traceback" not in err and out == ""
    assert err.strip().splitlines() == [
        "sessionlog bench: error: --postgres: its query names the database (dbname=), which would "
        "override the scratch database the bench runs in: name it in the path instead"
    ]
    assert _left(postgres_server, database) == NOTHING
    assert list(tmp_path.iterdir()) == []


def test_run_from_python_keeps_its_postgres_rows_in_a_scratch_database(
    postgres_server: Any, tmp_path: Path
) -> None:
    # Found calling the exported bench.run with a server's URL: the scratch database was made by
    # the command line only, and run() wrote its sessions into the URL's own database
    url = postgres_server.new_database()
    result = bench.run(str(tmp_path), ["postgresql-repository"], url, "tiny", progress=False, only="aeh")
    names = {row["name"] for row in result["rows"]}
    assert {"postgresql: list", "postgresql repository (power)"} <= names  # the rows ran
    assert _left(postgres_server, url.rsplit("/", 1)[1]) == NOTHING
    assert list(tmp_path.iterdir()) == []


def test_run_from_python_refuses_a_dbname_in_the_query(postgres_server: Any, tmp_path: Path) -> None:
    url = postgres_server.new_database()
    database = url.rsplit("/", 1)[1]
    with pytest.raises(PlaceError, match=r"its query names the database \(dbname=\)"):
        bench.run(
            str(tmp_path), ["postgresql-repository"], f"{url}?dbname={database}", "tiny", False, only="e"
        )
    assert _left(postgres_server, database) == NOTHING
    assert list(tmp_path.iterdir()) == []


def _with_password(server: Any, password: str, where: str) -> str:
    """A URL of a new database on `server` with `password`, in its userinfo or its query."""
    url = server.new_database()
    user_and_password = url.split("://", 1)[1].split("@", 1)[0]
    if where == "userinfo":
        return url.replace(user_and_password, f"sessionlog:{password}")
    return url.replace(f"{user_and_password}@", "sessionlog@") + f"?password={password}"


@pytest.mark.parametrize("where", ["userinfo", "query"])
@pytest.mark.parametrize("caller", ["command line", "run()"])
def test_a_password_with_a_bad_percent_escape_is_never_shown(
    where: str, caller: str, postgres_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # libpq refuses 'Tr0ub4dor%zz3' by quoting it ('invalid percent-encoded token: "..."'); run()
    # from Python passed it on in a RowFailed
    url = _with_password(postgres_server, "Tr0ub4dor%zz3", where)
    if caller == "command line":
        code, out, err = _bench(capsys, *_argv(tmp_path, url))
        assert code == bench.EXIT_USAGE and "Traceback" not in err and len(err.strip().splitlines()) == 1
        shown = out + err
    else:
        with pytest.raises(PlaceError) as refused:
            bench.run(str(tmp_path), ["postgresql-repository"], url, "tiny", False, only="e")
        shown = str(refused.value) + capsys.readouterr().err
    assert "invalid percent-encoded token" in shown and "zz3" not in shown and "Tr0ub" not in shown
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("caller", ["command line", "run()"])
def test_a_failed_row_quoting_the_url_never_shows_its_password(
    caller: str, postgres_server: Any, tmp_path: Path, monkeypatch: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # A row's error is passed on in one line; a driver's may quote the URL it was given, the
    # scratch database's, which holds the password of --postgres
    url = postgres_server.new_database()
    password = url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]

    real_fill, real_listing, filled = restart.fill, shapes.listing_job, []

    def fill(kind: str, location: str, sessions: int) -> None:
        filled.append(location)
        real_fill(kind, location, sessions)

    def failing_listing(repo: Any, call: str) -> Any:
        real_listing(repo, call)

        def job() -> Any:
            raise RuntimeError(f"cannot list {filled[-1]}")

        return job

    monkeypatch.setattr(restart, "fill", fill)
    monkeypatch.setattr(shapes, "listing_job", failing_listing)
    if caller == "command line":
        code, out, err = _bench(capsys, *_argv(tmp_path, url))
        assert code == bench.EXIT_ROW_FAILED and "Traceback" not in err
        shown = out + err
    else:
        with pytest.raises(RowFailed) as failed:
            bench.run(str(tmp_path), ["postgresql-repository"], url, "tiny", False, only="e")
        shown = str(failed.value)
    assert "'postgresql: list' failed: RuntimeError: cannot list postgresql://sessionlog:***@" in shown, shown
    assert password not in shown
    assert _left(postgres_server, url.rsplit("/", 1)[1]) == NOTHING


def test_a_url_read_with_a_password_in_its_host_never_shows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A password holding an unencoded '/' ends the host early: urlsplit and libpq read the host
    # 'nobody', the port 12 and a path holding the rest of the password; the server named in the
    # message quoted it
    url = "postgresql://nobody:12/Sekr3t@db.invalid/app"
    code, out, err = _bench(capsys, *_argv(tmp_path, url))
    assert code == bench.EXIT_USAGE and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "Sekr3t" not in out + err, err


@pytest.fixture(scope="module")
def unsynced_server() -> Any:
    """A throwaway server running with fsync=off, as development and CI databases often do."""
    from sessionlog.testing.postgres import PostgresServer, PostgresUnavailable

    try:
        server = PostgresServer.start(fsync="off")
    except (PostgresUnavailable, ModuleNotFoundError) as error:
        pytest.skip(f"no PostgreSQL server can be started here: {error}")
    yield server
    server.stop()


def _role_with_weak_commits(server: Any) -> str:
    """A URL of a new database on `server`, as a new role whose synchronous_commit is off."""
    database = server.new_database().rsplit("/", 1)[1]
    role, password = f"bench_{secrets.token_hex(4)}", secrets.token_hex(12)
    server.psql(f"create role {role} login createdb password '{password}'")
    server.psql(f"alter role {role} set synchronous_commit = off")
    return f"postgresql://{role}:{password}@127.0.0.1:{server.port}/{database}"


@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        ("fsync=off", "the server runs with fsync=off: no class holds"),
        ("synchronous_commit=off", "synchronous_commit is 'off', too weak for the power class"),
    ],
)
def test_a_server_that_cannot_hold_the_power_class_skips_the_postgres_rows_and_the_run_goes_on(
    setting: str, reason: str, request: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Found running bench --postgres against a development server: DurabilityUnavailableError
    # raised while shape e opened its repository, a traceback, exit 1, the other rows lost
    if setting == "fsync=off":
        server = request.getfixturevalue("unsynced_server")
        url = server.new_database()
    else:
        server = request.getfixturevalue("postgres_server")
        url = _role_with_weak_commits(server)
    backends = "jsonl,directory-repository,postgresql-repository"
    argv = ["--dir", str(tmp_path), "--postgres", url, "--backends", backends, "--shape", "aeh", "--tiny"]
    code, out, err = _bench(capsys, *argv)
    assert code == bench.EXIT_OK and "Traceback" not in err, err
    assert "directory: list" in out and "jsonl" in out  # the rest of the run went on
    assert "postgresql" not in out.replace("PostgreSQL rows", "").lower().split("skipped:")[0]
    skipped = [line for line in out.splitlines() if line.startswith("skipped: the PostgreSQL rows")]
    assert len(skipped) == 1 and reason in skipped[0], out
    assert url.split(":")[2].split("@")[0] not in out + err  # the password
    assert _left(server, url.rsplit("/", 1)[1]) == NOTHING
    assert list(tmp_path.iterdir()) == []


def test_a_url_libpq_reads_is_rewritten_to_the_scratch_database_as_libpq_reads_it() -> None:
    """An empty host (`postgresql:///db?host=/run/postgresql`, libpq's form for a socket folder)
    lost its '//' (libpq then refused the rewritten URL); a host or port of the query is the
    server the messages name (they named the URL's own); several hosts are refused by name
    (found by a review of #38)."""
    from psycopg.conninfo import conninfo_to_dict

    scratch = places.database_url("postgresql:///app?host=/run/postgresql&port=5433&user=u", "scratch")
    assert conninfo_to_dict(scratch) == {
        "dbname": "scratch",
        "host": "/run/postgresql",
        "port": "5433",
        "user": "u",
    }
    url = "postgresql://u:Sekr3t@localhost/app?host=db.internal&port=6543"
    assert places.where(url) == "db.internal:6543/app"
    with pytest.raises(PlaceError, match=r"several hosts \(h1,h2\) are not supported") as refused:
        places.check_postgres("postgresql://u:Sekr3t@h1:5432,h2:5433/app")
    assert "Sekr3t" not in str(refused.value)

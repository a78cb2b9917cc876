"""PostgreSQL: the repository and store contracts against a real server the tests start, and
what only a shared database has: leases across hosts, recovery workers, an unknown COMMIT
outcome, a server killed mid-commit, a synchronous standby, bad credentials, and a foreign
table in the way."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from conftest import FIXTURES, budgets
from sessionlog.core import facts as F
from sessionlog.repositories.postgres_schema import SCHEMA_VERSION
from sessionlog.testing import AsyncStoreContract, StoreContract
from sessionlog.testing.postgres import (
    PathSessions,
    PostgresRows,
    PostgresServer,
    recovery_workers,
    terminate_backend,
)
from sessionlog.testing.repository_suite import AsyncRepositoryContract, RepositoryContract

HEADER: dict[str, Any] = {"provider": "openrouter", "model": "test/model", "cwd": "/w"}


def fresh_database(server: PostgresServer) -> str:
    return server.new_database()


def sql(url: str, statement: str, *values: Any) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        cursor = connection.execute(statement, values or None)
        return cursor.fetchall() if cursor.description else []


# -- the contracts -------------------------------------------------------------------------------


class PostgresHooks:
    urls: dict[Path, str]

    @pytest.fixture(autouse=True)
    def _server(self, postgres_server: PostgresServer) -> None:
        self.server = postgres_server
        self.urls = {}

    def location(self, where: Path) -> str:
        if where not in self.urls:
            self.urls[where] = fresh_database(self.server)
        return self.urls[where]

    def downgrade(self, where: Path) -> None:
        """Schema version 1: no caller keys."""
        sql(
            self.location(where),
            "drop table sessionlog.session_keys; update sessionlog.schema_version set version = 1",
        )

    def take_over(self, where: Path, session_id: str) -> None:
        """A writer on another host takes the session (its lease expired, or it was told to)."""
        sql(
            self.location(where),
            "update sessionlog.sessions set writer = 'elsewhere:1:x', writer_epoch = writer_epoch + 1, "
            "lease_expires_at = now() + interval '1 minute' where session_id = %s",
            session_id,
        )


class TestPostgresRepository(PostgresHooks, RepositoryContract):
    pass


class TestAsyncPostgresRepository(PostgresHooks, AsyncRepositoryContract):
    pass


@pytest.fixture(scope="session")
def postgres_paths(postgres_server: PostgresServer) -> Any:
    paths = PathSessions(fresh_database(postgres_server))
    yield paths
    paths.close()


class StoreHooks(PostgresRows):
    @pytest.fixture(autouse=True)
    def _paths(self, postgres_paths: PathSessions) -> None:
        self.paths = postgres_paths
        self.registry = postgres_paths.registry()


class TestPostgresStore(StoreHooks, StoreContract):
    backend = "postgres-store"
    fixture_dir = FIXTURES


class TestPostgresAsyncStore(StoreHooks, AsyncStoreContract):
    backend = "postgres-store-async"
    fixture_dir = FIXTURES


# -- schema, roles, bad input --------------------------------------------------------------------

# The crash harnesses run short by default and long behind the `long` marker (conftest.budgets).
KILLS = budgets(10, 200, 2_000)  # short: 10 kills a case in the default run (8 min bound); long: 200


def test_many_workers_starting_at_once_make_the_schema_once(postgres_server: PostgresServer) -> None:
    url = fresh_database(postgres_server)
    source = "import sys, sessionlog\nrepo = sessionlog.repository(sys.argv[1])\nprint(len(repo.list()))"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", source, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(6)
    ]
    answers = [child.communicate(timeout=120) for child in children]
    assert [out.strip() for out, _ in answers] == ["0"] * 6, [error[-300:] for _, error in answers]
    assert sql(url, "select version from sessionlog.schema_version") == [(SCHEMA_VERSION,)]


def test_migrate_apart_and_a_runtime_role_with_table_rights_only(
    postgres_server: PostgresServer, cli: Any
) -> None:
    url = fresh_database(postgres_server)
    with pytest.raises(sessionlog.SessionPathError, match="sessionlog migrate"):
        sessionlog.repository(url, migrate=False)
    run = cli("migrate", url)
    assert run.code == 0 and f"version {SCHEMA_VERSION}" in run.out
    assert postgres_server.password not in run.out + run.err
    assert cli("migrate", url).code == 0  # nothing left to do
    postgres_server.psql("create role agent login password 'agent-secret'")
    for statement in (
        "grant usage on schema sessionlog to agent",
        "grant select, insert, update, delete on all tables in schema sessionlog to agent",
    ):
        sql(url, statement)
    runtime = url.replace(f"sessionlog:{postgres_server.password}@", "agent:agent-secret@")
    with sessionlog.repository(runtime, migrate=False) as repo, repo.create(**HEADER) as store:
        store.commit(F.accept_prompt("no DDL needed"))
        assert repo.list()[0].title == "no DDL needed"
    import psycopg

    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # the runtime role cannot change the schema
        sql(runtime, "drop table sessionlog.lines")


def test_bad_credentials_and_hosts_are_typed_errors_without_the_password(
    postgres_server: PostgresServer,
) -> None:
    secret = "hunter2-not-the-password"
    wrong = postgres_server.url.replace(postgres_server.password, secret)
    with pytest.raises(sessionlog.SessionPathError) as caught:
        sessionlog.repository(wrong)
    assert "password authentication failed" in str(caught.value)
    assert secret not in str(caught.value) and secret not in repr(caught.value)
    assert postgres_server.password not in str(caught.value)
    closed = f"postgresql://sessionlog:{secret}@127.0.0.1:1/sessionlog?connect_timeout=2"
    with pytest.raises(sessionlog.SessionPathError) as caught:
        sessionlog.repository(closed)
    assert secret not in str(caught.value)
    with sessionlog.repository(postgres_server.url) as repo:
        assert postgres_server.password not in repr(repo) + str(repo.path)


def test_a_foreign_table_of_the_same_name_is_refused_and_left_alone(postgres_server: PostgresServer) -> None:
    url = fresh_database(postgres_server)
    sql(url, "create schema sessionlog")
    sql(url, "create table sessionlog.sessions (id serial primary key, secret text)")
    sql(url, "insert into sessionlog.sessions (secret) values ('theirs')")
    with pytest.raises(sessionlog.SessionPathError, match="another application's table"):
        sessionlog.repository(url)
    assert sql(url, "select secret from sessionlog.sessions") == [("theirs",)]
    assert sql(url, "select to_regclass('sessionlog.lines')") == [(None,)]


def test_the_replicated_class_is_refused_without_a_synchronous_standby(
    postgres_server: PostgresServer,
) -> None:
    with pytest.raises(sessionlog.DurabilityUnavailableError, match="synchronous_standby_names is empty"):
        sessionlog.repository(postgres_server.url, durability="replicated")
    with pytest.raises(ValueError, match="synchronous_commit=off is no class"):
        sessionlog.repository(postgres_server.url, durability="process")


def test_a_pool_the_caller_passes_stays_the_callers(postgres_server: PostgresServer) -> None:
    from psycopg_pool import ConnectionPool

    url = fresh_database(postgres_server)
    with ConnectionPool(url, min_size=1, max_size=4, open=True) as pool:
        repo = sessionlog.repositories.postgres.PostgresRepository(pool=pool)
        with repo.create(**HEADER) as store:
            store.commit(F.accept_prompt("on your pool"))
        repo.close()
        assert not pool.closed
        with pool.connection() as connection:
            assert connection.execute("select count(*) from sessionlog.lines").fetchone() == (2,)


# -- writers across hosts ------------------------------------------------------------------------


def test_a_lease_expires_and_the_old_writer_is_fenced(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = fresh_database(postgres_server)
    with sessionlog.repository(url) as repo:  # a lease no delayed heartbeat ends before the checks
        first = repo.create(**HEADER)
        first.commit(F.accept_prompt("slow worker"))
        session_id = first.load().session_id
        with pytest.raises(sessionlog.SessionLockedError, match="lease until"):
            repo.open(session_id)
        monkeypatch.setattr(repo.heartbeat, "renew_now", lambda: None)  # its renewals reach nothing
        # The lease ran out on the server's clock (the one that counts) while the writer still
        # counts it as running: only fencing can refuse its next commit.
        sql(
            url,
            "update sessionlog.sessions set lease_expires_at = now() - interval '1 second' "
            "where session_id = %s",
            session_id,
        )
        assert [row.session_id for row in repo.unfinished()] == [session_id]
        second = repo.open(session_id)
        with pytest.raises(sessionlog.StorePoisonedError) as caught:
            first.commit([F.user_message("too late")])
        assert isinstance(caught.value.__cause__, sessionlog.SessionChangedError)
        second.commit([F.user_message("the new writer")])
        assert [m["content"] for m in repo.load(session_id).transcript][-1] == "the new writer"
        first.close()
        second.close()


def test_two_recovery_workers_never_claim_the_same_session(postgres_server: PostgresServer) -> None:
    url = fresh_database(postgres_server)
    with sessionlog.repository(url) as repo:
        for index in range(12):
            with repo.create(**HEADER) as store:
                store.commit(F.accept_prompt(f"crashed {index}"))
        claimed = recovery_workers(url, 4)
        assert len(claimed) == 12 and len(set(claimed)) == 12


_HOST = """
import sys, time, sessionlog
from sessionlog.core import facts as F
url, session_id, name, take = sys.argv[1:5]
repo = sessionlog.repository(url)
store = repo.open(session_id, take_over=take == "take")
print("open", flush=True)
written = 0
try:
    for index in range(10_000):
        store.commit([F.user_message(f"{name} {index}")])
        written += 1
        time.sleep(0.001)
except sessionlog.StorePoisonedError as error:
    print("fenced", written, type(error.__cause__).__name__, flush=True)
"""


def test_two_writers_on_two_hosts_one_is_fenced_and_lines_never_interleave(
    postgres_server: PostgresServer,
) -> None:
    url = fresh_database(postgres_server)
    with sessionlog.repository(url) as repo, repo.create(**HEADER) as store:
        session_id = store.load().session_id
    first = subprocess.Popen(
        [sys.executable, "-c", _HOST, url, session_id, "a", "wait"], stdout=subprocess.PIPE, text=True
    )
    assert first.stdout is not None and first.stdout.readline().strip() == "open"
    refused = subprocess.run(
        [sys.executable, "-c", _HOST, url, session_id, "b", "wait"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "SessionLockedError" in refused.stderr
    time.sleep(0.2)
    second = subprocess.Popen(
        [sys.executable, "-c", _HOST, url, session_id, "b", "take"], stdout=subprocess.PIPE, text=True
    )
    assert second.stdout is not None and second.stdout.readline().strip() == "open"
    fenced = first.stdout.readline().split()
    with sessionlog.repository(url) as repo:
        started = time.monotonic()
        while repo.load(session_id).transcript[-1]["content"][0] != "b":  # the new writer goes on
            assert time.monotonic() - started < 120, "the new writer committed nothing in 120 s"
            time.sleep(0.05)
    second.kill()
    second.communicate()
    first.communicate()
    assert fenced[0] == "fenced" and fenced[2] == "SessionChangedError"
    with sessionlog.repository(url) as repo:
        writers = [m["content"].split()[0] for m in repo.load(session_id).transcript]
    assert writers == sorted(writers) and writers.count("a") == int(fenced[1]) and "b" in writers


# -- an unknown COMMIT outcome -------------------------------------------------------------------


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_connection_broken_at_commit_poisons_and_reopening_tells_the_truth(
    when: str, postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    url = fresh_database(postgres_server)
    repo = sessionlog.repository(url)
    store = repo.create(**HEADER)
    store.commit(F.accept_prompt("kept"))
    session_id = store.load().session_id
    real_execute = psycopg.Connection.execute
    armed = True

    def terminate(connection: Any) -> None:
        terminate_backend(url, connection.info.backend_pid)  # gone, so "before" is before

    def execute(connection: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        """The commit is one autocommit statement: its COMMIT is that statement's end."""
        nonlocal armed
        if not armed or not str(query).startswith("with updated"):
            return real_execute(connection, query, *args, **kwargs)
        armed = False
        if when == "before":
            terminate(connection)  # the statement then goes to a dead backend
            return real_execute(connection, query, *args, **kwargs)
        real_execute(connection, query, *args, **kwargs)  # it committed; the answer is lost
        terminate(connection)
        connection.close()
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(psycopg.Connection, "execute", execute)
    with pytest.raises(sessionlog.StorePoisonedError) as caught:
        store.commit([F.user_message("in doubt")])
    assert isinstance(caught.value.__cause__, sessionlog.CommitOutcomeUnknownError)
    assert "may or may not" in str(caught.value.__cause__)
    with pytest.raises(sessionlog.StorePoisonedError):
        store.commit([F.user_message("never retried")])
    store.close()
    monkeypatch.setattr(psycopg.Connection, "execute", real_execute)
    with repo.open(session_id) as reopened:
        contents = [m["content"] for m in reopened.load().transcript]
    assert contents == (["kept", "in doubt"] if when == "after" else ["kept"])
    assert "never retried" not in contents
    repo.close()


# -- crashes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kills", KILLS)
@pytest.mark.parametrize("api", ["sync", "async"])
def test_kill9_of_a_postgres_client_loses_nothing(
    api: str, kills: int, postgres_server: PostgresServer
) -> None:
    from sessionlog.testing.repository_kills import run_repository_kills

    report = run_repository_kills(fresh_database(postgres_server), kills, use_async=api == "async")
    print(
        f"\npostgres client ({api}): {report.kills} kills, {report.acknowledged} acknowledged, "
        f"{report.lost} lost"
    )
    assert report.failures == [] and report.lost == 0
    assert report.kills == kills and report.acknowledged > 0


@pytest.mark.parametrize("restarts", budgets(1, 10, 100))
def test_kill9_of_the_postmaster_during_commits_loses_nothing(
    restarts: int, postgres_server: PostgresServer
) -> None:
    """power: the server is SIGKILLed mid-commit (its backends too) and restarted; every commit a
    client saw acknowledged is there after recovery."""
    from sessionlog.testing.repository_kills import run_repository_kills

    url = fresh_database(postgres_server)

    def crash(child: Any) -> None:
        postgres_server.kill()
        postgres_server.restart()

    report = run_repository_kills(url, restarts, max_wait=0.3, crash=crash)
    print(f"\npostmaster kills: {report.kills}, {report.acknowledged} acknowledged, {report.lost} lost")
    assert report.failures == [] and report.lost == 0 and report.acknowledged > 0


@pytest.mark.parametrize("failovers", budgets(1, 3, 20))
def test_replicated_kill9_of_the_primary_then_promote_loses_nothing(
    failovers: int, postgres_server: PostgresServer
) -> None:
    """replicated: a primary with a synchronous standby is SIGKILLed mid-commit; the standby is
    promoted; every acknowledged commit is on it. (Its own servers: `postgres_server` only says
    that one can be had.)"""
    from sessionlog.testing.postgres import run_failovers

    report = run_failovers(failovers)
    print(
        f"\nreplicated: {report.kills} primaries killed, {report.acknowledged} acknowledged, "
        f"{report.lost} lost"
    )
    assert report.failures == [] and report.lost == 0
    assert report.kills == failovers and report.acknowledged > 0


def test_claim_unfinished_goes_past_the_sessions_this_process_already_holds(
    postgres_server: PostgresServer,
) -> None:
    """Found by the bench's restart shape: once this process held 64 unfinished sessions,
    `claim_unfinished()` said None while 36 of 100 were still unclaimed (it looked at the 64
    oldest candidates only, all its own live holds)."""
    url = fresh_database(postgres_server)
    with sessionlog.repository(url) as repo:
        for _ in range(100):
            with repo.create(**HEADER) as store:
                store.commit(F.accept_prompt("left unfinished"))  # a run open, then released
        claimed = []
        while (store := repo.claim_unfinished()) is not None:
            claimed.append(store)
            assert len(claimed) <= 100
        assert len({store.load().session_id for store in claimed}) == 100
        for store in claimed:
            store.close()

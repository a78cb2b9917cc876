"""PostgreSQL under faults: a writer idle for many leases keeps its session (a heartbeat renews
it), a writer that cannot renew or was stopped past its lease is fenced and typed, a dead writer
of this host is claimed at once, dropped connections and restarts are survived, every driver
error is typed, and no password is ever shown. Faults come from outside the code under test: a
SIGSTOP, another connection's row lock, `pg_terminate_backend`, a server restart."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from conftest import wait_for
from sessionlog.core import facts as F
from sessionlog.testing.postgres import PostgresServer, recovery_workers, terminate_backend

HEADER: dict[str, Any] = {"provider": "openrouter", "model": "test/model", "cwd": "/w"}


def sql(url: str, statement: str, *values: Any) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        cursor = connection.execute(statement, values or None)
        return cursor.fetchall() if cursor.description else []


def contents(repo: Any, session_id: str) -> list[Any]:
    return [message["content"] for message in repo.load(session_id).transcript]


def lease_ran_out(url: str, session_id: str) -> bool:
    """On the server's clock, the one fencing and recovery go by."""
    query = "select lease_expires_at <= now() from sessionlog.sessions where session_id = %s"
    return sql(url, query, session_id) == [(True,)]


def expire_lease(url: str, session_id: str) -> None:
    """The lease runs out on the server at once, whatever its writer counts on its own clock."""
    query = (
        "update sessionlog.sessions set lease_expires_at = now() - interval '1 second' where session_id = %s"
    )
    sql(url, query, session_id)


# -- a heartbeat renews the lease of a writer that holds a session ----------------------------------


def test_a_writer_idle_for_many_leases_keeps_its_session(postgres_server: PostgresServer) -> None:
    """An agent waiting on one model call far longer than the lease is never taken over."""
    url = postgres_server.new_database()
    lease = 6  # renewed every 2 s: a renewal a loaded machine delays by seconds still lands in time
    with sessionlog.repository(url, lease_seconds=lease) as repo, sessionlog.repository(url) as recovery:
        store = repo.create(**HEADER)
        store.commit(F.accept_prompt("a long model call"))
        session_id = store.load().session_id
        query = (
            "select extract(epoch from lease_expires_at), extract(epoch from now()) "
            "from sessionlog.sessions where session_id = %s"
        )
        ((first_end, _),) = sql(url, query, session_id)  # set by the commit; from now on only renewed

        def idle_past_two_leases() -> bool:
            ((end, now),) = sql(url, query, session_id)
            assert repo.heartbeat.held(), "the writer counts its lease as run out: no renewal moved it on"
            assert end > now, f"the lease ran out on the server {now - end:.1f} s ago: no renewal reached it"
            # A renewal extends only a running lease: it ran all along, without a commit.
            return bool(end - first_end > 2 * lease)

        wait_for(idle_past_two_leases, "the heartbeat to renew an idle writer's lease past two leases", 180)
        assert recovery.unfinished() == []
        assert recovery.claim_unfinished() is None
        with pytest.raises(sessionlog.SessionLockedError):
            recovery.open(session_id)
        store.commit([F.user_message("the answer")])
        assert contents(recovery, session_id) == ["a long model call", "the answer"]
        store.close()
        assert [info.session_id for info in recovery.unfinished()] == [session_id]  # released


def test_a_writer_whose_renewal_is_blocked_knows_before_its_commit(postgres_server: PostgresServer) -> None:
    """Another transaction keeps the session's row locked, so no renewal reaches it: once the
    lease ran out the writer refuses its next commit (typed, nothing sent) instead of waiting on
    the lock or writing after a recovery worker may have taken over."""
    import psycopg

    url = postgres_server.new_database()
    with sessionlog.repository(url, lease_seconds=5) as repo:  # outlasts a slow first commit
        store = repo.create(**HEADER)
        store.commit(F.accept_prompt("mine"))
        session_id = store.load().session_id
        nemesis = psycopg.connect(url)
        outcome: list[BaseException | None] = []
        try:
            nemesis.execute(
                "select 1 from sessionlog.sessions where session_id = %s for update", (session_id,)
            )
            # Every renewal skips the locked row until the lease ran out on the server (so on the
            # writer's own clock, which counts it from before each renewal was sent).
            wait_for(lambda: lease_ran_out(url, session_id), "the lease of a locked row to run out")

            def commit() -> None:
                try:
                    store.commit([F.user_message("after the lease")])
                    outcome.append(None)
                except BaseException as error:
                    outcome.append(error)

            committer = threading.Thread(target=commit, daemon=True)
            committer.start()
            committer.join(60)  # a hang detector: a commit sent would wait on the row lock
            assert outcome, "the commit waited on the row lock: it was sent after the lease ran out"
        finally:
            nemesis.rollback()
            nemesis.close()
        assert isinstance(outcome[0], sessionlog.StorePoisonedError), outcome
        assert isinstance(outcome[0].__cause__, sessionlog.SessionChangedError)
        assert "lease" in str(outcome[0])
        assert contents(repo, session_id) == ["mine"]
        store.close()


_STOPPED = """
import sys, sessionlog
from sessionlog.core import facts as F
url, session_id = sys.argv[1:3]
repo = sessionlog.repository(url)  # its lease is ended on the server, not waited out
store = repo.open(session_id)
print("open", flush=True)
sys.stdin.readline()
try:
    store.commit([F.user_message("after the stop")])
    print("committed", flush=True)
except sessionlog.SessionLogError as error:
    print(type(error).__name__, type(error.__cause__).__name__, flush=True)
"""


def test_a_writer_stopped_past_its_lease_is_claimed_and_fenced(postgres_server: PostgresServer) -> None:
    """Fencing stays the backstop: a SIGSTOPped writer renews nothing; a recovery worker claims
    the session; the writer, continued, is refused, typed, and wrote nothing."""
    url = postgres_server.new_database()
    with sessionlog.repository(url) as repo:
        with repo.create(**HEADER) as store:
            store.commit(F.accept_prompt("stopped"))
            session_id = store.load().session_id
        child = subprocess.Popen(
            [sys.executable, "-c", _STOPPED, url, session_id],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdin is not None and child.stdout is not None
        try:
            assert child.stdout.readline().strip() == "open"
            assert repo.claim_unfinished() is None  # its lease runs
            os.kill(child.pid, signal.SIGSTOP)
            # Stopped past its lease: it ran out on the server's clock, not yet on the writer's, so
            # only fencing can refuse the writer once continued.
            expire_lease(url, session_id)
            claimed = repo.claim_unfinished()
            assert claimed is not None and claimed.load().session_id == session_id
            os.kill(child.pid, signal.SIGCONT)
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().split() == ["StorePoisonedError", "SessionChangedError"]
            claimed.commit([F.user_message("recovered")])
            claimed.close()
        finally:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
            child.communicate()
        assert contents(repo, session_id) == ["stopped", "recovered"]


# -- a dead writer of this host is claimed at once ------------------------------------------------

_DIES = """
import os, sys, sessionlog
from sessionlog.core import facts as F
repo = sessionlog.repository(sys.argv[1])
store = repo.open(sys.argv[2])
store.commit([F.user_message("before dying")])
os._exit(0)
"""


def test_claim_unfinished_takes_a_dead_writers_session_at_once(postgres_server: PostgresServer) -> None:
    url = postgres_server.new_database()
    with sessionlog.repository(url, lease_seconds=600) as repo:
        with repo.create(**HEADER) as store:
            store.commit(F.accept_prompt("crashed"))
            session_id = store.load().session_id
        subprocess.run([sys.executable, "-c", _DIES, url, session_id], check=True, timeout=60)
        assert [info.session_id for info in repo.unfinished()] == [session_id]
        claimed = repo.claim_unfinished()
        assert claimed is not None and claimed.load().session_id == session_id
        assert repo.claim_unfinished() is None  # taken: never twice
        claimed.commit([F.user_message("recovered")])
        claimed.close()
        assert contents(repo, session_id) == ["crashed", "before dying", "recovered"]


def test_two_workers_never_claim_the_same_dead_writers_session(postgres_server: PostgresServer) -> None:
    url = postgres_server.new_database()
    with sessionlog.repository(url, lease_seconds=600) as repo:
        ids = []
        for index in range(8):
            with repo.create(**HEADER) as store:
                store.commit(F.accept_prompt(f"crashed {index}"))
                ids.append(store.load().session_id)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )

    sql(
        url,
        "update sessionlog.sessions set writer = %s, lease_expires_at = now() + interval '10 minutes'",
        f"{socket.gethostname()}:{int(dead.stdout)}:dead",
    )
    assert sorted(recovery_workers(url, 4)) == sorted(ids)


# -- a dropped connection stops one batch, not the repository ---------------------------------------


@pytest.mark.parametrize("fault", ["terminate", "restart"])
def test_the_async_writer_replaces_a_connection_dropped_while_idle(
    fault: str, postgres_server: PostgresServer
) -> None:
    """Nothing was in flight when the writer's connection dropped: it is replaced before the next
    batch is sent, so no commit fails (none is poisoned as an unknown outcome), and every
    session goes on."""
    url = postgres_server.new_database()

    async def main() -> None:
        # a lease that outlasts the restart's crash recovery, however loaded the machine (it took
        # over 30 s beside other work): this test is about the connection, not the lease
        repo = await sessionlog.repository_async(url, lease_seconds=600)
        first, second = await repo.create(**HEADER), await repo.create(**HEADER)
        await first.commit(F.accept_prompt("first"))
        await second.commit(F.accept_prompt("second"))
        first_id = (await first.load()).session_id
        if fault == "terminate":
            terminate_backend(url, repo.writer.connection.info.backend_pid)  # gone, not just signalled
        else:
            postgres_server.kill()
            postgres_server.restart()
        await first.commit([F.user_message("after the drop")])
        await second.commit([F.user_message("goes on")])
        assert [info.session_id for info in await repo.list()]  # the pool's connections too
        await first.close()
        reopened = await repo.open(first_id)
        await reopened.commit([F.user_message("reopened")])
        assert [m["content"] for m in (await repo.load(first_id)).transcript] == [
            "first",
            "after the drop",
            "reopened",
        ]
        await reopened.close()
        await second.close()
        await repo.close()

    asyncio.run(main())


def test_an_async_batch_whose_connection_breaks_at_commit_is_an_unknown_outcome(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's backend is terminated as its COMMIT is sent: that batch is poisoned as an
    unknown outcome (never retried: it may have landed), and every session goes on."""
    import psycopg

    url = postgres_server.new_database()
    real_commit = psycopg.Connection.commit
    broken: list[int] = []

    def commit_on_a_terminated_backend(connection: Any) -> None:
        if not broken:
            broken.append(connection.info.backend_pid)
            terminate_backend(url, connection.info.backend_pid)  # gone before the COMMIT is sent
        real_commit(connection)

    async def main() -> None:
        # a lease that outlasts the restart's crash recovery, however loaded the machine (it took
        # over 30 s beside other work): this test is about the connection, not the lease
        repo = await sessionlog.repository_async(url, lease_seconds=600)
        first, second = await repo.create(**HEADER), await repo.create(**HEADER)
        await first.commit(F.accept_prompt("first"))
        await second.commit(F.accept_prompt("second"))
        first_id = (await first.load()).session_id
        monkeypatch.setattr(psycopg.Connection, "commit", commit_on_a_terminated_backend)
        with pytest.raises(sessionlog.StorePoisonedError) as caught:
            await first.commit([F.user_message("in flight")])
        assert isinstance(caught.value.__cause__, sessionlog.CommitOutcomeUnknownError), (
            caught.value.__cause__
        )
        await second.commit([F.user_message("goes on")])
        await first.close()
        reopened = await repo.open(first_id)
        assert [m["content"] for m in (await reopened.load()).transcript] == ["first"]  # it had not landed
        await reopened.commit([F.user_message("reopened")])
        await reopened.close()
        await second.close()
        await repo.close()

    asyncio.run(main())
    assert len(broken) == 1


def test_a_sync_store_used_after_its_repository_closed_was_not_written(
    postgres_server: PostgresServer,
) -> None:
    """Nothing is sent once the repository is closed: the store says so (typed), never that the
    commit may or may not be on disk."""
    url = postgres_server.new_database()
    repo = sessionlog.repository(url)
    store = repo.create(**HEADER)
    store.commit(F.accept_prompt("before the close"))
    session_id = store.load().session_id
    repo.close()
    with pytest.raises(sessionlog.SessionLogError) as caught:
        store.commit([F.user_message("after the close")])
    assert "may or may not" not in str(caught.value), caught.value
    assert "not written" in str(caught.value), caught.value
    with sessionlog.repository(url) as again:
        assert contents(again, session_id) == ["before the close"]


def test_a_sync_repository_goes_on_after_a_server_restart(postgres_server: PostgresServer) -> None:
    url = postgres_server.new_database()
    with sessionlog.repository(url, lease_seconds=600) as repo:  # outlasts a slow crash recovery
        store = repo.create(**HEADER)
        store.commit(F.accept_prompt("before the restart"))
        session_id = store.load().session_id
        postgres_server.kill()
        postgres_server.restart()
        assert [info.session_id for info in repo.list()] == [session_id]
        store.commit([F.user_message("after the restart")])
        assert contents(repo, session_id) == ["before the restart", "after the restart"]
        store.close()


def test_a_restart_clears_the_children_a_killed_postmaster_left(postgres_server: PostgresServer) -> None:
    """A child of a killed postmaster that outlives it (one forked while the kill went on; here a
    stopped backend, which cannot see its postmaster die) holds the server's shared memory, and
    every start is refused ("pre-existing shared memory block is still in use"): the restart
    kills it and starts (the nemesis' restart gave up on one after 60 s in a CI run)."""
    import psycopg

    connection = psycopg.connect(postgres_server.url, autocommit=True)
    backend = connection.execute("select pg_backend_pid()").fetchone()[0]  # type: ignore[index]
    os.kill(backend, signal.SIGSTOP)
    os.kill(postgres_server.postmaster_pid(), signal.SIGKILL)
    wait_for(lambda: not postgres_server.listening(), what="the killed postmaster to stop listening")
    try:
        postgres_server.restart(seconds=20)
        assert not _live(backend)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(backend, signal.SIGKILL)  # (where the restart did not)
    assert postgres_server.psql("select 1") == "(1,)"
    connection.close()


def _live(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# -- every driver error typed, naming the operation and the session ---------------------------------


def test_a_broken_connection_in_every_sync_call_is_a_typed_error(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver fails every statement on sessionlog's tables (the connection broke): each
    public call raises RepositoryError naming its operation and session, without the password."""
    import psycopg

    url = postgres_server.new_database()
    repo = sessionlog.repository(url)
    with repo.create(**HEADER) as store:
        store.commit(F.accept_prompt("kept"))
        session_id = store.load().session_id
    exported = repo.export(session_id)
    real_execute = psycopg.Connection.execute

    def broken(connection: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if "sessionlog." in str(query):
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return real_execute(connection, query, *args, **kwargs)

    calls: dict[str, tuple[Any, str | None]] = {
        "list": (lambda: repo.list(), None),
        "create": (lambda: repo.create(**HEADER), None),
        "open": (lambda: repo.open(session_id), session_id),
        "load": (lambda: repo.load(session_id), session_id),
        "label": (lambda: repo.label(session_id, ["x"]), session_id),
        "delete": (lambda: repo.delete(session_id), session_id),
        "fork": (lambda: repo.fork(session_id, 2), session_id),
        "export": (lambda: repo.export(session_id), session_id),
        "import": (lambda: repo.import_(exported), None),
        "unfinished": (lambda: repo.unfinished(), None),
        "claim_unfinished": (lambda: repo.claim_unfinished(), None),
    }
    monkeypatch.setattr(psycopg.Connection, "execute", broken)
    for operation, (call, named) in calls.items():
        with pytest.raises(sessionlog.RepositoryError) as caught:
            call()
        assert caught.value.operation == operation, (operation, caught.value)
        assert caught.value.session_id == named, (operation, caught.value)
        assert isinstance(caught.value.__cause__, psycopg.OperationalError)
        assert postgres_server.password not in str(caught.value) + repr(caught.value)
    monkeypatch.setattr(psycopg.Connection, "execute", real_execute)
    assert contents(repo, session_id) == ["kept"]
    repo.close()


def test_a_connection_broken_at_the_commit_of_a_create_is_an_unknown_outcome(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    url = postgres_server.new_database()
    with sessionlog.repository(url) as repo:

        def broken(connection: Any) -> None:
            raise psycopg.OperationalError("server closed the connection unexpectedly")

        monkeypatch.setattr(psycopg.Connection, "commit", broken)
        with pytest.raises(sessionlog.CommitOutcomeUnknownError, match="may or may not"):
            repo.create(**HEADER)


# -- no password shown, whatever the location's shape -----------------------------------------------

SECRET = "S3cr3t-pw"
SHAPES = [
    f"postgresql://u:{SECRET}@[host",  # malformed: libpq echoes the whole URL
    f"postgresql://u:{SECRET}@[::1/db",
    f"postgresql://u:{SECRET}@127.0.0.1:notaport/db",
    f"postgresql://u:{SECRET}@127.0.0.1:1/db?connect_timeout=2",
    f"postgresql://u:{SECRET}@127.0.0.1:1/db?bogus=1",
    f"postgresql://u:{SECRET}@127.0.0.1:1/db?sslmode=bogus",
    f"postgresql://u@127.0.0.1:1/db?password={SECRET}&connect_timeout=2",
    f"postgresql://u@127.0.0.1:1/db?password={SECRET}&bogus=1",
    "postgresql://u:S3cr%33t-pw@127.0.0.1:1/db?bogus=1",  # percent-encoded
    "postgresql://u@127.0.0.1:1/db?password=S3cr%33t-pw&bogus=1",
    f"postgresql://u:{SECRET}@@127.0.0.1:1/db?bogus=1",
    f"host=127.0.0.1 port=1 user=u password={SECRET} connect_timeout=2",
    f"host=127.0.0.1 port=notaport password={SECRET}",
    f"host=127.0.0.1 password = {SECRET} bogus=1",
    f"host=127.0.0.1 password='{SECRET}' bogus=1",
    f"host=127.0.0.1 password='{SECRET} x' bogus=1",
    f"host=127.0.0.1 password='{SECRET}",  # an unterminated quote
    f"host=[x password={SECRET} port",
    f"password={SECRET}",
]


def _every_text(error: BaseException) -> str:
    """Everything an error can show: str, repr, args, the chain, the formatted traceback."""
    import traceback

    texts = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts += [str(current), repr(current), repr(current.args)]
        current = current.__cause__ or current.__context__
    texts += traceback.format_exception(error)
    return "\n".join(texts)


@pytest.mark.parametrize("location", SHAPES)
def test_no_password_in_any_error_whatever_the_shape(location: str) -> None:
    from sessionlog.repositories.locations import mask_in, masked
    from sessionlog.repositories.postgres import PostgresRepository

    with pytest.raises(sessionlog.SessionLogError) as caught:
        PostgresRepository(location)
    shown = _every_text(caught.value)
    assert SECRET not in shown and "S3cr%33t-pw" not in shown, shown
    for text in (masked(location), mask_in(f"bad: {location}", location)):
        assert SECRET not in text and "S3cr%33t-pw" not in text and "S3cr3t" not in text, text


def test_no_password_in_reprs_or_errors_of_a_live_repository(postgres_server: PostgresServer) -> None:
    url = postgres_server.new_database()
    password = postgres_server.password
    with sessionlog.repository(url) as repo, repo.create(**HEADER) as store:
        shown = repr(repo) + str(repo.path) + repr(store) + str(store.path)
        with pytest.raises(sessionlog.SessionNotFoundError) as caught:
            repo.open("01a23551-afe2-7383-ba2e-1bf74f5db851")
        shown += _every_text(caught.value)
    assert password not in shown


@pytest.mark.parametrize(
    ("location", "password"),
    [
        ("postgresql://u:S3cr%33t-pw@h/db", SECRET),
        ("postgresql://u@h/db?password=S3cr%33t-pw", SECRET),
        ("postgresql://u@h/db?sslmode=require&PASSWORD=S3cr%33t-pw", SECRET),
        (f"postgresql://u:{SECRET}@@h/db", SECRET),
        (f"postgresql://u:{SECRET}@x@h/db", f"{SECRET}@x"),
        (f"host=h password='{SECRET} x'", f"{SECRET} x"),
        (r"host=h password='S3cr3t\'pw'", "S3cr3t'pw"),
        (f"postgres://u:{SECRET}@h:5432", SECRET),
    ],
)
def test_a_drivers_message_is_masked_in_every_form_of_the_password(location: str, password: str) -> None:
    """libpq quotes a password decoded (percent-encoding, quotes, escapes) or not at all."""
    from sessionlog.repositories.locations import mask_in

    shown = mask_in(f'connection failed for {location}: password "{password}" rejected', location)
    assert password not in shown and SECRET not in shown, shown


# -- create=False creates nothing -----------------------------------------------------------------


def test_create_false_on_a_database_without_the_schema_creates_nothing(
    postgres_server: PostgresServer,
) -> None:
    url = postgres_server.new_database()
    with pytest.raises(sessionlog.RepositoryNotFoundError) as caught:
        sessionlog.repository(url, create=False)
    assert isinstance(caught.value, FileNotFoundError) and postgres_server.password not in str(caught.value)
    with pytest.raises(sessionlog.RepositoryNotFoundError):
        asyncio.run(sessionlog.repository_async(url, create=False))
    assert sql(url, "select to_regnamespace('sessionlog')") == [(None,)]
    missing = postgres_server.url_for("no_such_database")
    with pytest.raises(sessionlog.RepositoryNotFoundError) as caught:
        sessionlog.repository(missing, create=False)
    assert postgres_server.password not in str(caught.value)
    with sessionlog.repository(url) as repo, repo.create(**HEADER):
        pass
    with sessionlog.repository(url, create=False) as repo:  # an existing one opens as before
        assert len(repo.list()) == 1


def test_a_sync_repository_goes_on_after_its_backends_are_terminated(postgres_server: PostgresServer) -> None:
    """Every pooled connection is terminated at once (as a failover or an operator does): the
    next calls and commits go through new connections, not one failed call per dead one."""
    url = postgres_server.new_database()
    with sessionlog.repository(url) as repo:
        store = repo.create(**HEADER)
        store.commit(F.accept_prompt("before"))
        session_id = store.load().session_id
        database = url.rsplit("/", 1)[1]
        terminated = [
            pid
            for pid, _ in sql(
                url,
                "select pid, pg_terminate_backend(pid) from pg_stat_activity "
                "where datname = %s and pid <> pg_backend_pid()",
                database,
            )
        ]
        assert terminated  # the repository's connections
        # The terminations are signals: the next call must not reach a backend still alive.
        wait_for(
            lambda: not sql(url, "select 1 from pg_stat_activity where pid = any(%s)", terminated),
            f"the terminated backends {terminated} to be gone",
        )
        for _ in range(4):
            assert [info.session_id for info in repo.list()] == [session_id]
        store.commit([F.user_message("after")])
        assert contents(repo, session_id) == ["before", "after"]
        store.close()


@pytest.mark.parametrize("lease", [1e-05, 0, -1, float("nan"), float("inf"), 10**6, "30", True])
def test_a_lease_is_checked_at_the_door(lease: Any, postgres_server: PostgresServer) -> None:
    """A lease SQL cannot spell (1e-05), or no lease at all, is refused before any connection."""
    with pytest.raises(ValueError, match="lease_seconds"):
        sessionlog.repository(postgres_server.url, lease_seconds=lease)


def test_a_store_dropped_without_close_is_renewed_no_longer(postgres_server: PostgresServer) -> None:
    """The heartbeat renews a session only while a store of it exists: one dropped without
    `close()` lets its lease run out, and the session is then recovered as any other."""
    import gc

    url = postgres_server.new_database()
    with sessionlog.repository(url, lease_seconds=5) as repo:  # outlasts a slow first commit
        store = repo.create(**HEADER)
        store.commit(F.accept_prompt("dropped"))
        session_id = store.load().session_id
        del store
        gc.collect()
        assert repo.heartbeat.held() == []
        wait_for(lambda: lease_ran_out(url, session_id), "the lease of a dropped store to run out")
        assert [info.session_id for info in repo.unfinished()] == [session_id]
        with repo.open(session_id) as again:
            again.commit([F.user_message("picked up")])
        assert contents(repo, session_id) == ["dropped", "picked up"]


def test_a_dropped_async_store_gives_its_session_back(postgres_server: PostgresServer) -> None:
    """An async store dropped without `close()` releases its session once collected (the
    writer thread writes the release, in order with the commits): it is unfinished at once."""
    import gc

    url = postgres_server.new_database()

    async def main() -> None:
        repo = await sessionlog.repository_async(url)  # a lease no late renewal loses: released, not lapsed
        dropped, other = await repo.create(**HEADER), await repo.create(**HEADER)
        await dropped.commit(F.accept_prompt("dropped"))
        session_id = (await dropped.load()).session_id
        del dropped
        gc.collect()
        await other.commit(F.accept_prompt("after the drop"))  # the writer handled what came before
        assert session_id in [info.session_id for info in await repo.unfinished()]
        assert repo.sync.heartbeat.held() == [((await other.load()).session_id, 1)]
        again = await repo.open(session_id)
        await again.commit([F.user_message("picked up")])
        assert [m["content"] for m in (await repo.load(session_id)).transcript] == ["dropped", "picked up"]
        await again.close()
        await other.close()
        await repo.close()

    asyncio.run(main())


def test_a_second_ctrl_c_while_a_server_stops_still_removes_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found pressing Ctrl-C twice while `sessionlog bench` set up its throwaway server: the
    second interrupted `pg_ctl stop`, and the server's folder (its password file in it) was
    left. The stop is tried once more and the folder removed in any case; the interrupt is the
    caller's (its first Ctrl-C is already on its way)."""
    try:
        server = PostgresServer(tmp_path / "server", tmp_path / "server" / "data", 1, "pw", None)
    except Exception as error:  # no PostgreSQL binaries: this stop has nothing to stop
        pytest.skip(f"no PostgreSQL binaries here: {error}")
    server.data.mkdir(parents=True)
    (server.data / "postmaster.pid").write_text("1\n")
    calls: list[str] = []

    def interrupted(*command: Any, **options: Any) -> Any:
        calls.append(Path(str(command[0])).name)
        raise KeyboardInterrupt

    monkeypatch.setattr(server, "_run", interrupted)
    server.stop()
    assert calls == ["pg_ctl", "pg_ctl"]  # tried again after the first interrupt, not more
    assert not server.root.exists()

"""The fault harness (`sessionlog.testing.nemesis`) and its checker (`testing.histories`).

Workers open, create, fork, label, delete, claim, commit and close at random on one repository
of each kind while a nemesis kills them (SIGKILL), stops them (SIGSTOP, past the lease on
PostgreSQL) and shifts their clocks (libfaketime), and on PostgreSQL terminates their
connections and kills and restarts the server; the checker then judges every history against
what the repository holds. Short runs here (about 10 s of faults per kind, ~45 s in all with
the server's start, longer where a loaded machine needs it for the 51 acknowledged commits a run
goes on until); the long ones (`-m long`, and `scripts/reliability.py`) run minutes.

The checker's mutation test feeds it a real history with one acknowledged commit removed, one
duplicated and one reordered (and each other violation it knows): it must name each.
Defects the harness found have their own regression tests at the end.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from conftest import budgets, start_postgres, wait_for
from sessionlog.testing.histories import check, operations, parse_token, read_histories
from sessionlog.testing.nemesis import faketime_library, read_contents, run_fault_harness, summary
from sessionlog.testing.postgres import PostgresServer

SECONDS = budgets(10, 120, 600)
ACKNOWLEDGED = 51  # commits a run has acknowledged at least (it goes on until it has): real work


def _require_faketime() -> None:
    if faketime_library() is None:
        if os.environ.get("CI"):
            pytest.fail("libfaketime is required in CI (apt-get install faketime) for the clock shifts")
        print("\nWARNING: libfaketime is not installed: this run shifts no clocks (apt-get install faketime)")


def _judged(report: Any) -> None:
    print(summary(report))
    for remark in report.remarks:  # faults that could not be made, say
        print("  note:", remark)
    assert report.ok, "\n".join(report.check.violations[:20] + report.notes[:10])
    assert report.check.acknowledged >= ACKNOWLEDGED, summary(report)  # the run did real work
    assert report.check.faults["kill"] > 0 and report.check.faults["stop"] > 0, summary(report)


@pytest.fixture(scope="module")
def own_server() -> Iterator[PostgresServer]:
    """A server of this module's own: the nemesis kills and restarts it."""
    server = start_postgres()
    yield server
    server.stop()


# -- the short (and long) runs, one per repository kind ------------------------------------------


@pytest.mark.parametrize("seconds", SECONDS)
def test_a_directory_repository_under_the_nemesis(tmp_path: Path, seconds: int) -> None:
    _require_faketime()
    report = run_fault_harness(
        str(tmp_path / "repo"), seconds=seconds, min_acknowledged=ACKNOWLEDGED, work=tmp_path / "work"
    )
    _judged(report)


@pytest.mark.parametrize("seconds", SECONDS)
def test_a_sqlite_repository_under_the_nemesis(tmp_path: Path, seconds: int) -> None:
    _require_faketime()
    report = run_fault_harness(
        f"sqlite:///{tmp_path}/sessions.db",
        seconds=seconds,
        min_acknowledged=ACKNOWLEDGED,
        work=tmp_path / "work",
    )
    _judged(report)
    if faketime_library() is not None:
        assert report.check.faults["clock"] > 0


@pytest.mark.parametrize("seconds", SECONDS)
def test_a_postgres_repository_under_the_nemesis(
    own_server: PostgresServer, tmp_path: Path, seconds: int
) -> None:
    _require_faketime()
    report = run_fault_harness(
        own_server.new_database(),
        seconds=seconds,
        min_acknowledged=ACKNOWLEDGED,
        faults=("kill", "stop", "clock", "terminate", "restart"),
        options={"lease_seconds": 1.0},
        stop_seconds=1.5,  # past the lease: the stopped writer's sessions may be taken over
        server=own_server,
        work=tmp_path / "work",
    )
    _judged(report)
    assert report.check.faults["restart"] > 0 and report.check.faults["terminate"] > 0


# -- the checker, mutated ------------------------------------------------------------------------


RECORDED = 60  # acknowledged commits of the recorded run at least


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """A real history: a short run on a directory repository, and what the repository holds, with
    a session the mutations below can use (`_mutable_session`). Which sessions a run leaves is
    chance (deletes, kills), so a run that left none is followed by one of another seed."""
    runs: list[str] = []
    for seed in range(3):
        tmp = tmp_path_factory.mktemp("recorded")
        location = str(tmp / "repo")
        report = run_fault_harness(
            location,
            seconds=4,
            min_acknowledged=RECORDED,  # however slow the machine: enough for sessions of several
            faults=("kill",),
            pause=1.0,
            seed=seed,
            work=tmp / "work",
        )
        assert report.ok, report.check.violations[:5] + report.notes[:5]
        records, contents = read_histories(tmp / "work" / "histories"), read_contents(location, {})
        if _mutable_session(records, contents) is not None:
            return records, contents
        runs.append(f"seed {seed}: {report.check.acknowledged} acknowledged, {len(contents)} sessions left")
    pytest.fail(
        "no recorded run left a session with three acknowledged commits of its own, two of them "
        f"neighbours by one writer ({'; '.join(runs)})"
    )


def _mutable_session(
    records: list[dict[str, Any]], contents: dict[str, list[str]]
) -> tuple[str, list[str], list[str], int] | None:
    """A session (the longest) that holds three acknowledged commits of its own and no delete
    was asked of (its absence would be allowed), two of its own lines neighbours by one writer:
    (session, its texts, its own acknowledged ones, the index in texts of the later neighbour)."""
    commits = [op for op in operations(records) if op.op == "commit"]
    made_in = {op.value: op.session for op in commits}  # a fork's copies are of their parent
    acked = {op.value for op in commits if op.outcome == "ok"}
    deleted = {r["s"] for r in records if r.get("op") == "delete" and r.get("type") == "invoke"}
    for session, texts in sorted(contents.items(), key=lambda item: -len(item[1])):
        if session in deleted:
            continue
        own = {text for text in texts if made_in.get(text) == session}
        mine = [text for text in texts if text in own and text in acked]
        # own lines' neighbours by one process: a swap is a reorder (copied ones would be no prefix)
        neighbours = [
            i
            for i in range(1, len(texts))
            if texts[i - 1] in own and texts[i].split(":")[0] == texts[i - 1].split(":")[0]
        ]
        if len(mine) >= 3 and neighbours:
            return session, texts, mine, neighbours[-1]
    return None


def _acknowledged_session(
    records: list[dict[str, Any]], contents: dict[str, list[str]]
) -> tuple[str, list[str], list[str], int]:
    found = _mutable_session(records, contents)
    assert found is not None, "the recorded run left no session the mutations can use"
    return found


def test_the_checker_passes_the_real_history(recorded: Any) -> None:
    records, contents = recorded
    report = check(records, contents)
    assert report.ok and report.acknowledged >= RECORDED, report.violations[:5]


def test_the_checker_names_a_removed_acknowledged_commit(recorded: Any) -> None:
    records, contents = recorded
    session, texts, acknowledged, _ = _acknowledged_session(records, contents)
    removed = acknowledged[-2]
    report = check(records, {**contents, session: [text for text in texts if text != removed]})
    assert [v for v in report.violations if v.startswith("lost")] == [
        f"lost: acknowledged {removed!r} is missing from session {session}"
    ]


def test_the_checker_names_a_duplicated_commit(recorded: Any) -> None:
    records, contents = recorded
    session, texts, _, _ = _acknowledged_session(records, contents)
    report = check(records, {**contents, session: [*texts, texts[-1]]})
    assert any(v.startswith(f"duplicated: {texts[-1]!r}") for v in report.violations), report.violations


def test_the_checker_names_reordered_commits(recorded: Any) -> None:
    records, contents = recorded
    session, texts, _, at = _acknowledged_session(records, contents)  # texts[at - 1], texts[at]: one writer's
    swapped = [*texts[: at - 1], texts[at], texts[at - 1], *texts[at + 1 :]]
    report = check(records, {**contents, session: swapped})
    assert any(v.startswith("reordered") for v in report.violations), report.violations


def test_the_checker_names_a_whole_session_missing(recorded: Any) -> None:
    records, contents = recorded
    session, _, _, _ = _acknowledged_session(records, contents)
    rest = {key: value for key, value in contents.items() if key != session}
    report = check(records, rest)
    assert report.lost >= 3, report.violations


def _synthetic(*ops: tuple[str, str, str | None, str | None, str, int, int]) -> list[dict[str, Any]]:
    """Records from (process, op, session, value, outcome, invoked s, completed s) tuples."""
    records: list[dict[str, Any]] = []
    for index, (process, op, session, value, outcome, start, end) in enumerate(ops):
        records.append(
            {
                "p": process,
                "i": index,
                "type": "invoke",
                "op": op,
                "s": session,
                "v": value,
                "t": start * 10**9,
            }
        )
        records.append({"p": process, "i": index, "type": outcome, "t": end * 10**9})
    return records


def test_the_checker_names_each_other_violation() -> None:
    a1, a2, b1 = "w0.0:1:1", "w0.0:1:2", "w1.0:1:1"
    base = _synthetic(
        ("w0.0", "commit", "S", a1, "ok", 1, 2),
        ("w0.0", "commit", "S", a2, "ok", 5, 6),
        ("w1.0", "commit", "S", b1, "ok", 3, 4),
    )
    # hold w1.0:1 wrote between two commits of hold w0.0:1, in the log and in time
    report = check(base, {"S": [a1, b1, a2]})
    assert any(v.startswith("interleaved") for v in report.violations), report.violations
    assert any(v.startswith("two live writers") for v in report.violations), report.violations
    assert check(base[:2] + base[4:], {"S": [a1, b1]}).ok  # one hold after the other: fine
    # a2 invoked before b1 was acknowledged, but told only after (its process stopped meanwhile):
    # no proof of two writers; the log's order (a2 before b1) says it landed first
    stopped = _synthetic(
        ("w0.0", "commit", "S", a1, "ok", 1, 2), ("w0.0", "commit", "S", a2, "ok", 3, 9),
        ("w1.0", "commit", "S", b1, "ok", 5, 6),
    )  # fmt: skip
    assert check(stopped, {"S": [a1, a2, b1]}).ok
    # CI (PostgreSQL, lease 1 s, stop 1.5 s): a1 landed, then its writer was stopped before it
    # heard so; b's writer took the session over and went on committing. a1's late acknowledgement
    # made b look like the older hold, and b2 like a second live writer: the log says a came first
    b2 = "w1.0:1:2"
    taken_over = _synthetic(
        ("w0.0", "commit", "S", a1, "ok", 1, 10), ("w1.0", "commit", "S", b1, "ok", 3, 4),
        ("w1.0", "commit", "S", b2, "ok", 11, 12),
    )  # fmt: skip
    assert check(taken_over, {"S": [a1, b1, b2]}).ok, check(taken_over, {"S": [a1, b1, b2]}).violations
    # and a writer that goes on after being taken over is named, however late its acknowledgements
    went_on = _synthetic(
        ("w0.0", "commit", "S", a1, "ok", 1, 10), ("w1.0", "commit", "S", b1, "ok", 3, 4),
        ("w0.0", "commit", "S", a2, "ok", 11, 12),
    )  # fmt: skip
    assert any(v.startswith("two live writers") for v in check(went_on, {"S": [a1, b1, a2]}).violations)
    assert any(v.startswith("phantom") for v in check(base, {"S": [a1, a2, b1, "w9.0:1:1"]}).violations)
    # Where the session is gone (deleted later), time alone must tell which hold came first. The
    # hunt (PostgreSQL, lease 1 s, stop 1.5 s): a1 landed, its writer was stopped before it heard
    # so, b took the session over; a1's acknowledgement came between b1's and b2's invocations
    deleted = ("w2.0", "delete", "S", None, "ok", 20, 21)
    overtaken = _synthetic(
        ("w0.0", "commit", "S", a1, "ok", 1, 10), ("w1.0", "commit", "S", b1, "ok", 8, 9),
        ("w1.0", "commit", "S", b2, "ok", 11, 12), deleted,
    )  # fmt: skip
    assert check(overtaken, {}).ok, check(overtaken, {}).violations
    # a writer that went on after its commit had landed before the other's began is still named
    went_on_gone = _synthetic(
        ("w0.0", "commit", "S", a1, "ok", 1, 2), ("w1.0", "commit", "S", b1, "ok", 3, 4),
        ("w0.0", "commit", "S", a2, "ok", 11, 12), deleted,
    )  # fmt: skip
    assert [v.split(":")[0] for v in check(went_on_gone, {}).violations] == ["two live writers"]
    # and where either may have come first, late commits of both are proof, named once
    both_late = _synthetic(
        ("w0.0", "commit", "S", a1, "ok", 1, 10), ("w1.0", "commit", "S", b1, "ok", 3, 4),
        ("w0.0", "commit", "S", a2, "ok", 11, 12), ("w1.0", "commit", "S", b2, "ok", 11, 13), deleted,
    )  # fmt: skip
    assert [v.split(":")[0] for v in check(both_late, {}).violations] == ["two live writers"]
    refused = _synthetic(("w0.0", "commit", "S", a1, "fail", 1, 2))
    assert [v.split(":")[0] for v in check(refused, {"S": [a1]}).violations] == ["refused but present"]
    assert check(refused, {"S": []}).ok
    # a delete whose worker was killed before it was told may have happened: not a loss
    gone = _synthetic(("w0.0", "commit", "S", a1, "ok", 1, 2), ("w1.0", "delete", "S", None, "ok", 3, 4))
    assert check(gone[:3], {}).ok
    assert check(gone[:2], {}).lost == 1  # no delete at all: lost
    late = _synthetic(("w0.0", "delete", "S", None, "ok", 1, 2), ("w1.0", "commit", "S", b1, "ok", 3, 4))
    assert any(v.startswith("acknowledged after delete") for v in check(late, {}).violations)
    slow = _synthetic(("w0.0", "label", "S", None, "ok", 1, 40))
    assert any(v.startswith("hung") for v in check(slow, {"S": []}, bound=30).violations)
    stop = {
        "p": "nemesis",
        "type": "fault",
        "fault": "stop",
        "target": "w0.0",
        "t": 2 * 10**9,
        "until": 35 * 10**9,
    }
    stopped = [*slow, stop]
    assert check(stopped, {"S": []}, bound=30).ok  # its 33 s stopped by the nemesis do not count
    raw = _synthetic(("w0.0", "label", "S", None, "unknown", 1, 2))
    raw[1].update(err="psycopg.OperationalError", typed=False)
    assert any(v.startswith("untyped error") for v in check(raw, {"S": []}).violations)
    never = [raw[0]]
    assert any(v.startswith("hung") for v in check(never, {"S": []}, alive=["w0.0"]).violations)
    assert check(never, {"S": []}).ok  # its process was killed: it just never returned
    unknown = _synthetic(("w0.0", "commit", "S", a1, "unknown", 1, 2))
    assert check(unknown, {"S": [a1]}).unknown_present == 1
    assert check(unknown, {"S": []}).unknown_absent == 1
    assert any(v.startswith("duplicated") for v in check(unknown, {"S": [a1, a1]}).violations)
    assert parse_token("hello") is None and parse_token(a1) == ("w0.0", "w0.0:1", 1)


# -- defects the harness found -------------------------------------------------------------------


def _backoffs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, float]]:
    """Every delay psycopg_pool's backoff sets from now on, as (attempt, thread, seconds): a
    reconnect attempt's after each failed connect (in the pool's worker), and a caller's after
    each connection the pool's check refused (0 s for the first, then 1, 2, 4 ...)."""
    import psycopg_pool.pool
    from psycopg_pool.base import AttemptWithBackoff

    delays: list[tuple[int, int, float]] = []
    numbers = itertools.count()

    class Recorded(AttemptWithBackoff):
        def __init__(self, *, timeout: float) -> None:
            super().__init__(timeout=timeout)
            self.number = next(numbers)
            delays.append((self.number, threading.get_ident(), self.delay))

        def update_delay(self, now: float) -> None:
            super().update_delay(now)
            delays.append((self.number, threading.get_ident(), self.delay))

    monkeypatch.setattr(psycopg_pool.pool, "AttemptWithBackoff", Recorded)
    return delays


def test_calls_go_on_promptly_once_a_server_that_was_down_a_while_is_back(
    own_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the harness: after the server was down a few seconds, psycopg_pool's reconnect
    backoff (1, 2, 4, 8 s ... doubling up to its 5 minute reconnect_timeout) left calls waiting
    up to their whole 30 s for a connection although the server was back within a second. Now
    the pool gives up on an attempt after RECONNECT_SECONDS and starts afresh: however long the
    server is down, the pool waits at most that long between two tries to connect, so the first
    try after its return comes within it. The server stays down until the pool backed off three
    times (the third delay, doubling, is 4 s; started afresh, the second attempt's first)."""
    from sessionlog.repositories.postgres_pool import RECONNECT_SECONDS

    backoffs = _backoffs(monkeypatch)
    url = own_server.new_database()
    with sessionlog.repository(url, max_connections=1) as repo:  # one connection: one reconnect attempt
        session_id = repo.create(provider="p", model="m", cwd="/w").load().session_id
        own_server.kill()
        waiting = threading.Thread(target=_quietly, args=(repo.list,))
        waiting.start()  # a call while the server is down: the pool tries to connect, and backs off
        wait_for(
            lambda: len([delay for _, _, delay in backoffs if delay > 0]) >= 3,
            "the pool to back off three times from connecting to the server that is down (an attempt "
            "that gave up tries no more unless one is started afresh)",
        )
        own_server.restart()
        repo.label(session_id, ["after"])  # its 30 s for a connection: a hang bound only
        assert [row.labels for row in repo.list()] == [("after",)]
        waiting.join()
    delays = [round(delay, 2) for _, _, delay in backoffs if delay > 0]
    attempts = {attempt for attempt, _, delay in backoffs if delay > 0}
    print(f"the pool's delays between tries to connect: {delays} s")
    assert max(delays) <= RECONNECT_SECONDS, (
        f"the pool waited up to {max(delays):.1f} s between tries to connect to a server that was "
        f"down (delays {delays} s: doubling), past RECONNECT_SECONDS ({RECONNECT_SECONDS:g} s)"
    )
    assert len(attempts) > 1, f"one reconnect attempt went on (delays {delays} s): never started afresh"


def _quietly(call: Any) -> None:
    with contextlib.suppress(sessionlog.core.errors.SessionLogError):
        call()


TERMINATE = (
    "select pg_terminate_backend(pid) from pg_stat_activity where datname = current_database() "
    "and pid <> pg_backend_pid() and backend_type = 'client backend'"
)


def test_calls_go_on_beside_a_burst_of_terminated_connections(
    own_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the harness: with `pg_terminate_backend` hitting every connection ten times a
    second, psycopg_pool slept a doubling delay (0, 1, 2, 4, 8, 16 s) after each connection its
    check refused, so calls waited their whole 30 s for a connection beside fresh ones, and went
    on waiting after the burst. Now the repository checks the connections it is lent itself and
    gives a broken one back at once: a call that meets a pool of terminated connections goes
    through them all, each refused, to a fresh one, and the pool's backoff never delays it."""
    import psycopg
    from psycopg_pool import ConnectionPool

    from sessionlog.repositories.postgres_pool import readable

    backoffs = _backoffs(monkeypatch)
    refused = 0
    real = ConnectionPool.check_connection

    def counted(connection: Any) -> None:
        nonlocal refused
        try:
            real(connection)
        except Exception:
            refused += 1
            raise

    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(counted))
    url = own_server.new_database()
    with (
        sessionlog.repository(url, max_connections=4) as repo,
        psycopg.connect(url, autocommit=True) as killer,
    ):
        session_id = repo.create(provider="p", model="m", cwd="/w").load().session_id
        for burst in range(3):
            with contextlib.ExitStack() as lent:  # the pool's four connections, terminated while lent
                connections = [lent.enter_context(repo.lent()) for _ in range(4)]
                killer.execute(TERMINATE)
                wait_for(
                    lambda connections=connections: all(map(readable, connections)),
                    "the server to end the four terminated connections",
                )
            before = refused
            repo.label(session_id, [f"after {burst}"])  # its 30 s for a connection: a hang bound only
            assert refused - before == 4, f"{refused - before} of the 4 terminated connections refused"
        assert [row.labels for row in repo.list()] == [("after 2",)]
    caller = [round(delay, 2) for _, thread, delay in backoffs if thread == threading.get_ident()]
    print(f"{refused} terminated connections refused; the pool's backoff delayed the calls {caller} s")
    assert caller == [], (
        f"calls that met terminated connections were put through the pool's backoff: delays {caller} s "
        "(doubling from the second refused connection on)"
    )


def test_a_connection_interrupted_in_its_check_is_given_back(
    own_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check `lent()` makes is the repository's own now: a KeyboardInterrupt in it must not
    leak the connection (with one connection, the next call would wait out its timeout)."""
    with sessionlog.repository(own_server.new_database(), max_connections=1) as repo:
        repo.list()
        time.sleep(1.2)  # idle past the unchecked second: the next lending checks it
        real = type(repo.pool).check_connection

        def interrupted(connection: Any) -> None:
            monkeypatch.setattr(type(repo.pool), "check_connection", real)
            raise KeyboardInterrupt

        monkeypatch.setattr(type(repo.pool), "check_connection", staticmethod(interrupted))
        with pytest.raises(KeyboardInterrupt):
            repo.list()
        with repo.lent(timeout=5) as connection:  # PoolTimeout here if it leaked
            assert connection.execute("select 1").fetchone() == (1,)


def test_the_checker_names_what_the_review_found_it_missed() -> None:
    """A hostile review of the checker found false passes; each is named now."""
    a1, a2, b1 = "w0.0:1:1", "w0.0:1:2", "w1.0:1:1"
    # a delete returned ok, yet the session is still there
    deleted = _synthetic(("w0.0", "commit", "S", a1, "ok", 1, 2), ("w1.0", "delete", "S", None, "ok", 3, 4))
    assert any(v.startswith("deleted but present") for v in check(deleted, {"S": [a1]}).violations)
    # a delete told (unknown) before a commit was acknowledged cannot excuse that commit's loss
    early = _synthetic(
        ("w1.0", "delete", "S", None, "unknown", 1, 2), ("w0.0", "commit", "S", a1, "ok", 3, 4)
    )
    assert check(early, {}).lost == 1
    # another session's lines at the head of a session no fork was asked of
    assert any("not a prefix" in v for v in check(deleted[:2], {"S": [a1], "T": [a1]}).violations)
    forked = _synthetic(
        ("w0.0", "commit", "S", a1, "ok", 1, 2), ("w0.0", "commit", "S", a2, "ok", 3, 4),
        ("w1.0", "fork", "S", None, "ok", 5, 6),
    )  # fmt: skip
    assert check(forked, {"S": [a1, a2], "F": [a1, a2]}).ok
    assert any("not a prefix" in v for v in check(forked, {"S": [a1, a2], "F": [a2, a1]}).violations)
    refused = _synthetic(("w0.0", "commit", "S", b1, "fail", 1, 2), ("w1.0", "fork", "S", None, "ok", 5, 6))
    assert any(v.startswith("refused but present") for v in check(refused, {"F": [b1]}).violations)
    # a call pending 99 s when its process was killed hung, kill or not
    pending = _synthetic(("w0.0", "label", "S", None, "ok", 1, 2))[:1]
    kill = {"p": "nemesis", "type": "fault", "fault": "kill", "target": "w0.0", "t": 100 * 10**9}
    assert any(v.startswith("hung") for v in check([*pending, kill], {"S": []}, bound=30).violations)


def test_a_fenced_commit_counts_as_refused_not_unknown() -> None:
    """A store poisoned because its hold was found lost before the commit was sent says "nothing
    was written": the harness records it as refused, so a fenced commit that landed is caught."""
    from sessionlog.core.errors import SessionChangedError, StorePoisonedError
    from sessionlog.testing.nemesis import _outcome

    fenced = StorePoisonedError("nothing was written")
    fenced.__cause__ = SessionChangedError("taken over")
    assert _outcome(fenced) == "fail"
    assert _outcome(StorePoisonedError("fdatasync failed")) == "unknown"


def test_a_lapsed_hold_is_not_reported_as_taken_over() -> None:
    """Found by the harness: a hold the server said was no longer this writer's was reported as
    taken over by another writer, although its lease may just have run out there."""
    from sessionlog.repositories.leases import Heartbeat

    heartbeat = Heartbeat(lambda keys: (set(), set(keys)), 30.0, "db")
    key = ("S", 1)
    heartbeat.hold(key, time.monotonic())
    heartbeat.renew_now()
    with pytest.raises(sessionlog.core.errors.SessionChangedError) as lost:
        heartbeat.check(key)
    assert "lease ran out there" in str(lost.value), lost.value
    heartbeat.close()


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        (["--faults", "bogus"], "no such fault: bogus"),
        (["--workers", "0"], "workers is a whole number"),
        (["--seconds", "-5"], "seconds is a number above 0"),
        (["--faults", "restart"], "needs the PostgresServer"),
    ],
)
def test_the_command_refuses_bad_input(tmp_path: Path, arguments: list[str], says: str) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "sessionlog.testing.nemesis", "run", str(tmp_path / "repo"), *arguments],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_command_refuses_a_file_for_a_directory_at_once(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "afile").write_text("x")
    done = subprocess.run(
        [sys.executable, "-m", "sessionlog.testing.nemesis", "run", str(tmp_path / "afile"), "--seconds=9"],
        capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr


def test_the_nemesis_takes_no_worker_whose_pid_is_not_written_yet(tmp_path: Path) -> None:
    """Found on a loaded machine: a worker's pid file read between its creation and its write was
    taken as pid 0, and the nemesis's SIGKILL (or SIGSTOP) went to its whole process group: the
    harness and the test run that started it. Such a file, or one removed meanwhile, is left out."""
    from sessionlog.testing.nemesis import _running

    (tmp_path / "w0.0").write_text("")  # created, not written yet
    (tmp_path / "w1.0").write_text("4242")
    (tmp_path / "w2.0").write_text("0")
    assert _running(tmp_path) == {"w1.0": 4242}


def test_an_interrupted_run_leaves_no_process_behind(tmp_path: Path) -> None:
    """Ctrl-C of the harness stops its workers and its nemesis (a stopped worker too). The signal
    reaches the whole process group, as a terminal's Ctrl-C does, with SIGINT at its default in
    the harness (a shell's background job, or a CI runner, may start us with it ignored, which
    Python keeps: the harness then ran its course, 30 s, and was taken for a slow stop). The run
    is asked for 600 s, so only the signal can end it within the wait."""
    import signal
    import subprocess
    import sys

    # SIGINT at its default through exec (a preexec_fn is unsafe beside the test runner's threads)
    harness = [sys.executable, "-m", "sessionlog.testing.nemesis", "run", str(tmp_path / "repo"),
               "--seconds", "600", "--faults", "stop"]  # fmt: skip
    default_sigint = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    run = subprocess.Popen(
        [sys.executable, "-c", default_sigint, *harness],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        started = time.monotonic()
        pids: list[int] = []
        while len(pids) < 4 and run.poll() is None and time.monotonic() - started < 300:
            time.sleep(0.1)  # a poll for a condition: the four workers running
            found = subprocess.run(["pgrep", "-f", f"nemesis worker {tmp_path}"], capture_output=True)
            pids = [int(pid) for pid in found.stdout.split()]
        took = time.monotonic() - started
        assert len(pids) >= 4, f"the workers did not start in {took:.0f} s (harness exit: {run.poll()})"
        os.killpg(run.pid, signal.SIGINT)
        interrupted = time.monotonic()
        try:
            _, errors = run.communicate(timeout=300)  # a bound for a hang only: a stop takes a second
        except subprocess.TimeoutExpired:
            raise AssertionError("the harness did not stop within 300 s of SIGINT") from None
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode == -signal.SIGINT, (run.returncode, errors.decode()[-2000:])  # the signal ended it
    assert b"KeyboardInterrupt" in errors, errors.decode()[-2000:]
    left = subprocess.run(
        ["pgrep", "-f", f"sessionlog.testing.nemesis .*{tmp_path}"], capture_output=True, text=True
    )
    assert left.stdout.split() == [], f"left running: {left.stdout.split()}"
    print(f"stopped {time.monotonic() - interrupted:.1f} s after SIGINT")


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_session_deleted_while_it_is_opened_is_not_found(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """Found by the harness (SQLite, a worker whose clock ran ahead deleting a session it saw
    as unheld): a delete landing between `open`'s read of the lines and of the summary row made
    `open` raise a bare TypeError ('NoneType' object is not subscriptable). It is
    SessionNotFoundError now, as for a session deleted before the open."""
    if kind == "sqlite":
        location = f"sqlite:///{tmp_path}/sessions.db"
    else:
        location = request.getfixturevalue("own_server").new_database()
    with sessionlog.repository(location) as repo:
        session_id = repo.create(provider="p", model="m", cwd="/w").load().session_id
        repo.list()  # the store above was dropped: its hold is released at collection
        real = type(repo).read

        def read_then_deleted(self: Any, session: str, connection: Any = None) -> bytes:
            data = real(self, session, connection)
            schema = "" if kind == "sqlite" else "sessionlog."
            if kind == "sqlite":
                import sqlite3

                with sqlite3.connect(f"{tmp_path}/sessions.db", isolation_level=None) as other:
                    other.execute(f"delete from {schema}lines where session_id = ?", (session,))
                    other.execute(f"delete from {schema}sessions where session_id = ?", (session,))
            else:
                import psycopg

                with psycopg.connect(location, autocommit=True) as other:
                    other.execute(f"delete from {schema}lines where session_id = %s", (session,))
                    other.execute(f"delete from {schema}sessions where session_id = %s", (session,))
            return data

        monkeypatch.setattr(type(repo), "read", read_then_deleted)
        with pytest.raises(sessionlog.core.errors.SessionNotFoundError):
            repo.open(session_id, take_over=True)


def test_a_delete_told_while_a_commit_was_in_flight_may_have_followed_it() -> None:
    """Found by the long SQLite run in CI: a commit landed, a worker whose clock ran 40 s ahead
    saw the writer's lease as run out and deleted the session (ok), and only then was the writer
    told of its commit. The delete may have come after the commit took effect (at any time after
    it was invoked), so the commit went with its session: not a loss."""
    a1 = "w0.0:1:1"
    in_flight = _synthetic(("w0.0", "commit", "S", a1, "ok", 1, 4), ("w1.0", "delete", "S", None, "ok", 2, 3))
    report = check(in_flight, {})
    assert report.ok and report.deleted_with_session == 1, report.violations
    # one that ended before the commit was even invoked cannot excuse it
    before = _synthetic(
        ("w1.0", "delete", "S", None, "unknown", 1, 2), ("w0.0", "commit", "S", a1, "ok", 3, 4)
    )
    assert check(before, {}).lost == 1


def test_the_server_starts_again_after_kills_amid_new_connections(own_server: PostgresServer) -> None:
    """Found by the long PostgreSQL run in CI: the server was down when the check read the
    repository (a restart of the nemesis had failed, the failure swallowed, and every later
    restart skipped: no pid file to kill by). Now a restart is retried for a minute, a kill of a
    server that is down is nothing, a fault that could not be made is a remark of the report,
    and a server still down at the end is started or an error with its log."""
    import psycopg

    url = own_server.new_database()
    stop = threading.Event()

    def connect_all_the_time() -> None:
        while not stop.is_set():
            with contextlib.suppress(psycopg.Error), psycopg.connect(url, connect_timeout=1):
                pass

    threads = [threading.Thread(target=connect_all_the_time) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(5):
            time.sleep(0.3)
            own_server.kill()
            assert not own_server.listening()
            own_server.restart()
            assert own_server.listening()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    with psycopg.connect(url) as connection:
        assert connection.execute("select 1").fetchone() == (1,)

"""kill -9: SIGKILL a child committing to each registered backend, at random moments, and check the
log after every kill (`sessionlog.testing.crash`). Process class and power class alike promise
that an acknowledged commit survives kill -9.

Each harness runs short in the default test command (20 kills per backend) and long behind the
`long` marker, which CI selects (200; SESSIONLOG_SOAK=1 runs 2,000). Where a kill lands is
random; no assertion depends on it (the number of torn tails is printed, not asserted).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

import sessionlog
from conftest import FILE_BACKENDS, budgets
from sessionlog.testing.agent_kills import run_agent_kills
from sessionlog.testing.crash import run_kills
from sessionlog.testing.operations import OPERATIONS, run_operation_kills
from sessionlog.testing.repository_kills import run_repository_kills
from sessionlog.testing.stream import Stream, verify_log

KILLS = budgets(10, 200, 2_000)  # short: 10 kills a case in the default run (8 min bound); long: 200
BACKENDS = FILE_BACKENDS


@pytest.mark.parametrize("kills", KILLS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_kill9_never_loses_an_acknowledged_commit(backend: str, kills: int, tmp_path: Path) -> None:
    report = run_kills(backend, kills, directory=tmp_path)
    print(
        f"\n{backend} ({report.durability}): {report.kills} kills, {report.acknowledged} acknowledged, "
        f"{report.lost} lost, {report.torn_tails} torn tails, {report.reopened} reopen+append checks"
    )
    assert report.failures == []  # includes every failed reopen + append
    assert report.lost == 0
    assert report.kills == kills
    assert report.acknowledged > 0 and report.reopened > 0


def test_the_child_runs_as_a_module(tmp_path: Path) -> None:
    """`python -m sessionlog.testing.crash child ...`: the launcher a third party can use too."""
    report = run_kills("jsonl", 4, directory=tmp_path, lanes=1, launcher="subprocess")
    assert report.failures == [] and report.kills == 4


def test_the_command_line_runs_kills(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sessionlog.testing.crash", "run", "--backend", "jsonl", "--kills", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 kills" in done.stdout and "0 lost" in done.stdout


def test_the_stream_is_deterministic_and_spans_100_bytes_to_megabytes() -> None:
    stream = Stream(3)
    assert stream.transaction(17) == Stream(3).transaction(17)
    assert stream.transaction(17) != Stream(4).transaction(17)
    sizes = [stream.size(index) for index in range(2_000)]
    assert min(sizes) < 200 and max(sizes) > 2 << 20
    assert {stream.fact_count(index) for index in range(50)} == {1, 2, 3}


def _log(tmp_path: Path, backend: str, stream: Stream, count: int) -> bytes:
    path = tmp_path / f"{backend}.jsonl"
    with sessionlog.create(path, backend, provider="p", model="m", cwd="/") as store:
        for index in range(count):
            store.commit(stream.transaction(index))
    return path.read_bytes()


def test_the_check_catches_what_it_must(tmp_path: Path) -> None:
    """`verify_log` is not vacuous: each way a log can be wrong after a kill is reported."""
    stream = Stream(5, small=(100, 400), huge_fraction=0, medium_fraction=0)
    data = _log(tmp_path, "jsonl", stream, 4)
    head, *lines = data.splitlines(keepends=True)
    good = verify_log(data, stream, rule={})
    assert (good.transactions, good.torn_bytes, good.mismatch, good.error) == (4, 0, None, None)
    assert good.lost(4) == 0 and good.lost(5) == 1  # one acknowledged commit more than it holds

    torn = verify_log(data + lines[0][:30], stream, rule={})
    assert torn.transactions == 4 and torn.torn_bytes == 30

    duplicated = verify_log(head + lines[0] + lines[0], stream, rule={})
    assert duplicated.error is not None and duplicated.lost(1) == 1

    other = Stream(6, small=(100, 400), huge_fraction=0, medium_fraction=0)
    foreign = verify_log(_log(tmp_path, "jsonl-fsync", other, 2), stream, rule={})
    assert foreign.mismatch is not None  # valid, but not the issued stream

    # The same transactions, split into one line per fact: reduces, but is not the stream.
    split = [head]
    for line in lines:
        value = orjson.loads(line)
        split += [orjson.dumps(fact) + b"\n" for fact in (value if isinstance(value, list) else [value])]
    if len(split) > len(lines) + 1:
        assert verify_log(b"".join(split), stream, rule={}).mismatch is not None

    start = len(head) + len(lines[0])
    hole = -start % 512 or 512  # from the last write's start to a sector boundary
    assert hole < len(lines[1]) - 1, "the stream's second line is longer than the hole"
    nul = head + lines[0] + bytes(hole) + lines[1][hole:]
    assert verify_log(nul, stream, rule={}).error is not None  # process class: corruption
    power = verify_log(nul, stream, rule={"nul_tail": True})  # power class: a torn last line
    assert power.transactions == 1 and power.torn_bytes == len(lines[1])


@pytest.mark.parametrize("kills", budgets(20, 50, 500))  # fewer: at 8, a run saw no kill land in time
@pytest.mark.parametrize("operation", OPERATIONS)
def test_kill9_during_an_operator_command_loses_nothing_and_leaves_no_debris(
    operation: str, kills: int, tmp_path: Path
) -> None:
    report = run_operation_kills(operation, kills, directory=tmp_path)
    print(f"\n{operation}: {report.kills} kills, {report.killed} before it finished, {report.outcomes}")
    assert report.failures == []
    assert report.kills == kills
    assert report.killed > 0  # some kills landed before the command finished


@pytest.mark.parametrize("kills", KILLS)
def test_kill9_of_the_runtime_loop_never_runs_bash_twice_nor_out_of_order(kills: int, tmp_path: Path) -> None:
    """The agent loop on sessionlog.Session, killed and resumed again and again."""
    report = run_agent_kills(kills, directory=tmp_path)
    print(
        f"\nruntime loop: {report.kills} kills, {report.rounds} sessions, "
        f"{report.runs_finished} runs finished "
        f"({report.aborted} aborted), {report.bash_runs} bash runs, {report.replays} safe reads replayed"
    )
    assert report.failures == []
    assert report.kills == kills and report.rounds > 0 and report.bash_runs > 0


@pytest.mark.parametrize("kills", KILLS)
@pytest.mark.parametrize("api", ["sync", "async"])
@pytest.mark.parametrize("durability", ["power", "process"])
def test_kill9_of_a_sqlite_repository_writer_loses_nothing(
    durability: str, api: str, kills: int, tmp_path: Path
) -> None:
    location = f"sqlite:///{tmp_path / 'sessions.db'}?durability={durability}"
    report = run_repository_kills(location, kills, use_async=api == "async")
    print(
        f"\nsqlite ({durability}, {api}): {report.kills} kills, {report.acknowledged} acknowledged, "
        f"{report.lost} lost"
    )
    assert report.failures == [] and report.lost == 0
    assert report.kills == kills and report.acknowledged > 0

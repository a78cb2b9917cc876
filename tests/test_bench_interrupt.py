"""`sessionlog bench` interrupted: by Ctrl-C, SIGTERM or SIGHUP, at any point, it removes what
it made and exits (never hangs on its own threads)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sessionlog.bench import command, shapes


def test_an_interrupt_before_the_start_line_lets_every_worker_thread_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Found with Ctrl-C during shape c (3 in 11 tries): the message, then no exit, every worker
    # waiting at the start line (a barrier the interrupted main thread never reached).
    def interrupted() -> None:
        raise KeyboardInterrupt

    barriers: list[threading.Barrier] = []

    class Seen(threading.Barrier):  # so that a failure lets the workers go, not hang the tests
        def __init__(self, parties: int) -> None:
            super().__init__(parties)
            barriers.append(self)

    monkeypatch.setattr(shapes.WINDOW, "start", interrupted)  # called just before the start line
    monkeypatch.setattr(shapes.threading, "Barrier", Seen)
    before = set(threading.enumerate())
    commits: list[Any] = []
    with pytest.raises(KeyboardInterrupt):
        shapes.in_threads(4, 3, lambda session, index: commits.append((session, index)))
    workers = set(threading.enumerate()) - before
    deadline = time.monotonic() + 30  # a bound for a hang only
    for worker in workers:
        worker.join(timeout=max(0.0, deadline - time.monotonic()))
    stuck = [worker.name for worker in workers if worker.is_alive()]
    for barrier in barriers:
        barrier.abort()
    assert not stuck, f"worker threads left waiting at the start line: {stuck}"
    assert commits == []  # none started past the start line the main thread never reached


# The bench in a child process, held inside its first measurement (after its first progress
# line, its scratch folder made) until a signal comes: the signal always lands mid-run.
HELD = """
import sys, time
from sessionlog.bench import command, runner

def held(*args, **kwargs):
    print("measuring", flush=True)
    time.sleep(600)  # a bound for a hang only: the test signals it long before
    raise AssertionError("no signal came")

runner.steady = held
sys.exit(command.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_signal_mid_run_removes_the_scratch_folder_and_exits_as_interrupted(
    tmp_path: Path, name: str
) -> None:
    # Found with SIGTERM 2.5 s into a run: exit 143 and the scratch folder (and the scratch
    # database, and a throwaway server's folder) left; only SIGINT was handled.
    argv = ["--tiny", "--shape", "d", "--backends", "jsonl", "--dir", str(tmp_path)]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-c", HELD, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "measuring\n", child.stderr.read() if child.stderr else ""
        assert [path.name[:17] for path in tmp_path.iterdir()] == ["sessionlog-bench-"]
        child.send_signal(getattr(signal, name))
        _, err = child.communicate(timeout=120)  # a bound for a hang only
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == command.EXIT_INTERRUPTED == 130, err
    assert "interrupted; the scratch folder and database are removed" in err
    assert list(tmp_path.iterdir()) == []

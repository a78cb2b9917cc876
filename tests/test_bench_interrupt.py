"""`sessionlog bench` interrupted: by Ctrl-C, SIGTERM or SIGHUP, at any point, it removes what
it made and exits (never hangs on its own threads)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sessionlog.bench import command, shapes
from sessionlog.testing import postgres


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


@pytest.mark.parametrize("step", ["free_port", "token_hex", "initdb", "start_postmaster"])
def test_an_interrupt_at_any_step_of_a_throwaway_servers_start_leaves_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    # Found with Ctrl-C 1.2 s after a throwaway server's folder appeared (1 in 4 tries): an empty
    # /tmp/sessionlog-pg-* left behind; the cleanup began after the folder was made.
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    def ran(
        server: postgres.PostgresServer, *command: Any, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        if Path(str(command[0])).name == "initdb":  # what the steps after it read
            server.data.mkdir()
            (server.data / "pg_hba.conf").touch()
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp makes the folder
    monkeypatch.setattr(postgres, "binaries", lambda: tmp_path / "bin")  # none are run
    monkeypatch.setattr(postgres.os, "geteuid", lambda: 1000)  # not root: no `postgres` user needed
    monkeypatch.setattr(postgres.PostgresServer, "_run", ran)
    monkeypatch.setattr(postgres.PostgresServer, "configure", lambda self, settings: None)
    monkeypatch.setattr(postgres.PostgresServer, "version", lambda self: 15)
    where = {
        "free_port": (postgres, "free_port"),
        "token_hex": (postgres.secrets, "token_hex"),
        "initdb": (postgres.PostgresServer, "_run"),
        "start_postmaster": (postgres.PostgresServer, "start_postmaster"),
    }
    monkeypatch.setattr(*where[step], interrupted)
    with pytest.raises(KeyboardInterrupt):
        postgres.PostgresServer.start()
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_server_command_takes_its_own_children_with_it(tmp_path: Path) -> None:
    # initdb runs the server in single-user mode as its child: an interrupt that killed initdb
    # alone left that child writing into the folder being removed (the folder then stayed).
    server = postgres.PostgresServer.__new__(postgres.PostgresServer)
    server.run_as = None
    spawned = tmp_path / "grandchild"
    command = f"sleep 300 & echo $! > {spawned}.tmp && mv {spawned}.tmp {spawned}; wait"

    def interrupt_once_spawned() -> None:
        deadline = time.monotonic() + 60  # a bound for a hang only
        while not spawned.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    helper = threading.Thread(target=interrupt_once_spawned)
    helper.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            server._run("sh", "-c", command, timeout=120)
    finally:
        helper.join()
    grandchild = int(spawned.read_text())
    deadline = time.monotonic() + 30  # a bound for a hang only
    while _running(grandchild) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _running(grandchild), f"the command's child {grandchild} outlived the interrupt"


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie (here PID 1 may reap none) is not running

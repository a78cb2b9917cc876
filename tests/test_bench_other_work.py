"""`bench.other_work`: the CPU other work took during a run, not the run's own (this process and
its descendants, a server it started and its backends). The attribution rule on made-up process
tables; then a real stranger on this machine. No timing is asserted: CPU seconds a process was
told to burn are compared with what /proc says it burnt."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sessionlog.bench import other_work
from sessionlog.bench.other_work import Process

TICK = os.sysconf("SC_CLK_TCK")


def test_only_processes_that_are_not_the_runs_count_and_only_since_the_start() -> None:
    me, server = os.getpid(), 900
    start = {
        me: Process(1, 10, 5 * TICK),
        1: Process(0, 1, 0),
        500: Process(1, 20, 3 * TICK),  # a stranger: 3 s before the run
        600: Process(1, 30, 1 * TICK),  # a stranger that ends; its pid is reused below
        server: Process(1, 40, 0),
    }
    end = {
        me: Process(1, 10, 50 * TICK),  # the run itself
        1: Process(0, 1, 1 * TICK),  # it reaped the stranger that ended: its 1 s, all before the run
        501: Process(me, 60, 9 * TICK),  # the run's child
        502: Process(501, 61, 9 * TICK),  # and its grandchild
        500: Process(1, 20, 5 * TICK),  # the stranger: 2 s during the run
        600: Process(1, 70, 1 * TICK),  # a new stranger on the reused pid: all of its 1 s
        server: Process(1, 40, 7 * TICK),  # a server the bench started
        901: Process(server, 80, 4 * TICK),  # its backend
        2: Process(0, 2, 0),
        50: Process(2, 3, 8 * TICK),  # a kernel thread: nobody's
    }
    assert other_work.others_cpu_seconds(start, end, ours=[server]) == 3.0
    assert other_work.others_cpu_seconds(start, end) == 3.0 + 7 + 4  # the server, when not named


def test_a_process_reaped_during_the_run_counts_only_its_cpu_since_the_start() -> None:
    """Found trying the bench beside other work: a child that had burnt 8 s before the run and
    ended during it folded its whole lifetime into its parent's reaped-children time at once,
    and "other work took 287% of the CPUs" of an idle run. What it had at the start is taken off
    its reaper's growth; a process that ended unreaped (a zombie) is still in the table."""
    me = os.getpid()
    start = {
        me: Process(1, 10, 0),
        1: Process(0, 1, 0),
        700: Process(1, 20, 0),  # a shell
        701: Process(700, 30, 0),  # its `timeout`
        702: Process(701, 31, 8 * TICK),  # its hog: 8 s before the run
    }
    end = {
        me: Process(1, 10, 0),
        1: Process(0, 1, 0),
        700: Process(1, 20, 10 * TICK),  # the hog (10 s in all) and `timeout` reaped into it
    }
    assert other_work.others_cpu_seconds(start, end) == 2.0
    ours_then = {**start, 703: Process(me, 40, 5 * TICK)}  # a child of the run's, reaped by it
    assert other_work.others_cpu_seconds(ours_then, end) == 2.0


def test_a_real_stranger_is_counted_for_its_cpu_during_the_run_only(tmp_path: Path) -> None:
    """A process reparented away from this one (its parent shell exits at once), as another
    user's work is: it burns 0.5 s of CPU, the run starts, it burns 0.8 s more."""
    if other_work.processes() is None:
        pytest.skip("no /proc here: other work's CPU is not readable (the bench says so)")
    script = (
        "import os, sys, time\n"
        "folder = sys.argv[1]\n"
        "def burn(seconds):\n"
        "    end = time.process_time() + seconds\n"
        "    while time.process_time() < end: pass\n"
        "def wait_for(name):\n"  # and ends at 'exit' (or with its folder) whatever it waits for
        "    while not os.path.exists(os.path.join(folder, name)):\n"
        "        if os.path.exists(os.path.join(folder, 'exit')) or not os.path.isdir(folder): sys.exit(0)\n"
        "        time.sleep(0.01)\n"
        "burn(0.5)\n"
        "open(os.path.join(folder, 'pid.tmp'), 'w').write(str(os.getpid()))\n"
        "os.replace(os.path.join(folder, 'pid.tmp'), os.path.join(folder, 'pid'))\n"
        "wait_for('go')\n"
        "burn(0.8)\n"
        "open(os.path.join(folder, 'done'), 'w').close()\n"
        "wait_for('exit')\n"
    )
    subprocess.run(
        ["sh", "-c", '"$0" -c "$1" "$2" >/dev/null 2>&1 &', sys.executable, script, str(tmp_path)],
        check=True,
    )
    try:
        while not (tmp_path / "pid").exists():
            time.sleep(0.01)
        stranger = int((tmp_path / "pid").read_text())
        start = other_work.processes()
        assert start is not None and start[stranger].parent != os.getpid()
        (tmp_path / "go").touch()
        while not (tmp_path / "done").exists():
            time.sleep(0.01)
        end = other_work.processes()
        assert end is not None and stranger in end
        counted = other_work.others_cpu_seconds(start, end)  # other tests' workers may add to it
        without = other_work.others_cpu_seconds(start, end, ours=[stranger])
        assert 0.75 <= counted - without < 1.0, (counted, without)  # its 0.8 s, not the 0.5 before
    finally:
        (tmp_path / "exit").touch()
        while (tmp_path / "pid").exists() and _running(int((tmp_path / "pid").read_text())):
            time.sleep(0.01)  # until it has ended: no test leaves it behind


def _running(pid: int) -> bool:
    """Whether `pid` runs (not gone, not a zombie: an orphan's PID 1 here may reap nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

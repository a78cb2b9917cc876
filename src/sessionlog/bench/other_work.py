"""How much CPU other work on the machine took during a run: the figure `trust.unreliable`
judges a busy machine by. The load average cannot: it counts the run's own threads (shape b's 64
committers, a throwaway server's backends) as if they were someone else's, so an idle 2-CPU
machine showed a load of 2.8 at the end of a quick run.

Linux only (`/proc/PID/stat`; elsewhere the figure is None and the run says so). The processes
are read at the start and at the end of the run. A process is the run's own when it is this
process, a process among `ours` (a server the bench started) or a descendant of one; a kernel
thread is nobody's. Every other process alive at the end counts its CPU time since the start
(the whole of it when it started during the run), with the CPU time of the children it reaped
(a test suite's workers, a shell's commands); a process that ended during the run is taken off
its reaper's count for what it had at the start. Work whose reaper is not on the table (an
orphan reaped by a PID 1 outside this PID namespace) is missed: the figure errs towards "the
machine was idle"; the spread of each row's rounds (`trust.unreliable`) still catches what it
did to the figures.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
KERNEL_THREADS = 2  # kthreadd: the parent of every kernel thread


@dataclass(frozen=True)
class Process:
    parent: int
    started: int  # clock ticks after boot: with the pid, who the process is (pids are reused)
    cpu: int  # clock ticks: its own user and system time and its reaped children's


def processes(proc: Path = PROC) -> dict[int, Process] | None:
    """Every process now, by pid; None where there is no /proc."""
    if not (proc / "self" / "stat").exists():
        return None
    found = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (name) "; a name may hold spaces
        parent, started = int(fields[1]), int(fields[19])
        found[int(entry.name)] = Process(parent, started, sum(int(value) for value in fields[11:15]))
    return found


def _belongs(pid: int, table: dict[int, Process], roots: set[int]) -> bool:
    seen = set()
    while pid in table and pid not in seen:
        if pid in roots:
            return True
        seen.add(pid)
        pid = table[pid].parent
    return pid in roots


def others_cpu_seconds(start: dict[int, Process], end: dict[int, Process], ours: Iterable[int] = ()) -> float:
    """The CPU seconds other work took between two `processes()` readings. A process that ended
    between them was reaped by one alive at the end (an unreaped one is still listed: a zombie),
    whose reaped-children time grew by the whole of the ended one's: what the ended one had at
    the start is taken off again, so that only the CPU spent during the run counts."""
    roots = {os.getpid(), *ours}
    ticks = 0
    for pid, process in end.items():
        if not _others(pid, end, roots):
            continue
        before = start.get(pid)
        ticks += process.cpu - (before.cpu if before is not None and before.started == process.started else 0)
    for pid, process in start.items():
        after = end.get(pid)
        if (after is None or after.started != process.started) and _others(pid, start, roots):
            ticks -= process.cpu  # it ended: its reaper counted all of it
    return max(ticks, 0) / os.sysconf("SC_CLK_TCK")


def _others(pid: int, table: dict[int, Process], roots: set[int]) -> bool:
    """Whether `pid` is other work's: neither the run's nor a kernel thread (kthreadd's)."""
    return not _belongs(pid, table, roots | {KERNEL_THREADS})

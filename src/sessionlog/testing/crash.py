"""kill -9 harness: a child process commits, the parent kills it, the log must survive.

A child opens (or creates) a session with one backend and commits a deterministic `Stream` of
transactions whose sizes run from 100 B to several MB, so that a kill can land inside a write and
tear it. After each commit returns it reports the transaction's index on a pipe (one 4-byte record,
atomic on a pipe). The parent SIGKILLs it at a random moment, drains the pipe, and checks the log
(`verify_log`):

* it reduces (`reduce_bytes`, with the NUL rule in the power class);
* its committed lines are exactly the first N transactions of the stream, compared by ids and
  content (so: a prefix, no duplicate, nothing skipped, nothing foreign);
* N >= every index the child acknowledged (nothing acknowledged is lost: the process class
  promise, and the power class keeps it too).

The next child reopens the same log (dropping the torn tail) and goes on from transaction N, so
repair-then-append is exercised at every kill; every few kills the parent itself opens the log,
commits the next transaction and checks it (it accepts appends again), then starts a new file.

Children come from a fork server that imported sessionlog once (`ForkServer`: a child costs a
fork, not an interpreter start-up); `launcher="subprocess"` runs
`python -m sessionlog.testing.crash child ...` instead. Kill timing is random; no result depends
on timing, only the number of torn tails seen does.

    python -m sessionlog.testing.crash run --backend jsonl --kills 2000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backends.jsonl_file import FileOps
from ..opening import backends, create, create_async, open, open_async
from ..plugins.registry import Registry
from .stream import CWD, MODEL, PROVIDER, SNAPSHOT_EVERY, Stream, registry_for, verify_log

__all__ = ["KillReport", "run_kills"]


# Pipe records: a transaction index once its commit returned, or one of these marks.
_OPENED = 0xFFFFFFFF  # the session is open
_WRITING = 0xFFFFFFFE  # a write of at least _PROBE_BYTES starts now
_SYNCING = 0xFFFFFFFD  # an fdatasync/fsync starts now
_PROBE_BYTES = 2 << 20
_RECORD = struct.Struct("<I")
# -- the child ---------------------------------------------------------------------------------


def child_main(
    path: str,
    backend: str,
    seed: int,
    ack_fd: int,
    *,
    plugins: Sequence[str] = (),
    window: int = 4,
    probe: bool = True,
    snapshot_every: int = SNAPSHOT_EVERY,
) -> None:
    """Open or create the session, then commit the stream from where the log ends, reporting
    each acknowledged transaction on `ack_fd`, until killed (or 100,000 transactions). `probe`:
    run the backend with `ProbeOps`, which also report each large write and each sync as it
    starts, so the parent can aim a kill into one (the backend must take `ops=`).
    `snapshot_every`: a sync store writes a snapshot (`core.snapshot`) every that many
    transactions, so that kills land around snapshot writes and reopens load from them (0: never)."""
    registry = registry_for(plugins)
    stream = Stream(seed)
    options: dict[str, Any] = {"ops": ProbeOps(ack_fd)} if probe else {}
    info = backends(registry)[backend]
    if info.api == "sync":
        _child_sync(Path(path), backend, stream, ack_fd, registry, options, snapshot_every)
    else:
        asyncio.run(_child_async(Path(path), backend, stream, ack_fd, registry, options, window))


class ProbeOps(FileOps):
    """The real file operations, announcing each large write and each sync on a pipe first."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def write(self, fd: int, data: Any) -> int:
        if len(data) >= _PROBE_BYTES:
            _report(self._fd, _WRITING)
        return os.write(fd, data)

    def fdatasync(self, fd: Any) -> None:
        _report(self._fd, _SYNCING)
        os.fdatasync(fd)

    def fsync(self, fd: Any) -> None:
        _report(self._fd, _SYNCING)
        os.fsync(fd)

    def syncfs(self, fd: int) -> None:
        _report(self._fd, _SYNCING)
        super().syncfs(fd)


def _report(fd: int, value: int) -> None:
    os.write(fd, _RECORD.pack(value))


def _child_sync(
    path: Path,
    backend: str,
    stream: Stream,
    fd: int,
    registry: Registry | None,
    options: dict[str, Any],
    snapshot_every: int = 0,
) -> None:
    if path.exists():
        store = open(path, backend, registry=registry, **options)
    else:
        store = create(path, backend, provider=PROVIDER, model=MODEL, cwd=CWD, registry=registry, **options)
    _report(fd, _OPENED)
    first = stream.index_after(store.load().last_seq)
    for index in range(first, first + 100_000):
        store.commit(stream.transaction(index))
        _report(fd, index)
        if snapshot_every and index % snapshot_every == snapshot_every - 1:
            store.write_snapshot()


async def _child_async(
    path: Path,
    backend: str,
    stream: Stream,
    fd: int,
    registry: Registry | None,
    options: dict[str, Any],
    window: int,
) -> None:
    if path.exists():
        store = await open_async(path, backend, registry=registry, **options)
    else:
        store = await create_async(
            path, backend, provider=PROVIDER, model=MODEL, cwd=CWD, registry=registry, **options
        )
    _report(fd, _OPENED)
    first = stream.index_after((await store.load()).last_seq)

    def acknowledged(task: asyncio.Task[Any], index: int) -> None:
        if not task.cancelled() and task.exception() is None:
            _report(fd, index)

    # Several commits in flight, so the writer batches them (group commit in jsonl-group).
    in_flight: deque[asyncio.Task[Any]] = deque()
    for index in range(first, first + 100_000):
        task = asyncio.ensure_future(store.commit(stream.transaction(index)))
        task.add_done_callback(functools.partial(acknowledged, index=index))
        in_flight.append(task)
        if len(in_flight) >= window:
            await in_flight.popleft()


# -- the parent --------------------------------------------------------------------------------


@dataclass
class KillReport:
    """Totals of one backend's kills. `lost` counts acknowledged transactions missing after a
    kill (the process and power classes both promise 0); `torn_tails` the kills that left a new
    torn tail (a write cut short); `failures` says what went wrong."""

    backend: str
    durability: str
    kills: int = 0
    acknowledged: int = 0
    lost: int = 0
    torn_tails: int = 0
    reopened: int = 0
    sessions: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def merge(self, other: KillReport) -> None:
        self.kills += other.kills
        self.acknowledged += other.acknowledged
        self.lost += other.lost
        self.torn_tails += other.torn_tails
        self.reopened += other.reopened
        self.sessions += other.sessions
        self.failures.extend(other.failures)

    @property
    def ok(self) -> bool:
        return not self.failures and self.lost == 0


class ForkServer:
    """A process that imported sessionlog once and forks kill-test children on request, so a
    child costs a fork instead of an interpreter start-up. Each child gets its acknowledgement
    pipe by SCM_RIGHTS. Children stay unreaped until `reap`, so a pid is never reused while the
    parent may still signal it."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._socket = ours
        self._lock = threading.Lock()
        command = [sys.executable, "-m", "sessionlog.testing.crash", "serve", str(theirs.fileno())]
        self._process = subprocess.Popen(command, pass_fds=(theirs.fileno(),))
        theirs.close()

    def _ask(self, request: dict[str, Any], fds: Sequence[int] = ()) -> dict[str, Any]:
        with self._lock:
            socket.send_fds(self._socket, [json.dumps(request).encode()], list(fds))
            reply = self._socket.recv(65536)
        if not reply:
            raise RuntimeError("the kill-test fork server died")
        answer: dict[str, Any] = json.loads(reply)
        return answer

    def spawn(self, ack_fd: int, **arguments: Any) -> int:
        """Fork a child running `child_main(**arguments, ack_fd=...)`; its pid."""
        pid: int = self._ask({"op": "spawn", "args": arguments}, [ack_fd])["pid"]
        return pid

    def reap(self, pid: int) -> int:
        """Wait for a child; its exit code (negative: killed by that signal)."""
        code: int = self._ask({"op": "reap", "pid": pid})["code"]
        return code

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self._ask({"op": "exit"})
        self._socket.close()
        self._process.wait(timeout=30)

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(fd: int) -> None:
    """The fork server's loop (`python -m sessionlog.testing.crash serve FD`)."""
    import sessionlog.backends.async_file  # noqa: F401  (imported once, before any fork)

    backends()  # load the default registry once, too
    control = socket.socket(fileno=fd)
    while True:
        message, fds, _, _ = socket.recv_fds(control, 65536, 4)
        if not message:
            return
        request = json.loads(message)
        if request["op"] == "spawn":
            pid = os.fork()
            if pid == 0:  # the child
                control.close()
                code = 0
                try:
                    child_main(**request["args"], ack_fd=fds[0])
                except BaseException:
                    traceback.print_exc()
                    code = 1
                os._exit(code)
            for extra in fds:
                os.close(extra)
            control.send(json.dumps({"pid": pid}).encode())
        elif request["op"] == "reap":
            _, status = os.waitpid(request["pid"], 0)
            control.send(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode())
        else:
            control.send(b"{}")
            return


class _Child:
    """One child process and its acknowledgement pipe."""

    def __init__(
        self,
        server: ForkServer | None,
        path: Path,
        backend: str,
        seed: int,
        plugins: Sequence[str],
        probe: bool,
    ) -> None:
        self.acked = -1
        self.opened = False
        self.writes = 0  # large writes started
        self.syncs = 0  # syncs started
        self.records = 0  # everything it reported: its progress
        self._buffer = b""
        self._server = server
        self._fd, write_fd = os.pipe()
        try:
            if server is not None:
                self._pid = server.spawn(
                    write_fd, path=str(path), backend=backend, seed=seed, plugins=list(plugins), probe=probe
                )
                self._process: subprocess.Popen[bytes] | None = None
            else:
                command = [sys.executable, "-m", "sessionlog.testing.crash", "child", str(path), backend]
                command += [str(seed), "--ack-fd", str(write_fd)] + [f"--plugin={name}" for name in plugins]
                command += [] if probe else ["--no-probe"]
                self._process = subprocess.Popen(command, pass_fds=(write_fd,))
                self._pid = self._process.pid
        finally:
            os.close(write_fd)

    def poll(self, timeout: float) -> bool:
        """Read what the pipe holds (waiting up to `timeout`); False at EOF (the child is gone)."""
        ready, _, _ = select.select([self._fd], [], [], max(0.0, timeout))
        if not ready:
            return True
        chunk = os.read(self._fd, 65536)
        if not chunk:
            return False
        self._buffer += chunk
        whole = len(self._buffer) // 4 * 4
        self.records += whole // 4
        for (value,) in _RECORD.iter_unpack(self._buffer[:whole]):
            if value == _OPENED:
                self.opened = True
            elif value == _WRITING:
                self.writes += 1
            elif value == _SYNCING:
                self.syncs += 1
            else:
                self.acked = max(self.acked, value)
        self._buffer = self._buffer[whole:]
        return True

    def kill(self) -> int | None:
        """SIGKILL it (it is unreaped, so the pid is still ours), drain the pipe, reap it; the
        exit code if it had ended by itself."""
        os.kill(self._pid, signal.SIGKILL)
        while self.poll(10.0):
            pass
        os.close(self._fd)
        if self._process is not None:
            code = self._process.wait()
        else:
            assert self._server is not None
            code = self._server.reap(self._pid)
        return None if code == -signal.SIGKILL else code


def _aim(child: _Child, rng: random.Random, mode: str, start: int, hung: float) -> str | None:
    """Wait for the moment `mode` aims at: after 0 to 3 acknowledgements (and, for `write` and
    `sync`, inside the next large write or sync), however long a loaded machine takes to get
    there. None once there (or once the child ended by itself); what it waited for in vain if
    the child reported nothing for `hung` seconds (a hang, reported as a failure)."""
    if mode == "start-up":  # start-up, open, repair of the torn tail, the first commits
        time.sleep(rng.random() * 0.04)
        return None
    acks = rng.choice((0, 0, 1, 2, 3))
    alive = True

    def wait(ready: Callable[[], bool], what: str) -> str | None:
        nonlocal alive
        began = time.monotonic()
        deadline, heard = began + hung, child.records
        while alive and not ready():
            if child.records != heard:  # it goes on, however slowly
                deadline, heard = time.monotonic() + hung, child.records
            elif time.monotonic() >= deadline:
                return (
                    f"waited {time.monotonic() - began:.0f} s for {what} ({mode} kill), the last "
                    f"{hung:.0f} s without a word from the child: it hung"
                )
            alive = child.poll(deadline - time.monotonic())
        return None

    stuck = wait(lambda: child.opened and child.acked + 1 - start >= acks, f"{acks} acknowledgement(s)")
    if stuck is not None:
        return stuck
    if mode == "commit":
        time.sleep(rng.random() * 0.01)
    elif mode == "write":  # inside a write of several MB: it tears
        seen = child.writes
        stuck = wait(lambda: child.writes > seen, "a large write to start")
        if rng.random() < 0.3:
            time.sleep(rng.random() * 0.0005)
    else:  # inside an fdatasync
        seen = child.syncs
        stuck = wait(lambda: child.syncs > seen, "a sync to start")
    return stuck


def _lane(
    backend: str,
    kills: int,
    seed: int,
    directory: Path,
    *,
    rotate: int,
    server: ForkServer | None,
    plugins: Sequence[str],
    probe: bool,
    max_wait: float,
) -> KillReport:
    registry = registry_for(plugins)
    info = backends(registry)[backend]
    rule = info.nul_rule()
    report = KillReport(backend, info.durability)
    rng = random.Random(f"kills:{backend}:{seed}")
    modes = ["start-up", "commit", "commit"]
    if probe:
        modes += ["write", "write", "write"] + (["sync"] if info.durability == "power" else [])
    session = 0
    done = 0
    while done < kills:
        session += 1
        stream = Stream(seed * 1000 + session)
        path = directory / f"session-{session}.jsonl"
        acknowledged = 0  # transactions the log is known to hold (acknowledged or checked)
        known = False  # some child opened it: it must exist from now on
        last_tail = (0, 0)  # (transactions, torn bytes) at the previous check
        for _ in range(min(rotate, kills - done)):
            start = acknowledged
            child = _Child(server, path, backend, stream.seed, plugins, probe)
            stuck = None
            try:
                stuck = _aim(child, rng, rng.choice(modes), start, max_wait)
            finally:
                code = child.kill()
            done += 1
            report.kills += 1
            if code is not None:
                report.failures.append(f"{path.name}: the child exited by itself with code {code}")
                break
            if stuck is not None:
                report.failures.append(f"{path.name}, kill {report.kills}: {stuck}")
                break
            known = known or child.opened
            if child.acked >= 0:
                report.acknowledged += child.acked + 1 - start
                acknowledged = child.acked + 1
            if not path.exists():
                if known:
                    report.failures.append(f"{path.name}: the session vanished after a kill")
                    report.lost += acknowledged
                    break
                continue
            check = verify_log(path.read_bytes(), stream, rule=rule)
            if check.torn_bytes and (check.transactions, check.torn_bytes) != last_tail:
                report.torn_tails += 1  # a new one (a child killed before its repair leaves the old)
            last_tail = (check.transactions, check.torn_bytes)
            lost = check.lost(acknowledged)
            if not check.reduced or check.mismatch or lost:
                report.lost += lost
                report.failures.append(
                    f"{path.name} after kill {report.kills}: "
                    + (str(check.error) if check.error else check.mismatch or f"{lost} acknowledged lost")
                )
                break
            acknowledged = check.transactions
        else:
            if path.exists():
                _accepts_appends(path, backend, stream, acknowledged, registry, rule, report)
        report.sessions += 1
        if path.exists():
            path.unlink()
    return report


def _accepts_appends(
    path: Path,
    backend: str,
    stream: Stream,
    transactions: int,
    registry: Registry | None,
    rule: Mapping[str, Any],
    report: KillReport,
) -> None:
    """Open the killed log (checked: it holds `transactions`), commit the next transaction, and
    check the result."""
    try:
        if backends(registry)[backend].api == "sync":
            with open(path, backend, registry=registry) as store:
                store.commit(stream.transaction(transactions))
        else:

            async def append() -> None:
                store = await open_async(path, backend, registry=registry)
                try:
                    await store.commit(stream.transaction(transactions))
                finally:
                    await store.close()

            asyncio.run(append())
    except Exception as error:  # any failure to reopen and append is the finding
        report.failures.append(f"{path.name}: reopening and appending failed: {error!r}")
        return
    after = verify_log(path.read_bytes(), stream, rule=rule)
    if after.transactions != transactions + 1 or after.torn_bytes:
        report.failures.append(f"{path.name}: after reopen + commit: {after}")
        return
    report.reopened += 1


def run_kills(
    backend: str,
    kills: int = 200,
    *,
    seed: int = 0,
    directory: str | os.PathLike[str] | None = None,
    lanes: int = 2,
    rotate: int = 3,
    launcher: str = "forkserver",
    plugins: Sequence[str] = (),
    probe: bool = True,
    max_wait: float = 60.0,
) -> KillReport:
    """SIGKILL `kills` children committing to `backend`, `lanes` at a time (each lane its own
    session files, a new one every `rotate` kills), checking the log after every kill.
    `plugins`: modules that register the backend, for one outside the default registry;
    `probe=False` for a backend that takes no `ops=` (kills are then aimed by time only).
    `max_wait`: a hang detector: a kill waits for its acknowledgements (and its write or sync)
    however long they take, and a child that reports nothing for that many seconds meanwhile is
    a failure."""
    if launcher not in ("forkserver", "subprocess"):
        raise ValueError(f"launcher must be 'forkserver' or 'subprocess', not {launcher!r}")
    info = backends(registry_for(plugins))[backend]
    total = KillReport(backend, info.durability)
    started = time.monotonic()
    owned = directory is None
    root = Path(tempfile.mkdtemp(prefix="sessionlog-kill-")) if directory is None else Path(directory)
    server = ForkServer() if launcher == "forkserver" else None
    try:
        shares = [kills // lanes + (1 if lane < kills % lanes else 0) for lane in range(lanes)]
        with ThreadPoolExecutor(max_workers=lanes) as pool:
            futures = []
            for lane, share in enumerate(shares):
                folder = root / f"{backend}-lane{lane}"
                folder.mkdir(parents=True, exist_ok=True)
                futures.append(
                    pool.submit(
                        _lane,
                        backend,
                        share,
                        seed * 100 + lane,
                        folder,
                        rotate=rotate,
                        server=server,
                        plugins=plugins,
                        probe=probe,
                        max_wait=max_wait,
                    )
                )
            for future in futures:
                total.merge(future.result())
    finally:
        if server is not None:
            server.close()
        if owned:
            shutil.rmtree(root, ignore_errors=True)
    total.seconds = time.monotonic() - started
    return total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sessionlog.testing.crash", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    child = commands.add_parser("child", help="commit the stream until killed (used by the harness)")
    child.add_argument("path")
    child.add_argument("backend")
    child.add_argument("seed", type=int)
    child.add_argument("--ack-fd", type=int, required=True)
    child.add_argument("--plugin", action="append", default=[])
    child.add_argument("--window", type=int, default=4)
    child.add_argument("--no-probe", dest="probe", action="store_false")
    run = commands.add_parser("run", help="kill children of one backend and check every log")
    run.add_argument("--backend", action="append", help="default: every registered backend")
    run.add_argument("--kills", type=int, default=200)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--lanes", type=int, default=2)
    run.add_argument("--launcher", choices=("forkserver", "subprocess"), default="forkserver")
    run.add_argument("--plugin", action="append", default=[])
    serving = commands.add_parser("serve", help="the fork server (used by the harness)")
    serving.add_argument("fd", type=int)
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.fd)
        return 0
    if args.command == "child":
        child_main(
            args.path,
            args.backend,
            args.seed,
            args.ack_fd,
            plugins=args.plugin,
            window=args.window,
            probe=args.probe,
        )
        return 0
    names: Mapping[str, Any] = backends(registry_for(args.plugin))
    failed = False
    for name in args.backend or list(names):
        report = run_kills(
            name, args.kills, seed=args.seed, lanes=args.lanes, launcher=args.launcher, plugins=args.plugin
        )
        print(
            f"{name} ({report.durability}): {report.kills} kills, {report.acknowledged} acknowledged, "
            f"{report.lost} lost, {report.torn_tails} torn tails, {report.reopened} reopen+append checks, "
            f"{report.seconds:.1f}s: {'ok' if report.ok else 'FAILED'}"
        )
        for failure in report.failures[:10]:
            print("  ", failure)
        failed = failed or not report.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

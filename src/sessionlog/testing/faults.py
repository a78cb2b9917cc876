"""I/O fault injection through the `FileOps` seam: fail the k-th operation, for every k.

`FaultOps` performs the real operations and makes the k-th one fail: ``EIO``, ``ENOSPC`` or
``EFBIG`` (the k-th operation of any kind raises that errno), or ``short`` (the k-th *write*
stores only part of its bytes and returns the short count; the next operation, whatever it is,
raises ENOSPC). A failing `close` still closes the descriptor, as Linux does; a failing `fsync`
or `fdatasync` leaves the data wherever the kernel had it.

`run_faults` runs one workload (create; commit; close; reopen over a torn tail, which the store
truncates; commit; close) for k = 1, 2, ... until it completes without the fault firing. Each
run checks:

* the step that met the fault raised: StorePoisonedError for a commit, an OSError (a
  SessionLogError's OSError subclass or the errno itself) for create, open and close;
* a poisoned store refuses the next commit with StorePoisonedError and still closes;
* the writer guard was released: the session reopens in the same process;
* a failed create leaves no temporary file behind (unless removing it was what failed);
* after reopening (with the real operations) the log reduces, every acknowledged commit is
  there, the failing commit is wholly there or wholly absent, nothing else is, and a new
  commit lands (`stream.verify_log` compares ids and content).

`real_enospc` fills a real tiny filesystem (a 64 KiB tmpfs, when the process may mount one) and
checks the same.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backends.jsonl_file import FileOps
from ..core.errors import SessionLockedError, StorePoisonedError
from ..opening import backends, create, create_async, open, open_async, read_stored
from ..plugins.registry import Registry
from .stream import Stream, registry_for, verify_log

__all__ = ["FAULTS", "FaultOps", "FaultReport", "real_enospc", "run_faults"]

FAULTS = ("EIO", "ENOSPC", "EFBIG", "short")
PROVIDER = "openrouter"
MODEL = "faults/model"
CWD = "/faults"
_ERRNO = {"EIO": errno.EIO, "ENOSPC": errno.ENOSPC, "EFBIG": errno.EFBIG}


class FaultOps(FileOps):
    """The real file operations, with one injected fault (see the module docstring)."""

    def __init__(self, fault: str, at: int) -> None:
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, not {fault!r}")
        self.fault = fault
        self.at = at
        self.calls = 0
        self.writes = 0
        self.fired: str | None = None  # the operation that failed
        self._after_short = False
        self._lock = threading.Lock()

    def _enter(self, name: str) -> bool:
        """Count the call; True if it must fail."""
        with self._lock:
            self.calls += 1
            if self._after_short:
                self._after_short = False
                self.fired = f"{self.fired}, then {name}"
                return True
            if self.fault != "short" and self.calls == self.at and self.fired is None:
                self.fired = name
                return True
            return False

    def _error(self, name: str) -> OSError:
        code = errno.ENOSPC if self.fault == "short" else _ERRNO[self.fault]
        return OSError(code, f"injected {os.strerror(code)} in {name}")

    def open(self, path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if self._enter("open"):
            raise self._error("open")
        return os.open(path, flags, mode, dir_fd=dir_fd)

    def write(self, fd: int, data: Any) -> int:
        with self._lock:
            self.writes += 1
            short = self.fault == "short" and self.writes == self.at and self.fired is None
        if short:
            view = memoryview(data)
            written = os.write(fd, view[: max(1, len(view) // 2)])
            with self._lock:
                self.calls += 1
                self.fired = f"short write ({written} of {len(view)} bytes)"
                self._after_short = True
            return written
        if self._enter("write"):
            raise self._error("write")
        return os.write(fd, data)

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        if self._enter("pread"):
            raise self._error("pread")
        return os.pread(fd, length, offset)

    def fsync(self, fd: Any) -> None:
        if self._enter("fsync"):
            raise self._error("fsync")
        os.fsync(fd)

    def fdatasync(self, fd: Any) -> None:
        if self._enter("fdatasync"):
            raise self._error("fdatasync")
        os.fdatasync(fd)

    def syncfs(self, fd: int) -> None:
        if self._enter("syncfs"):
            raise self._error("syncfs")
        super().syncfs(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        if self._enter("ftruncate"):
            raise self._error("ftruncate")
        os.ftruncate(fd, length)

    def link(self, src: Any, dst: Any, **kwargs: Any) -> None:
        if self._enter("link"):
            raise self._error("link")
        os.link(src, dst, **kwargs)

    def unlink(self, path: Any, **kwargs: Any) -> None:
        if self._enter("unlink"):
            raise self._error("unlink")
        os.unlink(path, **kwargs)

    def close(self, fd: int) -> None:
        failing = self._enter("close")
        os.close(fd)  # Linux frees the descriptor even when close reports an error
        if failing:
            raise self._error("close")

    def fsync_directory(self, directory: Path) -> None:
        if self._enter("fsync_directory"):
            raise self._error("fsync_directory")
        super().fsync_directory(directory)


@dataclass
class FaultReport:
    """Totals of one backend's fault runs. `lost` counts acknowledged commits missing after a
    fault (must be 0); `failures` says what went wrong."""

    backend: str
    durability: str
    runs: int = 0
    faults: int = 0  # runs in which the fault fired
    acknowledged: int = 0
    lost: int = 0
    landed: int = 0  # failing commits found wholly present after reopening
    absent: int = 0  # failing commits found wholly absent
    by_operation: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def merge(self, other: FaultReport) -> None:
        self.runs += other.runs
        self.faults += other.faults
        self.acknowledged += other.acknowledged
        self.lost += other.lost
        self.landed += other.landed
        self.absent += other.absent
        for name, count in other.by_operation.items():
            self.by_operation[name] = self.by_operation.get(name, 0) + count
        self.failures.extend(other.failures)

    @property
    def ok(self) -> bool:
        return not self.failures and self.lost == 0


def _stream(seed: int) -> Stream:
    return Stream(
        seed, small=(100, 2 << 10), medium=(2 << 10, 64 << 10), medium_fraction=0.3, huge_fraction=0
    )


@dataclass
class _Run:
    acknowledged: int = 0  # transactions whose commit returned
    issued: int = 0  # transactions handed to commit
    raised: list[str] = field(default_factory=list)  # unexpected exceptions
    step: str = ""  # the step that met the fault
    created: bool = False


_FIRST, _SECOND = 5, 3


def _expect(run: _Run, step: str, error: BaseException, allowed: tuple[type[BaseException], ...]) -> None:
    run.step = step
    if not isinstance(error, allowed):
        run.raised.append(f"{step} raised {error!r}, expected {' or '.join(t.__name__ for t in allowed)}")


def _sync_workload(
    path: Path, backend: str, registry: Registry | None, ops: FaultOps, stream: Stream, run: _Run
) -> None:
    try:
        store = create(path, backend, provider=PROVIDER, model=MODEL, cwd=CWD, registry=registry, ops=ops)
    except Exception as error:
        _expect(run, "create", error, (OSError,))
        return
    run.created = True
    for phase in (0, 1):
        if phase:
            try:
                store = open(path, backend, registry=registry, ops=ops)
            except Exception as error:
                _expect(run, "open", error, (OSError,))
                return
        start, stop = (0, _FIRST) if phase == 0 else (_FIRST, _FIRST + _SECOND)
        for index in range(start, stop):
            run.issued = index + 1
            try:
                store.commit(stream.transaction(index))
            except Exception as error:
                _expect(run, "commit", error, (StorePoisonedError,))
                _poisoned_sync(store, stream, index, run)
                return
            run.acknowledged = index + 1
        try:
            store.close()
        except Exception as error:
            _expect(run, "close", error, (OSError,))
            return
        if phase == 0:
            _torn_tail(path)


def _poisoned_sync(store: Any, stream: Stream, index: int, run: _Run) -> None:
    try:
        store.commit(stream.transaction(index + 1))
    except StorePoisonedError:
        pass
    except Exception as error:
        run.raised.append(f"a commit to the poisoned store raised {error!r}")
    else:
        run.raised.append("the poisoned store accepted a commit")
    try:
        store.close()
    except Exception as error:
        run.raised.append(f"closing the poisoned store raised {error!r}")


async def _async_workload(
    path: Path, backend: str, registry: Registry | None, ops: FaultOps, stream: Stream, run: _Run
) -> None:
    try:
        store = await create_async(
            path, backend, provider=PROVIDER, model=MODEL, cwd=CWD, registry=registry, ops=ops
        )
    except Exception as error:
        _expect(run, "create", error, (OSError,))
        return
    run.created = True
    for phase in (0, 1):
        if phase:
            try:
                store = await open_async(path, backend, registry=registry, ops=ops)
            except Exception as error:
                _expect(run, "open", error, (OSError,))
                return
        start, stop = (0, _FIRST) if phase == 0 else (_FIRST, _FIRST + _SECOND)
        # Two commits in flight at a time, so a fault can hit a batch of several.
        index = start
        while index < stop:
            group = list(range(index, min(stop, index + 2)))
            run.issued = group[-1] + 1
            tasks = [asyncio.ensure_future(store.commit(stream.transaction(i))) for i in group]
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for i, result in zip(group, results, strict=True):
                if isinstance(result, BaseException):
                    _expect(run, "commit", result, (StorePoisonedError,))
                else:
                    run.acknowledged = max(run.acknowledged, i + 1)
            if any(isinstance(result, BaseException) for result in results):
                await _poisoned_async(store, stream, run.issued, run)
                return
            index = group[-1] + 1
        try:
            await store.close()
        except Exception as error:
            _expect(run, "close", error, (OSError,))
            return
        if phase == 0:
            _torn_tail(path)


async def _poisoned_async(store: Any, stream: Stream, index: int, run: _Run) -> None:
    try:
        await store.commit(stream.transaction(index))
    except StorePoisonedError:
        pass
    except Exception as error:
        run.raised.append(f"a commit to the poisoned store raised {error!r}")
    else:
        run.raised.append("the poisoned store accepted a commit")
    try:
        await store.close()
    except Exception as error:
        run.raised.append(f"closing the poisoned store raised {error!r}")


def _torn_tail(path: Path) -> None:
    """What a crash in the middle of a write leaves (written past the seam: setup, not a fault)."""
    with path.open("ab") as file:
        file.write(b'{"kind":"entry","seq":4')


def _check_after(
    path: Path,
    backend: str,
    registry: Registry | None,
    stream: Stream,
    run: _Run,
    report: FaultReport,
    label: str,
) -> None:
    """Reopen with the real operations; compare with what was acknowledged; append once more."""
    info = backends(registry)[backend]
    rule = info.nul_rule()
    if not path.exists():
        if run.created:
            report.failures.append(f"{label}: the session is gone")
            report.lost += run.acknowledged
        return
    data = read_stored(path, backend, registry)
    check = verify_log(data, stream, rule=rule)
    if check.error is not None and not run.created and check.error.code == "MISSING_HEADER":
        report.failures.append(f"{label}: a failed create left a session without a header: {check.error}")
        return
    lost = check.lost(run.acknowledged)
    if check.error is not None or check.mismatch is not None or lost:
        report.lost += lost
        report.failures.append(f"{label}: {check.error or check.mismatch or f'{lost} acknowledged lost'}")
        return
    if check.transactions > run.issued:
        report.failures.append(
            f"{label}: holds {check.transactions} transactions, only {run.issued} were issued"
        )
        return
    if run.step == "commit":
        if check.transactions > run.acknowledged:
            report.landed += 1
        else:
            report.absent += 1
    try:
        if info.api == "sync":
            with open(path, backend, registry=registry) as store:
                store.commit(stream.transaction(check.transactions))
        else:

            async def append() -> None:
                store = await open_async(path, backend, registry=registry)
                try:
                    await store.commit(stream.transaction(check.transactions))
                finally:
                    await store.close()

            asyncio.run(append())
    except SessionLockedError as error:
        report.failures.append(f"{label}: the failed store kept the session claimed: {error}")
        return
    except Exception as error:  # the finding itself
        report.failures.append(f"{label}: reopening and appending failed: {error!r}")
        return
    after = verify_log(path.read_bytes(), stream, rule=rule)
    if after.transactions != check.transactions + 1 or after.torn_bytes:
        report.failures.append(f"{label}: after reopen + commit: {after}")


def run_faults(
    backend: str,
    faults: Sequence[str] = FAULTS,
    *,
    seed: int = 0,
    directory: str | os.PathLike[str] | None = None,
    plugins: Sequence[str] = (),
    limit: int = 500,
    ops_factory: Callable[[str, int], FaultOps] = FaultOps,
) -> FaultReport:
    """For each fault kind, run the workload with the k-th operation failing, k = 1, 2, ...,
    until a run completes without the fault firing (at most `limit` runs per kind).
    `ops_factory(fault, k)` makes the injecting `FaultOps` (a subclass, to test the harness)."""
    registry = registry_for(plugins)
    info = backends(registry)[backend]
    report = FaultReport(backend, info.durability)
    owned = directory is None
    root = Path(tempfile.mkdtemp(prefix="sessionlog-faults-")) if directory is None else Path(directory)
    try:
        for fault in faults:
            for at in range(1, limit + 1):
                folder = root / f"{fault}-{at}"
                folder.mkdir(parents=True, exist_ok=True)
                path = folder / "session.jsonl"
                stream = _stream(seed * 1000 + at)
                ops = ops_factory(fault, at)
                run = _Run()
                if info.api == "sync":
                    _sync_workload(path, backend, registry, ops, stream, run)
                else:
                    asyncio.run(_async_workload(path, backend, registry, ops, stream, run))
                report.runs += 1
                label = (
                    f"{backend} {fault} at operation {at} ({ops.fired or 'not fired'}, in {run.step or '-'})"
                )
                report.failures.extend(f"{label}: {message}" for message in run.raised)
                if ops.fired is None:
                    if run.step or run.acknowledged != _FIRST + _SECOND:
                        report.failures.append(f"{label}: the workload failed without a fault")
                    shutil.rmtree(folder, ignore_errors=True)
                    break
                report.faults += 1
                report.acknowledged += run.acknowledged
                kind = ops.fired.split(" ")[0]
                report.by_operation[kind] = report.by_operation.get(kind, 0) + 1
                if not run.step:
                    report.failures.append(f"{label}: the fault fired but no step raised")
                leftovers = [name.name for name in folder.glob(".*.creating")]
                if leftovers and kind != "unlink":  # only a failed unlink may leave the temp file
                    report.failures.append(f"{label}: a failed create left {leftovers}")
                _check_after(path, backend, registry, stream, run, report, label)
                shutil.rmtree(folder, ignore_errors=True)
            else:
                report.failures.append(f"{backend} {fault}: the workload never completed in {limit} runs")
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)
    return report


# -- a real full filesystem --------------------------------------------------------------------


@dataclass
class EnospcResult:
    """`skipped` says why the real-ENOSPC check could not run here (None: it ran)."""

    backend: str
    skipped: str | None = None
    acknowledged: int = 0
    lost: int = 0
    failures: list[str] = field(default_factory=list)


def mount_tiny_tmpfs(directory: Path, size: str = "64k") -> str | None:
    """Mount a tmpfs of `size` on `directory`; None on success, else why not."""
    if os.geteuid() != 0:
        return "not root: cannot mount a tmpfs"
    if shutil.which("mount") is None:
        return "no mount command"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return f"mount -t tmpfs failed: {done.stderr.strip() or done.returncode}"
    return None


def unmount(directory: Path) -> None:
    subprocess.run(["umount", str(directory)], capture_output=True, check=False)


def real_enospc(backend: str, *, plugins: Sequence[str] = (), size: str = "64k") -> EnospcResult:
    """Commit to a session on a 64 KiB tmpfs until the disk is full, then check as `run_faults`
    does. Always unmounts."""
    registry = registry_for(plugins)
    info = backends(registry)[backend]
    result = EnospcResult(backend)
    mountpoint = Path(tempfile.mkdtemp(prefix="sessionlog-enospc-"))
    try:
        why = mount_tiny_tmpfs(mountpoint, size)
        if why is not None:
            result.skipped = why
            return result
        try:
            _fill(mountpoint / "session.jsonl", backend, info.api, info.durability, registry, result)
        finally:
            unmount(mountpoint)
    finally:
        shutil.rmtree(mountpoint, ignore_errors=True)
    return result


def _fill(
    path: Path, backend: str, api: str, durability: str, registry: Registry | None, result: EnospcResult
) -> None:
    stream = Stream(7, small=(1 << 10, 6 << 10), huge_fraction=0, medium_fraction=0)
    run = _Run()
    raised: BaseException | None = None

    def commit_all_sync() -> None:
        nonlocal raised
        store = create(path, backend, provider=PROVIDER, model=MODEL, cwd=CWD, registry=registry)
        run.created = True
        try:
            for index in range(10_000):
                run.issued = index + 1
                store.commit(stream.transaction(index))
                run.acknowledged = index + 1
        except StorePoisonedError as error:
            raised = error
        finally:
            store.close()

    async def commit_all_async() -> None:
        nonlocal raised
        store = await create_async(path, backend, provider=PROVIDER, model=MODEL, cwd=CWD, registry=registry)
        run.created = True
        try:
            for index in range(10_000):
                run.issued = index + 1
                await store.commit(stream.transaction(index))
                run.acknowledged = index + 1
        except StorePoisonedError as error:
            raised = error
        finally:
            await store.close()

    try:
        if api == "sync":
            commit_all_sync()
        else:
            asyncio.run(commit_all_async())
    except Exception as error:  # a full disk must surface as StorePoisonedError
        result.failures.append(f"filling the disk raised {error!r}")
        return
    cause = raised.__cause__ if raised is not None else None
    if not isinstance(cause, OSError) or cause.errno != errno.ENOSPC:
        result.failures.append(f"the full disk was reported as {raised!r} caused by {cause!r}, not ENOSPC")
    result.acknowledged = run.acknowledged
    report = FaultReport(backend, durability)
    run.step = "commit"
    _check_after(path, backend, registry, stream, run, report, f"{backend} real ENOSPC")
    result.lost = report.lost
    # The reopen + append may itself meet the full disk: that must be StorePoisonedError (a file
    # backend, at the append) or ENOSPC itself (a database, whose open for writing writes).
    result.failures.extend(
        failure
        for failure in report.failures
        if "reopening" not in failure
        or ("StorePoisonedError" not in failure and f"SessionPathError({errno.ENOSPC}," not in failure)
    )

"""I/O faults through the FileOps seam (`sessionlog.testing.faults`): the k-th operation fails
with EIO, ENOSPC, EFBIG, or a short write and then ENOSPC, for every k; and a real full disk
(a 64 KiB tmpfs) where the machine lets us mount one."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from conftest import FILE_BACKENDS
from sessionlog.testing.faults import FAULTS, FaultOps, real_enospc, run_faults

BACKENDS = FILE_BACKENDS


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_kth_operation_failing_loses_nothing_acknowledged(backend: str, tmp_path: Path) -> None:
    report = run_faults(backend, directory=tmp_path)
    print(
        f"\n{backend}: {report.runs} runs, {report.faults} faults fired ({report.by_operation}), "
        f"{report.acknowledged} acknowledged, {report.lost} lost; failing commits: {report.landed} "
        f"found whole, {report.absent} absent"
    )
    assert report.failures == []
    assert report.lost == 0
    assert report.faults >= 4 * 10  # every kind fired at many points of the workload
    if sessionlog.backends()[backend].durability == "power":  # a failed sync is among the cases
        assert {"fsync", "fsync_directory"} <= set(report.by_operation)  # at create
        assert {"fdatasync", "syncfs"} & set(report.by_operation)  # at commit
    assert {"open", "write", "pread", "ftruncate", "link", "unlink", "close", "short"} <= set(
        report.by_operation
    )


class SwallowingOps(FaultOps):
    """A broken writer core: a failed write reports success, so the commit is acknowledged
    although nothing was written. The harness must notice."""

    def write(self, fd: int, data: Any) -> int:
        try:
            return super().write(fd, data)
        except OSError:
            return len(data)


def test_the_harness_catches_a_swallowed_write_error(tmp_path: Path) -> None:
    report = run_faults("jsonl", ("EIO",), directory=tmp_path, ops_factory=SwallowingOps)
    assert report.lost > 0 or report.failures
    assert not report.ok


def test_fault_ops_fail_exactly_the_kth_operation(tmp_path: Path) -> None:
    ops = FaultOps("EFBIG", 2)
    fd = ops.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    with pytest.raises(OSError) as caught:
        ops.write(fd, b"abc")
    assert caught.value.errno == errno.EFBIG and ops.fired == "write"
    assert ops.write(fd, b"abc") == 3  # only the k-th
    ops.close(fd)
    short = FaultOps("short", 1)
    fd = short.open(tmp_path / "g", os.O_WRONLY | os.O_CREAT, 0o600)
    assert short.write(fd, b"abcdef") == 3
    with pytest.raises(OSError) as caught:
        short.write(fd, b"def")
    assert caught.value.errno == errno.ENOSPC  # the operation after the short write
    short.close(fd)
    assert (tmp_path / "g").read_bytes() == b"abc"
    closing = FaultOps("EIO", 2)
    fd = closing.open(tmp_path / "h", os.O_WRONLY | os.O_CREAT, 0o600)
    with pytest.raises(OSError):
        closing.close(fd)  # failed, but the descriptor is closed (as on Linux)
    with pytest.raises(OSError) as closed:
        os.fstat(fd)
    assert closed.value.errno == errno.EBADF
    assert set(FAULTS) == {"EIO", "ENOSPC", "EFBIG", "short"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_real_full_disk(backend: str) -> None:
    result = real_enospc(backend)
    if result.skipped is not None:
        pytest.skip(result.skipped)
    print(f"\n{backend}: real ENOSPC after {result.acknowledged} acknowledged commits, {result.lost} lost")
    assert result.failures == []
    assert result.lost == 0 and result.acknowledged > 0

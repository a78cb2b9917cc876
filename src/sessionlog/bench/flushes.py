"""Evidence that a row synced: the cache flushes the device under `--dir` completed during it.

Linux (5.5 and later) counts, per block device, the flush requests it completed: field 16 of a
line of `/proc/diskstats` ("flush requests completed"). A commit of the power class that waits
for its `fdatasync` makes the device flush its write cache at least once before it returns (ext4,
xfs and btrfs with barriers, the default), so a one-committer row of N commits that really synced
shows at least about N flushes; one whose commits never reached a sync shows next to none.

Which device: the one holding the scratch folder, `st_dev` -> `/sys/dev/block/MAJ:MIN`; a
partition's flushes are counted by its parent disk, so a partition is resolved to it. tmpfs,
overlay and other filesystems without a block device, or a kernel without the field, have no
counter: `FlushCounter.unavailable` says why, and a run then never calls a row "not syncing".

Attribution: the counter is the device's, not the process's. It is read at the start and the end
of the timed part of each round (`measure.Window`: the commits only, not the creation and removal
of the sessions around them), so a one-committer row of a backend that never syncs is a window of
a few microseconds a commit, into which little of the machine's other work falls. Other work that
syncs adds flushes to a row's window, so a count can only err towards "it synced", never accuse
an honest row; work that writes without syncing (a disk hog of buffered writes) adds at most the
filesystem's periodic journal commit, a few per 5 seconds. An honest row's commits each wait for
at least one completed flush (the block layer merges concurrent flush requests, but a request
waits for a flush that starts after it), so it shows at least one flush a commit however busy
the device is.
"""

from __future__ import annotations

import os
from pathlib import Path

DISKSTATS = Path("/proc/diskstats")
SYS_BLOCK = Path("/sys/dev/block")
FLUSH_FIELD = 18  # 0-based index in a split line: major, minor, name, then counter k at 2 + k (16)


class FlushCounter:
    """The flush counter of the device holding `path`; `read()` is None when unavailable."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.device: str | None = None
        self.unavailable: str | None = None
        try:
            stat = os.stat(path)
        except OSError as error:
            self.unavailable = f"cannot stat {path}: {error.strerror}"
            return
        major, minor = os.major(stat.st_dev), os.minor(stat.st_dev)
        link = SYS_BLOCK / f"{major}:{minor}"
        if not link.exists():
            self.unavailable = (
                f"{path} is on device {major}:{minor}, which is not a block device "
                "(tmpfs, overlay, a network filesystem): no flush counter"
            )
            return
        node = link.resolve()
        if (node / "partition").exists():  # a partition's flushes are its disk's
            node = node.parent
        self.device = node.name
        if self.read() is None:
            self.unavailable = (
                f"/proc/diskstats has no flush counter for {self.device} (kernel older than 5.5?)"
            )
            self.device = None

    def read(self) -> int | None:
        name = self.device
        if name is None:
            return None
        try:
            for line in DISKSTATS.read_text().splitlines():
                fields = line.split()
                if len(fields) > FLUSH_FIELD and fields[2] == name:
                    return int(fields[FLUSH_FIELD])
        except (OSError, ValueError):
            return None
        return None

    def describe(self) -> str:
        if self.device is None:
            return f"flushes not counted: {self.unavailable}"
        return f"flushes counted on /dev/{self.device} (/proc/diskstats, flush requests completed)"

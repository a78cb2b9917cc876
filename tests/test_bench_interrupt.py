"""`sessionlog bench` interrupted: by Ctrl-C, SIGTERM or SIGHUP, at any point, it removes what
it made and exits (never hangs on its own threads)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from sessionlog.bench import shapes


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

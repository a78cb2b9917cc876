"""Shape h, a platform's restart, and the filling it shares with shape e.

A round reopens a repository of N sessions, one in ten left with an unfinished run, lists them
all (`list(limit=None)`), asks which are unfinished (`unfinished()`) and claims each of those for
recovery: `claim_unfinished()` until it gives None where the repository has it (PostgreSQL: one
transaction a claim, `FOR UPDATE SKIP LOCKED`), else `open(session_id)` of each unfinished one
(the writer lock or lease a recovery worker takes). Where `claim_unfinished()` gives None before
every unfinished session is claimed, the rest are opened by id, and the row says after how many
claims it stopped (`claim_stopped`). The timing runs from the reopening to the
last claim; the stores and the repository are closed after it, which gives the sessions back,
so every round claims the same ones. A row's figure is sessions a second (N over the restart's
time), its p50 the restart's time.

The filling (`fill`), once per run and outside the timing: each session's bytes are prebuilt
from two templates (a finished session, an unfinished one), every id in them made new. A
directory gets the files as the repository lays them out (`<session id>.jsonl`, mode 0600),
then one listing builds its index; a SQL repository gets `create_row` for a finished session and
`import_` of the bytes for an unfinished one (one transaction each; PostgreSQL's from 8 threads,
so that the server shares its syncs among them).
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sessionlog
from sessionlog.core import facts as F
from sessionlog.core.ids import new_id

from .measure import WINDOW, Job, RowFailed
from .shapes import HEADER

UNFINISHED_EVERY = 10  # one session in ten has an unfinished run
_ID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}")


def unfinished_count(sessions: int) -> int:
    return len(range(0, sessions, UNFINISHED_EVERY))


def _template(unfinished: bool) -> bytes:
    """A session's bytes: a prompt accepted and its run started (unfinished), or one message."""
    with tempfile.TemporaryDirectory(prefix="sessionlog-bench-template-") as folder:
        path = Path(folder) / "template.jsonl"
        with sessionlog.create(path, "jsonl", **HEADER) as store:
            store.commit(F.accept_prompt("a task") if unfinished else [F.user_message("a task")])
        return path.read_bytes()


class Sessions:
    """Prebuilt sessions: `make(number)` is the (session id, bytes) of session `number` (one in
    `UNFINISHED_EVERY` unfinished), every id in it its own."""

    def __init__(self) -> None:
        self.templates = {flag: _template(flag) for flag in (False, True)}

    def make(self, number: int) -> tuple[str, bytes]:
        template = self.templates[number % UNFINISHED_EVERY == 0]
        fresh: dict[bytes, bytes] = {}
        data = _ID.sub(lambda found: fresh.setdefault(found[0], new_id().encode()), template)
        return next(iter(fresh.values())).decode(), data  # the header's id comes first


def fill(kind: str, location: str, sessions: int) -> None:
    """`sessions` sessions into the repository of `kind` at `location` (see the module's text)."""
    made = Sessions()
    if kind == "directory":
        folder = Path(location)
        folder.mkdir(parents=True, exist_ok=True)
        for number in range(sessions):
            session_id, data = made.make(number)
            fd = os.open(folder / f"{session_id}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        with sessionlog.repository(folder, backend="jsonl") as repo:
            repo.list(limit=None)  # builds its index
        return
    options: dict[str, Any] = {"durability": "process"} if kind == "sqlite" else {}
    repo = sessionlog.repository(location, **options)
    try:

        def one(number: int) -> None:
            if number % UNFINISHED_EVERY:
                repo.create_row(**HEADER)
            else:
                repo.import_(made.make(number)[1])

        if kind == "sqlite":
            for number in range(sessions):
                one(number)
        else:
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(one, range(sessions)))
    finally:
        repo.close()


def restart_job(reopen: Callable[[], Any], sessions: int, meta: dict[str, Any]) -> Job:
    """One restart a round: `reopen()`, list, unfinished, claim (see the module's text). What it
    found goes into `meta` (the row's: listed, unfinished, claimed); a restart that does not
    find the `sessions` sessions or does not claim every unfinished one fails the row."""

    def run() -> tuple[int, float, list[float]]:
        stores: list[Any] = []
        WINDOW.start()
        start = time.perf_counter()
        repo = reopen()
        try:
            listed = repo.list(limit=None)
            unfinished = repo.unfinished()
            claimed = 0
            if hasattr(repo, "claim_unfinished"):
                while (store := repo.claim_unfinished()) is not None:
                    stores.append(store)
                claimed = len(stores)
            mine = {store.header["id"] for store in stores}
            stores += [repo.open(info.session_id) for info in unfinished if info.session_id not in mine]
            elapsed = time.perf_counter() - start
            WINDOW.stop()
        finally:
            for store in stores:
                store.close()
            repo.close()
        meta.update(listed=len(listed), unfinished=len(unfinished), claimed=len(stores))
        if hasattr(repo, "claim_unfinished") and claimed < len(unfinished):
            meta["claim_stopped"] = (
                f"claim_unfinished() gave None after {claimed} claims of {len(unfinished)} unfinished "
                "sessions; the rest were opened by id"
            )
        wanted = unfinished_count(sessions)
        if len(listed) != sessions or len(unfinished) != wanted or len(stores) != wanted:
            raise ValueError(
                f"found {len(listed)} sessions, {len(unfinished)} unfinished, claimed {len(stores)}; "
                f"filled {sessions}, {wanted} unfinished"
            )
        return len(listed), elapsed, [elapsed]

    return run


def restart_rows(places: dict[str, str], sessions: int) -> dict[str, tuple[Job, dict[str, Any]]]:
    """The jobs of shape h: a row a repository kind of `places` (kind -> its location, filled
    with `fill` first), each reopened with its defaults (a directory: `jsonl-fsync`; SQLite and
    PostgreSQL: the power class), as a platform opens it."""
    jobs: dict[str, tuple[Job, dict[str, Any]]] = {}
    for kind, location in places.items():
        name = f"{kind} repository: reopen, list, claim the unfinished"
        try:  # no measured round, still the row's: named, never a traceback
            fill(kind, location, sessions)
        except Exception as error:
            raise RowFailed(name, error) from error
        meta: dict[str, Any] = {"durability": "-", "kind": "repository", "unit": "sessions/s"}
        reopen = functools.partial(sessionlog.repository, location)
        jobs[name] = (
            restart_job(reopen, sessions, meta),
            meta,
        )
    return jobs

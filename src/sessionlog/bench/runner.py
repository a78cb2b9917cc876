"""One run of `sessionlog bench`: every shape chosen, its rows beside their ceilings (`run`), and
how much to measure (`Plan`). The command line is `command`."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import sessionlog

from ..repositories.locations import mask_in
from . import other_work, restart, resume, shapes, trust
from .flushes import FlushCounter
from .machine import load_average, machine, others_share
from .measure import Job, RowFailed, paired_ratio, steady
from .places import ScratchDatabase, check_postgres

if TYPE_CHECKING:
    from ..plugins.registry import Registry

SHAPES = "abcdefgh"  # `--shape`: (a) 1 committer, (b) 64 committers, (c) N sessions, (d) load, (e) list,
# (f) 1 committer into a long session, (g) resume a session, (h) a platform's restart
RESUMED = ("jsonl", "sqlite")  # shape g's sessionlog rows when `--backends` names none
REPOSITORIES = ("directory", "sqlite", "postgresql")  # `--backends` names them `KIND-repository`


class Plan:
    """How much to measure: `quick` (the default, under 2 minutes on 2 idle cores), `full`, or
    `tiny` (a smoke test of every shape: numbers too small to mean anything). Quick measures one
    count of sessions at once (64, the one the README quotes) and lists 1,000 sessions (shape e,
    the size of shape h's restart); `--full` adds 16 and 256 sessions and lists 10,000."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.rounds = {"full": 5, "quick": 3, "tiny": 1}[mode]
        self.sessions = {"full": (16, 64, 256), "quick": (64,), "tiny": (4,)}[mode]
        self.loads = {"full": (1_000, 10_000, 100_000), "quick": (1_000, 10_000), "tiny": (200,)}[mode]
        self.listed = {"full": 10_000, "quick": 1_000, "tiny": 200}[mode]
        self.held = {"full": (10_000, 100_000), "quick": (10_000,), "tiny": (300,)}[mode]
        self.resumed = {"full": (1_000, 10_000, 100_000), "quick": (1_000, 10_000), "tiny": (100,)}[mode]
        self.restarted = {"full": 10_000, "quick": 1_000, "tiny": 100}[mode]
        self.scale = {"full": 3.0, "quick": 1.0, "tiny": 0.1}[mode]

    def commits(self, durability: str, api: str, sessions: int = 1) -> int:
        """Commits a session in one round: enough for a stable rate, little enough for a quick run."""
        if sessions > 1:
            base = 10 if durability != "process" else 30
        else:
            base = 60 if durability != "process" else (1000 if api == "sync" else 300)
        return max(2, int(base * self.scale))

    def session_commits(self, durability: str, api: str, sessions: int) -> int:
        """Commits a session in one round of shape c (rows and ceilings alike): quick halves
        them, 5 a session for the power class, 320 a round over 64 sessions (every row and peer
        still in every round; the peers on one SQLite file run their sessions' commits one at a
        time, and 640 of them took a round of seconds)."""
        return max(2, int(self.commits(durability, api, sessions) * (0.5 if self.mode == "quick" else 1)))


def postgres_rows(backends: list[str] | None, only: str) -> bool:
    """Whether a run has PostgreSQL rows: the repository's (a, c, e, h) and the PostgreSQL peers'
    (a, c), with the repository chosen."""
    return (backends is None or "postgresql-repository" in backends) and bool(set(only) & set("aceh"))


def no_peers(postgres: str | None) -> Sequence[shapes.Peer]:
    return ()


def run(
    directory: str | None = None,
    backends: list[str] | None = None,
    postgres: str | None = None,
    mode: str = "quick",
    progress: bool = True,
    peers: Callable[[str | None], Sequence[shapes.Peer]] = no_peers,
    only: str = SHAPES,
    registry: Registry | None = None,
    readers: Sequence[resume.Reader] = (),
    ours: Sequence[int] = (),
) -> dict[str, Any]:
    """Every shape of `only` (letters of SHAPES); `postgres`: a server's URL for the PostgreSQL
    rows, which run in a scratch database made on it and dropped after, never in the URL's own
    (`places.ScratchDatabase`; a URL that cannot be read or isolated, or a role that cannot create
    a database, is `places.PlaceError` before anything is measured; on a server that cannot give
    them the power class, fsync=off say, they are skipped with the reason); `peers`: the other libraries
    as a function of that scratch database's URL (`peers.peers`; None: no server; one that cannot
    open is listed as skipped with the reason, never estimated), `readers`: their read
    paths for shape g (`resume.readers`, skipped alike); `registry`: where the backends are
    registered (None: the default registry, third-party plugins too); `ours`: the pids of
    processes the bench started for the run (a throwaway server), whose CPU is not other work's
    (`other_work`). A row that raises stops the run (`RowFailed`, the URL's password masked);
    the scratch folder and database go in every case."""
    unknown_shapes = set(only) - set(SHAPES)
    if unknown_shapes or not only:
        raise ValueError(f"shapes are letters of {SHAPES}, not {only!r}")
    infos = sessionlog.backends(registry)
    unknown = set(backends or ()) - set(infos) - {f"{kind}-repository" for kind in REPOSITORIES}
    if unknown:
        raise ValueError(
            f"not a registered backend nor a repository: {', '.join(sorted(unknown))}; backends: "
            f"{', '.join(infos)}; repositories: {', '.join(f'{kind}-repository' for kind in REPOSITORIES)}"
        )
    if postgres is not None:
        check_postgres(postgres)
    if postgres is None or not postgres_rows(backends, only):
        return _run(directory, backends, None, mode, progress, peers(None), only, registry, readers, ours)
    scratch = ScratchDatabase(postgres)
    try:
        with scratch as server:
            refused = scratch.refusal("power")  # the class of every PostgreSQL row
            if refused is None:
                return _run(
                    directory, backends, server, mode, progress, peers(server), only, registry, readers, ours
                )
    except RowFailed as failed:  # a driver may quote the scratch URL it was given
        raise failed.masking(postgres) from failed.error
    result = _run(directory, backends, None, mode, progress, peers(None), only, registry, readers, ours)
    result["skipped"].append({"name": "the PostgreSQL rows", "reason": refused})
    return result


def _run(
    directory: str | None,
    backends: list[str] | None,
    postgres: str | None,
    mode: str,
    progress: bool,
    peers: Sequence[shapes.Peer],
    only: str,
    registry: Registry | None,
    readers: Sequence[resume.Reader],
    ours: Sequence[int],
) -> dict[str, Any]:
    """`run`, its PostgreSQL rows (if any) on `postgres`, a scratch database's URL."""
    plan = Plan(mode)
    infos = sessionlog.backends(registry)
    chosen = set(backends) if backends else None
    names = [name for name in infos if chosen is None or name in chosen]

    def repository_on(kind: str) -> bool:
        return chosen is None or f"{kind}-repository" in chosen

    scratch = shapes.Scratch(directory)
    counter = FlushCounter(scratch.root)
    rows: list[dict[str, Any]] = []
    usable: list[shapes.Peer] = []
    reading: list[resume.Reader] = []
    skipped: list[dict[str, str]] = []
    started = time.monotonic()
    seconds: dict[str, float] = {}  # shape -> seconds it took (`trust.full_estimate`)
    timed: dict[str, float] = {}  # shape -> seconds of its rounds' timed part (measured twice: 2x)
    load = {"cpus": os.cpu_count(), "start": load_average()}
    before = other_work.processes()

    def say(message: str) -> None:
        if progress:
            print(f"[{time.monotonic() - started:5.1f}s] {message}", file=sys.stderr, flush=True)

    def measure(shape: str, jobs: dict[str, tuple[Job, dict[str, Any]]], ceilings: dict[str, Job]) -> None:
        """Alternate every job with the ceilings of its class; one row each. A shape whose
        ceilings moved by more than `trust.MOVED` between rounds is measured once more, and the
        measurement whose ceilings moved least is kept."""
        began = time.monotonic()
        everything = {**ceilings, **{name: job for name, (job, _) in jobs.items()}}
        read = counter.read if counter.device else None
        measured, remeasured = steady(everything, ceilings, plan.rounds, read)
        if remeasured:
            say("  its ceiling moved between rounds: measured again")
        seconds[shape] = round(time.monotonic() - began, 2)
        timed[shape] = round(sum(one.seconds for one in measured.values()) * (2 if remeasured else 1), 2)
        marks = {"remeasured": True} if remeasured else {}
        for name in ceilings:
            summary = measured[name].summary()
            kept = name.endswith(shapes.KEPT_OPEN)
            fresh = name.removesuffix(shapes.KEPT_OPEN)
            files: dict[str, Any] = {}  # said only of the ceilings measured both ways (on files)
            if kept:
                files["files"] = "kept open across rounds"
            elif name + shapes.KEPT_OPEN in ceilings:
                files["files"] = "fresh each round"
            if kept and fresh in measured:  # the two kinds of ceiling, measured in the same rounds
                files["vs_fresh"] = paired_ratio(measured[name], measured[fresh])
                files["rounds"] = len(measured[name].rates)
            rows.append({"shape": shape, "name": name, "kind": "ceiling", **summary, **files, **marks})
        for name, (_, meta) in jobs.items():
            ceiling = meta.get("ceiling")
            row = {
                "shape": shape,
                "name": name,
                "kind": meta.get("kind", "backend"),
                **meta,
                **measured[name].summary(),
                **marks,
            }
            if ceiling in measured:
                row["ceiling_per_s"] = measured[ceiling].summary()["per_s"]
                row["vs_ceiling"] = paired_ratio(measured[name], measured[ceiling])
            rows.append(row)

    try:
        for peer in peers if set(only) & set("ac") else ():  # the shapes peers commit in
            try:  # one session opened and closed: a peer that is not installed or fails is a skip
                commit, close = peer.open(scratch.fresh(), 0)
                commit(0)
                close()
                usable.append(peer)
            except Exception as error:
                skipped.append({"name": peer.name, "reason": _reason(error, postgres)})
        for reader in readers if "g" in only else ():
            try:  # two messages stored and read back: one not installed or failing is a skip
                read, close = reader.build(scratch.fresh(), resume.messages(2))
                if read() != 2:
                    raise ValueError("it did not give back the 2 messages stored")
                close()
                reading.append(reader)
            except Exception as error:
                skipped.append({"name": reader.name, "reason": _reason(error, postgres)})
        # (a) one session, one committer
        for facts in (1, 10) if "a" in only else ():
            say(f"one session, one committer, {facts}-fact transactions")
            jobs: dict[str, tuple[Job, dict[str, Any]]] = {}
            for name in names:
                info = infos[name]
                commits = plan.commits(info.durability, info.api)
                ceiling = _ceiling(info.durability, 1, info.syncs_filesystem, kept=True)
                jobs[name] = (
                    shapes.sessions_job(scratch, name, 1, commits, facts, registry),
                    {"durability": info.durability, "api": info.api, "ceiling": ceiling},
                )
            for peer in usable if facts == 1 else ():  # a peer commits one message
                ceiling = (
                    shapes.POSTGRES_CEILING
                    if peer.on_postgres
                    else _ceiling(peer.durability, 1, kept=peer.kept_open)
                )
                jobs[f"peer: {peer.name}"] = (
                    shapes.peer_job(scratch, peer, 1, plan.commits(peer.durability, "sync")),
                    {"durability": peer.durability, "kind": "peer", "ceiling": ceiling},
                )
            if postgres and repository_on("postgresql") and facts == 1:  # beside the peers on its server
                for api, job in (
                    ("sync", shapes.sync_repository_job(lambda: postgres, plan.commits("power", "sync"))),
                    ("async", shapes.repository_job(lambda: postgres, 1, plan.commits("power", "async"))),
                ):
                    jobs[f"postgresql repository{', async' if api == 'async' else ''} (power)"] = (
                        job,
                        {
                            "durability": "power",
                            "api": api,
                            "kind": "repository",
                            "ceiling": shapes.POSTGRES_CEILING,
                            "on_server": True,
                        },
                    )
            ceilings = _one_writer_ceilings(scratch, plan, any(infos[n].syncs_filesystem for n in names))
            if postgres and any(meta.get("ceiling") == shapes.POSTGRES_CEILING for _, meta in jobs.values()):
                ceilings[shapes.POSTGRES_CEILING] = shapes.postgres_ceiling_job(
                    postgres, plan.commits("power", "sync")
                )
            measure(f"a: 1 session, 1 committer, {facts} fact{'s' if facts > 1 else ''}", jobs, ceilings)
        # (b) one session, 64 committers
        async_names = [name for name in names if infos[name].api == "async"]
        if async_names and "b" in only:
            say("one session, 64 committers")
            jobs = {
                name: (
                    shapes.committers_job(
                        scratch, name, 64, 10 if infos[name].durability != "process" else 30, registry
                    ),
                    {
                        "durability": infos[name].durability,
                        "api": "async",
                        "ceiling": _ceiling(infos[name].durability, 64),
                    },
                )
                for name in async_names
            }
            # each row beside the ceiling of its class: a process-class row makes no sync
            kinds = {_ceiling(infos[name].durability, 64): infos[name].durability for name in async_names}
            measure(
                "b: 1 session, 64 committers",
                jobs,
                {
                    ceiling: shapes.ceiling_job(
                        scratch,
                        64,
                        plan.commits(durability, "sync", 64),
                        "os.write" if durability == "process" else "write+fdatasync",
                    )
                    for ceiling, durability in sorted(kinds.items())
                },
            )
        # (c) N sessions, one writer each
        for sessions in plan.sessions if "c" in only else ():
            say(f"{sessions} sessions, one writer each")
            kept_open = sessions <= shapes.KEPT_UP_TO  # the rows' sessions kept open across rounds
            jobs = {}
            for name in names:
                info = infos[name]
                jobs[name] = (
                    shapes.sessions_job(
                        scratch,
                        name,
                        sessions,
                        plan.session_commits(info.durability, info.api, sessions),
                        registry=registry,
                    ),
                    {
                        "durability": info.durability,
                        "api": info.api,
                        "ceiling": _ceiling(info.durability, sessions, kept=kept_open),
                    },
                )
            for durability in ("power", "process") if repository_on("sqlite") else ():
                label = f"sqlite repository, async ({durability})"
                jobs[label] = (
                    shapes.repository_job(
                        lambda: f"sqlite:///{scratch.fresh() / 'sessions.db'}",
                        sessions,
                        plan.session_commits(durability, "async", sessions),
                        durability=durability,
                    ),
                    {
                        "durability": durability,
                        "api": "async",
                        "kind": "repository",
                        "ceiling": _ceiling(durability, sessions, kept=kept_open),
                    },
                )
            for peer in usable:
                if peer.concurrent:
                    jobs[f"peer: {peer.name}, a thread a session"] = (
                        shapes.peer_job(
                            scratch, peer, sessions, plan.session_commits(peer.durability, "sync", sessions)
                        ),
                        {
                            "durability": peer.durability,
                            "kind": "peer",
                            "ceiling": _ceiling(
                                peer.durability,
                                sessions,
                                kept=kept_open and peer.kept_open,
                            ),
                        },
                    )
            if postgres and repository_on("postgresql"):
                jobs["postgresql repository, async (power)"] = (
                    shapes.repository_job(
                        lambda: postgres, sessions, plan.session_commits("power", "async", sessions)
                    ),
                    {
                        "durability": "power",
                        "api": "async",
                        "kind": "repository",
                        "ceiling": _ceiling("power", sessions, kept=kept_open),
                        "on_server": True,  # its data on the server's disk, not --dir's
                    },
                )
            ceilings = {
                f"{sessions} threads: {kind}{shapes.KEPT_OPEN if kept else ''}": shapes.ceiling_job(
                    scratch, sessions, plan.session_commits(durability, "sync", sessions), kind, kept
                )
                for kind, durability in (("write+fdatasync", "power"), ("os.write", "process"))
                for kept in ((False, True) if kept_open else (False,))
            }
            measure(f"c: {sessions} sessions, one writer each", jobs, ceilings)
        # (d) loading
        folder = scratch.fresh()
        loads = [(facts, 0) for facts in plan.loads] + [
            (plan.loads[-1], compactions) for compactions in (10, 50)
        ]
        if "d" not in only:
            loads = []
        for facts, compactions in loads:
            label = f"d: load {facts:,} facts" + (f", {compactions} compactions" if compactions else "")
            say(label[3:])
            path = shapes.write_session(folder, facts, compactions)
            measure(
                label,
                {
                    "reduce (every backend's load)": (
                        shapes.load_job(path),
                        {"durability": "-", "ceiling": "split + orjson.loads", "unit": "facts/s"},
                    )
                },
                {"split + orjson.loads": shapes.parse_ceiling_job(path)},
            )
        # (e) listing
        if "e" in only:
            say(f"list and unfinished over {plan.listed:,} sessions")
        places: dict[str, Callable[[str], Any]] = {
            "directory": lambda location: sessionlog.repository(location, backend="jsonl"),
            "sqlite": lambda location: sessionlog.repository(location, durability="process"),
            "postgresql": lambda location: sessionlog.repository(location),
        }
        repos: dict[str, Any] = {}
        filling = time.monotonic()
        try:
            for kind, location in _locations(scratch, postgres).items() if "e" in only else ():
                if repository_on(kind):
                    try:  # no measured round, still the row's: named, never a traceback
                        restart.fill(kind, location, plan.listed)
                        repos[kind] = places[kind](location)
                    except Exception as error:
                        raise RowFailed(f"{kind}: list", error) from error
            jobs = {}
            for kind, repo in repos.items():
                repo.list(limit=None)  # a directory reads its index once
                for call in ("list", "unfinished"):
                    jobs[f"{kind}: {call}"] = (
                        shapes.listing_job(repo, call),
                        {"durability": "-", "unit": "calls/s"},
                    )
            if jobs:
                label = f"e: list and unfinished over {plan.listed:,} sessions"
                measure(label, jobs, {})
                seconds[label] = round(time.monotonic() - filling, 2)  # the filling is most of it
        finally:
            for repo in repos.values():
                repo.close()
        # (f) one committer into a long session (a's rows are the same commits into a new one)
        for held in plan.held if "f" in only else ():
            say(f"one committer into a session of {held:,} facts")
            jobs = {}
            for name in names:
                info = infos[name]
                jobs[name] = (
                    shapes.sessions_job(
                        scratch, name, 1, plan.commits(info.durability, info.api), 1, registry, held
                    ),
                    {
                        "durability": info.durability,
                        "api": info.api,
                        "ceiling": _ceiling(info.durability, 1, info.syncs_filesystem, kept=True),
                    },
                )
            ceilings = _one_writer_ceilings(scratch, plan, any(infos[n].syncs_filesystem for n in names))
            measure(f"f: 1 committer, a session of {held:,} facts", jobs, ceilings)
        # (g) resume: open, load and list a session, beside the peers' read paths
        resumed = [name for name in names if chosen is not None or name in RESUMED]
        for count in plan.resumed if "g" in only and (resumed or reading) else ():
            say(f"resume a session of {count:,} messages")
            building = time.monotonic()
            jobs, closers = resume.resume_rows(scratch.fresh(), count, resumed, reading, registry)
            try:
                label = f"g: resume a session of {count:,} messages"
                measure(label, jobs, {})
                seconds[label] = round(time.monotonic() - building, 2)  # with the building
            finally:
                for close in closers:
                    close()
        # (h) a platform's restart: reopen, list, claim the unfinished (PostgreSQL's in a
        # database of its own: shape e's sessions are in the scratch one)
        if "h" in only:
            with contextlib.ExitStack() as stack:
                other = None
                if postgres and repository_on("postgresql"):
                    other = stack.enter_context(ScratchDatabase(postgres))
                kept = {
                    kind: location
                    for kind, location in _locations(scratch, other).items()
                    if repository_on(kind)
                }
                if kept:
                    unfinished = restart.unfinished_count(plan.restarted)
                    label = f"h: restart: {plan.restarted:,} sessions, {unfinished:,} unfinished"
                    say(label[3:])
                    filling = time.monotonic()
                    measure(label, restart.restart_rows(kept, plan.restarted), {})
                    seconds[label] = round(time.monotonic() - filling, 2)  # with the filling
    finally:
        scratch.remove()
    return {
        "rows": rows,
        "skipped": skipped,
        "machine": machine(directory, postgres),
        "mode": mode,
        "flushes": counter.describe(),
        "flush_device": counter.device,
        "seconds": round(time.monotonic() - started, 1),
        "shape_seconds": seconds,
        "shape_timed_seconds": timed,
        "full_estimate_s": trust.full_estimate(seconds, mode, timed) if only == SHAPES else None,
        "load": {
            **load,
            "end": load_average(),
            "others": others_share(before, ours, time.monotonic() - started),
        },
        "shapes": only,
    }


def _locations(scratch: shapes.Scratch, postgres: str | None) -> dict[str, str]:
    """A fresh place for a repository of each kind (PostgreSQL's only with a server's URL)."""
    found = {
        "directory": str(scratch.fresh() / "sessions"),
        "sqlite": f"sqlite:///{scratch.fresh() / 'sessions.db'}",
    }
    return found | ({"postgresql": postgres} if postgres else {})


def _reason(error: BaseException, postgres: str | None) -> str:
    """Why a peer is skipped: its error, short, the PostgreSQL URL's password masked."""
    reason = f"{type(error).__name__}: {error}"
    return (mask_in(reason, postgres) if postgres else reason)[:200]


def _one_writer_ceilings(scratch: shapes.Scratch, plan: Plan, syncfs: bool) -> dict[str, Job]:
    """The bare ceilings of one writer: write+fdatasync, os.write and, when a backend syncs its
    filesystem, write+syncfs; each on a fresh file each round and on one kept open across
    rounds (`shapes.KEPT_OPEN`), as the rows' sessions are, measured in the same rounds."""
    kinds = ["write+fdatasync", "write+syncfs", "os.write"] if syncfs else ["write+fdatasync", "os.write"]
    commits = {kind: plan.commits("process" if kind == "os.write" else "power", "sync") for kind in kinds}
    return {
        kind + (shapes.KEPT_OPEN if kept else ""): shapes.ceiling_job(scratch, 1, commits[kind], kind, kept)
        for kind in kinds
        for kept in (False, True)
    }


def _ceiling(durability: str, sessions: int, syncs_filesystem: bool = False, kept: bool = False) -> str:
    """The name of the ceiling a row of `durability` with `sessions` writers is measured against:
    one session's is the bare form of its own sync; many sessions' is always N threads each
    writing and fdatasyncing its own file (what a writer per session would reach). `kept`: the
    row's sessions are kept open across rounds (`shapes.Kept`), and so are its ceiling's files."""
    if durability == "process":
        kind = "os.write"
    elif sessions == 1 and syncs_filesystem:
        kind = "write+syncfs"
    else:
        kind = "write+fdatasync"
    return (kind if sessions == 1 else f"{sessions} threads: {kind}") + (shapes.KEPT_OPEN if kept else "")

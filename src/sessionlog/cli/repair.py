"""`repair`: drop a torn tail under the writer lock; `--quarantine` sets a corrupt tail aside."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from .. import opening
from ..core.state import SessionState
from ..maintenance import quarantine
from ..plugins.registry import Registry
from ..repositories.directory import DirectoryRepository
from .output import out
from .sessions import UsageError, in_repository, load_session, open_for_writing, open_repository


def cmd_repair(args: argparse.Namespace, registry: Registry) -> int:
    if args.quarantine:
        return _quarantine(args, registry)
    data, state = load_session(
        args.file, args.backend, registry, args.progress
    )  # refuses corruption: nothing is touched
    end = state.repaired_length
    torn = len(data) - end
    if not torn:
        out(f"{args.file}: no torn tail, nothing to repair ({end:,} bytes, last seq {state.last_seq})")
        return 0
    if args.dry_run:
        out(
            f"{args.file}: would drop a torn tail of {torn:,} bytes "
            f"(keeping {end:,} bytes, last seq {state.last_seq})"
        )
        return 0
    # Opening a store for writing is the repair, under the writer lock: it reads and reduces again
    # and truncates the torn tail it finds then (the bytes counted above may have changed since).
    if in_repository(args.file, registry.info(args.backend)) or registry.info(args.backend).api == "sync":
        with open_for_writing(args.file, args.backend, registry) as store:
            dropped, kept = store.torn_bytes, store.load()
    else:

        async def repair_async() -> tuple[int, SessionState]:
            async with await opening.open_async(args.file, args.backend, registry=registry) as store:
                return store.torn_bytes, await store.load()

        dropped, kept = asyncio.run(repair_async())
    out(
        f"{args.file}: dropped a torn tail of {dropped:,} bytes "
        f"(now {kept.repaired_length:,} bytes, last seq {kept.last_seq})"
    )
    return 0


def _quarantine(args: argparse.Namespace, registry: Registry) -> int:
    path, info = Path(args.file), registry.info(args.backend)
    if in_repository(args.file, info):  # a directory repository's session is a file too
        location, session_id = args.file.rsplit("#", 1)
        with open_repository(location, registry) as repository:
            if not isinstance(repository, DirectoryRepository):
                raise UsageError(
                    f"--quarantine works on session files; {location} keeps its sessions elsewhere"
                )
            path, info = repository.path(session_id), registry.info(repository.backend)
    if not info.plain_file:
        raise UsageError(f"--quarantine works on a session file; backend {args.backend!r} stores elsewhere")
    report = quarantine(path, info.nul_rule(), dry_run=args.dry_run)
    if report is None:
        out(f"{args.file}: valid, nothing to quarantine")
        return 0
    seqs = "no readable seq" if report.seqs is None else f"seq {report.seqs[0]}-{report.seqs[1]}"
    verb = "would move" if args.dry_run else "moved"
    out(
        f"{args.file}: {verb} {report.lines:,} line{'s' if report.lines != 1 else ''} from line "
        f"{report.first_line} ({seqs}, {report.moved_bytes:,} bytes from byte offset {report.offset:,}) "
        f"into {report.side_file}; the first bad one: {report.error}"
    )
    if not args.dry_run:
        out(f"{args.file}: opens again with {report.offset:,} bytes")
    return 0

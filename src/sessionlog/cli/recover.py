"""`plan`, `recover` and `abort`: the recovery planner, run from the command line."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .. import opening
from ..core.commit import CommitPipeline
from ..core.errors import (
    ValidationError,
)
from ..core.planner import plan_recovery
from ..core.state import SessionState
from ..core.store import reduce_stored
from ..plugins.registry import Registry
from ..recovery import Plan, recover, recover_async
from ..runtime import RuntimeStateError, abort_facts
from .describe import describe_plan, seqs_text
from .output import PROG, out, out_json, say_error
from .sessions import (
    UsageError,
    in_repository,
    load_current,
    load_session,
    open_for_writing,
    read_session,
)


class MemoryStore:
    """A session's bytes in memory that commits like a store and writes nowhere (--dry-run)."""

    def __init__(self, data: bytes, path: str, *, power: dict[str, Any]) -> None:
        self._pipeline: CommitPipeline = reduce_stored(data, Path(path), **power)[0]

    def commit(self, facts: Any) -> list[dict[str, Any]]:
        prepared = self._pipeline.prepare(facts)
        self._pipeline.acknowledge(prepared)
        return prepared.facts

    def load(self) -> SessionState:
        return self._pipeline.state()


EXIT_BLOCKED = 4  # recovery is blocked: a person decides (`abort` ends the run)


def cmd_plan(args: argparse.Namespace, registry: Registry) -> int:
    current = load_current(args.current)
    state = load_session(args.file, args.backend, registry, args.progress)[1]
    plan = plan_recovery(state, current)
    if args.json:
        out_json(plan)
    else:
        out(f"{args.file}: {describe_plan(plan, idle=state.is_idle)}")
        if plan["type"] == "blocked":
            out(f"recovery cannot go on by itself; to end the run: {PROG} abort {args.file} --current ...")
    return EXIT_BLOCKED if plan["type"] == "blocked" else 0


AbortFacts = Callable[[SessionState], list[dict[str, Any]]]


def _recover(
    args: argparse.Namespace,
    registry: Registry,
    current: dict[str, Any],
    on_commit: Callable[[Mapping[str, Any], list[dict[str, Any]]], None],
    first: AbortFacts | None = None,
) -> tuple[Plan, bool]:
    """Open the session for writing (under its lock; in memory with --dry-run), commit `first`'s
    facts if any, then every recovery step that needs no effect. Returns the plan left and
    whether the session is then idle."""
    if getattr(args, "dry_run", False):
        data, rule = read_session(args.file, args.backend, registry)
        memory = MemoryStore(data, args.file, power=rule)
        if first is not None and (facts := first(memory.load())):
            on_commit({"type": "abort"}, memory.commit(facts))
        return recover(memory, current, on_commit=on_commit), memory.load().is_idle
    if in_repository(args.file, registry.info(args.backend)) or registry.info(args.backend).api == "sync":
        with open_for_writing(args.file, args.backend, registry) as store:
            if first is not None and (facts := first(store.load())):
                on_commit({"type": "abort"}, store.commit(facts))
            return recover(store, current, on_commit=on_commit), store.load().is_idle

    async def in_loop() -> tuple[Plan, bool]:
        async with await opening.open_async(args.file, args.backend, registry=registry) as store:
            if first is not None and (facts := first(await store.load())):
                on_commit({"type": "abort"}, await store.commit(facts))
            left = await recover_async(store, current, on_commit=on_commit)
            return left, (await store.load()).is_idle

    return asyncio.run(in_loop())


def _run_recovery(args: argparse.Namespace, registry: Registry, first: AbortFacts | None = None) -> int:
    current = load_current(args.current)
    done: list[dict[str, Any]] = []
    verb = "would commit" if getattr(args, "dry_run", False) else "committed"

    def on_commit(plan: Mapping[str, Any], committed: list[dict[str, Any]]) -> None:
        done.append({"plan": plan, "facts": committed})
        if not args.json:
            what = "abortRequested" if plan["type"] == "abort" else describe_plan(plan)
            out(f"{verb} {seqs_text(committed)}: {what}")

    try:
        plan, idle = _recover(args, registry, current, on_commit, first)
    except ValidationError as error:
        say_error(
            args.command,
            f"{args.file}: line {error.line}: the reducer refused the transaction recovery planned, "
            f"nothing of it was written ({len(done)} earlier ones were): {error}",
        )
        return 1
    if args.json:
        out_json({"dryRun": getattr(args, "dry_run", False), "committed": done, "plan": plan})
    else:
        if not done:
            out(f"{verb} nothing")
        out(f"plan left: {describe_plan(plan, idle=idle)}")
        out_json(plan)
    return EXIT_BLOCKED if plan["type"] == "blocked" else 0


def cmd_recover(args: argparse.Namespace, registry: Registry) -> int:
    return _run_recovery(args, registry)


def cmd_abort(args: argparse.Namespace, registry: Registry) -> int:
    def first(state: SessionState) -> list[dict[str, Any]]:
        try:
            return abort_facts(state, args.phase)
        except RuntimeStateError as error:
            raise UsageError(f"{args.file}: {error}") from None

    return _run_recovery(args, registry, first)

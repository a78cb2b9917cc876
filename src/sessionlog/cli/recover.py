"""`plan`, `recover` and `abort`: the recovery planner, run from the command line.

Without `--current`, the current configuration is the one the session itself last recorded
(`session_current`): the configuration snapshot of the current step's attempt, the replay
declarations (`replay`, `replayKey`) and environment identity of its intents. That is sound for
what these commands do: they never run a tool, and with the session's own configuration rule 11
settles a pending `never` tool as interrupted (always true: its effect may have happened) and
leaves a pending safe read to the program (`startTool` replay), as a program that did not change
its tools would. The commands say when they did so.

They plan as the runtime does, in the model's order (`recovery.plan_in_order`: a pending call is
settled before a later call of its step is started); that is the contract's planner except there."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .. import opening
from ..core.canonical import configuration_digest
from ..core.commit import CommitPipeline
from ..core.errors import (
    ValidationError,
)
from ..core.state import SessionState
from ..core.store import reduce_stored
from ..plugins.registry import Registry
from ..recovery import Plan, plan_in_order, recover, recover_async
from ..runtime_errors import RuntimeStateError
from ..runtime_shared import abort_facts
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
NO_STEP_DIGEST = "sha256:" + "0" * 64  # no attempt recorded: no rule reads the digest then


def session_current(state: SessionState) -> tuple[dict[str, Any], str]:
    """The current configuration as the session last recorded it (see the module docstring),
    and a sentence saying where each part came from."""
    step = state.step
    intents = state.tool_calls
    environment = next(
        (tool["environmentIdentity"] for tool in reversed(intents)),
        str(state.header.get("environmentIdentity") or "unknown"),
    )
    if step is None:
        current: dict[str, Any] = {
            "configurationDigest": NO_STEP_DIGEST,
            "environmentIdentity": environment,
            "tools": [],
        }
        return current, (
            "no --current: the run has no model attempt yet, so no rule reads the configuration "
            f"(environment {environment!r} from the session)"
        )
    snapshot = step["configurationSnapshot"]
    declared = {tool["toolName"]: tool for tool in intents}
    tools = []
    for tool in snapshot["tools"]:
        intent = declared.get(tool["name"])
        tools.append(
            {
                "name": tool["name"],
                "definitionDigest": tool["definitionDigest"],
                "replay": intent["replay"] if intent else "never",
                "replayKey": intent["replayKey"] if intent else f"{tool['name']}:unrecorded",
            }
        )
    current = {
        "configurationDigest": configuration_digest(snapshot),
        "environmentIdentity": environment,
        "tools": tools,
    }
    return current, (
        f"no --current: planning with the configuration this session last recorded (the snapshot of "
        f"attempt {step['attempt']} of step {step['stepId']}, the replay declarations of its "
        f"{len(intents)} tool intent(s), environment {environment!r}), as if the program had not changed"
    )


def _current_for(args: argparse.Namespace) -> Callable[[SessionState], tuple[dict[str, Any], str | None]]:
    """The configuration to plan with: --current's file, or the session's own (with a note)."""
    if args.current is not None:
        if not os.path.lexists(args.current):
            raise UsageError(f"--current {args.current}: cannot read it: no such configuration file")
        given = load_current(args.current)
        return lambda state: (given, None)
    return session_current


def _note(args: argparse.Namespace, note: str | None) -> None:
    """Say where the configuration came from: on stdout, or on stderr beside --json's JSON."""
    if note is not None:
        if args.json:
            print(f"{PROG} {args.command}: {args.file}: {note}", file=sys.stderr)
        else:
            out(f"{args.file}: {note}")


def cmd_plan(args: argparse.Namespace, registry: Registry) -> int:
    current_for = _current_for(args)
    state = load_session(args.file, args.backend, registry, args.progress)[1]
    current, note = current_for(state)
    plan = plan_in_order(state, current)
    if args.json:
        out_json(plan)  # the contract's plan, idle's too (rule 1; the shared fixture finish-idle)
    else:
        _note(args, note)
        out(f"{args.file}: {describe_plan(plan, idle=state.is_idle)}")
        if plan["type"] == "blocked":
            out(f"recovery cannot go on by itself; to end the run: {PROG} abort {args.file}")
    return EXIT_BLOCKED if plan["type"] == "blocked" else 0


AbortFacts = Callable[[SessionState], list[dict[str, Any]]]


CurrentFor = Callable[[SessionState], tuple[dict[str, Any], str | None]]


def _recover(
    args: argparse.Namespace,
    registry: Registry,
    current_for: CurrentFor,
    on_commit: Callable[[Mapping[str, Any], list[dict[str, Any]]], None],
    first: AbortFacts | None = None,
) -> tuple[Plan, SessionState]:
    """Open the session for writing (under its lock; in memory with --dry-run), take the
    configuration to plan with from `current_for` (said when it is the session's own), commit
    `first`'s facts if any, then every recovery step that needs no effect. Returns the plan left
    and the state then."""

    def current_of(state: SessionState) -> dict[str, Any]:
        current, note = current_for(state)
        _note(args, note)
        return current

    if getattr(args, "dry_run", False):
        data, rule = read_session(args.file, args.backend, registry)
        memory = MemoryStore(data, args.file, power=rule)
        current = current_of(memory.load())
        if first is not None and (facts := first(memory.load())):
            on_commit({"type": "abort"}, memory.commit(facts))
        return recover(memory, current, on_commit=on_commit, in_order=True), memory.load()
    if in_repository(args.file, registry.info(args.backend)) or registry.info(args.backend).api == "sync":
        with open_for_writing(args.file, args.backend, registry) as store:
            current = current_of(store.load())
            if first is not None and (facts := first(store.load())):
                on_commit({"type": "abort"}, store.commit(facts))
            return recover(store, current, on_commit=on_commit, in_order=True), store.load()

    async def in_loop() -> tuple[Plan, SessionState]:
        async with await opening.open_async(args.file, args.backend, registry=registry) as store:
            current = current_of(await store.load())
            if first is not None and (facts := first(await store.load())):
                on_commit({"type": "abort"}, await store.commit(facts))
            left = await recover_async(store, current, on_commit=on_commit, in_order=True)
            return left, await store.load()

    return asyncio.run(in_loop())


def _run_recovery(args: argparse.Namespace, registry: Registry, first: AbortFacts | None = None) -> int:
    current_for = _current_for(args)
    done: list[dict[str, Any]] = []
    verb = "would commit" if getattr(args, "dry_run", False) else "committed"

    def on_commit(plan: Mapping[str, Any], committed: list[dict[str, Any]]) -> None:
        done.append({"plan": plan, "facts": committed})
        if not args.json:
            what = "abortRequested" if plan["type"] == "abort" else describe_plan(plan)
            out(f"{verb} {seqs_text(committed)}: {what}")

    try:
        plan, state = _recover(args, registry, current_for, on_commit, first)
    except ValidationError as error:
        say_error(
            args.command,
            f"{args.file}: line {error.line}: the reducer refused the transaction recovery planned, "
            f"nothing of it was written ({len(done)} earlier ones were): {error}",
        )
        return 1
    # the run these commits ended (not the idle plan after it: "nothing to do", "completed")
    ended = state.last_finished if state.is_idle and done else None
    if args.json:
        left = None if state.is_idle else plan  # idle once finished: no plan left
        value = {"dryRun": getattr(args, "dry_run", False), "committed": done, "plan": left}
        value["currentFrom"] = "file" if args.current is not None else "session"
        if ended is not None:
            value["finished"] = ended
        out_json(value)
    else:
        if not done:
            out(f"{verb} nothing")
        if ended is not None:
            failed = ended.get("error")
            why = f" ({failed.get('code')}: {failed.get('message')})" if isinstance(failed, Mapping) else ""
            out(f"the run {'would end' if verb != 'committed' else 'ended'}: {ended['outcome']}{why}")
            out_json(ended)
        else:
            out(f"plan left: {describe_plan(plan, idle=state.is_idle)}")
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

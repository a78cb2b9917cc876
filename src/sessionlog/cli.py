"""The `sessionlog` command line: look into a session after a crash, repair it, recover it.

    sessionlog backends [--json]
    sessionlog inspect FILE [--backend NAME] [--json]
    sessionlog verify FILE [--backend NAME]
    sessionlog repair FILE [--backend NAME] [--dry-run] [--quarantine]
    sessionlog reduce FILE [--backend NAME]
    sessionlog plan FILE --current CONFIG.json [--backend NAME]
    sessionlog recover FILE --current CONFIG.json [--backend NAME] [--dry-run] [--json]
    sessionlog convert SRC DST --to BACKEND [--backend NAME]

Every command that reads a session also takes `--progress {auto,always,never}` (stderr; rich
when installed, plain text otherwise; `auto`: large sessions on a terminal).

Exit status: 0 ok; 1 the session is bad (corrupted, or the reducer refused what recovery
planned); 2 usage (bad arguments, no such file or backend, an unreadable --current file); 3 the
session is in use (another writer holds its lock: the writing commands repair, recover and
convert take it, like every store). Errors are one line on stderr naming the file, the line and
its byte offset.

Read-only commands (inspect, verify, reduce, plan, and repair/recover with --dry-run) never
modify the session and take no writer lock: for the built-in file backends they read the bytes
with a read-only descriptor; any other backend is read through its own `read()` and closed,
never truncated or appended to.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import orjson

from . import opening
from .backends.jsonl_file import read_session_file, remove_stale_temporaries, temporary_path
from .core.commit import CommitPipeline
from .core.errors import (
    CorruptionError,
    SessionExistsError,
    SessionLockedError,
    SessionLogError,
    SessionNotFoundError,
    SessionPathError,
    StorePoisonedError,
    UnknownBackendError,
    ValidationError,
)
from .core.framing import lines, parse_line
from .core.loading import check_torn_tail, reduce_bytes
from .core.planner import plan_recovery
from .core.state import SessionState
from .core.store import reduce_stored
from .maintenance import link_into_place, quarantine, sync_file
from .plugins.registry import Registry, default_registry
from .recovery import Plan, recover, recover_async

PROG = "sessionlog"
EXIT_IN_USE = 3
_CURRENT_LIMIT = 16 << 20  # bytes: a current configuration is a few kilobytes
_LARGE = 32 << 20  # bytes: from here on, work on a terminal shows progress
_CHUNK_BYTES = 4 << 20
_CHUNK_LINES = 1024
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}").fullmatch

BLOCKED = {
    "configuration_changed": "the configuration differs from the one the step or the pending tool was "
    "started with",
    "environment_changed": "the environment identity differs from the pending tool's",
    "replay_declaration_changed": "a pending safe tool is no longer declared safe with the same replay key",
    "attempts_exhausted": "attempt 2 is open: its answer is unknown and there is no attempt 3",
}


class UsageError(Exception):
    """Bad input from the command line (exit 2)."""


class Mismatch(SessionLogError):
    """A converted session does not reduce to the state of its source (exit 1)."""


# -- output ------------------------------------------------------------------------------------


def _dumps(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
    except TypeError:  # integers beyond 64 bits (tool arguments may hold them)
        return json.dumps(value, indent=2, ensure_ascii=False)


def _out(text: str = "") -> None:
    """A line for people: control and format characters (terminal escapes, bidi overrides) that
    a model or a file put in a session are shown escaped, never executed by the terminal."""
    sys.stdout.write(_escaped(text) + "\n")


def _out_json(value: Any) -> None:
    """JSON for programs (its encoder escapes what JSON must)."""
    sys.stdout.write(_dumps(value) + "\n")


def _escaped(text: str) -> str:
    if text.isprintable():
        return text
    return "".join(
        char
        if char.isprintable() or char == "\n"
        else f"\\x{ord(char):02x}"
        if ord(char) < 0x100
        else f"\\u{ord(char):04x}"
        for char in text
    )


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _error(command: str, message: str) -> None:
    sys.stderr.write(f"{PROG} {command}: {_escaped(_one_line(message))}\n")


def _compact(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class Progress:
    """Progress of a long operation on stderr: a rich bar when rich is installed, else plain
    text. Shown with `--progress always`, or by default for large work on a terminal."""

    def __init__(self, mode: str, label: str, total: int) -> None:
        self.total = max(total, 1)
        self.label = label
        self._shown = -1
        self._bar: Any = None
        self._task: Any = None
        self.enabled = mode == "always" or (mode == "auto" and total >= _LARGE and sys.stderr.isatty())
        if not self.enabled or not sys.stderr.isatty():  # plain lines into a pipe or a log file
            return
        try:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn
        except ImportError:
            return
        self._bar = Progress(
            "{task.description}",
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task(label, total=self.total)

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=done)
            return
        percent = done * 100 // self.total
        step = 1 if sys.stderr.isatty() else 10
        if percent // step != self._shown // step:
            self._shown = percent
            end = "\r" if sys.stderr.isatty() else "\n"
            sys.stderr.write(f"{self.label}: {percent}%{end}")
            sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.stop()
        elif sys.stderr.isatty():
            sys.stderr.write("\n")
        self.enabled = False


@contextlib.contextmanager
def _status(mode: str, label: str, size: int) -> Iterator[None]:
    """An indicator for work that reports no fraction done (reducing a large log)."""
    shown = mode == "always" or (mode == "auto" and size >= _LARGE and sys.stderr.isatty())
    if not shown:
        yield
        return
    try:
        if not sys.stderr.isatty():
            raise ImportError("plain lines into a pipe or a log file")
        from rich.console import Console
    except ImportError:
        started = time.monotonic()
        sys.stderr.write(f"{label} ({size:,} bytes)...\n")
        yield
        sys.stderr.write(f"{label}: done in {time.monotonic() - started:.1f} s\n")
        return
    with Console(stderr=True).status(f"{label} ({size:,} bytes)"):
        yield


# -- reading a session -------------------------------------------------------------------------


def read_session(path: str, backend: str, registry: Registry) -> bytes:
    """The stored bytes of a session, read-only: the file itself for the built-in file backends,
    otherwise the backend's own read path (opened, read, closed; never truncated)."""
    info = registry.info(backend)
    if info.plain_file:  # the session is the file: read it directly, without opening a writer
        return read_session_file(path)
    factory = registry.factory(backend)
    if info.api == "sync":
        opened = factory(Path(path), create=None)
        try:
            return bytes(opened.read())
        finally:
            opened.close()

    async def read_async() -> bytes:
        opened = await factory(Path(path), create=None)
        try:
            return bytes(await opened.read())
        finally:
            await opened.close()

    return asyncio.run(read_async())


def _power(registry: Registry, backend: str) -> dict[str, Any]:
    """How the backend reads its log: in the power class a NUL-bearing last write is torn."""
    return registry.info(backend).nul_rule()


def _reduce(path: str, data: bytes, mode: str, power: dict[str, Any]) -> SessionState:
    """As the store reads it: in the power class a NUL-bearing last write is torn, not corrupt."""
    with _status(mode, f"reducing {path}", len(data)):
        return reduce_bytes(data, path=path, **power)


def load_session(path: str, backend: str, registry: Registry, mode: str) -> tuple[bytes, SessionState]:
    """The stored bytes of a session and their state, read-only, as a store of `backend` reads them."""
    data = read_session(path, backend, registry)
    return data, _reduce(path, data, mode, _power(registry, backend))


def _counts(data: bytes, end: int, mode: str, path: str) -> dict[str, Any]:
    """What the committed lines hold, by kind, entry role and record type (of a reduced log)."""
    kinds: Counter[str] = Counter()
    entries: Counter[str] = Counter()
    records: Counter[str] = Counter()
    progress = Progress(mode, f"counting {path}", end)
    numbered = lines(data, end)
    next(numbered)  # the header
    transactions = 0
    try:
        for number, offset, raw in numbered:
            transactions += 1
            value = parse_line(raw, number, offset)
            for fact in value if type(value) is list else [value]:
                kind = fact["kind"]
                kinds[kind] += 1
                if kind == "entry":
                    entry = fact["entry"]
                    entries[entry["message"]["role"] if entry["type"] == "message" else "compaction"] += 1
                elif kind == "record":
                    records[fact["record"]["type"]] += 1
            if not number & 0xFFF:
                progress.update(offset)
    finally:
        progress.close()
    return {
        "lines": transactions + 1,
        "transactions": transactions,
        "facts": sum(kinds.values()),
        "entries": kinds["entry"],
        "records": kinds["record"],
        "usage": kinds["usage"],
        "entryKinds": dict(sorted(entries.items())),
        "recordTypes": dict(sorted(records.items())),
    }


# -- the current configuration -----------------------------------------------------------------


def _current_problem(value: Any) -> str | None:
    if type(value) is not dict:
        return "not a JSON object"
    keys = {"configurationDigest", "environmentIdentity", "tools"}
    if value.keys() != keys:
        missing, extra = sorted(keys - value.keys()), sorted(value.keys() - keys)
        return f"needs exactly the keys {sorted(keys)} (missing {missing}, unknown {extra})"
    if type(value["configurationDigest"]) is not str or not _DIGEST(value["configurationDigest"]):
        return "configurationDigest is not sha256:<64 hex>"
    if type(value["environmentIdentity"]) is not str or not value["environmentIdentity"]:
        return "environmentIdentity is not a non-empty string"
    if type(value["tools"]) is not list:
        return "tools is not an array"
    tool_keys = {"name", "definitionDigest", "replay", "replayKey"}
    for index, tool in enumerate(value["tools"]):
        if type(tool) is not dict or tool.keys() != tool_keys:
            return f"tools[{index}] needs exactly the keys {sorted(tool_keys)}"
        if type(tool["name"]) is not str or not tool["name"]:
            return f"tools[{index}].name is not a non-empty string"
        if type(tool["definitionDigest"]) is not str or not _DIGEST(tool["definitionDigest"]):
            return f"tools[{index}].definitionDigest is not sha256:<64 hex>"
        if tool["replay"] not in ("safe", "never"):
            return f"tools[{index}].replay is not safe or never"
        if type(tool["replayKey"]) is not str or not tool["replayKey"]:
            return f"tools[{index}].replayKey is not a non-empty string"
    return None


def load_current(path: str) -> dict[str, Any]:
    """The current-configuration JSON file the planner needs (its schema, checked)."""
    try:
        text = read_session_file(path, limit=_CURRENT_LIMIT).decode("utf-8")
    except SessionPathError as error:
        raise UsageError(f"--current {path}: cannot read it: {error.strerror}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"--current {path}: cannot read it: {error}") from None
    try:
        value = json.loads(text)
    except ValueError as error:
        raise UsageError(f"--current {path}: not JSON: {error}") from None
    problem = _current_problem(value)
    if problem is not None:
        raise UsageError(f"--current {path}: not a current configuration: {problem}")
    return value  # type: ignore[no-any-return]


# -- describing ------------------------------------------------------------------------------


def describe_plan(plan: Mapping[str, Any], *, idle: bool = False) -> str:
    """One line for a plan, for people."""
    kind = plan["type"]
    if kind == "finish":
        if idle:
            return "nothing to do: the session is idle"
        text = f"finish {plan['outcome']}"
        if "completion" in plan:
            text += f" ({plan['completion']})"
        if "finalEntryId" in plan:
            text += f", final entry {plan['finalEntryId']}"
        if "error" in plan:
            text += f", error {plan['error'].get('code')}: {plan['error'].get('message')}"
        return text
    if kind == "startStep":
        text = (
            f"startStep attempt {plan['attempt']} ({plan['stepKind']}), "
            f"context through {plan['contextThroughEntryId']}"
        )
        if "stepId" in plan:
            text += f", step {plan['stepId']}"
        return text + ": the caller makes the model request"
    if kind == "startTool":
        text = (
            f"startTool {plan['mode']} {plan['toolName']} (call {plan['toolIndex']}) "
            f"{_compact(plan['arguments'])}"
        )
        if plan["mode"] == "replay":
            text += f", intent {plan['toolStartedId']}: the caller runs the safe read again"
        else:
            text += ": the caller writes the intent, then runs the tool"
        return text
    if kind == "appendSynthetic":
        parts = [
            f"{result['reason']} {result['toolName']} (call {result['toolIndex']})"
            for result in plan["results"]
        ]
        return "appendSynthetic " + ", ".join(parts)
    if kind == "closeAttempt":
        return f"closeAttempt: {plan['error'].get('code')}: {plan['error'].get('message')}"
    if kind == "blocked":
        return f"blocked: {plan['reason']} ({BLOCKED.get(plan['reason'], 'needs a human')})"
    return _compact(plan)


def _seqs(committed: Sequence[Mapping[str, Any]]) -> str:
    first, last = committed[0]["seq"], committed[-1]["seq"]
    return f"seq {first}" if first == last else f"seq {first}-{last}"


def _created(ms: int) -> str:
    try:
        return (
            datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        )
    except (OverflowError, OSError, ValueError):
        return str(ms)


def _counter_text(counter: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in counter.items())


# -- commands ----------------------------------------------------------------------------------


def cmd_backends(args: argparse.Namespace, registry: Registry) -> int:
    rows = [
        {"name": info.name, "api": info.api, "durability": info.durability, "description": info.description}
        for info in (registry[name] for name in registry)
    ]
    if args.json:
        _out_json(rows)
        return 0
    width = max((len(row["name"]) for row in rows), default=4)
    for row in rows:
        _out(f"{row['name']:<{width}}  {row['api']:<5}  {row['durability']:<7}  {row['description']}")
    return 0


def cmd_inspect(args: argparse.Namespace, registry: Registry) -> int:
    data = read_session(args.file, args.backend, registry)
    try:
        state = _reduce(args.file, data, args.progress, _power(registry, args.backend))
    except CorruptionError as error:
        if args.json:
            failed = {"path": args.file, "backend": args.backend, "ok": False, "error": error.to_json()}
            failed["error"]["offset"] = error.offset
            _out_json(failed)
        raise
    end = state.repaired_length
    counts = _counts(data, end, args.progress, args.file)
    report = {
        "path": args.file,
        "backend": args.backend,
        "ok": True,
        "header": state.header,
        "bytes": {"size": len(data), "committed": end, "tornTail": len(data) - end},
        "counts": counts,
        "lastSeq": state.last_seq,
        "transcriptMessages": len(state.transcript),
        "activeContextMessages": len(state.active_context),
        "operation": state.operation,
        "openAttempt": state.open_attempt,
        "pendingIntents": state.pending_tools,
        "usageTotals": state.usage.to_json(),
    }
    if args.json:
        _out_json(report)
        return 0
    header = state.header
    torn = len(data) - end
    _out(f"{args.file} ({args.backend})")
    _out(f"header       id {header['id']}, created {_created(header['createdAt'])}")
    _out(f"             provider {header['provider']}, model {header['model']}")
    _out(f"             cwd {header['cwd']}, environment {header['environmentIdentity']}")
    tail = "no torn tail" if not torn else f"torn tail of {torn:,} bytes after the last LF (uncommitted)"
    _out(
        f"log          {counts['lines']:,} lines (header + {counts['transactions']:,} transactions), "
        f"{end:,} bytes committed, {tail}"
    )
    _out(f"facts        {counts['facts']:,}, last seq {state.last_seq}")
    _out(f"  entries    {counts['entries']:,} ({_counter_text(counts['entryKinds']) or 'none'})")
    _out(f"  records    {counts['records']:,} ({_counter_text(counts['recordTypes']) or 'none'})")
    _out(f"  usage      {counts['usage']:,}")
    _out(
        f"transcript   {report['transcriptMessages']:,} messages, "
        f"active context {report['activeContextMessages']:,}"
    )
    operation = state.operation
    if operation["kind"] == "idle":
        _out("operation    idle")
    else:
        if operation["kind"] == "run":
            what = f"run {operation['operationId']} (input {operation['inputEntryId']})"
        else:
            what = (
                f"compaction {operation['operationId']} (through {operation['inputThroughEntryId']}, "
                f"result {operation['resultEntryId']})"
            )
        abort = ", abort requested" if operation["abortRequested"] else ""
        _out(f"operation    {what}{abort}, unfinished")
        step = state.step
        if step is None:
            _out("step         none yet")
        else:
            if "settledEntryId" in step:
                status = f"settled by {step['settledEntryId']} ({step['stopReason']})"
            else:
                status = step["status"]
            _out(f"step         {step['stepId']} attempt {step['attempt']} {step['stepKind']}: {status}")
    attempt = state.open_attempt
    if attempt is None:
        _out("open attempt none")
    else:
        _out(
            f"open attempt {attempt['attemptId']} (attempt {attempt['attempt']} of step {attempt['stepId']}, "
            f"context through {attempt['contextThroughEntryId']}): "
            "a request may have been sent, its answer is unknown"
        )
    pending = state.pending_tools
    _out(f"pending      {len(pending)} tool intent{'' if len(pending) == 1 else 's'} without a result")
    for tool in pending:
        _out(
            f"  [{tool['toolIndex']}] {tool['toolName']} {tool['toolCallId']} (replay {tool['replay']}, "
            f"{tool['replayKey']}) intent {tool['toolStartedId']}, result {tool['resultEntryId']}, "
            f"arguments {_compact(tool['arguments'])}"
        )
    usage = state.usage.to_json()
    _out("usage        " + ", ".join(f"{key} {value:,}" for key, value in usage.items()))
    return 0


def cmd_verify(args: argparse.Namespace, registry: Registry) -> int:
    data, state = load_session(args.file, args.backend, registry, args.progress)
    end = state.repaired_length
    check_torn_tail(data, end, path=args.file)  # a damaged LF is no torn tail: a store refuses it
    count = data.count(b"\n", 0, end)
    notes = [f"{count:,} lines", f"last seq {state.last_seq}", f"{end:,} bytes committed"]
    if len(data) > end:
        notes.append(
            f"torn tail of {len(data) - end:,} bytes after the last LF (uncommitted; repair drops it)"
        )
    if not state.is_idle:
        notes.append(f"{state.operation['kind']} unfinished (see: {PROG} plan)")
    _out(f"{args.file}: valid ({'; '.join(notes)})")
    return 0


def cmd_reduce(args: argparse.Namespace, registry: Registry) -> int:
    data = read_session(args.file, args.backend, registry)
    try:
        state = _reduce(args.file, data, args.progress, _power(registry, args.backend))
    except CorruptionError as error:
        _out_json({"ok": False, "error": error.to_json()})
        raise
    _out_json({"ok": True, "state": state.to_json()})
    return 0


def cmd_plan(args: argparse.Namespace, registry: Registry) -> int:
    current = load_current(args.current)
    state = load_session(args.file, args.backend, registry, args.progress)[1]
    _out_json(plan_recovery(state, current))
    return 0


def cmd_repair(args: argparse.Namespace, registry: Registry) -> int:
    if args.quarantine:
        return _quarantine(args, registry)
    data, state = load_session(
        args.file, args.backend, registry, args.progress
    )  # refuses corruption: nothing is touched
    end = state.repaired_length
    torn = len(data) - end
    if not torn:
        _out(f"{args.file}: no torn tail, nothing to repair ({end:,} bytes, last seq {state.last_seq})")
        return 0
    if args.dry_run:
        _out(
            f"{args.file}: would drop a torn tail of {torn:,} bytes "
            f"(keeping {end:,} bytes, last seq {state.last_seq})"
        )
        return 0
    # Opening a store for writing is the repair, under the writer lock: it reads and reduces again
    # and truncates the torn tail it finds then (the bytes counted above may have changed since).
    if registry.info(args.backend).api == "sync":
        with opening.open(args.file, args.backend, registry=registry) as store:
            dropped, kept = store.torn_bytes, store.load()
    else:

        async def repair_async() -> tuple[int, SessionState]:
            async with await opening.open_async(args.file, args.backend, registry=registry) as store:
                return store.torn_bytes, await store.load()

        dropped, kept = asyncio.run(repair_async())
    _out(
        f"{args.file}: dropped a torn tail of {dropped:,} bytes "
        f"(now {kept.repaired_length:,} bytes, last seq {kept.last_seq})"
    )
    return 0


def _quarantine(args: argparse.Namespace, registry: Registry) -> int:
    info = registry.info(args.backend)
    if not info.plain_file:
        raise UsageError(f"--quarantine works on a session file; backend {args.backend!r} stores elsewhere")
    report = quarantine(Path(args.file), info.nul_rule(), dry_run=args.dry_run)
    if report is None:
        _out(f"{args.file}: valid, nothing to quarantine")
        return 0
    seqs = "no readable seq" if report.seqs is None else f"seq {report.seqs[0]}-{report.seqs[1]}"
    verb = "would move" if args.dry_run else "moved"
    _out(
        f"{args.file}: {verb} {report.lines:,} line{'s' if report.lines != 1 else ''} from line "
        f"{report.first_line} ({seqs}, {report.moved_bytes:,} bytes from byte offset {report.offset:,}) "
        f"into {report.side_file}; the first bad one: {report.error}"
    )
    if not args.dry_run:
        _out(f"{args.file}: opens again with {report.offset:,} bytes")
    return 0


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


def cmd_recover(args: argparse.Namespace, registry: Registry) -> int:
    current = load_current(args.current)
    done: list[dict[str, Any]] = []
    verb = "would commit" if args.dry_run else "committed"

    def on_commit(plan: Plan, committed: list[dict[str, Any]]) -> None:
        done.append({"plan": plan, "facts": committed})
        if not args.json:
            _out(f"{verb} {_seqs(committed)}: {describe_plan(plan)}")

    idle = False
    try:
        if args.dry_run:
            data = read_session(args.file, args.backend, registry)
            store = MemoryStore(data, args.file, power=_power(registry, args.backend))
            plan = recover(store, current, on_commit=on_commit)
            idle = store.load().is_idle
        elif registry.info(args.backend).api == "sync":
            with opening.open(args.file, args.backend, registry=registry) as sync_store:
                plan = recover(sync_store, current, on_commit=on_commit)
                idle = sync_store.load().is_idle
        else:

            async def recover_in_loop() -> tuple[Plan, bool]:
                async with await opening.open_async(
                    args.file, args.backend, registry=registry
                ) as async_store:
                    left = await recover_async(async_store, current, on_commit=on_commit)
                    return left, (await async_store.load()).is_idle

            plan, idle = asyncio.run(recover_in_loop())
    except ValidationError as error:
        _error(
            "recover",
            f"{args.file}: line {error.line}: the reducer refused the transaction recovery planned, "
            f"nothing of it was written ({len(done)} earlier ones were): {error}",
        )
        return 1
    if args.json:
        _out_json({"dryRun": args.dry_run, "committed": done, "plan": plan})
        return 0
    if not done:
        _out(f"{'would commit' if args.dry_run else 'committed'} nothing")
    _out(f"plan left: {describe_plan(plan, idle=idle)}")
    _out_json(plan)
    return 0


def _chunks(body: list[bytes]) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    size = 0
    for line in body:
        if chunk and (size + len(line) > _CHUNK_BYTES or len(chunk) >= _CHUNK_LINES):
            yield chunk
            chunk, size = [], 0
        chunk.append(line)
        size += len(line)
    if chunk:
        yield chunk


def _write_sync(backend: Any, body: list[bytes], progress: Progress) -> None:
    written = 0
    many = getattr(backend, "append_many", None)  # the file backends write many lines at once
    for chunk in _chunks(body):
        if many is not None:
            many(chunk)
        else:
            for line in chunk:
                backend.append(line)
        written += sum(len(line) for line in chunk)
        progress.update(written)


async def _write_async(backend: Any, body: list[bytes], progress: Progress) -> None:
    written = 0
    for chunk in _chunks(body):
        await backend.append_batch(chunk)
        written += sum(len(line) for line in chunk)
        progress.update(written)


def cmd_convert(args: argparse.Namespace, registry: Registry) -> int:
    info = registry.info(args.to)  # an unknown target is a usage error before anything is read
    destination = Path(args.dst)
    if info.plain_file:
        remove_stale_temporaries(destination)  # of a convert killed earlier
        if os.path.lexists(destination):
            raise SessionExistsError(
                errno.EEXIST, f"a session already exists: {destination}", str(destination)
            )
    data, state = load_session(args.src, args.backend, registry, args.progress)  # all valid from here on
    end = state.repaired_length
    header_end = data.index(b"\n") + 1
    body = [data[start : start + len(raw) + 1] for _, start, raw in lines(data, end)][1:]
    # A file target is written under a temporary name and linked into place when complete and
    # synced: a kill leaves no partial copy under the destination's name.
    target = temporary_path(destination, "converting") if info.plain_file else destination
    progress = Progress(args.progress, f"writing {args.dst}", end - header_end)
    try:
        _copy(registry, args.to, target, data[:header_end], body, progress)
        progress.close()
        if info.plain_file:
            sync_file(target)
        converted = load_session(str(target), args.to, registry, args.progress)[1]
        if converted != state:
            raise Mismatch(f"{args.dst}: the converted session does not reduce to the state of {args.src}")
        if info.plain_file:
            link_into_place(target, destination)
    except BaseException:
        progress.close()
        if info.plain_file:
            with contextlib.suppress(OSError):
                target.unlink()
        raise
    torn = len(data) - end
    note = f"; dropped a torn tail of {torn:,} bytes (uncommitted)" if torn else ""
    _out(
        f"converted {args.src} ({args.backend}) -> {args.dst} ({args.to}): "
        f"{len(body):,} transactions, last seq {state.last_seq}, {end:,} bytes{note}"
    )
    return 0


def _copy(
    registry: Registry, backend: str, path: Path, header: bytes, body: list[bytes], progress: Progress
) -> None:
    """Create the session at `path` with the source's header line, then store the source's
    committed lines unchanged: seq, ids and timestamps stay exactly."""
    factory = registry.factory(backend)
    if registry.info(backend).api == "sync":
        opened = factory(path, create=header)
        try:
            _write_sync(opened, body, progress)
        finally:
            opened.close()
        return

    async def copy_async() -> None:
        opened = await factory(path, create=header)
        try:
            await _write_async(opened, body, progress)
        finally:
            await opened.close()

    asyncio.run(copy_async())


# -- the parser --------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {_one_line(message)}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Look into, repair and recover sessionlog sessions (the canonical v2 session contract).",
        epilog="exit status: 0 ok, 1 the session is bad, 2 usage, 3 the session is in use",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help: str, *, file: bool = True) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        if file:
            sub.add_argument("file", metavar="FILE", help="the session")
        return sub

    def common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--backend", default="jsonl", metavar="NAME", help="the backend that stores FILE (default: jsonl)"
        )
        sub.add_argument(
            "--progress",
            choices=("auto", "always", "never"),
            default="auto",
            help="progress on stderr (default: auto, for large sessions on a terminal)",
        )

    sub = command("backends", "list the registered backends", file=False)
    sub.add_argument("--json", action="store_true", help="as JSON")

    sub = command("inspect", "header, counts, operation state, open attempt, pending intents, usage")
    common(sub)
    sub.add_argument("--json", action="store_true", help="as JSON")

    sub = command("verify", "check the whole session against the contract (exit 1 when corrupted)")
    common(sub)

    sub = command("repair", "drop a torn tail (only that: a corrupted session is refused and left as it is)")
    common(sub)
    sub.add_argument("--dry-run", action="store_true", help="say what would be dropped, change nothing")
    sub.add_argument(
        "--quarantine",
        action="store_true",
        help="for a session refused as corrupt: move everything from its first bad line into a side "
        "file next to it (NAME.quarantine.OFFSET, synced), so that it opens again; never a default",
    )

    sub = command(
        "reduce", 'print the reduced state: {"ok": true, "state": ...} or {"ok": false, "error": ...}'
    )
    common(sub)

    sub = command("plan", "print the recovery plan: the one next action")
    common(sub)
    sub.add_argument("--current", required=True, metavar="CONFIG.json", help="the current configuration")

    sub = command("recover", "commit every recovery step that needs no effect; print them and the plan left")
    common(sub)
    sub.add_argument("--current", required=True, metavar="CONFIG.json", help="the current configuration")
    sub.add_argument("--dry-run", action="store_true", help="say what would be committed, write nothing")
    sub.add_argument("--json", action="store_true", help="as JSON")

    sub = commands.add_parser(
        "convert",
        help="copy a session into another backend, every transaction unchanged",
        description="copy a session into another backend, every transaction unchanged",
    )
    sub.add_argument("src", metavar="SRC", help="the session to copy")
    sub.add_argument("dst", metavar="DST", help="the new session (must not exist)")
    sub.add_argument("--to", required=True, metavar="BACKEND", help="the backend of DST")
    common(sub)
    return parser


COMMANDS = {
    "backends": cmd_backends,
    "inspect": cmd_inspect,
    "verify": cmd_verify,
    "repair": cmd_repair,
    "reduce": cmd_reduce,
    "plan": cmd_plan,
    "recover": cmd_recover,
    "convert": cmd_convert,
}
_USAGE_ERRORS = (UsageError, UnknownBackendError, SessionNotFoundError, SessionExistsError, SessionPathError)
_BAD_SESSION = (CorruptionError, ValidationError, Mismatch, StorePoisonedError)


def _message(error: BaseException) -> str:
    if isinstance(error, OSError) and not isinstance(error, SessionLogError) and error.filename:
        return f"{error.filename}: {error.strerror or error}"
    if isinstance(error, OSError) and isinstance(error, SessionLogError) and error.strerror:
        return str(error.strerror)
    return str(error)


def main(argv: Sequence[str] | None = None, *, registry: Registry | None = None) -> int:
    """Run the command line; return the exit status (0 ok, 1 the session is bad, 2 usage, 3 in use)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit:  # --help, or a usage error argparse has reported
        return 0 if exit.code is None else exit.code if isinstance(exit.code, int) else 2
    registry = registry if registry is not None else default_registry()
    try:
        return COMMANDS[args.command](args, registry)
    except _USAGE_ERRORS as error:
        _error(args.command, _message(error))
        return 2
    except _BAD_SESSION as error:
        _error(args.command, _message(error))
        return 1
    except SessionLockedError as error:
        _error(args.command, f"{_message(error)}; nothing was changed (try again when it is closed)")
        return EXIT_IN_USE
    except BrokenPipeError:  # `sessionlog reduce FILE | head`: the reader left, say nothing more
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as error:
        _error(args.command, _message(error))
        return 1


if __name__ == "__main__":
    sys.exit(main())

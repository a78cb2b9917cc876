"""The read-only commands: backends, inspect, verify, reduce."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from typing import Any

from ..core.errors import (
    CorruptionError,
)
from ..core.loading import check_torn_tail, reduce_bytes, valid_prefix
from ..plugins.registry import Registry
from ..recovery import idempotency_key
from ..runtime_reconcile import reconciliation
from .describe import counter_text, created_text
from .output import PROG, compact, out, out_json
from .sessions import (
    count_lines,
    load_session,
    read_session,
    reduce_session,
    stored_by,
)


def cmd_backends(args: argparse.Namespace, registry: Registry) -> int:
    rows = [
        {"name": info.name, "api": info.api, "durability": info.durability, "description": info.description}
        for info in (registry[name] for name in registry)
    ]
    if args.json:
        out_json(rows)
        return 0
    width = max((len(row["name"]) for row in rows), default=4)
    for row in rows:
        out(f"{row['name']:<{width}}  {row['api']:<5}  {row['durability']:<7}  {row['description']}")
    return 0


def cmd_inspect(args: argparse.Namespace, registry: Registry) -> int:
    data, rule = read_session(args.file, args.backend, registry)
    stored = stored_by(args.file, args.backend, registry)
    try:
        state = reduce_session(args.file, data, args.progress, rule, registry)
    except CorruptionError as error:
        prefix = _valid_prefix(data, rule)
        if args.json:
            failed = {"path": args.file, "backend": stored, "ok": False, "error": error.to_json()}
            failed["error"]["offset"] = error.offset
            failed["validPrefix"] = prefix
            out_json(failed)
        elif prefix["bytes"]:
            out(
                f"{args.file}: refused at line {error.line}; the valid prefix is {prefix['bytes']:,} bytes "
                f"(lines 1-{prefix['lines']}, last seq {prefix['lastSeq']}). To set the rest aside and "
                f"open it again: {PROG} repair {args.file} --quarantine"
            )
        else:
            out(f"{args.file}: refused at line {error.line}; not even the header is valid")
        raise
    end = state.repaired_length
    counts = count_lines(data, end, args.progress, args.file)
    report = {
        "path": args.file,
        "backend": stored,
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
        "reconciled": reconciled_calls(state.transcript),
        "usageTotals": state.usage.to_json(),
    }
    if args.json:
        out_json(report)
        return 0
    header = state.header
    torn = len(data) - end
    out(f"{args.file} ({stored})")
    out(f"header       id {header['id']}, created {created_text(header['createdAt'])}")
    out(f"             provider {header['provider']}, model {header['model']}")
    out(f"             cwd {header['cwd']}, environment {header['environmentIdentity']}")
    tail = "no torn tail" if not torn else f"torn tail of {torn:,} bytes after the last LF (uncommitted)"
    out(
        f"log          {counts['lines']:,} lines (header + {counts['transactions']:,} transactions), "
        f"{end:,} bytes committed, {tail}"
    )
    out(f"facts        {counts['facts']:,}, last seq {state.last_seq}")
    out(f"  entries    {counts['entries']:,} ({counter_text(counts['entryKinds']) or 'none'})")
    out(f"  records    {counts['records']:,} ({counter_text(counts['recordTypes']) or 'none'})")
    out(f"  usage      {counts['usage']:,}")
    out(
        f"transcript   {report['transcriptMessages']:,} messages, "
        f"active context {report['activeContextMessages']:,}"
    )
    operation = state.operation
    if operation["kind"] == "idle":
        out("operation    idle")
    else:
        if operation["kind"] == "run":
            what = f"run {operation['operationId']} (input {operation['inputEntryId']})"
        else:
            what = (
                f"compaction {operation['operationId']} (through {operation['inputThroughEntryId']}, "
                f"result {operation['resultEntryId']})"
            )
        abort = ", abort requested" if operation["abortRequested"] else ""
        out(f"operation    {what}{abort}, unfinished")
        step = state.step
        if step is None:
            out("step         none yet")
        else:
            if "settledEntryId" in step:
                status = f"settled by {step['settledEntryId']} ({step['stopReason']})"
            else:
                status = step["status"]
            out(f"step         {step['stepId']} attempt {step['attempt']} {step['stepKind']}: {status}")
    attempt = state.open_attempt
    if attempt is None:
        out("open attempt none")
    else:
        out(
            f"open attempt {attempt['attemptId']} (attempt {attempt['attempt']} of step {attempt['stepId']}, "
            f"context through {attempt['contextThroughEntryId']}): "
            "a request may have been sent, its answer is unknown"
        )
    pending = state.pending_tools
    out(f"pending      {len(pending)} tool intent{'' if len(pending) == 1 else 's'} without a result")
    for tool in pending:
        out(
            f"  [{tool['toolIndex']}] {tool['toolName']} {tool['toolCallId']} (replay {tool['replay']}, "
            f"{tool['replayKey']}) intent {tool['toolStartedId']}, result {tool['resultEntryId']}, "
            f"arguments {shortened(compact(tool['arguments']))}"
        )
        out(f"      idempotency key {idempotency_key(tool['toolStartedId'])}")
    reconciled = report["reconciled"]
    if reconciled:
        ran = sum(1 for call in reconciled if call["decision"] == "ran")
        out(
            f"reconciled   {len(reconciled)} call{'' if len(reconciled) == 1 else 's'} after a crash: "
            f"{ran} had run "
            f"(result from its counterpart), {len(reconciled) - ran} had not (run then, same key)"
        )
        for call in reconciled:
            out(f"  {call['toolName']} {call['toolCallId']}: {call['decision']}")
    usage = state.usage.to_json()
    out("usage        " + ", ".join(f"{key} {value:,}" for key, value in usage.items()))
    return 0


def reconciled_calls(transcript: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The tool results reconciliation decided (`runtime_reconcile`), in log order: the call's
    id, its tool's name and `ran` or `notRun`."""
    names: dict[str, str] = {}
    found = []
    for message in transcript:
        for call in message.get("tool_calls") or []:
            names[call["id"]] = call["function"]["name"]
        decided = reconciliation(message.get("content")) if message["role"] == "tool" else None
        if decided is not None:
            call_id = message["tool_call_id"]
            found.append({"toolCallId": call_id, "toolName": names.get(call_id, "?"), "decision": decided})
    return found


SHOWN_ARGUMENTS = 160  # characters of a pending call's arguments `inspect` shows


def shortened(text: str) -> str:
    """A summary's share of a value that can be megabytes (a file a tool is to write): its start
    and its size, and where it is whole."""
    if len(text) <= SHOWN_ARGUMENTS:
        return text
    size = len(text.encode())
    return f"{text[:SHOWN_ARGUMENTS]}... ({size:,} bytes in all; `{PROG} reduce` shows them whole)"


def cmd_verify(args: argparse.Namespace, registry: Registry) -> int:
    data, state = load_session(args.file, args.backend, registry, args.progress)
    end = state.repaired_length
    check_torn_tail(data, end, state.last_seq + 1, path=args.file)  # a damaged LF: a store refuses it
    count = data.count(b"\n", 0, end)
    notes = [f"{count:,} lines", f"last seq {state.last_seq}", f"{end:,} bytes committed"]
    if len(data) > end:
        notes.append(
            f"torn tail of {len(data) - end:,} bytes after the last LF (uncommitted; repair drops it)"
        )
    if not state.is_idle:
        notes.append(f"{state.operation['kind']} unfinished (see: {PROG} plan)")
    out(f"{args.file}: valid ({'; '.join(notes)})")
    return 0


def cmd_reduce(args: argparse.Namespace, registry: Registry) -> int:
    data, rule = read_session(args.file, args.backend, registry)
    try:
        state = reduce_session(args.file, data, args.progress, rule, registry)
    except CorruptionError as error:
        out_json({"ok": False, "error": error.to_json()})
        raise
    out_json({"ok": True, "state": state.to_json()})
    return 0


def _valid_prefix(data: bytes, rule: dict[str, Any]) -> dict[str, int]:
    """Where a refused log stops being valid: its longest prefix of whole lines that reduces."""
    end = valid_prefix(data, **rule)[0]
    if not end:
        return {"bytes": 0, "lines": 0, "lastSeq": 0}
    return {
        "bytes": end,
        "lines": data.count(b"\n", 0, end),
        "lastSeq": reduce_bytes(data[:end], **rule).last_seq,
    }

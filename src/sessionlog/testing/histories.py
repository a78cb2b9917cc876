"""Histories of operations on a repository, and the checker that judges them (Jepsen's way).

Every worker of `sessionlog.testing.nemesis` appends to its own history file, outside the
repository, one JSON line when it invokes an operation and one when it is told the outcome:
`ok`, `fail` (a typed refusal that says nothing was done) or `unknown` (it may or may not have
happened: the outcome of a commit whose connection died, a store poisoned mid-write). Each line
is one `os.write` to a file opened with O_APPEND, so a SIGKILL never loses a recorded line (the
histories do not claim to survive power loss: nothing here simulates it). The nemesis records
its faults in a history of its own.

A commit's value is a token naming its writer process, its hold (one `open`, `create`, `fork`
or `claim_unfinished` of that process) and a number that grows with every commit the process
invokes: `w2.0:3:17`. After the run, `check` compares the histories with the messages the
repository holds (`contents`: session id -> message texts in order) and names every violation:

* `lost`: an acknowledged commit is missing from its session, and no delete of that session
  may have come after it (one that returned after the commit was invoked).
* `duplicated`: a commit (acknowledged or of unknown outcome) is present more than once.
* `reordered`: a writer's commits are not in the order it made them.
* `refused but present`: a commit refused as not written is there.
* `phantom`: a message no worker ever invoked.
* `interleaved`: the lines of two holds alternate in one session (two writers in one epoch).
* `two live writers`: the acknowledgements of two holds of one session alternate in time.
* `acknowledged after delete`: a commit invoked after a delete of its session returned ok
  was acknowledged.
* `untyped error`: an exception that is not a `SessionLogError` reached a caller.
* `hung`: an operation took longer than `bound` seconds (time its worker spent stopped by the
  nemesis not counted), or never returned although its worker lived.

Lines copied by a fork keep their tokens: a session's lines of commits made to another session
must be a prefix of it (the fork's copy) and are not counted there.
"""

from __future__ import annotations

import os
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

OUTCOMES = ("ok", "fail", "unknown")


class Recorder:
    """One process's history file: `invoke` before an operation, `complete` after it."""

    def __init__(self, path: Path, process: str) -> None:
        self.process = process
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.index = 0

    def record(self, **fields: Any) -> None:
        fields.setdefault("t", time.monotonic_ns())
        os.write(self.fd, orjson.dumps({"p": self.process, **fields}) + b"\n")

    def invoke(self, op: str, session: str | None = None, value: str | None = None) -> int:
        self.index += 1
        self.record(i=self.index, type="invoke", op=op, s=session, v=value)
        return self.index

    def complete(
        self, index: int, outcome: str, *, session: str | None = None, error: BaseException | None = None
    ) -> None:
        fields: dict[str, Any] = {"i": index, "type": outcome}
        if session is not None:
            fields["s"] = session
        if error is not None:
            from ..core.errors import SessionLogError

            fields["err"] = f"{type(error).__module__}.{type(error).__qualname__}"
            fields["typed"] = isinstance(error, SessionLogError)
            fields["msg"] = str(error)[:300]
            if not fields["typed"]:  # where it was raised: the innermost frames
                frames = traceback.extract_tb(error.__traceback__)[-3:]
                fields["where"] = " < ".join(
                    f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames)
                )
        self.record(**fields)


def read_histories(directory: Path) -> list[dict[str, Any]]:
    """Every record of every history file in `directory`; a torn last line (a process killed in
    its write) is dropped, as an operation that was never recorded."""
    records: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_bytes().split(b"\n"):
            if line:
                try:
                    records.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    continue
    return records


class AcknowledgedCount:
    """The commits acknowledged in the workers' history files (`w*.jsonl`), counted on from where
    the last count stopped, up to the last whole line: a harness asks while its workers write."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.count = 0
        self.read: dict[Path, int] = {}  # bytes counted of each file
        self.pending: dict[Path, set[int]] = {}  # commits invoked and not yet told, by file

    def reach(self, needed: int) -> bool:
        """Whether the histories hold `needed` acknowledged commits (read only until they do)."""
        for path in sorted(self.directory.glob("w*.jsonl")):
            pending = self.pending.setdefault(path, set())
            with open(path, "rb") as file:
                file.seek(self.read.get(path, 0))
                for line in file:
                    if self.count >= needed or not line.endswith(b"\n"):
                        break  # a line being written (or torn by a kill) is read again next time
                    self.read[path] = self.read.get(path, 0) + len(line)
                    try:
                        record = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        continue
                    if record.get("type") == "invoke":
                        if record.get("op") == "commit":
                            pending.add(record.get("i"))
                    elif record.get("i") in pending:
                        pending.discard(record.get("i"))
                        if record.get("type") == "ok":
                            self.count += 1
        return self.count >= needed


def token(process: str, hold: int, number: int) -> str:
    return f"{process}:{hold}:{number}"


def parse_token(text: str) -> tuple[str, str, int] | None:
    """(process, hold, number) of a commit's token; None for any other message."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[0].startswith("w") or not parts[2].isdigit():
        return None
    return parts[0], f"{parts[0]}:{parts[1]}", int(parts[2])


@dataclass
class Operation:
    """One invoked operation and what its caller was told (`outcome` None: never told)."""

    process: str
    index: int
    op: str
    session: str | None
    value: str | None
    invoked: int
    outcome: str | None = None
    completed: int | None = None
    error: str | None = None
    typed: bool = True
    message: str = ""


@dataclass
class CheckReport:
    operations: int = 0
    by_op: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # typed failures told to callers, by class
    acknowledged: int = 0  # acknowledged commits checked
    deleted_with_session: int = 0  # acknowledged commits whose session was deleted afterwards
    unknown_present: int = 0
    unknown_absent: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return sum(1 for violation in self.violations if violation.startswith("lost"))

    @property
    def ok(self) -> bool:
        return not self.violations


def operations(records: Iterable[Mapping[str, Any]]) -> list[Operation]:
    """The workers' operations, each invoke paired with its completion (nemesis lines left out)."""
    found: dict[tuple[str, int], Operation] = {}
    for record in records:
        if record.get("type") == "invoke":
            key = (record["p"], record["i"])
            found[key] = Operation(
                record["p"], record["i"], record["op"], record.get("s"), record.get("v"), record["t"]
            )
        elif record.get("type") in OUTCOMES:
            operation = found.get((record["p"], record["i"]))
            if operation is None:
                continue
            operation.outcome = record["type"]
            operation.completed = record["t"]
            operation.session = record.get("s", operation.session)
            operation.error = record.get("err")
            operation.typed = record.get("typed", True)
            operation.message = f"{record.get('msg', '')} at {record['where']}" if "where" in record else ""
    return list(found.values())


def stopped_intervals(records: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[int, int]]]:
    """When the nemesis held each process stopped (SIGSTOP to SIGCONT), in monotonic ns."""
    stops: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for record in records:
        if record.get("type") == "fault" and record.get("fault") == "stop":
            stops[record["target"]].append((record["t"], record["until"]))
    return stops


def check(
    records: Sequence[Mapping[str, Any]],
    contents: Mapping[str, Sequence[str]],
    *,
    bound: float = 30.0,
    alive: Iterable[str] = (),
) -> CheckReport:
    """Judge a run: `records` from `read_histories`, `contents` the repository's sessions at the
    end (id -> message texts), `alive` the processes that lived to the end (an operation of
    theirs never completed hung; one of a killed process just never returned)."""
    report = CheckReport()
    ops = operations(records)
    stops = stopped_intervals(records)
    alive = set(alive)
    for record in records:
        if record.get("type") == "fault":
            report.faults[record["fault"]] += 1
    report.operations = len(ops)
    commits: dict[str, Operation] = {}
    deleted_at: dict[str, int] = {}  # session -> when a delete of it returned ok (earliest)
    # session -> when each delete that may have happened returned (None: killed before it was told)
    deletes: dict[str, list[int | None]] = defaultdict(list)
    killed = {record["target"]: record["t"] for record in records if record.get("fault") == "kill"}
    forks: set[str] = set()  # the sessions a fork was asked of
    for operation in ops:
        report.by_op[operation.op] += 1
        report.outcomes[operation.outcome or "none"] += 1
        if operation.error is not None:
            report.errors[operation.error.rsplit(".", 1)[-1]] += 1
        if not operation.typed:
            report.violations.append(
                f"untyped error: {operation.op} of {operation.process} raised {operation.error}: "
                + operation.message
            )
        if operation.completed is None and operation.process in alive:
            report.violations.append(f"hung: {operation.op} of {operation.process} never returned")
        ended = operation.completed if operation.completed is not None else killed.get(operation.process)
        if ended is not None:  # a call its process was killed in had waited until the kill
            paused = sum(
                max(0, min(end, ended) - max(start, operation.invoked))
                for start, end in stops.get(operation.process, ())
            )
            took = (ended - operation.invoked - paused) / 1e9
            if took > bound:
                report.violations.append(
                    f"hung: {operation.op} of {operation.process} took {took:.1f} s (bound {bound:g} s)"
                )
        if operation.op == "commit" and operation.value is not None:
            commits[operation.value] = operation
        if operation.op == "delete" and operation.session is not None:
            if operation.outcome in ("ok", "unknown", None):  # None: killed before it was told
                deletes[operation.session].append(operation.completed)
            if operation.outcome == "ok" and operation.completed is not None:
                deleted_at[operation.session] = min(
                    deleted_at.get(operation.session, operation.completed), operation.completed
                )

        if operation.op == "fork" and operation.session is not None:
            forks.add(operation.session)

    # What each session holds: its own lines (after any fork's copied prefix).
    placed: dict[str, list[str]] = {}
    copied: dict[str, list[str]] = {}
    for session, texts in contents.items():
        own: list[str] = []
        copy: list[str] = []
        copying = True
        for text in texts:
            parsed = parse_token(text)
            commit = commits.get(text)
            if parsed is None or commit is None:
                report.violations.append(f"phantom: {text!r} in session {session} was never invoked")
                continue
            if commit.session != session:
                if not copying:
                    report.violations.append(
                        f"phantom: {text!r} of session {commit.session} stands in {session} "
                        "after its own lines"
                    )
                else:
                    copy.append(text)
                continue
            copying = False
            own.append(text)
        placed[session] = own
        copied[session] = copy
    for session, copy in copied.items():  # a fork's copy: a prefix of a session a fork was asked of
        if not copy:
            continue
        # a fork of a fork copies its parent's copy too: any session a fork was asked of may be the
        # source; one deleted since cannot be compared, so then the copy is only checked for doubles
        sources = [source for source in forks if source in contents]
        if not any(contents[source][: len(copy)] == copy for source in sources) and all(
            source in contents for source in forks
        ):
            report.violations.append(
                f"phantom: session {session} starts with other sessions' lines, not a prefix of any "
                "session a fork was asked of"
            )
        if len(set(copy)) != len(copy):
            report.violations.append(f"duplicated: session {session}'s copied lines hold one twice")
        for text in copy:
            if commits[text].outcome == "fail":
                report.violations.append(f"refused but present: {text!r} was refused, and a fork copied it")

    for session in deleted_at:
        if session in contents:
            report.violations.append(
                f"deleted but present: session {session} was deleted (ok) and is still there"
            )
    seen: Counter[str] = Counter(text for own in placed.values() for text in own)
    for text, times in seen.items():
        if times > 1:
            report.violations.append(f"duplicated: {text!r} is present {times} times")
    for value, commit in commits.items():
        present = seen[value] > 0
        session = commit.session or ""
        if commit.outcome == "ok":
            report.acknowledged += 1
            gone = deleted_at.get(session)
            if gone is not None and commit.invoked > gone:
                report.violations.append(
                    f"acknowledged after delete: {value!r} was invoked after session {session} was deleted"
                )
            # a delete that may have come after the commit took effect (at any time after it
            # was invoked: its writer may hear of it only after the delete returned)
            could_go = [end for end in deletes.get(session, ()) if end is None or end > commit.invoked]
            if not present:
                if session not in contents and could_go:  # a delete that may have run after it
                    report.deleted_with_session += 1
                else:
                    report.violations.append(
                        f"lost: acknowledged {value!r} is missing from session {session}"
                        + ("" if session in contents else " (gone, by no delete that may have followed it)")
                    )
        elif commit.outcome == "fail" and present:
            report.violations.append(f"refused but present: {value!r} was refused as not written")
        elif commit.outcome in ("unknown", None):  # None: its process was killed before it was told
            if present:
                report.unknown_present += 1
            else:
                report.unknown_absent += 1

    for session, own in placed.items():
        order: dict[str, int] = {}
        holds: list[str] = []
        for text in own:
            parsed = parse_token(text)
            assert parsed is not None
            process, hold, number = parsed
            if number <= order.get(process, -1):
                report.violations.append(
                    f"reordered: {text!r} in session {session} after a later commit of {process}"
                )
            order[process] = max(number, order.get(process, -1))
            if not holds or holds[-1] != hold:
                if hold in holds:
                    report.violations.append(
                        f"interleaved: hold {hold} wrote to session {session} again after hold {holds[-1]}"
                    )
                holds.append(hold)

    # Two live writers: a hold whose commit was *invoked* after a later hold's first commit was
    # acknowledged, and was acknowledged too. (One acknowledged after the other's acknowledgement
    # but invoked before it is no proof: its process may have been stopped between the commit
    # landing and hearing so, and the lines' order, checked above, says which came first.) Which
    # hold is the later one the log says, where it holds lines of both: a hold stopped between
    # its first commit landing and hearing so is first acknowledged after the hold that took its
    # session over, yet came first (CI: a PostgreSQL writer stopped 1.5 s past its 1 s lease).
    # Where the session is gone (deleted) time tells only when one hold's commit landed before
    # any of the other's began; else a violation needs a late commit of each.
    by_hold: dict[str, dict[str, list[Operation]]] = defaultdict(lambda: defaultdict(list))
    for value, commit in commits.items():
        if commit.outcome == "ok" and commit.completed is not None and commit.session is not None:
            parsed = parse_token(value)
            assert parsed is not None
            by_hold[commit.session][parsed[1]].append(commit)
    for session, holds_of in by_hold.items():
        first_ack = {hold: min(c.completed or 0 for c in acked) for hold, acked in holds_of.items()}
        first_line: dict[str, int] = {}
        for index, text in enumerate(placed.get(session, [])):
            parsed = parse_token(text)
            assert parsed is not None
            first_line.setdefault(parsed[1], index)
        log = set(holds_of) <= set(first_line)  # where the session is gone, time must tell
        for hold in holds_of:
            for other in holds_of:
                if other == hold:
                    continue
                # `hold`'s acknowledged commits invoked after `other` was first acknowledged
                late = [c for c in holds_of[hold] if c.invoked > first_ack[other]]
                late_other = [c for c in holds_of[other] if c.invoked > first_ack[hold]]
                if log:
                    later = first_line[other] > first_line[hold]
                elif first_ack[hold] < min(c.invoked for c in holds_of[other]):
                    later = True  # a commit of `hold` landed before any of `other` began
                elif first_ack[other] < min(c.invoked for c in holds_of[hold]):
                    later = False
                else:  # either may have come first (a writer stopped before hearing): proof is
                    # a late commit either way; named once
                    later = hold < other and bool(late_other)
                if later and late:  # `hold` wrote after `other` began
                    report.violations.append(
                        f"two live writers: hold {hold} of session {session} had {late[0].value!r} "
                        f"acknowledged, invoked after hold {other} was first acknowledged"
                    )
    return report

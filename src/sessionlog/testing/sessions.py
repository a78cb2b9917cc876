"""Deterministic random sessions that satisfy the v2 contract, for property tests and benchmarks.

``generate_session(seed, facts)`` plays an agent against a seeded ``random.Random``: accepted
prompts, runs of several steps with parallel tool calls, tool intents with ``safe`` and ``never``
replay, their results, retries via attempt 2, step failures, aborts that leave a mix of pending
and unstarted tools, pre-execution synthetic results, truncated completions, compactions and usage
facts. Facts are built with :mod:`sessionlog.core.facts`; ids are UUIDv7 strings drawn from the
same ``Random``, so one seed always gives the same bytes.

The session stops after exactly ``facts`` facts, wherever that falls: in the middle of a step,
with an attempt open or a tool pending. Every prefix at a line boundary is a valid session.

The generator keeps its own model of what a correct reducer must arrive at (effects only, no
validation), so a session also knows its expected state after every line:
:meth:`GeneratedSession.expected_state`. That model is independent of the reducer's code.

``profile="bulk"`` is for benchmarks: ~500-byte messages, mostly tool-using runs with usage facts,
two compactions (after about a third and two thirds of the facts: a ``compactionStarted`` lists
every message id, it is O(session)), and no per-line expected states. Unlike a mixed session, a
bulk session of n facts is therefore not a prefix of a longer one of the same seed.
``profile="bulk-flat"`` is the same without compactions, to tell the per-fact cost from the
O(session) cost of compacting.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from ..core import facts as build
from ..core.canonical import configuration_digest, source_digest
from ..core.ids import new_id
from ..core.state import copy_json

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = ["PROFILES", "GeneratedSession", "SeededIds", "generate_session", "sessions"]

PROFILES = ("mixed", "bulk", "bulk-flat")

Fact = dict[str, Any]

_EPOCH = 1_710_000_000_000
_MASK_48 = (1 << 48) - 1

# name: (replay, replayKey). Reads are declared safe to replay; effects never are.
_DECLARED = {
    "read": ("safe", "builtin:read:v1"),
    "grep": ("safe", "builtin:grep:v1"),
    "bash": ("never", "builtin:bash:v1"),
    "write": ("never", "builtin:write:v1"),
}
_UNDECLARED = ("browse", "mcp__jira__search")

_PROSE = (
    "The user asked the agent to reconcile last quarter's invoices against the ledger, flag any "
    "duplicates, and draft a short summary for the finance channel. The agent listed the open "
    "items, called the accounting tool twice, and noted that two vendor credits had been applied "
    "to the wrong cost centre in March. "
)
# Text that exercises the encoder: multi-byte UTF-8 of every length, escapes, U+2028, U+0800
# (whose second byte lies in A0..BF, next to the surrogate range).
_PIECES = (
    "read the config",
    "naïve café",
    "日本語のテキスト",
    "emoji 🎉🚀",
    'a "quoted" word',
    "back\\slash and /slash",
    "tab\tand\nnewline",
    "line\u2028separator",
    "\u0800\u0fff\ud7ff\ue000",
    "ok",
    "Ünïcödé",
    "$ ls -la ~/src",
)
_PATHS = ("README.md", "src/app.py", "docs/guide.md", "tests/test_app.py", "données/été.csv")


def _digest_of(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class SeededIds:
    """UUIDv7 strings from a seeded ``Random``: 48-bit ms, version 7, variant 10.

    A 32-bit counter fills the low bits of ``rand_b`` so ids of one source never collide.
    """

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._count = 0

    def __call__(self, ms: int) -> str:
        self._count += 1
        rand_a = self._rng.getrandbits(12)
        rand_b = (self._rng.getrandbits(30) << 32) | (self._count & 0xFFFFFFFF)
        value = ((ms & _MASK_48) << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
        text = f"{value:032x}"
        return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


class _Mark(NamedTuple):
    """What the expected state after one line needs: lengths of the append-only lists, the
    active context object of that moment, usage totals and a copy of the operation."""

    transcript_length: int
    active: list[dict[str, Any]]
    active_length: int
    usage: tuple[int, int, int, int]
    operation: dict[str, Any] | None


@dataclass
class GeneratedSession:
    """A generated session: its header, its committed transactions and what it should reduce to."""

    seed: int
    profile: str
    header: dict[str, Any]
    transactions: list[list[Fact]]
    snapshots: list[dict[str, Any]]
    """The configuration snapshots its steps use; ``snapshots[0]`` is the usual one."""
    tools: dict[str, dict[str, str]]
    """Declared tools: name -> ``{definitionDigest, replay, replayKey}``."""
    _transcript: list[dict[str, Any]] = field(default_factory=list, repr=False)
    _marks: list[_Mark] | None = field(default=None, repr=False)

    # -- bytes -------------------------------------------------------------------------------

    def lines(self) -> list[bytes]:
        """Every line, LF included: the header, then one per transaction (a single fact bare,
        several as an array)."""
        dumps = orjson.dumps
        out = [dumps(self.header) + b"\n"]
        for transaction in self.transactions:
            out.append(dumps(transaction[0] if len(transaction) == 1 else transaction) + b"\n")
        return out

    def to_bytes(self) -> bytes:
        return b"".join(self.lines())

    def line_ends(self) -> list[int]:
        """``line_ends()[n - 1]`` is the byte length of the first ``n`` lines."""
        ends = []
        total = 0
        for line in self.lines():
            total += len(line)
            ends.append(total)
        return ends

    @property
    def line_count(self) -> int:
        return 1 + len(self.transactions)

    @property
    def fact_count(self) -> int:
        return sum(len(transaction) for transaction in self.transactions)

    def prefix(self, lines: int) -> GeneratedSession:
        """The session made of its first ``lines`` lines (1 = the header only)."""
        if not 1 <= lines <= self.line_count:
            raise ValueError(f"a session of {self.line_count} lines has no {lines}-line prefix")
        marks = None if self._marks is None else self._marks[:lines]
        return GeneratedSession(
            self.seed,
            self.profile,
            self.header,
            self.transactions[: lines - 1],
            self.snapshots,
            self.tools,
            self._transcript,
            marks,
        )

    # -- expectations ------------------------------------------------------------------------

    def expected_state(self, line: int | None = None) -> dict[str, Any]:
        """The contract's state object after ``line`` lines (default: all of them), from the
        generator's own model. Not kept for the bulk profile."""
        if self._marks is None:
            raise ValueError(f"profile {self.profile!r} keeps no expected states")
        number = self.line_count if line is None else line
        if not 1 <= number <= self.line_count:
            raise ValueError(f"a session of {self.line_count} lines has no line {number}")
        mark = self._marks[number - 1]
        header = {key: self.header[key] for key in ("id", "createdAt", "cwd", "provider", "model")}
        header["environmentIdentity"] = self.header["environmentIdentity"]
        usage = dict(zip(("input", "output", "cacheRead", "cacheWrite"), mark.usage, strict=True))
        return {
            "header": header,
            "transcript": copy_json(self._transcript[: mark.transcript_length]),
            "activeContext": copy_json(mark.active[: mark.active_length]),
            "usage": usage,
            "operation": copy_json(mark.operation) if mark.operation else {"kind": "idle"},
            "repairedLength": self.line_ends()[number - 1],
        }

    def current_configuration(self, snapshot: int = 0) -> dict[str, Any]:
        """The planner's current configuration matching ``snapshots[snapshot]`` and the header."""
        return {
            "configurationDigest": configuration_digest(self.snapshots[snapshot]),
            "environmentIdentity": self.header["environmentIdentity"],
            "tools": [{"name": name, **declaration} for name, declaration in self.tools.items()],
        }


class _Model:
    """The effects of valid facts on the contract's state (no validation: the reducer's job)."""

    def __init__(self, track: bool) -> None:
        self.transcript: list[dict[str, Any]] = []
        self.active: list[dict[str, Any]] = []
        self.messages: list[tuple[str, dict[str, Any]]] = []  # message entries, in order
        self.usage = [0, 0, 0, 0]
        self.operation: dict[str, Any] | None = None
        self.intents: dict[str, dict[str, Any]] = {}
        self.boundary: str | None = None
        self.marks: list[_Mark] | None = [] if track else None

    def mark(self) -> None:
        if self.marks is None:
            return
        operation = self.operation
        if operation is not None:
            operation = dict(operation)
            if "step" in operation:
                operation["step"] = dict(operation["step"])
            if "toolCalls" in operation:
                operation["toolCalls"] = [dict(tool) for tool in operation["toolCalls"]]
        usage = self.usage
        self.marks.append(
            _Mark(
                len(self.transcript),
                self.active,
                len(self.active),
                (usage[0], usage[1], usage[2], usage[3]),
                operation,
            )
        )

    def apply(self, fact: Fact) -> None:
        kind = fact["kind"]
        if kind == "usage":
            counts = fact["usage"]
            usage = self.usage
            usage[0] += counts["input"]
            usage[1] += counts["output"]
            usage[2] += counts["cacheRead"]
            usage[3] += counts["cacheWrite"]
        elif kind == "entry":
            self._entry(fact["id"], fact["entry"])
        else:
            self._record(fact["id"], fact["record"])

    def _entry(self, fact_id: str, entry: dict[str, Any]) -> None:
        operation = self.operation
        if entry["type"] == "compaction":
            assert operation is not None
            summary = {"role": "user", "content": "[Compacted history]\n" + entry["summary"]}
            self.active = [summary, *(item["message"] for item in entry["retainedTail"])]
            self.boundary = operation["inputThroughEntryId"]
            operation["step"] = {**operation["step"], "status": "settled", "settledEntryId": fact_id}
            return
        message = entry["message"]
        self.transcript.append(message)
        self.active.append(message)
        self.messages.append((fact_id, message))
        self.boundary = fact_id
        if message["role"] == "assistant":
            assert operation is not None
            operation["step"] = {
                **operation["step"],
                "status": "settled",
                "settledEntryId": fact_id,
                "stopReason": entry["stopReason"],
            }
        elif "toolStartedId" in entry:
            self.intents[entry["toolStartedId"]]["status"] = "completed"

    def _record(self, fact_id: str, record: dict[str, Any]) -> None:
        kind = record["type"]
        operation = self.operation
        if kind == "runStarted":
            self.operation = {
                "kind": "run",
                "operationId": record["operationId"],
                "inputEntryId": record["inputEntryId"],
                "toolCalls": [],
                "abortRequested": False,
            }
        elif kind == "compactionStarted":
            self.operation = {
                "kind": "compaction",
                "operationId": record["operationId"],
                "inputThroughEntryId": record["inputThroughEntryId"],
                "resultEntryId": record["resultEntryId"],
                "abortRequested": False,
            }
        elif operation is None:
            raise AssertionError(f"{kind} while idle")
        elif kind == "stepAttempt":
            operation["step"] = {
                "operationId": record["operationId"],
                "stepId": record["stepId"],
                "attemptId": record["attemptId"],
                "attempt": record["attempt"],
                "stepKind": record["stepKind"],
                "status": "attempting",
                "contextThroughEntryId": record["contextThroughEntryId"],
                "configurationSnapshot": record["configurationSnapshot"],
                "configurationDigest": record["configurationDigest"],
            }
        elif kind == "stepFailed":
            operation["step"] = {**operation["step"], "status": "failed"}
        elif kind == "toolStarted":
            tool = {
                "operationId": record["operationId"],
                "toolStartedId": fact_id,
                **{
                    key: record[key]
                    for key in (
                        "stepId",
                        "assistantEntryId",
                        "toolIndex",
                        "toolCallId",
                        "toolName",
                        "arguments",
                        "replay",
                        "replayKey",
                        "environmentIdentity",
                        "resultEntryId",
                    )
                },
                "status": "pending",
            }
            operation["toolCalls"].append(tool)
            self.intents[fact_id] = tool
        elif kind == "abortRequested":
            operation["abortRequested"] = True
        elif kind == "operationFinished":
            self.operation = None
        else:
            raise AssertionError(f"unknown record {kind}")


class _Full(Exception):
    """The fact budget is spent: the session ends here."""


class _Odds(NamedTuple):
    retry: float  # attempt 1 left open, attempt 2 of the same step
    fail: float  # stepFailed, then operationFinished failed
    abort_model: float  # abort while the attempt is open
    abort_tools: float  # abort after toolUse: some tools done, some pending, some unstarted
    abort_settled: float  # abort after a final answer, before operationFinished
    stop_first: float  # the first step answers without tools
    stop_later: float  # a later step answers without tools
    length: float  # stopped by the token limit with tool calls: truncated
    undeclared: float  # a call to an undeclared tool: unknownTool
    invalid: float  # a call whose arguments do not parse: invalidArguments
    tool_error: float  # a started tool fails
    interrupted: float  # a started `never` tool settled as interrupted (no abort)
    tool_usage: float  # a usage fact for a tool
    compaction: float  # at an idle point
    late_usage: float  # at an idle point: usage of an earlier, finished operation
    split: float  # a multi-fact transaction written as single-fact lines
    alt_snapshot: float  # a step under the other configuration snapshot
    max_calls: int
    max_steps: int


_ODDS = {
    "mixed": _Odds(
        retry=0.12,
        fail=0.05,
        abort_model=0.05,
        abort_tools=0.12,
        abort_settled=0.03,
        stop_first=0.25,
        stop_later=0.45,
        length=0.07,
        undeclared=0.08,
        invalid=0.08,
        tool_error=0.2,
        interrupted=0.15,
        tool_usage=0.3,
        compaction=0.1,
        late_usage=0.05,
        split=0.3,
        alt_snapshot=0.15,
        max_calls=4,
        max_steps=4,
    ),
    "bulk": _Odds(
        retry=0.01,
        fail=0.003,
        abort_model=0.003,
        abort_tools=0.005,
        abort_settled=0.0,
        stop_first=0.1,
        stop_later=0.5,
        length=0.005,
        undeclared=0.01,
        invalid=0.01,
        tool_error=0.1,
        interrupted=0.01,
        tool_usage=0.5,
        compaction=0.0,  # scheduled by fact count instead, see _BULK_COMPACTIONS_AT
        late_usage=0.01,
        split=0.1,
        alt_snapshot=0.0,
        max_calls=3,
        max_steps=3,
    ),
}
_ODDS["bulk-flat"] = _ODDS["bulk"]
# A bulk session compacts twice by default, after about a third and two thirds of its facts
# (`compactions=N` spreads N evenly instead): a compaction names every message so far, so a
# fixed count keeps the session's size linear in its facts.
_BULK_COMPACTIONS = 2


class _Generator:
    def __init__(
        self, seed: int, budget: int, profile: str, text_scale: int = 1, compactions: int = _BULK_COMPACTIONS
    ) -> None:
        if profile not in _ODDS:
            raise ValueError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
        self.seed = seed
        self.profile = profile
        self.rng = random.Random(seed)
        self.bulk = profile.startswith("bulk")
        self.compacts = profile != "bulk-flat"
        self.text_scale = text_scale
        self.odds = _ODDS[profile]
        self.new_id = SeededIds(self.rng)
        self.clock = _EPOCH + self.rng.randrange(10**9)
        self.seq = 0
        self.remaining = budget
        self.transactions: list[list[Fact]] = []
        self.model = _Model(track=not self.bulk)
        self.calls = 0
        self.templates: dict[tuple[int, str, int], Fact] = {}
        self.last_attempt: tuple[str, str] | None = None  # (operation, attempt) for late usage
        self.compaction_points = [budget * (n + 1) // (compactions + 1) for n in range(compactions)]
        environment = f"env-{self.rng.getrandbits(32):08x}"
        model = self.rng.choice(("test/model", "anthropic/claude-sonnet", "openai/gpt-4.1"))
        self.header: dict[str, Any] = {
            "kind": "header",
            "version": 2,
            "id": self.id(),
            "createdAt": self.clock,
            "cwd": self.rng.choice(("/workspace", "/home/dev/projet-été", "/srv/agent")),
            "provider": "openrouter",
            "model": model,
            "environmentIdentity": environment,
        }
        self.tools = {
            name: {"definitionDigest": _digest_of(f"tool:{name}"), "replay": replay, "replayKey": key}
            for name, (replay, key) in _DECLARED.items()
        }
        declared = [
            {"name": name, "definitionDigest": tool["definitionDigest"]} for name, tool in self.tools.items()
        ]
        base = {
            "model": model,
            "systemPromptDigest": _digest_of("system prompt v1"),
            "tools": declared,
            "adapterIdentity": "openrouter:chat-completions:v1",
            "routingIdentity": f"openrouter:{model}",
            "outputOptionsDigest": _digest_of("{}"),
        }
        # The other snapshot declares the same tools (a tool started under one snapshot is then
        # declared under both), with another system prompt.
        self.snapshots = [base, {**base, "systemPromptDigest": _digest_of("system prompt v2")}]

    # -- plumbing ----------------------------------------------------------------------------

    def id(self) -> str:
        return self.new_id(self.clock)

    def emit(self, group: Sequence[Fact]) -> None:
        """Commit a group of facts: one transaction, or (sometimes) one line per fact."""
        if not group:
            return
        if len(group) > 1 and self.rng.random() < self.odds.split:
            for fact in group:
                self._commit([fact])
        else:
            self._commit(group)

    def _commit(self, group: Sequence[Fact]) -> None:
        if self.remaining <= 0:
            raise _Full
        taken = group[: self.remaining]
        rng = self.rng
        transaction = []
        for fact in taken:
            self.clock += rng.choice((0, 0, 1, 1, 2, 7, 40, 900))
            self.seq += 1
            committed = {"kind": fact["kind"], "seq": self.seq, "id": fact["id"], "timestamp": self.clock}
            for key, value in fact.items():
                if key not in committed:
                    committed[key] = value
            self.model.apply(committed)
            transaction.append(committed)
        self.transactions.append(transaction)
        self.model.mark()
        self.remaining -= len(taken)
        if self.remaining <= 0:
            raise _Full

    def text(self, size: int) -> str:
        """About ``size`` characters of text."""
        if self.bulk:
            size *= self.text_scale
            start = self.rng.randrange(len(_PROSE))
            return (_PROSE[start:] + _PROSE * (size // len(_PROSE) + 1))[:size]
        pieces = self.rng.choices(_PIECES, k=max(1, size // 12))
        return " ".join(pieces)

    def counts(self) -> dict[str, int]:
        rng = self.rng
        return {
            "input": rng.randrange(5000),
            "output": rng.randrange(800),
            "cacheRead": rng.choice((0, 0, rng.randrange(4000))),
            "cacheWrite": rng.choice((0, rng.randrange(300))),
        }

    def usage_of_attempt(self, operation_id: str, attempt_id: str) -> Fact:
        return build.usage(operation_id, self.counts(), attempt_id=attempt_id, id=self.id())

    # -- the session -------------------------------------------------------------------------

    def generate(self) -> GeneratedSession:
        self.model.mark()
        try:
            while True:
                self.idle_point()
        except _Full:
            pass
        return GeneratedSession(
            self.seed,
            self.profile,
            self.header,
            self.transactions,
            self.snapshots,
            self.tools,
            self.model.transcript,
            self.model.marks,
        )

    def idle_point(self) -> None:
        rng = self.rng
        odds = self.odds
        if self.last_attempt is not None and rng.random() < odds.late_usage:
            self.emit([self.usage_of_attempt(*self.last_attempt)])
        if (
            self.model.messages
            and self.compacts
            and (self.bulk_compaction_due() or rng.random() < odds.compaction)
        ):
            self.compaction()
        else:
            self.run()

    def bulk_compaction_due(self) -> bool:
        points = self.compaction_points
        if not self.bulk or not points or self.seq < points[0]:
            return False
        del points[0]
        return True

    def snapshot(self) -> dict[str, Any]:
        return self.snapshots[1 if self.rng.random() < self.odds.alt_snapshot else 0]

    def attempt(self, operation_id: str, kind: str) -> tuple[str, str, dict[str, Any]]:
        """Attempt 1 of a new step, sometimes left open and retried as attempt 2."""
        step_kind = "assistant" if kind == "run" else "compaction"
        snapshot = self.snapshot()
        context = self.model.boundary
        assert context is not None
        step_id, attempt_id = self.id(), self.id()
        self.emit([self.step_attempt(operation_id, context, snapshot, step_kind, 1, step_id, attempt_id)])
        if self.rng.random() < self.odds.retry:
            if self.rng.random() < 0.5:  # the lost request was billed
                self.emit([self.usage_of_attempt(operation_id, attempt_id)])
            attempt_id = self.id()
            self.emit([self.step_attempt(operation_id, context, snapshot, step_kind, 2, step_id, attempt_id)])
        self.last_attempt = (operation_id, attempt_id)
        return step_id, attempt_id, snapshot

    def step_attempt(
        self,
        operation_id: str,
        context: str,
        snapshot: dict[str, Any],
        step_kind: str,
        attempt: int,
        step_id: str,
        attempt_id: str,
    ) -> Fact:
        """``facts.step_attempt``, built once per snapshot and kind: its digest is the costly part."""
        key = (id(snapshot), step_kind, attempt)
        template = self.templates.get(key)
        if template is None:
            template = self.templates[key] = build.step_attempt(
                "", "", snapshot, step_kind=step_kind, attempt=attempt, step_id="", attempt_id="", id=""
            )
        record = {
            **template["record"],
            "operationId": operation_id,
            "stepId": step_id,
            "attemptId": attempt_id,
            "contextThroughEntryId": context,
        }
        return {**template, "id": self.id(), "record": record}

    def unsettled_attempt(self, operation_id: str, kind: str, step_id: str, attempt_id: str) -> bool:
        """Maybe end the operation while its attempt is open: failed, or aborted. True if ended."""
        rng = self.rng
        roll = rng.random()
        if roll < self.odds.fail:
            failed = build.step_failed(
                operation_id, step_id, attempt_id, "provider_error", "HTTP 529: overloaded", id=self.id()
            )
            finished = build.operation_finished(
                operation_id,
                kind,
                "failed",
                error={"code": "model_error", "message": "provider request failed"},
                id=self.id(),
            )
            group = [failed, finished]
            if rng.random() < 0.5:
                group.insert(1, self.usage_of_attempt(operation_id, attempt_id))
            self.emit(group)
            return True
        if roll < self.odds.fail + self.odds.abort_model:
            phase = "model" if kind == "run" else "compact"
            self.emit([build.abort_requested(operation_id, kind, phase, id=self.id())])
            closed = build.step_failed(
                operation_id, step_id, attempt_id, "aborted", "Operation aborted", id=self.id()
            )
            self.emit([closed, build.operation_finished(operation_id, kind, "aborted", id=self.id())])
            return True
        return False

    # -- runs --------------------------------------------------------------------------------

    def run(self) -> None:
        user_id, operation_id = self.id(), self.id()
        user = build.user_message(self.text(450 if self.bulk else 40), id=user_id)
        self.emit([user, build.run_started(user_id, operation_id=operation_id, id=self.id())])
        step = 0
        while not self.step(operation_id, step):
            step += 1

    def step(self, operation_id: str, number: int) -> bool:
        """One step of a run; True when the run is over."""
        rng = self.rng
        odds = self.odds
        step_id, attempt_id, snapshot = self.attempt(operation_id, "run")
        if self.unsettled_attempt(operation_id, "run", step_id, attempt_id):
            return True
        stop = odds.stop_first if number == 0 else odds.stop_later
        roll = rng.random()
        if number + 1 >= odds.max_steps or roll < stop:
            answer = build.assistant_message(
                step_id, attempt_id, self.text(400 if self.bulk else 30), id=self.id()
            )
            self.emit([answer, self.usage_of_attempt(operation_id, attempt_id)])
            if rng.random() < odds.abort_settled:
                self.emit([build.abort_requested(operation_id, "run", "model", id=self.id())])
                self.emit([build.operation_finished(operation_id, "run", "aborted", id=self.id())])
            else:
                finished = build.operation_finished(
                    operation_id,
                    "run",
                    "completed",
                    completion="normal",
                    final_entry_id=answer["id"],
                    id=self.id(),
                )
                self.emit([finished])
            return True
        calls = self.tool_calls(snapshot)
        truncated = roll < stop + odds.length
        content = rng.choice((None, "", self.text(150 if self.bulk else 20)))
        assistant = build.assistant_message(
            step_id,
            attempt_id,
            content,
            tool_calls=[call for call, _ in calls],
            stop_reason="length" if truncated else "toolUse",
            id=self.id(),
        )
        group = [assistant]
        if rng.random() < 0.8:
            group.append(self.usage_of_attempt(operation_id, attempt_id))
        self.emit(group)
        if truncated:
            results = [
                build.pre_execution_result(step_id, assistant["id"], index, call, "truncated", id=self.id())
                for index, (call, _) in enumerate(calls)
            ]
            self.emit(results)
            finished = build.operation_finished(
                operation_id,
                "run",
                "completed",
                completion="truncated",
                final_entry_id=assistant["id"],
                id=self.id(),
            )
            self.emit([finished])
            return True
        if rng.random() < odds.abort_tools:
            self.aborted_tools(operation_id, step_id, assistant["id"], calls)
            return True
        self.settle_tools(operation_id, step_id, assistant["id"], calls)
        return False

    def tool_calls(self, snapshot: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
        """(call, plan) pairs; plan is ``start``, ``unknownTool`` or ``invalidArguments``."""
        rng = self.rng
        declared = [tool["name"] for tool in snapshot["tools"]]
        calls = []
        for _ in range(rng.randint(1, self.odds.max_calls)):
            self.calls += 1
            call_id = f"call_{self.calls}_{rng.getrandbits(24):06x}"
            roll = rng.random()
            if roll < self.odds.undeclared:
                name, plan = rng.choice(_UNDECLARED), "unknownTool"
            else:
                name = rng.choice(declared)
                plan = "invalidArguments" if roll < self.odds.undeclared + self.odds.invalid else "start"
            if plan == "invalidArguments":
                arguments = rng.choice(('{"path": "src/ma', "[1, 2]", '"README.md"', "", "null"))
            else:
                arguments = orjson.dumps(self.arguments(name)).decode()
            calls.append((build.tool_call(call_id, name, arguments), plan))
        return calls

    def arguments(self, name: str) -> dict[str, Any]:
        rng = self.rng
        path = rng.choice(_PATHS)
        if name == "bash":
            return {"command": f"wc -l {path}", "timeout": rng.choice((10, 60))}
        if name == "write":
            return {"path": path, "content": self.text(120 if self.bulk else 16)}
        if name == "grep":
            return {"pattern": rng.choice(("TODO", "é+", "^def ")), "path": path}
        return {"path": path}

    def intent(
        self, operation_id: str, step_id: str, assistant_id: str, index: int, call: dict[str, Any]
    ) -> Fact:
        name = call["function"]["name"]
        replay, key = _DECLARED.get(name, ("never", f"mcp:{name}:v1"))
        return build.tool_started(
            operation_id,
            step_id,
            assistant_id,
            index,
            call,
            orjson.loads(call["function"]["arguments"]),
            replay=replay,
            replay_key=key,
            environment_identity=self.header["environmentIdentity"],
            result_entry_id=self.id(),
            id=self.id(),
        )

    def result(self, intent: Fact) -> list[Fact]:
        """The result of a started tool, sometimes with its usage."""
        rng = self.rng
        record = intent["record"]
        if record["replay"] == "never" and rng.random() < self.odds.interrupted:
            facts = [build.interrupted_result(intent)]
        else:
            ok = rng.random() >= self.odds.tool_error
            content = self.text(450 if self.bulk else 24) if ok else "Error: " + self.text(40)
            facts = [build.tool_result(intent, content, ok=ok)]
        if rng.random() < self.odds.tool_usage:
            counts = {
                "input": rng.randrange(100),
                "output": rng.randrange(60),
                "cacheRead": 0,
                "cacheWrite": 0,
            }
            usage = build.usage(record["operationId"], counts, tool_started_id=intent["id"], id=self.id())
            facts.insert(rng.randrange(2), usage)
        return facts

    def settle_tools(
        self, operation_id: str, step_id: str, assistant_id: str, calls: list[tuple[dict[str, Any], str]]
    ) -> None:
        rng = self.rng
        pre: list[Fact] = []
        intents: list[Fact] = []
        for index, (call, plan) in enumerate(calls):
            if plan == "start":
                intents.append(self.intent(operation_id, step_id, assistant_id, index, call))
            else:
                pre.append(build.pre_execution_result(step_id, assistant_id, index, call, plan, id=self.id()))
        if rng.random() < 0.5:  # parallel: every intent durable first, results in any order
            first = intents + pre
            rng.shuffle(first)
            self.emit(first)
            results = [self.result(intent) for intent in intents]
            rng.shuffle(results)
            if rng.random() < 0.5:
                self.emit([fact for facts in results for fact in facts])
            else:
                for facts in results:
                    self.emit(facts)
        else:  # one call after the other, in index order
            by_index = {fact["record"]["toolIndex"]: fact for fact in intents}
            by_index.update((fact["entry"]["toolIndex"], fact) for fact in pre)
            for index in range(len(calls)):
                fact = by_index[index]
                self.emit([fact])
                if fact["kind"] == "record":
                    self.emit(self.result(fact))

    def aborted_tools(
        self, operation_id: str, step_id: str, assistant_id: str, calls: list[tuple[dict[str, Any], str]]
    ) -> None:
        """Escape while tools run: some finished, some pending (started, no result), some never
        started; the abort settles pending ones as interrupted and unstarted ones as aborted."""
        rng = self.rng
        pending: list[tuple[int, Fact]] = []
        unstarted: list[tuple[int, dict[str, Any]]] = []
        for index, (call, plan) in enumerate(calls):
            fate = rng.choice(("done", "pending", "unstarted"))
            if plan != "start":
                if fate == "done":
                    self.emit(
                        [build.pre_execution_result(step_id, assistant_id, index, call, plan, id=self.id())]
                    )
                else:
                    unstarted.append((index, call))
            elif fate == "unstarted":
                unstarted.append((index, call))
            else:
                intent = self.intent(operation_id, step_id, assistant_id, index, call)
                self.emit([intent])
                if fate == "done":
                    self.emit(self.result(intent))
                else:
                    pending.append((index, intent))
        victim = rng.choice(calls)[0]["id"]
        self.emit([build.abort_requested(operation_id, "run", "tool", tool_call_id=victim, id=self.id())])
        settled = [(index, build.interrupted_result(intent)) for index, intent in pending]
        settled += [
            (index, build.pre_execution_result(step_id, assistant_id, index, call, "aborted", id=self.id()))
            for index, call in unstarted
        ]
        settled.sort(key=lambda pair: pair[0])
        if settled:
            self.emit([fact for _, fact in settled])
        self.emit([build.operation_finished(operation_id, "run", "aborted", id=self.id())])

    # -- compactions -------------------------------------------------------------------------

    def compaction(self) -> None:
        rng = self.rng
        messages = self.model.messages
        through = self.model.boundary
        assert through is not None and through == messages[-1][0]
        # The retained tail must be a legal transcript on its own: it may not open with a tool
        # message (its call would be in the compacted part).
        last = len(messages) - 1
        window = range(max(0, last - 12), last + 1) if self.bulk else range(last + 1)
        cuts = [k for k in window if k == last or messages[k + 1][1]["role"] != "tool"]
        cut = rng.choice(cuts)
        operation_id, result_id = self.id(), self.id()
        started = build.compaction_started(
            through,
            [entry_id for entry_id, _ in messages[: cut + 1]],
            [entry_id for entry_id, _ in messages[cut + 1 :]],
            source_digest(messages),
            operation_id=operation_id,
            result_entry_id=result_id,
            id=self.id(),
        )
        tail = list(messages[cut + 1 :])
        self.emit([started])
        step_id, attempt_id, _ = self.attempt(operation_id, "compaction")
        if self.unsettled_attempt(operation_id, "compaction", step_id, attempt_id):
            return
        entry = build.compaction_entry(started, self.text(200 if self.bulk else 30), messages[cut][0], tail)
        group = [entry]
        if rng.random() < 0.7:
            group.append(self.usage_of_attempt(operation_id, attempt_id))
        self.emit(group)
        self.emit(
            [
                build.operation_finished(
                    operation_id, "compaction", "completed", final_entry_id=result_id, id=self.id()
                )
            ]
        )


def generate_session(
    seed: int,
    facts: int = 200,
    *,
    profile: str = "mixed",
    text_scale: int = 1,
    compactions: int | None = None,
) -> GeneratedSession:
    """A valid session of exactly ``facts`` facts, the same for the same arguments.
    ``text_scale`` (bulk profiles only) multiplies the length of every message and argument text:
    4 makes ~2 KB tool results, as a coding agent's file reads and command outputs often are.
    ``compactions`` (``bulk`` only, default 2) spreads that many compactions evenly."""
    if facts < 0:
        raise ValueError(f"facts must be >= 0, got {facts}")
    if type(text_scale) is not int or text_scale < 1:
        raise ValueError(f"text_scale must be a positive integer, got {text_scale!r}")
    if (text_scale != 1 or compactions is not None) and profile != "bulk":
        if text_scale != 1 and profile == "bulk-flat":
            return _Generator(seed, facts, profile, text_scale).generate()
        raise ValueError("text_scale applies to the bulk profiles only, compactions to bulk")
    if compactions is not None and (type(compactions) is not int or compactions < 0):
        raise ValueError(f"compactions must be an integer >= 0, got {compactions!r}")
    return _Generator(
        seed, facts, profile, text_scale, _BULK_COMPACTIONS if compactions is None else compactions
    ).generate()


def sessions(
    *, min_facts: int = 0, max_facts: int = 80, profile: str = "mixed"
) -> SearchStrategy[GeneratedSession]:
    """A hypothesis strategy of generated sessions (hypothesis is imported only when called)."""
    from hypothesis import strategies as st

    return st.builds(
        generate_session,
        st.integers(min_value=0, max_value=2**32 - 1),
        st.integers(min_value=min_facts, max_value=max_facts),
        profile=st.just(profile),
    )


# A configuration snapshot declaring one safe tool, `read`, for `tool_run`.
READ_SNAPSHOT: dict[str, Any] = {
    "model": "m",
    "systemPromptDigest": "sha256:" + "0" * 64,
    "tools": [{"name": "read", "definitionDigest": "sha256:" + "1" * 64}],
    "adapterIdentity": "adapter",
    "routingIdentity": "routing",
    "outputOptionsDigest": "sha256:" + "0" * 64,
}


def tool_run(steps: int, *, result: str = "contents") -> Iterator[list[Fact]]:
    """The transactions of one long run: the prompt, then `steps` steps of one `read` each
    (attempt, answer, intent, result: four transactions a step), the run left open. For the
    benchmarks and tests of costs that must not grow with the run."""
    prompt = build.accept_prompt("read everything")
    yield prompt
    operation, context = prompt[1]["record"]["operationId"], prompt[0]["id"]
    for index in range(steps):
        attempt = build.step_attempt(operation, context, READ_SNAPSHOT, id=new_id())
        step, attempt_id = attempt["record"]["stepId"], attempt["record"]["attemptId"]
        call = build.tool_call(f"call_{index}", "read", '{"path":"a.txt"}')
        answer = build.assistant_message(step, attempt_id, None, tool_calls=[call], id=new_id())
        intent = build.tool_started(
            operation,
            step,
            answer["id"],
            0,
            call,
            {"path": "a.txt"},
            replay="safe",
            replay_key="read:v1",
            environment_identity="env",
            id=new_id(),
        )
        done = build.tool_result(intent, result)
        context = done["id"]
        yield [attempt]
        yield [answer]
        yield [intent]
        yield [done]

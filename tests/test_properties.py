"""Properties of framing, reduction, rollback and planning over generated valid sessions.

The sessions come from `sessionlog.testing.sessions`, whose own model of the state (independent
of the reducer) gives the expected state after every line.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionlog import ContractError, CorruptionError, plan_recovery, reduce_bytes
from sessionlog.core import facts as build
from sessionlog.core.canonical import configuration_digest
from sessionlog.core.loading import load
from sessionlog.core.reducer import SYNTHETIC_CONTENT
from sessionlog.core.state import SessionState
from sessionlog.testing.sessions import GeneratedSession, SeededIds, generate_session, sessions

UUID7 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
SURROGATE = re.compile(rb"\xed[\xa0-\xbf][\x80-\xbf]")

# Every property below builds several sessions per example and reduces many byte strings.
SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

Outcome = tuple[str, Any]


def outcome(data: bytes) -> Outcome:
    """("ok", state) or ("error", (code, line, seq, offset)); any other exception escapes."""
    try:
        return "ok", reduce_bytes(data).to_json()
    except CorruptionError as error:
        return "error", (error.code, error.line, error.seq, error.offset)


def line_start(data: bytes, line: int) -> int:
    """Byte offset where 1-based `line` starts."""
    offset = 0
    for _ in range(line - 1):
        offset = data.index(b"\n", offset) + 1
    return offset


def line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


# -- the generator ---------------------------------------------------------------------------


@settings(SLOW, max_examples=40)
@given(sessions(max_facts=120))
def test_generated_sessions_reduce_to_the_generators_model(session: GeneratedSession) -> None:
    """The first test: every generated session reduces, line by line, to its expected state."""
    data = session.to_bytes()
    ends = session.line_ends()
    assert reduce_bytes(data).to_json() == session.expected_state()
    for line in range(1, session.line_count + 1):
        assert reduce_bytes(data[: ends[line - 1]]).to_json() == session.expected_state(line)


@pytest.mark.parametrize("seed", range(12))
def test_larger_sessions_reduce(seed: int) -> None:
    session = generate_session(seed, 600)
    assert session.fact_count == 600
    assert reduce_bytes(session.to_bytes()).to_json() == session.expected_state()


def test_bulk_sessions_reduce() -> None:
    session = generate_session(7, 6000, profile="bulk")
    data = session.to_bytes()
    state = reduce_bytes(data)
    assert state.last_seq == 6000
    assert state.repaired_length == len(data)
    assert len(data) / 6000 > 400  # ~500-byte messages


def test_text_scale_lengthens_texts_and_keeps_sessions_valid() -> None:
    plain = generate_session(3, 2000, profile="bulk-flat").to_bytes()
    long = generate_session(3, 2000, profile="bulk-flat", text_scale=16).to_bytes()
    assert reduce_bytes(long).last_seq == 2000
    assert len(long) > 3 * len(plain)
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="text_scale"):
            generate_session(3, 10, profile="bulk", text_scale=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bulk profiles only"):
        generate_session(3, 10, text_scale=2)


def test_generation_is_deterministic() -> None:
    for seed in (0, 1, 2**31):
        assert generate_session(seed, 150).to_bytes() == generate_session(seed, 150).to_bytes()
    assert generate_session(1, 150).to_bytes() != generate_session(2, 150).to_bytes()


def test_seeded_ids_are_uuid7_and_distinct() -> None:
    ids = SeededIds(random.Random(5))
    made = [ids(ms) for ms in (0, 1, 2**48 - 1, 1_710_000_000_000) for _ in range(500)]
    assert all(UUID7.fullmatch(value) for value in made)
    assert len(set(made)) == len(made)
    assert made[-1][:13].replace("-", "") == f"{1_710_000_000_000:012x}"


@settings(SLOW, max_examples=30)
@given(sessions(max_facts=200))
def test_generated_facts_are_well_formed(session: GeneratedSession) -> None:
    """seq runs 1..n across lines and arrays, timestamps never go back, every id is a UUIDv7."""
    facts = [fact for transaction in session.transactions for fact in transaction]
    assert [fact["seq"] for fact in facts] == list(range(1, len(facts) + 1))
    stamps = [session.header["createdAt"]] + [fact["timestamp"] for fact in facts]
    assert stamps == sorted(stamps)
    assert all(transaction for transaction in session.transactions)
    ids = [session.header["id"]]
    for fact in facts:
        ids.append(fact["id"])
        stack = [fact.get("entry") or fact.get("record") or fact]
        while stack:
            value = stack.pop()
            for key, item in value.items():
                if key.endswith("Id") and key != "toolCallId":
                    ids.append(item)
                elif key.endswith("EntryIds"):
                    ids.extend(item)
                elif isinstance(item, dict) and key not in ("message", "configurationSnapshot"):
                    stack.append(item)
                elif key == "retainedTail":
                    ids.extend(kept["sourceEntryId"] for kept in item)
    assert all(UUID7.fullmatch(value) for value in ids), [
        value for value in ids if not UUID7.fullmatch(value)
    ]
    lines = session.to_bytes().split(b"\n")
    assert lines[-1] == b"" and all(lines[:-1])


def test_sessions_module_imports_without_hypothesis() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['hypothesis'] = None\n"
        "from sessionlog.testing.sessions import generate_session\n"
        "assert generate_session(1, 20).fact_count == 20"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_generator_covers_every_feature() -> None:
    """The generator must keep producing what the properties rely on."""
    seen: set[str] = set()
    for seed in range(40):
        session = generate_session(seed, 250)
        for transaction in session.transactions:
            seen.add("multi-fact transaction" if len(transaction) > 1 else "single-fact transaction")
            for fact in transaction:
                seen.update(_features(fact))
    wanted = {
        "multi-fact transaction",
        "single-fact transaction",
        "user+runStarted",
        "parallel tool calls",
        "stop:stop",
        "stop:toolUse",
        "stop:length",
        "attempt 2",
        "compaction step",
        "stepFailed",
        "abort:model",
        "abort:tool",
        "abort:compact",
        "replay:safe",
        "replay:never",
        "result:success",
        "result:error",
        "result:interrupted",
        "synthetic:unknownTool",
        "synthetic:invalidArguments",
        "synthetic:truncated",
        "synthetic:aborted",
        "compaction entry",
        "finished:completed",
        "finished:failed",
        "finished:aborted",
        "completion:normal",
        "completion:truncated",
        "usage:attempt",
        "usage:tool",
    }
    assert wanted <= seen, sorted(wanted - seen)


def _features(fact: dict[str, Any]) -> set[str]:
    if fact["kind"] == "usage":
        return {"usage:attempt" if "attemptId" in fact else "usage:tool"}
    if fact["kind"] == "entry":
        entry = fact["entry"]
        if entry["type"] == "compaction":
            return {"compaction entry"}
        features = set()
        if "stopReason" in entry:
            features.add(f"stop:{entry['stopReason']}")
            if len(entry["message"].get("tool_calls", ())) > 1:
                features.add("parallel tool calls")
        if "result" in entry:
            result = entry["result"]
            name = result["type"] if result["type"] != "synthetic" else result["reason"]
            kind = "synthetic" if "toolIndex" in entry else "result"
            features.add(f"{kind}:{name}")
        return features
    record = fact["record"]
    kind = record["type"]
    if kind == "runStarted":
        return {"user+runStarted"}
    if kind == "stepAttempt":
        return {"attempt 2"} if record["attempt"] == 2 else {f"{record['stepKind']} step"}
    if kind == "toolStarted":
        return {f"replay:{record['replay']}"}
    if kind == "abortRequested":
        return {f"abort:{record['phase']}"}
    if kind == "operationFinished":
        return {f"finished:{record['outcome']}", f"completion:{record.get('completion')}"}
    return {kind}


# -- framing: prefixes -----------------------------------------------------------------------


def check_prefixes(session: GeneratedSession, cuts: list[int]) -> None:
    data = session.to_bytes()
    for cut in cuts:
        complete = data.count(b"\n", 0, cut)  # complete lines in data[:cut]
        if complete == 0:
            assert outcome(data[:cut]) == ("error", ("MISSING_HEADER", 1, None, 0)), cut
        else:
            assert outcome(data[:cut]) == ("ok", session.expected_state(complete)), cut


@settings(SLOW, max_examples=6)
@given(sessions(max_facts=8))
def test_every_byte_prefix_reduces_to_its_last_complete_line(session: GeneratedSession) -> None:
    check_prefixes(session, list(range(len(session.to_bytes()) + 1)))


@settings(SLOW, max_examples=12)
@given(sessions(min_facts=10, max_facts=100), st.randoms(use_true_random=False))
def test_sampled_byte_prefixes_reduce_to_their_last_complete_line(
    session: GeneratedSession, rng: random.Random
) -> None:
    ends = session.line_ends()
    size = ends[-1]
    sampled = rng.sample(ends, min(len(ends), 25))
    cuts = [cut for end in sampled for cut in (end - 1, end, end + 1) if 0 <= cut <= size]
    cuts += [rng.randrange(size + 1) for _ in range(50)]
    check_prefixes(session, cuts)


def test_prefix_cut_inside_a_multibyte_character_is_a_torn_tail() -> None:
    session = next(s for seed in range(100) if "é".encode() in (s := generate_session(seed, 30)).to_bytes())
    data = session.to_bytes()
    ends = session.line_ends()
    inside = data.index("é".encode(), ends[0]) + 1  # between the two bytes of é, after line 1
    complete = data.count(b"\n", 0, inside)
    assert outcome(data[:inside]) == ("ok", session.expected_state(complete))


def test_missing_or_empty_header_line() -> None:
    data = generate_session(3, 5).to_bytes()
    assert outcome(b"") == ("error", ("MISSING_HEADER", 1, None, 0))
    assert outcome(b"\n" + data) == ("error", ("MISSING_HEADER", 1, None, 0))
    assert outcome(data[: data.index(b"\n")]) == ("error", ("MISSING_HEADER", 1, None, 0))


# -- determinism -----------------------------------------------------------------------------


@settings(SLOW, max_examples=20)
@given(sessions(max_facts=150))
def test_reduction_is_deterministic(session: GeneratedSession) -> None:
    data = session.to_bytes()
    first = reduce_bytes(data)
    second = reduce_bytes(bytes(data))
    assert first == second
    assert first.to_json() == second.to_json()
    assert orjson.dumps(first.to_json()) == orjson.dumps(second.to_json())
    regenerated = generate_session(session.seed, session.fact_count, profile=session.profile)
    assert reduce_bytes(regenerated.to_bytes()).to_json() == first.to_json()


# -- the planner makes progress --------------------------------------------------------------

ACTIONABLE = {"appendSynthetic", "closeAttempt", "finish", "startStep", "startTool"}
VARIANTS = (
    "same",
    "other-snapshot",
    "changed-model",
    "changed-environment",
    "tools-removed",
    "replay-changed",
)


class Configuration:
    """A current configuration and the snapshot a new attempt 1 would carry under it."""

    def __init__(self, snapshot: dict[str, Any], environment: str, tools: list[dict[str, Any]]) -> None:
        self.snapshot = snapshot
        self.current: dict[str, Any] = {
            "configurationDigest": configuration_digest(snapshot),
            "environmentIdentity": environment,
            "tools": tools,
        }


def configuration(
    session: GeneratedSession, state: SessionState, variant: str, rng: random.Random
) -> Configuration:
    step = state.step
    snapshot = step["configurationSnapshot"] if step else session.snapshots[0]
    environment = session.header["environmentIdentity"]
    tools = session.current_configuration()["tools"]
    if variant == "other-snapshot":
        snapshot = next(other for other in session.snapshots if other != snapshot)
    elif variant == "changed-model":
        snapshot = {**snapshot, "model": "other/model"}
    elif variant == "changed-environment":
        environment = "elsewhere"
    elif variant == "tools-removed":
        removed = set(rng.sample([tool["name"] for tool in tools], rng.randint(1, len(tools))))
        tools = [tool for tool in tools if tool["name"] not in removed]
        snapshot = {**snapshot, "tools": [tool for tool in snapshot["tools"] if tool["name"] not in removed]}
    elif variant == "replay-changed":
        flipped = {"safe": "never", "never": "safe"}
        tools = [
            {**tool, "replay": flipped[tool["replay"]]}
            if rng.random() < 0.5
            else {**tool, "replayKey": tool["replayKey"] + ":v2"}
            for tool in tools
        ]
    return Configuration(snapshot, environment, tools)


class PlanWriter:
    """Translates a plan into the facts that carry it out (a test-local stand-in for the
    production `sessionlog.recovery`)."""

    def __init__(self, rng: random.Random, configuration: Configuration) -> None:
        self.rng = rng
        self.ids = SeededIds(rng)
        self.configuration = configuration
        self.allow_tool_use = True

    def id(self) -> str:
        return self.ids(1_800_000_000_000)

    def facts(self, state: SessionState, plan: dict[str, Any]) -> list[dict[str, Any]]:
        operation = state.operation
        kind, operation_id = operation["kind"], operation["operationId"]
        action = plan["type"]
        if action == "finish":
            finished = build.operation_finished(
                operation_id,
                kind,
                plan["outcome"],
                completion=plan.get("completion"),
                final_entry_id=plan.get("finalEntryId"),
                error=plan.get("error"),
                id=self.id(),
            )
            return [finished]
        step = state.step
        assert step is not None or action == "startStep"
        if action == "closeAttempt":
            assert step is not None
            error = plan["error"]
            return [
                build.step_failed(
                    operation_id,
                    step["stepId"],
                    step["attemptId"],
                    error["code"],
                    error["message"],
                    id=self.id(),
                )
            ]
        if action == "appendSynthetic":
            assert step is not None
            return [self.synthetic(state, step["stepId"], result) for result in plan["results"]]
        if action == "startStep":
            return self.start_step(operation_id, plan, step)
        assert action == "startTool" and step is not None
        return self.start_tool(state, operation_id, step["stepId"], plan)

    def synthetic(self, state: SessionState, step_id: str, result: dict[str, Any]) -> dict[str, Any]:
        reason = result["reason"]
        assert result["content"] == SYNTHETIC_CONTENT[reason]
        if reason == "interrupted":
            intent = next(
                tool for tool in state.tool_calls if tool["toolStartedId"] == result["toolStartedId"]
            )
            assert intent["resultEntryId"] == result["resultEntryId"]
            return build.interrupted_result(intent)
        call = build.tool_call(result["toolCallId"], result["toolName"], "")
        return build.pre_execution_result(
            step_id, result["assistantEntryId"], result["toolIndex"], call, reason, id=self.id()
        )

    def start_step(
        self, operation_id: str, plan: dict[str, Any], step: dict[str, Any] | None
    ) -> list[dict[str, Any]]:
        retry = plan["attempt"] == 2
        assert not retry or (step is not None and plan["stepId"] == step["stepId"])
        snapshot = step["configurationSnapshot"] if retry and step else self.configuration.snapshot
        step_id, attempt_id = plan.get("stepId") or self.id(), self.id()
        attempt = build.step_attempt(
            operation_id,
            plan["contextThroughEntryId"],
            snapshot,
            step_kind=plan["stepKind"],
            attempt=plan["attempt"],
            step_id=step_id,
            attempt_id=attempt_id,
            id=self.id(),
        )
        facts = [attempt]
        settle = self.rng.choice(("open", "stop", "toolUse" if self.allow_tool_use else "stop"))
        if plan["stepKind"] != "assistant" or settle == "open":
            return facts
        if settle == "stop":
            facts.append(build.assistant_message(step_id, attempt_id, "done", id=self.id()))
            return facts
        names = [tool["name"] for tool in snapshot["tools"]] + ["browse"]
        calls = []
        for index in range(self.rng.randint(1, 3)):
            arguments = self.rng.choice(('{"path":"README.md"}', '{"path":', "[]"))
            calls.append(build.tool_call(f"plan_{step_id[-6:]}_{index}", self.rng.choice(names), arguments))
        stop = self.rng.choice(("toolUse", "toolUse", "length"))
        facts.append(
            build.assistant_message(
                step_id, attempt_id, None, tool_calls=calls, stop_reason=stop, id=self.id()
            )
        )
        return facts

    def start_tool(
        self, state: SessionState, operation_id: str, step_id: str, plan: dict[str, Any]
    ) -> list[dict[str, Any]]:
        if plan["mode"] == "replay":
            intent = next(tool for tool in state.tool_calls if tool["toolStartedId"] == plan["toolStartedId"])
            assert intent["arguments"] == plan["arguments"]
            return [build.tool_result(intent, "replayed contents")]
        call = state.settled_calls[plan["toolIndex"]]
        assert call["function"]["name"] == plan["toolName"]
        assert plan["assistantEntryId"] == state.settled_entry_id
        current = self.configuration.current
        declared = next(tool for tool in current["tools"] if tool["name"] == plan["toolName"])
        intent = build.tool_started(
            operation_id,
            step_id,
            plan["assistantEntryId"],
            plan["toolIndex"],
            call,
            plan["arguments"],
            replay=declared["replay"],
            replay_key=declared["replayKey"],
            environment_identity=current["environmentIdentity"],
            result_entry_id=self.id(),
            id=self.id(),
        )
        if self.rng.random() < 0.5:
            return [intent]  # the process dies while the tool runs
        return [intent, build.tool_result(intent, "contents", ok=self.rng.random() < 0.8)]


def commit_line(state: SessionState, facts: list[dict[str, Any]]) -> bytes:
    """One transaction line for `facts`, continuing the state's seq."""
    committed = [
        {"seq": state.last_seq + 1 + index, "timestamp": 1_800_000_000_000, **fact}
        for index, fact in enumerate(facts)
    ]
    return orjson.dumps(committed[0] if len(committed) == 1 else committed) + b"\n"


def drive(session: GeneratedSession, lines: int, variant: str, rng: random.Random) -> list[dict[str, Any]]:
    """Plan and apply from the prefix of `lines` lines until idle or blocked; the plans seen."""
    data = b"".join(session.lines()[:lines])
    state = reduce_bytes(data)
    chosen = configuration(session, state, variant, rng)
    writer = PlanWriter(rng, chosen)
    plans: list[dict[str, Any]] = []
    for round_ in range(60):
        writer.allow_tool_use = round_ < 12
        plan = plan_recovery(state, chosen.current)
        assert not plans or plan != plans[-1], f"the plan did not move: {plan}"
        plans.append(plan)
        if plan["type"] == "blocked" or state.is_idle:
            assert plan["type"] in ACTIONABLE | {"blocked"}
            return plans
        data += commit_line(state, writer.facts(state, plan))
        try:
            state = reduce_bytes(data)
        except CorruptionError as error:
            raise AssertionError(f"applying {plan} was refused: {error}") from error
    raise AssertionError(f"no end after {len(plans)} plans: {plans[-3:]}")


@settings(SLOW, max_examples=60)
@given(
    sessions(min_facts=3, max_facts=90),
    st.sampled_from(VARIANTS),
    st.randoms(use_true_random=False),
    st.data(),
)
def test_planner_progress(
    session: GeneratedSession, variant: str, rng: random.Random, data: st.DataObject
) -> None:
    busy = [
        line
        for line in range(1, session.line_count + 1)
        if session.expected_state(line)["operation"]["kind"] != "idle"
    ]
    lines = data.draw(st.sampled_from(busy) if busy else st.just(session.line_count), label="prefix lines")
    drive(session, lines, variant, rng)


def test_planner_progress_from_every_line_of_some_sessions() -> None:
    seen: set[tuple[str, str]] = set()
    for seed in range(4):
        session = generate_session(seed, 100)
        for lines in range(1, session.line_count + 1):
            variant = VARIANTS[(seed + lines) % len(VARIANTS)]
            for plan in drive(session, lines, variant, random.Random(seed * 1000 + lines)):
                detail = plan.get("reason") or plan.get("outcome") or plan.get("mode") or plan.get("attempt")
                if plan["type"] == "appendSynthetic":
                    detail = plan["results"][0]["reason"]
                seen.add((plan["type"], str(detail)))
    wanted = {
        ("appendSynthetic", reason)
        for reason in ("interrupted", "aborted", "unknownTool", "invalidArguments", "truncated")
    }
    wanted |= {
        ("blocked", reason)
        for reason in (
            "attempts_exhausted",
            "configuration_changed",
            "environment_changed",
            "replay_declaration_changed",
        )
    }
    wanted |= {("finish", outcome) for outcome in ("completed", "aborted", "failed")}
    wanted |= {("startStep", "1"), ("startStep", "2"), ("startTool", "start"), ("startTool", "replay")}
    wanted |= {("closeAttempt", "None")}
    assert wanted <= seen, sorted(wanted - seen)


def _settled_run(
    content: str | None, stop: str, calls: list[dict[str, Any]], snapshot: dict[str, Any]
) -> bytes:
    session = generate_session(0, 0)
    user = build.user_message("hi", id="0190aaaa-0000-7000-8000-000000000001")
    run = build.run_started(
        user["id"],
        operation_id="0190aaaa-0000-7000-8000-000000000002",
        id="0190aaaa-0000-7000-8000-000000000003",
    )
    attempt = build.step_attempt(
        run["record"]["operationId"],
        user["id"],
        snapshot,
        step_id="0190aaaa-0000-7000-8000-000000000004",
        attempt_id="0190aaaa-0000-7000-8000-000000000005",
        id="0190aaaa-0000-7000-8000-000000000006",
    )
    answer = build.assistant_message(
        "0190aaaa-0000-7000-8000-000000000004",
        "0190aaaa-0000-7000-8000-000000000005",
        content,
        tool_calls=calls,
        stop_reason=stop,
        id="0190aaaa-0000-7000-8000-000000000007",
    )
    data = orjson.dumps(session.header) + b"\n"
    seq = 0
    for transaction in ([user, run], [attempt], [answer]):
        committed = [{"seq": (seq := seq + 1), "timestamp": 1, **fact} for fact in transaction]
        data += orjson.dumps(committed[0] if len(committed) == 1 else committed) + b"\n"
    return data


def _apply_plan(data: bytes, current: dict[str, Any], snapshot: dict[str, Any]) -> None:
    state = reduce_bytes(data)
    plan = plan_recovery(state, current)
    writer = PlanWriter(
        random.Random(0), Configuration(snapshot, current["environmentIdentity"], current["tools"])
    )
    reduce_bytes(data + commit_line(state, writer.facts(state, plan)))


GAP = "contract gap (planner rule {rule} vs reducer): "


@pytest.mark.xfail(
    strict=True,
    raises=CorruptionError,
    reason=GAP.format(rule=8) + "a `length` stop without tool calls plans finish completed/normal, which "
    "the reducer refuses (normal needs stopReason stop): INVALID_REFERENCE",
)
def test_gap_length_stop_without_tool_calls() -> None:
    session = generate_session(0, 0)
    _apply_plan(
        _settled_run("partial answer", "length", [], session.snapshots[0]),
        session.current_configuration(),
        session.snapshots[0],
    )


@pytest.mark.xfail(
    strict=True,
    raises=CorruptionError,
    reason=GAP.format(rule=8) + "a `stop` with blank (or null) content plans finish completed/normal, which "
    "the reducer refuses (normal needs non-blank content): INVALID_TRANSCRIPT",
)
def test_gap_blank_final_answer() -> None:
    session = generate_session(0, 0)
    _apply_plan(
        _settled_run(" \u00a0", "stop", [], session.snapshots[0]),
        session.current_configuration(),
        session.snapshots[0],
    )


@pytest.mark.xfail(
    strict=True,
    raises=CorruptionError,
    reason=GAP.format(rule=9) + "a call to a tool declared now but not in the snapshot of the attempt that "
    "produced it plans startTool, whose toolStarted the reducer refuses: INVALID_TRANSITION",
)
def test_gap_tool_declared_now_but_not_in_the_attempt_snapshot() -> None:
    session = generate_session(0, 0)
    snapshot = session.snapshots[0]
    narrow = {**snapshot, "tools": [tool for tool in snapshot["tools"] if tool["name"] != "write"]}
    call = build.tool_call("call_1", "write", '{"path":"a.txt","content":"x"}')
    _apply_plan(_settled_run(None, "toolUse", [call], narrow), session.current_configuration(), snapshot)


# -- single-byte mutations -------------------------------------------------------------------

INTERESTING_BYTES = (
    0x0A,
    0x0D,
    0x00,
    0x20,
    0x22,
    0x2C,
    0x30,
    0x31,
    0x3A,
    0x5C,
    0x5B,
    0x5D,
    0x7B,
    0x7D,
    0x66,
    0x6E,
    0x74,
    0x80,
    0xA0,
    0xBF,
    0xC3,
    0xE0,
    0xED,
    0xF0,
    0xFF,
)


def expected_mutation_error(original: bytes, mutated: bytes, position: int) -> tuple[str, int] | None:
    """The (code, line) the contract forces for a mutation, when it can be told from framing
    alone; None when any outcome on the mutated line or later is possible."""
    end = mutated.rfind(b"\n") + 1
    if end == 0:
        return "MISSING_HEADER", 1
    surrogate = SURROGATE.search(mutated, 0, end)
    if surrogate is not None:
        return "MALFORMED_JSON", line_of(mutated, surrogate.start())
    try:
        mutated[:end].decode("utf-8")
    except UnicodeDecodeError as error:
        return "INVALID_UTF8", line_of(mutated, error.start)
    if mutated[0] == 0x0A:
        return "MISSING_HEADER", 1
    line = line_of(original, position)
    start = line_start(original, line)
    if original[position] == 0x0A:
        # Two lines merged into one: two JSON values with a byte between them are not JSON. The
        # last LF merges nothing: the last line becomes a torn tail.
        return None if position == len(original) - 1 else ("MALFORMED_JSON", line)
    if mutated[position] == 0x0A:
        # The line is cut in two: an empty line, or a proper prefix of an object/array text.
        return ("BLANK_LINE", line) if position == start else ("MALFORMED_JSON", line)
    if mutated[position] == 0x0D and original[position + 1] == 0x0A:
        return "CRLF_NOT_ALLOWED", line
    return None


def check_mutation(session: GeneratedSession, position: int, byte: int) -> None:
    original = session.to_bytes()
    mutated = original[:position] + bytes([byte]) + original[position + 1 :]
    line = line_of(original, position)
    kind, result = outcome(mutated)  # anything but CorruptionError fails the test here
    forced = expected_mutation_error(original, mutated, position)
    if kind == "ok":
        assert forced is None, f"expected {forced}"
        if original[position] == 0x0A:  # the last LF: the last line became a torn tail
            assert result == session.expected_state(session.line_count - 1)
        else:
            assert result["repairedLength"] == len(mutated)
        return
    code, error_line, _seq, offset = result
    if forced is not None:
        assert (code, error_line) == forced
    # The lines before the mutated one are intact, so the error is on it or later (a changed id
    # or message content can break a later reference to it).
    assert error_line >= line or code == "MISSING_HEADER"
    assert offset == line_start(mutated, error_line)
    through = mutated.find(b"\n", offset) + 1
    if code in ("INVALID_UTF8", "MALFORMED_JSON") and SURROGATE.search(mutated, 0, through):
        code = "surrogate"
    if code in ("INVALID_UTF8", "surrogate"):
        # Whole-prefix checks come before the line-by-line ones: the prefix through the bad
        # byte's line fails the same way, whatever the lines before it hold.
        assert outcome(mutated[:through]) == ("error", result)
    elif code != "MISSING_HEADER":
        # Line-by-line reduction: the prefix before the failing line is valid, and the prefix
        # through it fails the same way.
        assert offset == 0 or outcome(mutated[:offset])[0] == "ok"
        assert outcome(mutated[:through]) == ("error", result)


@settings(SLOW, max_examples=400)
@given(sessions(min_facts=0, max_facts=25), st.data())
def test_single_byte_mutation_is_corruption_on_its_line_or_later(
    session: GeneratedSession, data: st.DataObject
) -> None:
    original = session.to_bytes()
    newlines = [index for index, value in enumerate(original) if value == 0x0A]
    position = data.draw(
        st.one_of(
            st.integers(0, len(original) - 1),
            st.sampled_from(newlines),
            st.sampled_from([n - 1 for n in newlines]),
        ),
        label="position",
    )
    byte = data.draw(
        st.one_of(st.sampled_from(INTERESTING_BYTES), st.integers(0, 255)).filter(
            lambda b: b != original[position]
        ),
        label="byte",
    )
    check_mutation(session, position, byte)


def test_mutation_of_every_byte_of_a_small_session() -> None:
    session = generate_session(11, 6)
    original = session.to_bytes()
    rng = random.Random(11)
    for position in range(len(original)):
        for byte in (0x0A, rng.choice(INTERESTING_BYTES), rng.randrange(256)):
            if byte != original[position]:
                check_mutation(session, position, byte)


def test_a_mutation_can_break_a_later_line() -> None:
    """Why the property above says "or later": a changed id keeps its own line valid and breaks
    the line that names it."""
    session = next(s for seed in range(50) if (s := generate_session(seed, 40)).line_count > 6)
    data = session.to_bytes()
    lines = session.lines()
    for number, transaction in enumerate(session.transactions, 2):
        fact_id = transaction[-1]["id"].encode()
        later = b"".join(lines[number:])
        if fact_id in later and transaction[-1]["kind"] == "entry":
            break
    else:
        pytest.skip("no entry named by a later line")
    start = sum(map(len, lines[: number - 1]))
    position = data.index(fact_id, start) + 35  # the last hex digit of the id, on its own line
    flipped = b"0" if data[position : position + 1] != b"0" else b"1"
    kind, result = outcome(data[:position] + flipped + data[position + 1 :])
    assert kind == "error" and result[1] > number, result


# -- rollback --------------------------------------------------------------------------------

CORRUPTIONS: dict[str, Callable[[list[dict[str, Any]], int, list[str]], str]] = {}


def corruption(name: str) -> Callable[[Callable[..., str]], Callable[..., str]]:
    def register(function: Callable[..., str]) -> Callable[..., str]:
        CORRUPTIONS[name] = function
        return function

    return register


@corruption("seq")
def _wrong_seq(transaction: list[dict[str, Any]], index: int, used: list[str]) -> str:
    transaction[index]["seq"] += 1 + index
    return "SEQ_MISMATCH"


@corruption("unknown key")
def _unknown_key(transaction: list[dict[str, Any]], index: int, used: list[str]) -> str:
    transaction[index]["note"] = "not in the contract"
    return "INVALID_FACT"


@corruption("kind")
def _unknown_kind(transaction: list[dict[str, Any]], index: int, used: list[str]) -> str:
    transaction[index]["kind"] = "event"
    return "INVALID_FACT"


@corruption("id")
def _bad_id(transaction: list[dict[str, Any]], index: int, used: list[str]) -> str:
    transaction[index]["id"] = transaction[index]["id"].upper()
    return "INVALID_FACT"


@corruption("duplicate id")
def _duplicate_id(transaction: list[dict[str, Any]], index: int, used: list[str]) -> str:
    earlier = used + [fact["id"] for fact in transaction[:index]]
    if not earlier:
        return _wrong_seq(transaction, index, used)
    transaction[index]["id"] = earlier[-1]
    return "DUPLICATE_ID"


@corruption("trailing bad fact")
def _trailing_fact(transaction: list[dict[str, Any]], index: int, used: list[str]) -> str:
    last = transaction[-1]
    transaction.append(
        {
            "kind": "entry",
            "seq": last["seq"] + 1,
            "id": "0190ffff-0000-7000-8000-000000000001",
            "timestamp": last["timestamp"],
            "entry": {"type": "message", "message": {"role": "system", "content": "be brief"}},
        }
    )
    return "INVALID_FACT"


@settings(SLOW, max_examples=80)
@given(sessions(min_facts=1, max_facts=80), st.data())
def test_rollback_restores_the_state(session: GeneratedSession, data: st.DataObject) -> None:
    lines = session.lines()
    count = data.draw(st.integers(1, len(lines) - 1), label="prefix lines")
    prefix = b"".join(lines[:count])
    reducer, end = load(prefix)
    before = SessionState(reducer, end).to_json()
    following = lines[count]
    bad = orjson.loads(following)
    bad = bad if isinstance(bad, list) else [bad]
    index = data.draw(st.integers(0, len(bad) - 1), label="corrupted fact")
    name = data.draw(st.sampled_from(sorted(CORRUPTIONS)), label="corruption")
    used = [fact["id"] for transaction in session.transactions[: count - 1] for fact in transaction]
    code = CORRUPTIONS[name](bad, index, used)

    mark = reducer.begin()
    with pytest.raises(ContractError) as raised:
        reducer.apply(bad, count + 1)
    assert raised.value.code == code
    reducer.rollback(mark)
    assert SessionState(reducer, end).to_json() == before

    # The journal undid everything: the valid transaction applies, and so does the rest.
    mark = reducer.begin()
    reducer.apply(orjson.loads(following), count + 1)
    through = prefix + following
    assert SessionState(reducer, len(through)).to_json() == reduce_bytes(through).to_json()
    reducer.release()
    for number in range(count + 1, len(lines)):
        reducer.apply(orjson.loads(lines[number]), number + 1)
    whole = session.to_bytes()
    assert SessionState(reducer, len(whole)).to_json() == reduce_bytes(whole).to_json()


@settings(SLOW, max_examples=30)
@given(sessions(min_facts=3, max_facts=60), st.data())
def test_nested_rollback_marks(session: GeneratedSession, data: st.DataObject) -> None:
    """Two transactions in flight: undoing the second keeps the first; undoing the first too
    returns to the start."""
    lines = session.lines()
    if len(lines) < 3:
        return
    count = data.draw(st.integers(1, len(lines) - 2), label="prefix lines")
    prefix = b"".join(lines[:count])
    reducer, end = load(prefix)
    before = SessionState(reducer, end).to_json()
    first = reducer.begin()
    reducer.apply(orjson.loads(lines[count]), count + 1)
    middle_end = end + len(lines[count])
    middle = SessionState(reducer, middle_end).to_json()
    second = reducer.begin()
    reducer.apply(orjson.loads(lines[count + 1]), count + 2)
    reducer.rollback(second)
    assert SessionState(reducer, middle_end).to_json() == middle
    reducer.rollback(first)
    assert SessionState(reducer, end).to_json() == before
    with pytest.raises(RuntimeError):
        reducer.rollback(0)

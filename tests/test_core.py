"""Core behaviour the shared fixtures do not pin down: framing edges, errors, canonical JSON, the
commit pipeline's atomicity, the planner's corner rules."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

import sessionlog
from conftest import SNAPSHOT
from sessionlog.core import facts as F
from sessionlog.core.canonical import canonical
from sessionlog.core.commit import CommitPipeline, encode_header
from sessionlog.core.framing import SECTOR
from sessionlog.core.loading import load
from sessionlog.core.reducer import SYNTHETIC_CONTENT
from sessionlog.core.state import SessionState

HEADER = encode_header(cwd="/w", provider="p", model="m", environment_identity="env")


class Session:
    """A pipeline on bytes in memory: commit like a store, keep the bytes."""

    def __init__(self) -> None:
        reducer, end = load(HEADER)
        self.pipeline = CommitPipeline(reducer, end, 1)
        self.data = HEADER

    def commit(self, facts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        prepared = self.pipeline.prepare(facts)
        self.pipeline.acknowledge(prepared)
        self.data += prepared.line
        return prepared.facts

    def state(self) -> SessionState:
        return self.pipeline.state()


def settled_tool_step(session: Session, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """Accept a prompt and settle one assistant step that calls `calls`; return the ids."""
    user, run = session.commit(F.accept_prompt("do it"))
    operation = run["record"]["operationId"]
    attempt = session.commit([F.step_attempt(operation, user["id"], SNAPSHOT)])[0]["record"]
    assistant = session.commit(
        [F.assistant_message(attempt["stepId"], attempt["attemptId"], None, tool_calls=calls)]
    )
    return {"operation": operation, "step": attempt["stepId"], "assistant": assistant[0]["id"]}


CURRENT = {
    "configurationDigest": sessionlog.configuration_digest(SNAPSHOT),
    "environmentIdentity": "env",
    "tools": [
        {"name": "read", "definitionDigest": "sha256:" + "1" * 64, "replay": "safe", "replayKey": "read:v1"},
        {
            "name": "write",
            "definitionDigest": "sha256:" + "2" * 64,
            "replay": "never",
            "replayKey": "write:v1",
        },
    ],
}


# -- framing -----------------------------------------------------------------------------------


def error_of(data: bytes) -> sessionlog.CorruptionError:
    with pytest.raises(sessionlog.CorruptionError) as raised:
        sessionlog.reduce_bytes(data)
    return raised.value


def test_invalid_utf8_names_the_line_and_offset_of_the_bad_byte() -> None:
    session = Session()
    session.commit([F.user_message("fine")])
    data = session.data + b'{"bad":"\xff"}\n'
    error = error_of(data)
    assert (error.code, error.line, error.offset) == ("INVALID_UTF8", 3, len(session.data))


def test_raw_surrogate_bytes_are_malformed_json_at_their_line() -> None:
    data = HEADER + b'"\xed\xa0\x80"\n'
    error = error_of(data)
    assert (error.code, error.line, error.offset) == ("MALFORMED_JSON", 2, len(HEADER))


@pytest.mark.parametrize(
    "line",
    [
        b'{"a":{"b":1,"b":2}}',  # duplicate key, nested
        b'[{"seq":1},{"x":[{"k":1,"k":1}]}]',
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": 1e400}',  # overflows a double
        b'{"a": "\\ud800"}',  # escaped lone surrogate
        b'{"a": 1} x',
        b'{"a": 1',
    ],
)
def test_malformed_lines(line: bytes) -> None:
    assert error_of(HEADER + line + b"\n").code == "MALFORMED_JSON"


def test_blank_and_crlf_lines() -> None:
    assert (error_of(HEADER + b"\n").code, error_of(HEADER + b"\n").line) == ("BLANK_LINE", 2)
    assert error_of(HEADER + b'{"a":1}\r\n').code == "CRLF_NOT_ALLOWED"
    assert error_of(b"\n").code == "MISSING_HEADER"
    assert error_of(HEADER[:-1]).code == "MISSING_HEADER"


def test_non_compact_json_from_another_writer_reduces_the_same() -> None:
    """Spaces, escaped slashes and \\u escapes take the strict path and give the same state."""
    session = Session()
    session.commit([F.user_message("a/b é")])
    header, line = session.data.split(b"\n")[:2]
    value = orjson.loads(line)
    spaced = orjson.dumps(value, option=orjson.OPT_INDENT_2).replace(b"\n", b"")
    escaped = line.replace(b"a/b", b"a\\/b").replace("é".encode(), b"\\u00e9")
    for variant in (spaced, escaped):
        assert (
            sessionlog.reduce_bytes(header + b"\n" + variant + b"\n").transcript == session.state().transcript
        )


def test_big_integers_in_tool_arguments_are_kept_exactly() -> None:
    session = Session()
    call = F.tool_call("c1", "read", "{}")
    ids = settled_tool_step(session, [call])
    big = 2**70
    session.data += (
        orjson.dumps(
            {
                **F.tool_started(
                    ids["operation"],
                    ids["step"],
                    ids["assistant"],
                    0,
                    call,
                    {"n": 1},
                    replay="safe",
                    replay_key="read:v1",
                    environment_identity="env",
                ),
                "seq": 5,
                "timestamp": 1,
            }
        ).replace(b'{"n":1}', str({"n": big}).replace("'", '"').encode())
        + b"\n"
    )
    state = sessionlog.reduce_bytes(session.data)
    assert state.tool_calls[0]["arguments"] == {"n": big}


def test_corruption_error_names_everything() -> None:
    session = Session()
    session.commit([F.user_message("one")])
    bad = session.data + orjson.dumps({**F.user_message("two"), "seq": 9, "timestamp": 1}) + b"\n"
    with pytest.raises(sessionlog.CorruptionError) as raised:
        sessionlog.reduce_bytes(bad, path="/tmp/s.jsonl")
    error = raised.value
    assert (error.code, error.line, error.seq, error.offset, error.path) == (
        "SEQ_MISMATCH",
        3,
        9,
        len(session.data),
        "/tmp/s.jsonl",
    )
    for part in ("SEQ_MISMATCH", "/tmp/s.jsonl", "line 3", f"byte offset {len(session.data)}", "seq 9"):
        assert part in str(error)
    assert isinstance(error, ValueError) and isinstance(error, sessionlog.SessionLogError)


# -- canonical JSON ----------------------------------------------------------------------------


def test_canonical_sorts_keys_by_utf16_code_units() -> None:
    # U+FF61 sorts after U+1F600 by code point but before it by UTF-16 (D83D < FF61).
    value = {"\uff61": 1, "\U0001f600": 2, "a": [True, None, "é"]}
    assert canonical(value) == '{"a":[true,null,"é"],"\U0001f600":2,"\uff61":1}'.encode()
    with pytest.raises(ValueError):
        canonical({"a": 1.5})
    with pytest.raises(ValueError):
        canonical({"a": "\ud800"})
    with pytest.raises(ValueError):
        sessionlog.configuration_digest({"model": 1})


def test_snapshot_key_order_does_not_change_the_digest() -> None:
    reordered = dict(reversed(list(SNAPSHOT.items())))
    assert sessionlog.configuration_digest(reordered) == sessionlog.configuration_digest(SNAPSHOT)


# -- commit pipeline ---------------------------------------------------------------------------


def test_rejected_commit_leaves_state_bytes_and_seq_unchanged() -> None:
    session = Session()
    user, run = session.commit(F.accept_prompt("go"))
    before = session.state().to_json()
    length, next_seq = session.pipeline.length, session.pipeline.reducer.next_seq
    good = F.step_attempt(run["record"]["operationId"], user["id"], SNAPSHOT)
    bad_second = F.step_attempt(run["record"]["operationId"], user["id"], SNAPSHOT)  # second open step
    with pytest.raises(sessionlog.ValidationError) as raised:
        session.pipeline.prepare([good, F.user_message("x"), bad_second])
    assert (raised.value.code, raised.value.seq) == ("INVALID_TRANSITION", 5)
    assert session.state().to_json() == before
    assert (session.pipeline.length, session.pipeline.reducer.next_seq) == (length, next_seq)
    committed = session.commit([good])
    assert committed[0]["seq"] == 3
    assert sessionlog.reduce_bytes(session.data) == session.state()


def test_assigned_fields_and_caller_ids() -> None:
    session = Session()
    own = sessionlog.new_id()
    committed = session.commit(
        [
            F.user_message("a", id=own),
            {"kind": "entry", "entry": {"type": "message", "message": {"role": "user", "content": "b"}}},
        ]
    )
    assert committed[0]["id"] == own
    assert [fact["seq"] for fact in committed] == [1, 2]
    assert committed[0]["timestamp"] == committed[1]["timestamp"] > 0
    later = session.commit([F.user_message("c")])
    assert later[0]["timestamp"] >= committed[1]["timestamp"]
    for field in ("seq", "timestamp"):
        with pytest.raises(sessionlog.ValidationError, match=f"{field} is assigned by the store"):
            session.pipeline.prepare([{**F.user_message("d"), field: 1}])
    with pytest.raises(sessionlog.ValidationError) as raised:
        session.pipeline.prepare([])
    assert raised.value.code == "EMPTY_TRANSACTION"
    with pytest.raises(TypeError):
        session.pipeline.prepare(F.user_message("not a list"))  # type: ignore[arg-type]


def test_committed_state_cannot_be_mutated_by_the_caller() -> None:
    session = Session()
    fact = F.user_message("original")
    session.commit([fact])
    fact["entry"]["message"]["content"] = "changed"
    session.state().transcript[0]["content"] = "changed too"
    assert session.state().transcript == [{"role": "user", "content": "original"}]


def test_timestamps_never_decrease_after_reopening_a_future_dated_log() -> None:
    future = 10**13
    data = HEADER + orjson.dumps({**F.user_message("x"), "seq": 1, "timestamp": future}) + b"\n"
    reducer, end = load(data)
    pipeline = CommitPipeline(reducer, end, 2)
    prepared = pipeline.prepare([F.user_message("y")])
    assert prepared.facts[0]["timestamp"] == future


# -- planner corners ---------------------------------------------------------------------------


def test_abort_settles_pending_and_unstarted_calls_but_not_settled_ones() -> None:
    session = Session()
    calls = [
        F.tool_call("c0", "read", "{}"),
        F.tool_call("c1", "write", "{}"),
        F.tool_call("c2", "nope", "{}"),
        F.tool_call("c3", "read", "{}"),
    ]
    ids = settled_tool_step(session, calls)
    started = session.commit(
        [
            F.tool_started(
                ids["operation"],
                ids["step"],
                ids["assistant"],
                1,
                calls[1],
                {},
                replay="never",
                replay_key="write:v1",
                environment_identity="env",
            )
        ]
    )
    session.commit([F.pre_execution_result(ids["step"], ids["assistant"], 2, calls[2], "unknownTool")])
    done = session.commit(
        [
            F.tool_started(
                ids["operation"],
                ids["step"],
                ids["assistant"],
                3,
                calls[3],
                {},
                replay="safe",
                replay_key="read:v1",
                environment_identity="env",
            )
        ]
    )
    session.commit([F.tool_result(done[0], "ok")])
    session.commit([F.abort_requested(ids["operation"], "run", "tool", tool_call_id="c1")])
    plan = sessionlog.plan_recovery(session.state(), CURRENT)
    assert plan["type"] == "appendSynthetic"
    assert [(result["toolIndex"], result["reason"]) for result in plan["results"]] == [
        (0, "aborted"),
        (1, "interrupted"),
    ]
    assert plan["results"][1]["toolStartedId"] == started[0]["id"]
    session.commit(
        [
            F.pre_execution_result(ids["step"], ids["assistant"], 0, calls[0], "aborted"),
            F.interrupted_result(started[0]),
        ]
    )
    assert sessionlog.plan_recovery(session.state(), CURRENT) == {"type": "finish", "outcome": "aborted"}
    session.commit([F.operation_finished(ids["operation"], "run", "aborted")])
    assert session.state().is_idle


def test_truncated_step_settles_every_call_then_finishes_truncated() -> None:
    session = Session()
    user, run = session.commit(F.accept_prompt("go"))
    operation = run["record"]["operationId"]
    attempt = session.commit([F.step_attempt(operation, user["id"], SNAPSHOT)])[0]["record"]
    calls = [F.tool_call("c0", "read", '{"pa'), F.tool_call("c1", "read", "{}")]
    assistant = session.commit(
        [
            F.assistant_message(
                attempt["stepId"], attempt["attemptId"], None, tool_calls=calls, stop_reason="length"
            )
        ]
    )[0]
    plan = sessionlog.plan_recovery(session.state(), CURRENT)
    assert [result["reason"] for result in plan["results"]] == ["truncated", "truncated"]
    session.commit(
        [
            F.pre_execution_result(attempt["stepId"], assistant["id"], index, call, "truncated")
            for index, call in enumerate(calls)
        ]
    )
    assert sessionlog.plan_recovery(session.state(), CURRENT) == {
        "type": "finish",
        "outcome": "completed",
        "completion": "truncated",
        "finalEntryId": assistant["id"],
    }


def test_next_step_needs_every_call_settled() -> None:
    """Contract §5: a later step only after a toolUse entry whose tools all have results."""
    session = Session()
    calls = [F.tool_call("c0", "read", "{}"), F.tool_call("c1", "read", "{}")]
    ids = settled_tool_step(session, calls)
    started = session.commit(
        [
            F.tool_started(
                ids["operation"],
                ids["step"],
                ids["assistant"],
                0,
                calls[0],
                {},
                replay="safe",
                replay_key="read:v1",
                environment_identity="env",
            )
        ]
    )
    result = session.commit([F.tool_result(started[0], "ok")])[0]
    with pytest.raises(sessionlog.ValidationError) as raised:
        session.pipeline.prepare([F.step_attempt(ids["operation"], result["id"], SNAPSHOT)])
    assert raised.value.code == "INVALID_TRANSITION"
    plan = sessionlog.plan_recovery(session.state(), CURRENT)
    assert (plan["type"], plan["toolIndex"], plan["mode"]) == ("startTool", 1, "start")


def test_synthetic_contents_are_the_contract_texts() -> None:
    assert SYNTHETIC_CONTENT["interrupted"] == (
        "Operation interrupted after execution status became unknown; the tool was not replayed."
    )
    assert len(SYNTHETIC_CONTENT) == 5


def test_nul_rule_covers_the_last_write_of_a_group_commit() -> None:
    """A lost page inside an unsynced batch leaves NULs in a line that is not the last."""
    session = Session()
    session.commit([F.user_message("synced")])
    synced = session.data
    for text in ("batch one" * 60, "batch two" * 60):
        session.commit([F.user_message(text)])
    batch = session.data[len(synced) :]
    hole = -len(synced) % SECTOR or SECTOR  # from the write's start to a sector boundary
    lost = synced + b"\0" * hole + batch[hole:]  # the batch's first sector came back zeroed
    assert error_of(lost).code == "MALFORMED_JSON"
    with pytest.raises(sessionlog.CorruptionError):  # the last line only: still corruption
        sessionlog.reduce_bytes(lost, nul_tail=True)
    state = sessionlog.reduce_bytes(lost, nul_tail=True, nul_window=len(batch))
    assert (state.last_seq, state.repaired_length) == (1, len(synced))
    with pytest.raises(sessionlog.CorruptionError):  # a NUL before the window stays corruption
        sessionlog.reduce_bytes(lost, nul_tail=True, nul_window=len(batch) - 20)

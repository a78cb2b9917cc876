"""Verified snapshots (core/snapshot.py): snapshot + tail is the full reduction, at every prefix of
generated sessions and after any damage to the snapshot or the log; the restored reducer is the
reduced one, table by table, and validates later commits the same way."""

from __future__ import annotations

import hashlib
import hmac
import pickle
import random
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionlog import CorruptionError
from sessionlog.core import snapshot, snapshot_key
from sessionlog.core.loading import load
from sessionlog.core.model import Attempt, Entry, Operation
from sessionlog.core.reducer import Reducer
from sessionlog.core.snapshot import encode, load_with_snapshot, restore
from sessionlog.core.state import SessionState
from sessionlog.testing.sessions import GeneratedSession, generate_session, sessions

SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def tables(reducer: Reducer) -> Any:
    """Every table of a reducer in a comparable form (sets sorted, objects by their slots), and
    the references that must be shared, as a full reduction shares them."""

    def plain(value: Any) -> Any:
        if isinstance(value, Entry | Attempt | Operation):
            return {name: plain(getattr(value, name)) for name in type(value).__slots__}
        if isinstance(value, set | frozenset):
            return sorted(map(repr, value))
        if isinstance(value, dict):
            return [(repr(key), plain(item)) for key, item in value.items()]
        if isinstance(value, list | tuple):
            return [plain(item) for item in value]
        return value

    fields = {
        name: plain(value)
        for name, value in vars(reducer).items()
        if name not in ("source_hash", "source_count", "undo")
    }
    shared = [
        all(reducer.tools[tool["toolStartedId"]] is tool for tool in operation.tool_calls)
        and (operation.step is None or reducer.attempts[operation.step.attempt_id] is operation.step)
        for operation in reducer.operations.values()
    ]
    current = reducer.current is None or reducer.operations[reducer.current.id] is reducer.current
    messages = all(
        reducer.entries[mid].message is message
        for mid, message in zip(reducer.message_ids, reducer.transcript, strict=True)
    )
    return fields, shared, current, messages


def state_json(reducer: Reducer, end: int) -> bytes:
    return orjson.dumps(SessionState(reducer, end).to_json())


def outcome(data: bytes, blob: bytes | None) -> tuple[str, Any]:
    try:
        reducer, end, *_ = load_with_snapshot(data, blob)
    except CorruptionError as error:
        return "error", (error.code, error.line, error.seq, error.offset)
    return "ok", (state_json(reducer, end), tables(reducer)[0])


def full(data: bytes) -> tuple[str, Any]:
    return outcome(data, None)


# -- snapshot + tail == full reduction --------------------------------------------------------


@settings(SLOW, max_examples=30)
@given(sessions(max_facts=90))
def test_snapshot_and_tail_equal_the_full_reduction_at_every_prefix(session: GeneratedSession) -> None:
    data = session.to_bytes()
    ends = session.line_ends()
    reduced, end = load(data)
    for cut in ends:
        blob = encode(load(data[:cut])[0], data, cut)
        restored, restored_end, covered, covered_bytes, _ = load_with_snapshot(data, blob)
        assert (covered, covered_bytes) == (data.count(b"\n", 0, cut), cut)
        assert state_json(restored, restored_end) == state_json(reduced, end)
        assert tables(restored) == tables(reduced)
        # the snapshot of the whole log restores to the reducer that made it
        alone = restore(blob, data[:cut], cut)
        assert alone is not None and tables(alone[0]) == tables(load(data[:cut])[0])


@settings(SLOW, max_examples=15)
@given(sessions(min_facts=20, max_facts=90), st.randoms(use_true_random=False))
def test_a_restored_reducer_validates_later_commits_as_the_reduced_one(
    session: GeneratedSession, rng: random.Random
) -> None:
    """Each later line, applied in a journalled transaction (as a store validates a commit), then
    rolled back or kept, does the same to a restored reducer as to a reduced one; so does a line
    that must be refused (a duplicate of one already applied)."""
    data = session.to_bytes()
    ends = session.line_ends()
    cut = ends[rng.randrange(len(ends))]
    reduced = load(data[:cut])[0]
    restored = restore(encode(reduced, data, cut), data, cut)
    assert restored is not None
    twin = restored[0]
    raw = [line for line in data[cut:].split(b"\n") if line]
    for number, line in enumerate(raw, start=data.count(b"\n", 0, cut) + 1):
        value = orjson.loads(line)
        for reducer in (reduced, twin):
            if rng.random() < 0.3:  # refused by the store's writer, say: undone, then committed again
                mark = reducer.begin()
                reducer.apply(value, number)
                reducer.rollback(mark)
            reducer.begin()
            reducer.apply(value, number)
            reducer.release()
        assert tables(twin) == tables(reduced)
        again = []
        rng_state = rng.getstate()
        for reducer in (reduced, twin):
            rng.setstate(rng_state)
            reducer.begin()
            try:
                reducer.apply(orjson.loads(raw[0]), number)
                again.append(None)
            except Exception as error:
                again.append((type(error), getattr(error, "code", None), str(error)))
            reducer.rollback()
        assert again[0] == again[1]
        assert tables(twin) == tables(reduced)


# -- a damaged snapshot or log ------------------------------------------------------------------


def _mutations(blob: bytes, rng: random.Random) -> list[bytes]:
    cuts = {0, 1, len(blob) - 1, *(rng.randrange(len(blob)) for _ in range(12))}
    found = [blob[:cut] for cut in cuts]
    for _ in range(24):
        position = rng.randrange(len(blob))
        flipped = bytearray(blob)
        flipped[position] ^= 1 << rng.randrange(8)
        found.append(bytes(flipped))
    found.append(blob + b"x")
    found.append(blob.replace(b'"format":1', b'"format":2'))
    return found


@settings(SLOW, max_examples=25)
@given(sessions(min_facts=1, max_facts=80), st.randoms(use_true_random=False))
def test_every_mutation_of_the_snapshot_still_loads_the_full_reduction(
    session: GeneratedSession, rng: random.Random
) -> None:
    data = session.to_bytes()
    ends = session.line_ends()
    expected = full(data)
    cut = ends[rng.randrange(len(ends))]
    blob = encode(load(data[:cut])[0], data, cut)
    for mutated in _mutations(blob, rng):
        assert outcome(data, mutated) == expected


@settings(SLOW, max_examples=25)
@given(sessions(min_facts=4, max_facts=80), st.randoms(use_true_random=False))
def test_a_changed_log_is_never_read_through_its_old_snapshot(
    session: GeneratedSession, rng: random.Random
) -> None:
    """Bit flips, cuts and rewrites of the log, inside the covered prefix or after it: the load
    gives what the full reduction gives, the same state or the same error at the same place."""
    data = session.to_bytes()
    ends = session.line_ends()
    cut = ends[rng.randrange(len(ends))]
    blob = encode(load(data[:cut])[0], data, cut)
    changed = []
    for _ in range(12):
        flipped = bytearray(data)
        flipped[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        changed.append(bytes(flipped))
    changed += [data[: rng.randrange(len(data))] for _ in range(6)]
    changed.append(data[:cut] + b"\n" + data[cut:])  # a blank line where the tail starts
    changed.append(data[:cut] + b"\xff\n")  # invalid UTF-8 in the tail: reported as without a snapshot
    changed.append(data[:cut].replace(b'"seq":1,', b'"seq":1 ,'))  # same facts, other bytes
    for log in changed:
        assert outcome(log, blob) == full(log)


def test_a_snapshot_of_another_session_or_version_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    one, other = generate_session(1, 60), generate_session(2, 60)
    blob = encode(load(one.to_bytes())[0], one.to_bytes(), len(one.to_bytes()))
    assert load_with_snapshot(other.to_bytes(), blob)[2] == 0
    assert load_with_snapshot(one.to_bytes(), blob)[2] > 0
    monkeypatch.setattr(snapshot, "versions", lambda: {"format": 1, "library": "0.0.0", "python": "3.0"})
    assert load_with_snapshot(one.to_bytes(), blob)[2] == 0


def test_a_snapshot_of_longer_lines_than_the_reader_allows_is_ignored() -> None:
    """A store opened with a smaller `max_line_bytes` must refuse a long line of the covered
    prefix, as the full reduction does: the snapshot says how long its lines could be."""
    data = generate_session(5, 60).to_bytes()
    blob = encode(load(data)[0], data, len(data))
    longest = max(len(line) for line in data.split(b"\n"))
    with pytest.raises(CorruptionError) as error:
        load_with_snapshot(data, blob, max_line_bytes=longest - 1)
    assert error.value.code == "MALFORMED_JSON"


def resigned(blob: bytes, body: bytes | None = None, key: bytes | None = None, **meta: Any) -> bytes:
    """`blob` with its body and meta fields replaced, signed again with `key` (this user's by
    default): what someone holding the key could write."""
    signed_at = blob.index(b"\n", len(snapshot.MAGIC)) + 1
    split = blob.index(b"\n", signed_at)
    fields = {**orjson.loads(blob[signed_at:split]), **meta}
    body = blob[split + 1 :] if body is None else body
    fields["bodyLength"] = len(body)
    signed = orjson.dumps(fields) + b"\n" + body
    key = snapshot_key.read_key() if key is None else key
    assert key is not None
    mac = hmac.new(key, signed, hashlib.sha256).hexdigest().encode()
    return snapshot.MAGIC + mac + b"\n" + signed


def test_a_snapshot_names_only_the_model_classes() -> None:
    """A body that names another callable is refused before it is called, even signed."""
    data = generate_session(3, 20).to_bytes()
    blob = encode(load(data)[0], data, len(data))
    assert restore(resigned(blob), data, len(data)) is not None  # the forger's tool works
    assert restore(resigned(blob, pickle.dumps(print, protocol=5)), data, len(data)) is None


def test_the_encoding_is_refused_mid_transaction() -> None:
    data = generate_session(4, 20).to_bytes()
    reducer = load(data)[0]
    reducer.begin()
    with pytest.raises(RuntimeError):
        encode(reducer, data, len(data))

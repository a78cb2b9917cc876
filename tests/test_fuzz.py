"""Corruption fuzzing of the read path: the deterministic corpus of `sessionlog.testing.mutations`
(over 10,000 cases) and hypothesis on top. Each case reduces to the state of its committed prefix
or raises CorruptionError at the right line, never anything else, never skipping a line; the
module docstring of `mutations` says exactly how `judge` checks that."""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionlog import CorruptionError, SessionState, reduce_bytes
from sessionlog.testing.mutations import KINDS, Case, corpus, judge, mutate, run_corpus
from sessionlog.testing.sessions import GeneratedSession, generate_session, sessions

SOAK = os.environ.get("SESSIONLOG_SOAK") == "1"
PER_KIND = 7_000 if SOAK else 600
FUZZ = settings(
    max_examples=1_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def test_the_mutation_corpus() -> None:
    count, outcomes, problems = run_corpus(per_kind=PER_KIND)
    print(f"\nmutation corpus: {count} cases")
    for kind, seen in outcomes.items():
        print(f"  {kind}: {seen}")
    assert problems == []
    assert count >= 10_000 * (10 if SOAK else 1)
    assert outcomes["re-encode"] == {"reduced": PER_KIND}  # the same values in other bytes still reduce
    assert set(outcomes["crlf"]) == {"CRLF_NOT_ALLOWED"}
    assert set(outcomes["duplicate-key"]) == {"MALFORMED_JSON"}
    for kind in KINDS:
        if kind != "re-encode":
            assert set(outcomes[kind]) - {"reduced"}, f"{kind} never produced a corruption"


def test_the_corpus_is_deterministic() -> None:
    first = [case.data for case in corpus(3, per_kind=5, sessions=2)]
    again = [case.data for case in corpus(3, per_kind=5, sessions=2)]
    assert first == again
    assert first != [case.data for case in corpus(4, per_kind=5, sessions=2)]


def test_truncation_at_every_byte_offset_reduces_to_the_committed_prefix() -> None:
    session = generate_session(11, 12)
    data = session.to_bytes()
    ends = session.line_ends()
    for offset in range(len(data) + 1):
        lines = sum(1 for end in ends if end <= offset)
        if lines == 0:
            with pytest.raises(CorruptionError) as caught:
                reduce_bytes(data[:offset])
            assert (caught.value.code, caught.value.line) == ("MISSING_HEADER", 1)
        else:
            assert reduce_bytes(data[:offset]).to_json() == session.expected_state(lines)


@FUZZ
@given(sessions(min_facts=3, max_facts=16), st.sampled_from(KINDS), st.randoms(use_true_random=False))
def test_hypothesis_mutations(session: GeneratedSession, kind: str, rng: random.Random) -> None:
    data, note = mutate(kind, session, rng)
    verdict = judge(Case(kind, session, session.to_bytes(), data, note))
    assert verdict.problem is None, f"{kind} {note}: {verdict.problem}"


edits = st.lists(
    st.tuples(st.floats(0, 1), st.integers(0, 8), st.binary(max_size=6)),
    min_size=1,
    max_size=4,
)


@FUZZ
@given(sessions(min_facts=2, max_facts=12), edits)
def test_hypothesis_arbitrary_edits(
    session: GeneratedSession, changes: list[tuple[float, int, bytes]]
) -> None:
    """Replace a few byte ranges with arbitrary bytes (hypothesis shrinks a failure to the
    smallest edit)."""
    original = session.to_bytes()
    data = original
    for where, size, replacement in changes:
        at = int(where * len(data))
        data = data[:at] + replacement + data[at + size :]
    verdict = judge(Case("edit", session, original, data, repr(changes)))
    assert verdict.problem is None, verdict.problem


# -- the judge is not vacuous ---------------------------------------------------------------------


def _cases(kind: str, count: int) -> list[Case]:
    rng = random.Random(kind)
    out = []
    for number in range(count):
        session = generate_session(number, 10)
        data, note = mutate(kind, session, rng)
        out.append(Case(kind, session, session.to_bytes(), data, note))
    return out


def _lenient(data: bytes) -> SessionState:
    """A broken read path: a bad last committed line is silently skipped."""
    try:
        return reduce_bytes(data)
    except CorruptionError as error:
        start = error.offset or 0
        if data.find(b"\n", start) + 1 == len(data) and error.line > 1:
            return reduce_bytes(data[:start])
        raise


def _off_by_one(data: bytes) -> SessionState:
    try:
        return reduce_bytes(data)
    except CorruptionError as error:
        raise CorruptionError(
            error.code, error.line + 1, error.seq, error.detail, offset=error.offset
        ) from None


def _crashes(data: bytes) -> Any:
    if b"\r" in data:
        raise IndexError("boom")
    return reduce_bytes(data)


@pytest.mark.parametrize(
    ("broken", "kind"), [(_lenient, "bit-flip"), (_off_by_one, "duplicate-line"), (_crashes, "crlf")]
)
def test_the_judge_catches_a_broken_read_path(broken: Any, kind: str) -> None:
    found = [judge(case, broken).problem for case in _cases(kind, 60)]
    assert any(problem is not None for problem in found)
    assert all(judge(case).problem is None for case in _cases(kind, 60))

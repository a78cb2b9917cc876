"""The commit path does nothing twice (issue 25, item 3): one walk copies the facts and refuses
what is not plain JSON (no parse of the line just encoded, no `marshal` pass), the SQL summary row
is made from the prepared facts (no parse of the line), and a PostgreSQL store keeps its
connection while it holds the session. Each check is against behaviour: what is refused, what
is written, what the state holds after the caller mutates what it passed."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import marshal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sessionlog
from conftest import HEADER
from sessionlog.core.commit import CommitPipeline, Line, encode_header
from sessionlog.core.framing import MAX_NESTING_DEPTH
from sessionlog.core.loading import load
from sessionlog.repositories import rows
from sessionlog.testing.sessions import generate_session

_JSON_ONLY = (
    orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def _pipeline(*, contract: bool = True) -> CommitPipeline:
    """`contract=False`: the reducer's rules are not applied (a message's unknown key would be
    refused by them), only the JSON checks of the commit path."""
    header = encode_header(cwd="/", provider="p", model="m", environment_identity="e")
    reducer, end = load(header)
    if not contract:
        reducer.apply = lambda value, line: None  # type: ignore[method-assign]
    pipeline = CommitPipeline(reducer, end, 1)
    pipeline.line_facts = True  # lines carry the copies: what the reducer was given
    return pipeline


def _user(text: str, extra: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "user", "content": text}
    if extra is not None:
        message["extra"] = extra
    return {"kind": "entry", "entry": {"type": "message", "message": message}}


def _refused_before(value: Any) -> bool:
    """What the commit path refused before this change: orjson's encoding, then marshal's type
    check, then the parse of the line compared with the value."""
    try:
        line = orjson.dumps(value, option=_JSON_ONLY)
        marshal.dumps(value)
    except (TypeError, ValueError):
        return True
    return bool(orjson.loads(line) != value)


# -- what is refused: exactly what was --------------------------------------------------------------


class _Colour(enum.Enum):
    RED = "red"


class _Number(enum.IntEnum):
    ONE = 1


class _Name(enum.StrEnum):
    ADA = "ada"


class _Text(str):
    pass


class _Int(int):
    pass


class _Float(float):
    pass


class _Dict(dict):  # type: ignore[type-arg]
    pass


class _List(list):  # type: ignore[type-arg]
    pass


@dataclasses.dataclass
class _Point:
    x: int


ODD = [
    float("nan"),
    float("inf"),
    float("-inf"),
    1e400,
    -0.0,
    1.5,
    (1, 2),
    (),
    {1, 2},
    frozenset(),
    b"x",
    bytearray(b"x"),
    1j,
    decimal.Decimal("1.5"),
    datetime.datetime(2026, 1, 1),
    datetime.date(2026, 1, 1),
    uuid.UUID(int=1),
    _Colour.RED,
    _Number.ONE,
    _Name.ADA,
    _Text("x"),
    _Int(1),
    _Float(1.0),
    _Dict(a=1),
    _List([1]),
    _Point(1),
    orjson.Fragment(b"1"),
    Ellipsis,
    1 << 63,
    (1 << 64) - 1,
    1 << 64,
    -(1 << 63),
    -(1 << 63) - 1,
    1 << 70,
    True,
    None,
    "\ud800",
    "a\udfffb",
    "plain",
    {"a": 1},
    {1: "int key"},
    {True: "bool key"},
    {None: "none key"},
    {_Text("k"): "str subclass key"},
    {"\ud800": "surrogate key"},
    {(1,): "tuple key"},
    [1, [2, [3, float("nan")]]],
    {"deep": {"deeper": (1,)}},
]


def _odd_id(odd: Any) -> str:
    """The type and the repr, without a memory address (the same id in every process)."""
    shown = "Fragment(b'1')" if isinstance(odd, orjson.Fragment) else repr(odd)
    return f"{type(odd).__name__}:{shown}"[:40]


@pytest.mark.parametrize("odd", ODD, ids=_odd_id)
@pytest.mark.parametrize("facts", [1, 2])
def test_a_value_is_refused_exactly_when_it_was_before(odd: Any, facts: int) -> None:
    pipeline = _pipeline(contract=False)
    transaction = [_user("first"), _user("fine", [0, odd])][-facts:]
    before = pipeline.reducer.next_seq
    refused = _refused_before(transaction[0] if facts == 1 else transaction)
    if refused:
        with pytest.raises(sessionlog.ValidationError) as caught:
            pipeline.prepare(transaction)
        assert caught.value.code == "INVALID_FACT"
        assert pipeline.reducer.next_seq == before and pipeline.pending == 0
    else:
        prepared = pipeline.prepare(transaction)
        decoded = orjson.loads(bytes(prepared.line))
        assert (decoded if facts > 1 else [decoded]) == prepared.line.facts


_keys = st.one_of(st.text(max_size=3), st.integers(-2, 2), st.sampled_from([_Text("k"), "\ud800", True]))
_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 66), max_value=1 << 66),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(st.characters(codec=None, exclude_categories=()), max_size=4),
    st.sampled_from([_Name.ADA, _Number.ONE, uuid.UUID(int=7), _Text("t"), b"b", (), (1,)]),
)
_values = st.recursive(
    _leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(_keys, children, max_size=4),
        st.tuples(children),
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_values)
def test_any_value_is_refused_exactly_when_it_was_before(value: Any) -> None:
    pipeline = _pipeline(contract=False)
    fact = _user("x", [value])
    if _refused_before(fact):
        with pytest.raises(sessionlog.ValidationError) as caught:
            pipeline.prepare([fact])
        assert caught.value.code == "INVALID_FACT"
    else:
        prepared = pipeline.prepare([fact])
        assert orjson.loads(bytes(prepared.line)) == prepared.line.facts[0]
        assert prepared.line.facts[0]["entry"]["message"]["extra"] == [value]


def _nested(depth: int) -> Any:
    value: Any = 1
    for level in range(depth):
        value = [value] if level % 2 else {"n": value}
    return value


@pytest.mark.parametrize("facts", [1, 2])
def test_nesting_is_refused_where_orjson_refuses_it(facts: int) -> None:
    """A fact is 4 levels (itself, entry, message, extra's list) above its value; two facts one
    more, in their array: MAX_NESTING_DEPTH levels in all are written, one more is refused."""
    above = 4 + (facts > 1)
    for depth, refused in ((MAX_NESTING_DEPTH - above, False), (MAX_NESTING_DEPTH - above + 1, True)):
        pipeline = _pipeline(contract=False)
        transaction = [_user("first"), _user("x", [_nested(depth)])][-facts:]
        assert _refused_before(transaction[0] if facts == 1 else transaction) == refused
        if refused:
            with pytest.raises(sessionlog.ValidationError, match="not encodable as JSON"):
                pipeline.prepare(transaction)
        else:
            assert pipeline.prepare(transaction).line.facts[-1]["entry"]["message"]["extra"] == [
                _nested(depth)
            ]


_HOLDS_ITSELF = """
import sessionlog
from sessionlog.core.commit import CommitPipeline, encode_header
from sessionlog.core.loading import load

reducer, end = load(encode_header(cwd="/", provider="p", model="m", environment_identity="e"))
reducer.apply = lambda value, line: None  # the JSON checks alone
pipeline = CommitPipeline(reducer, end, 1)
for shape in ("dict", "list", "wide"):
    extra = {} if shape == "dict" else []
    if shape == "dict":
        extra["again"] = extra
    else:
        extra.extend([extra] * (1 if shape == "list" else 8))
    message = {"role": "user", "content": "x", "extra": extra}
    fact = {"kind": "entry", "entry": {"type": "message", "message": message}}
    try:
        pipeline.prepare([fact])
    except sessionlog.ValidationError as error:
        print(error.code, "not encodable as JSON" in str(error))
"""


def test_a_fact_that_holds_itself_is_refused_not_walked_for_ever() -> None:
    """Found writing the walk: the refusal's path search (`first_non_json`) looped for ever on
    a value holding itself (orjson had refused it for its depth). Run apart: a hang would be the
    defect, and the timeout only a hang detector."""
    done = subprocess.run(
        [sys.executable, "-c", _HOLDS_ITSELF], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["INVALID_FACT True"] * 3


def _stack_depth() -> int:
    frame, depth = sys._getframe(1), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1  # type: ignore[assignment]
    return depth


def _deep_in_the_stack(call: Any, room: int) -> Any:
    """`call()` with only `room` frames left below Python's recursion limit."""

    def down(levels: int) -> Any:
        return down(levels - 1) if levels else call()

    return down(sys.getrecursionlimit() - _stack_depth() - room)


def test_a_caller_deep_in_its_own_stack_commits_the_same_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk recurses; a caller that left it too little of the recursion limit gets the same
    copy from the iterative check, and the same refusals (never an outcome that depends on the
    caller's stack)."""
    from sessionlog.core import commit

    slow: list[Any] = []
    real = commit._copied_slowly
    monkeypatch.setattr(commit, "_copied_slowly", lambda value: slow.append(value) or real(value))
    value = _nested(200)
    expected = orjson.loads(bytes(_pipeline(contract=False).prepare([_user("x", [value])]).line))["entry"]
    assert not slow
    prepared = _deep_in_the_stack(lambda: _pipeline(contract=False).prepare([_user("x", [value])]), 40)
    assert len(slow) == 1
    assert orjson.loads(bytes(prepared.line))["entry"] == expected == prepared.line.facts[0]["entry"]
    with pytest.raises(sessionlog.ValidationError) as caught:
        _deep_in_the_stack(lambda: _pipeline(contract=False).prepare([_user("x", [value, float("nan")])]), 40)
    assert caught.value.code == "INVALID_FACT" and "float nan" in str(caught.value)


# -- what the state and the line keep: copies -------------------------------------------------------


def test_a_callers_later_mutation_changes_neither_the_state_nor_the_line(tmp_path: Path) -> None:
    with sessionlog.create(tmp_path / "s.jsonl", "jsonl", **HEADER) as store:
        fact = _user("kept")
        returned = store.commit([fact])
        fact["entry"]["message"]["content"] = "changed"
        fact["entry"]["message"]["role"] = "assistant"
        assert store.load().transcript[0] == {"role": "user", "content": "kept"}
        assert returned[0]["seq"] == 1 and returned[0]["kind"] == "entry"
    with sessionlog.open(tmp_path / "s.jsonl", "jsonl") as again:
        assert again.load().transcript[0]["content"] == "kept"
    pipeline = _pipeline(contract=False)
    fact = _user("queued", {"list": [1]})
    prepared = pipeline.prepare([fact])
    fact["entry"]["message"]["extra"]["list"].append(2)
    assert prepared.line.facts[0]["entry"]["message"]["extra"] == {"list": [1]}
    assert orjson.loads(bytes(prepared.line)) == prepared.line.facts[0]


def test_the_line_is_bytes_carrying_its_facts() -> None:
    pipeline = _pipeline()
    one = pipeline.prepare([_user("one")])
    two = pipeline.prepare([_user("two"), _user("three")])
    for prepared, count in ((one, 1), (two, 2)):
        assert isinstance(prepared.line, Line) and isinstance(prepared.line, bytes)
        prepared.line.facts  # noqa: B018
        assert prepared.line.endswith(b"\n") and prepared.line.count(b"\n") == 1
        decoded = orjson.loads(bytes(prepared.line))
        assert (decoded if count > 1 else [decoded]) == prepared.line.facts
        assert prepared.line.facts == prepared.facts  # what the caller is given back, equal
        assert prepared.line.facts[0] is not prepared.facts[0]  # but not the state's objects
    pipeline.line_facts = False  # a backend that did not ask for them: exact bytes
    assert type(pipeline.prepare([_user("four")]).line) is bytes


class _Recording:
    """A file backend's stand-in that keeps what it was handed."""

    def __init__(self, data: bytes, line_facts: bool) -> None:
        self.data, self.handed, self.line_facts = data, [], line_facts

    def read(self) -> bytes:
        return self.data

    def truncate(self, length: int) -> None:
        self.data = self.data[:length]

    def append(self, line: bytes) -> None:
        self.handed.append(line)
        self.data += line

    def close(self) -> None:
        pass


@pytest.mark.parametrize("line_facts", [False, True])
def test_a_store_hands_lines_with_facts_only_to_a_backend_that_asks(line_facts: bool) -> None:
    from sessionlog.core.store import BackendInfo, SessionStore

    header = encode_header(cwd="/", provider="p", model="m", environment_identity="e")
    backend = _Recording(header, line_facts)
    info = BackendInfo("recording", "process", "sync", "a test's")
    store = SessionStore.open_backend(backend, Path("recording"), info)  # type: ignore[arg-type]
    store.commit([_user("one")])
    (line,) = backend.handed
    assert (type(line) is bytes) != line_facts
    if line_facts:
        assert line.facts == [orjson.loads(bytes(line))]  # type: ignore[attr-defined]
    assert orjson.loads(bytes(line))["entry"]["message"]["content"] == "one"


# -- the SQL summary row: from the facts in hand ----------------------------------------------------


def test_the_summary_from_the_facts_is_the_summary_from_the_line() -> None:
    session = generate_session(11, 300)
    summary = {"provider": "p", "model": "m", "idle": True, "last_seq": 0, "title": None, "usage": [0] * 4}
    from_line = from_facts = summary
    for raw in session.to_bytes().splitlines(keepends=True)[1:]:
        value = orjson.loads(raw)
        line = Line(raw)
        line.facts = value if type(value) is list else [value]
        from_line = rows.summary_after(from_line, raw)
        from_facts = rows.summary_after(from_facts, line)
    assert from_facts == from_line
    assert from_line["last_seq"] == session.fact_count and from_line["title"] is not None


def test_a_sql_commit_does_not_parse_its_own_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with sessionlog.repository(f"sqlite:///{tmp_path / 's.db'}") as repo:
        store = repo.create(**HEADER)
        store.commit([_user("before")])  # the first commit reads where the session stands

        def parsed(data: Any) -> Any:
            raise AssertionError("the commit parsed its own line")

        monkeypatch.setattr(rows.orjson, "loads", parsed)
        store.commit([_user("two"), _user("three")])
        monkeypatch.undo()
        session_id = store.load().session_id
        store.close()
        (info,) = repo.list()
        assert (info.session_id, info.last_seq, info.title) == (session_id, 3, "before")


# -- PostgreSQL: a store keeps its connection while it holds the session ----------------------------


def _terminate(url: str, pid: int) -> None:
    from sessionlog.testing.postgres import terminate_backend

    terminate_backend(url, pid)  # gone, not just signalled: the next commit must find it dead


def _lending(repo: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The connections the repository's pool hands out from now on."""
    taken: list[Any] = []
    real = repo.pool.getconn

    def getconn(*args: Any, **kwargs: Any) -> Any:
        taken.append(real(*args, **kwargs))
        return taken[-1]

    monkeypatch.setattr(repo.pool, "getconn", getconn)
    return taken


def test_a_postgres_store_commits_on_the_connection_it_holds(
    postgres_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sessionlog.repository(postgres_server.new_database()) as repo:
        store = repo.create(**HEADER)
        store.commit([_user("first")])  # takes the connection it keeps
        assert repo.lender.held == 1
        taken = _lending(repo, monkeypatch)
        for index in range(20):
            store.commit([_user(f"message {index}")])
        assert taken == []  # no lending per commit
        session_id = store.load().session_id
        store.close()
        assert repo.lender.held == 0
        assert len(repo.load(session_id).transcript) == 21


def test_past_the_bound_a_store_borrows_a_connection_per_commit(
    postgres_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sessionlog.repository(postgres_server.new_database(), held_connections=1) as repo:
        first, second = repo.create(**HEADER), repo.create(**HEADER)
        ids = [store.load().session_id for store in (first, second)]
        first.commit([_user("holds")])
        taken = _lending(repo, monkeypatch)
        for index in range(3):
            second.commit([_user(f"borrows {index}")])
        assert repo.lender.held == 1 and len(taken) == 3
        first.close()
        second.commit([_user("now it holds")])
        taken.clear()
        second.commit([_user("on its own")])
        assert taken == [] and repo.lender.held == 1
        second.close()
        assert [len(repo.load(session_id).transcript) for session_id in ids] == [1, 5]
    for wrong in (-1, 16, 1.5, True, "2"):
        with pytest.raises(ValueError, match="held_connections"):
            sessionlog.repository(postgres_server.url, held_connections=wrong)


def test_a_held_connection_the_server_ended_is_replaced_before_a_commit(postgres_server: Any) -> None:
    """Terminated while the store waited between commits (a failover, an operator), or by a
    server restart: the next commit goes through a new connection, nothing refused or lost."""
    url = postgres_server.new_database()
    with sessionlog.repository(url, lease_seconds=600) as repo:  # outlasts a slow crash recovery
        store = repo.create(**HEADER)
        store.commit([_user("before")])
        held = store._backend._connection[0]
        _terminate(url, held.info.backend_pid)
        store.commit([_user("after a termination")])
        assert store._backend._connection[0] is not held and repo.lender.held == 1
        postgres_server.kill()
        postgres_server.restart()
        store.commit([_user("after a restart")])
        assert repo.lender.held == 1
        session_id = store.load().session_id
        store.close()
        contents = [m["content"] for m in repo.load(session_id).transcript]
        assert contents == ["before", "after a termination", "after a restart"]


def test_a_held_connection_that_breaks_in_a_commit_poisons_and_is_given_back(
    postgres_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    url = postgres_server.new_database()
    with sessionlog.repository(url) as repo:
        store = repo.create(**HEADER)
        store.commit([_user("kept")])
        session_id = store.load().session_id
        real = psycopg.Connection.execute

        def execute(connection: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            if str(query).startswith("with updated"):
                _terminate(url, connection.info.backend_pid)  # the statement goes to a dead backend
            return real(connection, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.Connection, "execute", execute)
        with pytest.raises(sessionlog.StorePoisonedError) as caught:
            store.commit([_user("in doubt")])
        monkeypatch.setattr(psycopg.Connection, "execute", real)
        assert isinstance(caught.value.__cause__, sessionlog.CommitOutcomeUnknownError)
        assert repo.lender.held == 0  # given back (closed: the pool replaces it)
        with pytest.raises(sessionlog.StorePoisonedError):
            store.commit([_user("never retried")])
        store.close()
        with repo.open(session_id) as again:
            again.commit([_user("reopened")])
            assert [m["content"] for m in again.load().transcript] == ["kept", "reopened"]


def test_a_dropped_postgres_store_gives_its_connection_back(postgres_server: Any) -> None:
    import gc

    with sessionlog.repository(postgres_server.new_database(), max_connections=2) as repo:
        store = repo.create(**HEADER)
        store.commit([_user("dropped")])
        assert repo.lender.held == 1
        del store
        gc.collect()
        assert repo.lender.held == 0
        with repo.lent(timeout=5) as connection, repo.lent(timeout=5) as other:  # both in the pool again
            assert connection is not other

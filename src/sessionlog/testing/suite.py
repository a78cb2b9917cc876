"""The conformance suite: the invariants every sessionlog backend keeps, as mixin classes.

A backend runs all of it by inheriting one class (the fixtures come from the pytest plugin
`sessionlog.testing.plugin`, which a `conftest.py` asks for: it is opt-in, so that installing
sessionlog changes no other project's test runs)::

    pytest_plugins = ["sessionlog.testing.plugin"]  # in conftest.py

    from sessionlog.testing import StoreContract

    class TestMine(StoreContract):
        backend = "mine"

`AsyncStoreContract` is the same for async backends (each test runs its own event loop with
`asyncio.run`, so no async pytest plugin is needed). Class attributes say how to reach the
backend and what it cannot do:

* `backend`: the registered name. `registry`: the `Registry` to find it in (None: the one
  `sessionlog.backends()` uses). `options`: keywords for every create and open.
* `unsupported`: capability -> reason. A test that needs a capability skips with that reason:
  - `raw`: read and replace the stored bytes through the `raw_bytes` / `write_raw` hooks (by
    default the file at the session path): round trip against the bytes, one line per
    transaction, torn tails, corruption, the golden fixtures;
  - `files`: the session is a regular file at its path (the writer guard across path spellings);
  - `flock`: `lock=True` takes a lock that a writer in another process sees;
  - `file_ops`: the backend takes `ops=` (a `FileOps`), so write and sync failures can be
    injected (poisoning).
* `fixture_dir`: a folder whose `manifest.json` lists golden session files and their expected
  results (the shared contract fixtures); None skips those tests with a reason.

Nothing here measures time: timing lives in `sessionlog bench`.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import orjson
import pytest

from ..backends.jsonl_file import FileOps
from ..core import facts
from ..core.errors import (
    CorruptionError,
    SessionExistsError,
    SessionLockedError,
    SessionNotFoundError,
    StoreClosedError,
    StorePoisonedError,
    ValidationError,
)
from ..core.ids import new_id
from ..core.loading import reduce_bytes
from ..core.state import SessionState
from ..plugins.registry import Registry
from .plugin import CWD, ENVIRONMENT, MODEL, PROVIDER

if TYPE_CHECKING:
    from ..core.async_store import AsyncSessionStore
    from ..core.store import SessionStore
    from .plugin import AsyncHarness, Harness

__all__ = [
    "SNAPSHOT",
    "AsyncStoreContract",
    "ContractBase",
    "RecordingOps",
    "Script",
    "StoreContract",
    "agent_turn",
    "committed_lines",
    "contract_classes",
    "stored_facts",
]

Fact = dict[str, Any]
Committed = list[dict[str, Any]]
Scenario = Generator[list[Fact], Committed, None]

_UUID7 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\Z")
_ZERO_DIGEST = "sha256:" + "0" * 64

# The configuration a model attempt runs under: one declared tool, `read`.
SNAPSHOT: dict[str, Any] = {
    "adapterIdentity": "openrouter:chat-completions:v1",
    "model": MODEL,
    "outputOptionsDigest": _ZERO_DIGEST,
    "routingIdentity": f"openrouter:{MODEL}",
    "systemPromptDigest": _ZERO_DIGEST,
    "tools": [{"definitionDigest": _ZERO_DIGEST, "name": "read"}],
}


# -- scenarios ---------------------------------------------------------------------------------


def agent_turn(prompt: str = "inspect the README") -> Scenario:
    """The transactions of one agent turn, intent before effect: accept the prompt (user entry +
    runStarted), an attempt before the model call, the assistant's tool call, the tool intent
    before the tool runs, its result, a second attempt, the final answer with the run's finish
    and the attempt's usage. Send each transaction's committed facts back into the generator."""
    user, run = yield facts.accept_prompt(prompt)
    operation_id = run["record"]["operationId"]
    (attempt,) = yield [facts.step_attempt(operation_id, user["id"], SNAPSHOT)]
    step_id, attempt_id = attempt["record"]["stepId"], attempt["record"]["attemptId"]
    call = facts.tool_call("call_1", "read", '{"path":"README.md"}')
    (assistant,) = yield [facts.assistant_message(step_id, attempt_id, None, tool_calls=[call])]
    (started,) = yield [
        facts.tool_started(
            operation_id,
            step_id,
            assistant["id"],
            0,
            call,
            {"path": "README.md"},
            replay="safe",
            replay_key="builtin:read:v1",
            environment_identity=ENVIRONMENT,
        )
    ]
    (result,) = yield [facts.tool_result(started, "# sessionlog")]
    (second,) = yield [facts.step_attempt(operation_id, result["id"], SNAPSHOT)]
    final = facts.assistant_message(second["record"]["stepId"], second["record"]["attemptId"], "done")
    yield [
        final,
        facts.operation_finished(
            operation_id, "run", "completed", completion="normal", final_entry_id=final["id"]
        ),
        facts.usage(operation_id, {"input": 120, "output": 30, "cacheRead": 7}, attempt_id=attempt_id),
    ]


class Script:
    """Steps a scenario: `next` is the transaction to commit (None when done); `advance` takes
    what the store returned for it."""

    def __init__(self, scenario: Scenario) -> None:
        self._scenario = scenario
        self.next: list[Fact] | None = next(scenario)
        self.committed: list[Committed] = []

    def advance(self, committed: Committed) -> None:
        self.committed.append(committed)
        try:
            self.next = self._scenario.send(committed)
        except StopIteration:
            self.next = None

    def run(self, store: SessionStore, limit: int | None = None) -> Script:
        """Commit up to `limit` transactions (all when None) through a sync store."""
        count = 0
        while self.next is not None and (limit is None or count < limit):
            self.advance(store.commit(self.next))
            count += 1
        return self

    async def run_async(self, store: AsyncSessionStore, limit: int | None = None) -> Script:
        count = 0
        while self.next is not None and (limit is None or count < limit):
            self.advance(await store.commit(self.next))
            count += 1
        return self


def committed_lines(data: bytes) -> list[bytes]:
    """The LF-terminated lines of `data` (without their LF): everything after the last LF is a
    torn tail and is not a line."""
    return data[: data.rfind(b"\n") + 1].split(b"\n")[:-1]


def stored_facts(data: bytes) -> list[dict[str, Any]]:
    """Every committed fact after the header, transactions flattened, in file order."""
    out: list[dict[str, Any]] = []
    for line in committed_lines(data)[1:]:
        value = orjson.loads(line)
        out.extend(value if isinstance(value, list) else [value])
    return out


def _user(content: str, **extra: Any) -> Fact:
    return facts.user_message(content, **extra)


def _contents(state: SessionState) -> list[str]:
    return [message["content"] for message in state.transcript if message["role"] == "user"]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- fault injection ---------------------------------------------------------------------------


class RecordingOps(FileOps):
    """`FileOps` that counts and logs every call, keeps every written chunk, and fails on demand.

    `max_write` caps what one `write` stores (short writes). `fail(name)` makes every later call
    of `name` raise OSError(EIO); a failing `write` may first store `partial` bytes."""

    def __init__(self, *, max_write: int | None = None) -> None:
        self.calls: Counter[str] = Counter()
        self.log: list[str] = []  # every call's name, in order
        self.writes: list[bytes] = []
        self.synced_directories: list[Path] = []
        self.max_write = max_write
        self._failing: dict[str, int | None] = {}
        self._lock = threading.Lock()

    def fail(self, name: str, *, partial: int | None = None) -> None:
        with self._lock:
            self._failing[name] = partial

    def heal(self, name: str) -> None:
        with self._lock:
            self._failing.pop(name, None)

    def syncs(self) -> int:
        """Every sync call: fsync, fdatasync and syncfs, of files, directories and filesystems."""
        return sum(self.calls[name] for name in ("fsync", "fdatasync", "syncfs", "fsync_directory"))

    def _enter(self, name: str) -> tuple[bool, int | None]:
        with self._lock:
            self.calls[name] += 1
            self.log.append(name)
            if name in self._failing:
                return True, self._failing[name]
            return False, None

    def _check(self, name: str) -> None:
        failing, _ = self._enter(name)
        if failing:
            raise OSError(errno.EIO, f"injected {name} failure")

    def open(self, path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        self._check("open")
        return os.open(path, flags, mode, dir_fd=dir_fd)

    def write(self, fd: int, data: Any) -> int:
        failing, partial = self._enter("write")
        view = memoryview(data)
        if failing:
            if partial:
                os.write(fd, view[:partial])
            raise OSError(errno.EIO, "injected write failure")
        if self.max_write is not None:
            view = view[: self.max_write]
        written = os.write(fd, view)
        with self._lock:
            self.writes.append(bytes(view[:written]))
        return written

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        self._check("pread")
        return os.pread(fd, length, offset)

    def fsync(self, fd: Any) -> None:
        self._check("fsync")
        os.fsync(fd)

    def fdatasync(self, fd: Any) -> None:
        self._check("fdatasync")
        os.fdatasync(fd)

    def syncfs(self, fd: int) -> None:
        self._check("syncfs")
        super().syncfs(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        self._check("ftruncate")
        os.ftruncate(fd, length)

    def link(self, source: Any, target: Any) -> None:  # type: ignore[override]
        self._check("link")
        os.link(source, target)

    def unlink(self, path: Any) -> None:  # type: ignore[override]
        self._check("unlink")
        os.unlink(path)

    def close(self, fd: int) -> None:
        self._check("close")
        os.close(fd)

    def fsync_directory(self, directory: Path) -> None:
        self._check("fsync_directory")
        self.synced_directories.append(Path(directory))
        super().fsync_directory(directory)


# -- shared expectations -----------------------------------------------------------------------

# name -> (build the transaction from a known fact id, code, index of the failing fact or None)
REJECTIONS: dict[str, tuple[Callable[[str], list[Any]], str, int | None]] = {
    "unknown-kind": (lambda known: [{"kind": "bogus"}], "INVALID_FACT", 0),
    "failing-fact-in-the-middle": (
        lambda known: [_user("before"), {"kind": "bogus"}, _user("after")],
        "INVALID_FACT",
        1,
    ),
    "dangling-reference": (lambda known: [facts.run_started(new_id())], "INVALID_REFERENCE", 0),
    "duplicate-id": (lambda known: [_user("again", id=known)], "DUPLICATE_ID", 0),
    "id-reused-within-the-transaction": (
        lambda known: [_user("a", id=(same := new_id())), _user("b", id=same)],
        "DUPLICATE_ID",
        1,
    ),
    "store-assigned-seq": (lambda known: [{**_user("x"), "seq": 99}], "INVALID_FACT", 0),
    "store-assigned-timestamp": (lambda known: [{**_user("x"), "timestamp": 1}], "INVALID_FACT", 0),
    "not-a-mapping": (lambda known: [_user("ok"), "text"], "INVALID_FACT", None),
    "not-encodable": (lambda known: [_user("x") | {"entry": object()}], "INVALID_FACT", 0),
    "not-json": (lambda known: [_user("x"), _user("y") | {"entry": float("nan")}], "INVALID_FACT", 1),
}

# name -> (bytes surgery on [header, tx1, tx2] lines, code, line, offset of that line, seq)
_Surgery = Callable[[list[bytes]], bytes]
CORRUPTIONS: dict[str, tuple[_Surgery, str, int, Callable[[list[bytes]], int], int | None]] = {
    "malformed-json": (
        lambda ls: ls[0] + ls[1] + b'{"kind": nope}\n' + ls[2],
        "MALFORMED_JSON",
        3,
        lambda ls: len(ls[0]) + len(ls[1]),
        None,
    ),
    "blank-line": (
        lambda ls: ls[0] + ls[1] + b"\n" + ls[2],
        "BLANK_LINE",
        3,
        lambda ls: len(ls[0]) + len(ls[1]),
        None,
    ),
    "crlf": (
        lambda ls: ls[0] + ls[1][:-1] + b"\r\n" + ls[2],
        "CRLF_NOT_ALLOWED",
        2,
        lambda ls: len(ls[0]),
        None,
    ),
    "invalid-utf8": (
        lambda ls: ls[0] + ls[1] + ls[2].replace(b"second", b"sec\xffnd"),
        "INVALID_UTF8",
        3,
        lambda ls: len(ls[0]) + len(ls[1]),
        None,
    ),
    "seq-mismatch": (lambda ls: ls[0] + ls[2], "SEQ_MISMATCH", 2, lambda ls: len(ls[0]), 2),
    "missing-header": (lambda ls: ls[0][:-1], "MISSING_HEADER", 1, lambda ls: 0, None),
}

_MULTIBYTE = "é ✓ 漢字 🎉 done"

# name -> tail appended after the last LF: never committed, never parsed.
TORN_TAILS: dict[str, Callable[[], bytes]] = {
    "half-line": lambda: orjson.dumps(_user("lost") | {"seq": 3})[:25],
    "cut-inside-a-utf8-character": lambda: _cut_inside_a_character(),
    "complete-json-without-lf": lambda: orjson.dumps(
        _user("lost") | {"seq": 3, "timestamp": 1, "id": new_id()}
    ),
    "lone-cr": lambda: b"\r",
}


def _cut_inside_a_character() -> bytes:
    line = orjson.dumps(_user(_MULTIBYTE) | {"seq": 3, "timestamp": 1})
    cut = line.index("🎉".encode()) + 2  # two of the emoji's four bytes
    tail = line[:cut]
    try:
        tail.decode()
    except UnicodeDecodeError:
        return tail
    raise AssertionError("the cut must fall inside a multi-byte character")


def _manifest(directory: Path | None) -> list[Any]:
    if directory is None:
        return [pytest.param(None, marks=pytest.mark.skip(reason="no fixture_dir set on the contract class"))]
    manifest = directory / "manifest.json"
    if not manifest.is_file():
        reason = f"the golden fixtures are absent ({manifest})"
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason))]
    entries = json.loads(manifest.read_text())["fixtures"]
    return [pytest.param((directory, entry), id=entry["name"]) for entry in entries]


def _expected(fixture: tuple[Path, dict[str, Any]]) -> tuple[bytes, dict[str, Any]]:
    directory, entry = fixture
    return (directory / entry["file"]).read_bytes(), json.loads((directory / entry["expected"]).read_text())


def _check_rejection(error: ValidationError, code: str, index: int | None, first_seq: int) -> None:
    assert isinstance(error, ValueError)
    assert error.code == code, error
    assert error.seq == (None if index is None else first_seq + index), error


def _check_corruption(
    error: CorruptionError, path: Path, code: str, line: int, offset: int, seq: int | None
) -> None:
    assert (error.code, error.line, error.seq, error.offset) == (code, line, seq, offset), error
    assert error.path == str(path)
    assert str(path) in str(error) and f"line {line}" in str(error) and f"offset {offset}" in str(error)


def _check_assigned(committed: list[Committed], before_ms: int, after_ms: int, first_seq: int = 1) -> None:
    flat = [fact for transaction in committed for fact in transaction]
    assert [fact["seq"] for fact in flat] == list(range(first_seq, first_seq + len(flat)))
    ids = [fact["id"] for fact in flat]
    assert all(isinstance(value, str) and _UUID7.match(value) for value in ids), ids
    assert len(set(ids)) == len(ids)
    stamps = [fact["timestamp"] for fact in flat]
    assert all(type(stamp) is int for stamp in stamps)
    assert stamps == sorted(stamps), "timestamps decreased"
    assert before_ms <= stamps[0] and stamps[-1] <= after_ms, (before_ms, stamps, after_ms)


def _lines_of(data: bytes) -> list[bytes]:
    return [line + b"\n" for line in committed_lines(data)]


def _check_serialized(data: bytes, workers: int, per_worker: int) -> None:
    """Every line is one whole transaction of one worker; each worker's lines are in its order."""
    lines = committed_lines(data)[1:]
    assert len(lines) == workers * per_worker, "a commit was lost or split"
    seen: dict[int, list[int]] = {worker: [] for worker in range(workers)}
    for line in lines:
        transaction = orjson.loads(line)
        assert isinstance(transaction, list) and len(transaction) == 2, line
        (w1, i1, a), (w2, i2, b) = (fact["entry"]["message"]["content"].split(":") for fact in transaction)
        assert (w1, i1, a, w2, i2, b) == (w1, i1, "a", w1, i1, "b"), f"interleaved line: {line!r}"
        assert transaction[1]["seq"] == transaction[0]["seq"] + 1
        seen[int(w1)].append(int(i1))
    for worker, order in seen.items():
        assert order == list(range(per_worker)), f"worker {worker} commits out of order: {order}"


def _pair(worker: int, index: int) -> list[Fact]:
    return [_user(f"{worker}:{index}:a"), _user(f"{worker}:{index}:b")]


# -- the contract classes ----------------------------------------------------------------------


class ContractBase:
    """What both mixins share: how to reach the backend, its capabilities, the byte hooks."""

    api: ClassVar[str] = "sync"
    backend: ClassVar[str] = ""
    registry: ClassVar[Registry | None] = None
    options: ClassVar[Mapping[str, Any]] = {}
    unsupported: ClassVar[Mapping[str, str]] = {}
    fixture_dir: ClassVar[Path | None] = None

    def session_path(self, directory: Path, name: str) -> Path:
        """Where a test's session lives (a backend keyed by something else may map it)."""
        return directory / name

    def raw_bytes(self, path: Path) -> bytes:
        """Hook: every byte stored for the session at `path`."""
        return path.read_bytes()

    def write_raw(self, path: Path, data: bytes) -> None:
        """Hook: make `data` the stored bytes of the session at `path` (not open)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "shared_fixture" in metafunc.fixturenames:
            metafunc.parametrize("shared_fixture", _manifest(type(self).fixture_dir))


class StoreContract(ContractBase):
    """The invariant suite for a sync backend (`sessionlog.open` / `sessionlog.create`)."""

    api = "sync"

    # -- create, open, identity --------------------------------------------------------------

    def test_create_gives_a_header_only_session(self, sessionlog_harness: Harness) -> None:
        with sessionlog_harness.create() as store:
            state = store.load()
            assert state.last_seq == 0 and state.transcript == [] and state.is_idle
            header = state.header
            assert (header["provider"], header["model"], header["cwd"]) == (PROVIDER, MODEL, CWD)
            assert header["environmentIdentity"] == ENVIRONMENT and _UUID7.match(header["id"])
            assert store.info.name == sessionlog_harness.backend
            assert store.durability in ("process", "power", "replicated")

    def test_create_refuses_an_existing_session(self, sessionlog_harness: Harness) -> None:
        with sessionlog_harness.create() as store:
            store.commit([_user("hello")])
        with pytest.raises(SessionExistsError) as caught:
            sessionlog_harness.create()
        assert isinstance(caught.value, FileExistsError)
        with sessionlog_harness.open() as store:
            assert _contents(store.load()) == ["hello"]

    def test_open_of_a_missing_session_is_not_found(self, sessionlog_harness: Harness) -> None:
        with pytest.raises(SessionNotFoundError) as caught:
            sessionlog_harness.open(sessionlog_harness.new_path("missing.jsonl"))
        assert isinstance(caught.value, FileNotFoundError)

    # -- round trip --------------------------------------------------------------------------

    def test_round_trip_load_equals_reduce_bytes_of_the_stored_bytes(
        self, sessionlog_harness: Harness
    ) -> None:
        h = sessionlog_harness
        with h.create() as store:
            h.raw()  # skip now, before any work, if the bytes are out of reach
            script = Script(agent_turn())
            while script.next is not None:
                script.advance(store.commit(script.next))
                assert store.load() == reduce_bytes(h.raw())
            final = store.load()
        assert final.to_json() == reduce_bytes(h.raw()).to_json()
        assert stored_facts(h.raw()) == [fact for tx in script.committed for fact in tx]
        with h.open() as store:
            assert store.load() == final

    def test_round_trip_through_close_and_reopen(self, sessionlog_harness: Harness) -> None:
        h = sessionlog_harness
        with h.create() as store:
            Script(agent_turn()).run(store)
            before = store.load()
        with h.open() as store:
            assert store.load() == before
            assert store.load().is_idle and before.usage.input == 120
            store.commit([_user("next prompt")])
        with h.open() as store:
            assert store.load().last_seq == before.last_seq + 1

    # -- assignment --------------------------------------------------------------------------

    def test_seq_ids_and_timestamps_are_assigned(self, sessionlog_harness: Harness) -> None:
        h = sessionlog_harness
        with h.create() as store:
            before = _now_ms()
            plain = {
                "kind": "entry",
                "entry": {"type": "message", "message": {"role": "user", "content": "x"}},
            }
            committed = [store.commit([plain]), store.commit([plain, plain, plain])]
            committed += Script(agent_turn()).run(store).committed
            after = _now_ms()
        _check_assigned(committed, before, after)
        with h.open() as store:
            assert store.load().last_seq == sum(len(tx) for tx in committed)

    def test_timestamps_never_decrease_when_the_clock_goes_back(
        self, sessionlog_harness: Harness, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with sessionlog_harness.create() as store:
            (first,) = store.commit([_user("now")])
            hour_ago = time.time_ns() - 3_600_000_000_000
            with monkeypatch.context() as patch:
                patch.setattr(time, "time_ns", lambda: hour_ago)
                (second,) = store.commit([_user("an hour ago")])
            assert second["timestamp"] == first["timestamp"]

    def test_timestamps_never_decrease_across_reopen(self, sessionlog_harness: Harness) -> None:
        h = sessionlog_harness
        with h.create() as store:
            store.commit([_user("from the future")])
        header, line = _lines_of(h.raw())
        future = _now_ms() + 3_600_000
        h.write_raw(header + orjson.dumps(orjson.loads(line) | {"timestamp": future}) + b"\n")
        with h.open() as store:
            (fact,) = store.commit([_user("now")])
        assert fact["timestamp"] == future

    def test_caller_supplied_ids_are_kept(self, sessionlog_harness: Harness) -> None:
        with sessionlog_harness.create() as store:
            user_id, operation_id = new_id(), new_id()
            transaction = [_user("hi", id=user_id), facts.run_started(user_id, operation_id=operation_id)]
            user, run = store.commit(transaction)
            assert user["id"] == user_id and run["record"]["inputEntryId"] == user_id
            assert store.load().operation["operationId"] == operation_id

    def test_reserved_result_id_is_borne_by_the_tool_result(self, sessionlog_harness: Harness) -> None:
        with sessionlog_harness.create() as store:
            script = Script(agent_turn()).run(store, limit=4)
            (started,) = script.committed[-1]
            reserved = started["record"]["resultEntryId"]
            assert [tool["status"] for tool in store.load().tool_calls] == ["pending"]
            before = store.load()
            with pytest.raises(ValidationError) as caught:  # the reserved id on another fact
                store.commit([_user("sneaky", id=reserved)])
            _check_rejection(caught.value, "DUPLICATE_ID", 0, before.last_seq + 1)
            anonymous = facts.tool_result(started, "# sessionlog")
            del anonymous["id"]  # the store would give it a fresh id: not the reserved one
            with pytest.raises(ValidationError) as caught:
                store.commit([anonymous])
            _check_rejection(caught.value, "INVALID_REFERENCE", 0, before.last_seq + 1)
            with pytest.raises(ValidationError) as caught:  # a user message while a call is open
                store.commit([_user("interrupting")])
            _check_rejection(caught.value, "INVALID_TRANSCRIPT", 0, before.last_seq + 1)
            assert store.load() == before
            assert script.next is not None
            (result,) = store.commit(script.next)
            assert result["id"] == reserved
            assert [tool["status"] for tool in store.load().tool_calls] == ["completed"]

    # -- transactions ------------------------------------------------------------------------

    def test_transaction_is_one_line(self, sessionlog_harness: Harness) -> None:
        h = sessionlog_harness
        with h.create() as store:
            h.raw()
            single = store.commit([_user("one")])
            triple = store.commit([_user("two"), _user("three"), _user("four")])
        lines = committed_lines(h.raw())
        assert len(lines) == 3 and h.raw().endswith(b"\n")
        assert orjson.loads(lines[1]) == single[0]  # one fact: bare
        assert orjson.loads(lines[2]) == triple  # several: one array

    @pytest.mark.parametrize("rejection", sorted(REJECTIONS))
    def test_rejected_transaction_changes_nothing(self, sessionlog_harness: Harness, rejection: str) -> None:
        build, code, index = REJECTIONS[rejection]
        h = sessionlog_harness
        with h.create() as store:
            (known,) = store.commit([_user("first")])
            store.commit([_user("second")])
            before = store.load()
            raw = h.raw() if "raw" not in self.unsupported else None
            with pytest.raises(ValidationError) as caught:
                store.commit(build(known["id"]))
            _check_rejection(caught.value, code, index, before.last_seq + 1)
            assert store.load() == before
            if raw is not None:
                assert h.raw() == raw
            (after,) = store.commit([_user("after")])
            assert after["seq"] == before.last_seq + 1
        with h.open() as store:
            assert _contents(store.load()) == ["first", "second", "after"]

    def test_empty_transaction_is_rejected(self, sessionlog_harness: Harness) -> None:
        h = sessionlog_harness
        with h.create() as store:
            store.commit([_user("first")])
            before = store.load()
            with pytest.raises(ValidationError) as caught:
                store.commit([])
            assert caught.value.code == "EMPTY_TRANSACTION"
            assert store.load() == before
            assert store.commit([_user("second")])[0]["seq"] == 2

    def test_a_bare_fact_is_not_a_transaction(self, sessionlog_harness: Harness) -> None:
        with sessionlog_harness.create() as store:
            with pytest.raises(TypeError):
                store.commit(_user("not in a list"))  # type: ignore[arg-type]
            assert store.load().last_seq == 0

    def test_stored_facts_are_isolated_from_the_caller(self, sessionlog_harness: Harness) -> None:
        with sessionlog_harness.create() as store:
            fact = _user("original")
            (committed,) = store.commit([fact])
            fact["entry"]["message"]["content"] = "changed by the caller"
            committed["entry"]["message"]["content"] = "changed too"
            state = store.load()
            state.transcript[0]["content"] = "and this"
            assert _contents(store.load()) == ["original"]

    # -- torn tails and corruption -----------------------------------------------------------

    @pytest.mark.parametrize("tail", sorted(TORN_TAILS))
    def test_torn_tail_is_repaired_on_open_and_appends_continue(
        self, sessionlog_harness: Harness, tail: str
    ) -> None:
        h = sessionlog_harness
        with h.create() as store:
            h.raw()
            store.commit([_user("first")])
            store.commit([_user(_MULTIBYTE)])
            before = store.load()
        committed = h.raw()
        h.write_raw(committed + TORN_TAILS[tail]())
        with h.open() as store:
            assert store.load() == before
            assert store.load().repaired_length == len(committed)
            (fact,) = store.commit([_user("third")])
            assert fact["seq"] == 3
        data = h.raw()
        assert data.startswith(committed) and len(committed_lines(data)) == 4 and data.endswith(b"\n")
        assert _contents(reduce_bytes(data)) == ["first", _MULTIBYTE, "third"]

    def test_torn_tail_right_after_the_header(self, sessionlog_harness: Harness) -> None:
        h = sessionlog_harness
        with h.create():
            h.raw()
        header = h.raw()
        h.write_raw(header + _cut_inside_a_character())
        with h.open() as store:
            assert store.load().last_seq == 0 and store.load().repaired_length == len(header)
            store.commit([_user("first")])
        assert _contents(reduce_bytes(h.raw())) == ["first"]

    @pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
    def test_corruption_is_refused_with_path_line_and_offset(
        self, sessionlog_harness: Harness, corruption: str
    ) -> None:
        surgery, code, line, offset, seq = CORRUPTIONS[corruption]
        h = sessionlog_harness
        with h.create() as store:
            h.raw()
            store.commit([_user("first")])
            store.commit([_user("second")])
        lines = _lines_of(h.raw())
        broken = surgery(lines)
        h.write_raw(broken)
        for _ in range(2):  # a refused open holds nothing: the next one is refused the same way
            with pytest.raises(CorruptionError) as caught:
                h.open()
            _check_corruption(caught.value, h.path, code, line, offset(lines), seq)
        assert h.raw() == broken

    def test_corruption_with_a_torn_tail_is_refused_and_left_unchanged(
        self, sessionlog_harness: Harness
    ) -> None:
        h = sessionlog_harness
        with h.create() as store:
            h.raw()
            store.commit([_user("first")])
        broken = h.raw() + b"[]\n" + b'{"kind":"ent'
        h.write_raw(broken)
        with pytest.raises(CorruptionError) as caught:
            h.open()
        assert (caught.value.code, caught.value.line) == ("EMPTY_TRANSACTION", 3)
        assert h.raw() == broken  # the torn tail is cut only after the prefix reduced cleanly

    def test_shared_fixture_loads_through_the_store(
        self, sessionlog_harness: Harness, shared_fixture: Any
    ) -> None:
        h = sessionlog_harness
        data, expected = _expected(shared_fixture)
        h.write_raw(data)
        if expected["ok"]:
            with h.open() as store:
                assert store.load().to_json() == expected["state"]
            with h.open() as store:  # the repaired file reopens to the same state
                assert store.load().to_json() == expected["state"]
        else:
            with pytest.raises(CorruptionError) as caught:
                h.open()
            assert caught.value.to_json() == expected["error"]
            assert caught.value.path == str(h.path)
            assert h.raw() == data

    # -- writers -----------------------------------------------------------------------------

    def test_second_writer_in_the_same_process_is_refused(self, sessionlog_harness: Harness) -> None:
        h = sessionlog_harness
        with h.create() as store:
            with pytest.raises(SessionLockedError):
                h.open()
            with pytest.raises(SessionLockedError):
                h.open(lock=True) if "flock" not in self.unsupported else h.open()
            store.commit([_user("still mine")])
        with h.open() as store:  # closing released it
            assert _contents(store.load()) == ["still mine"]

    def test_second_writer_through_another_path_spelling_is_refused(
        self, sessionlog_harness: Harness
    ) -> None:
        h = sessionlog_harness
        h.require("files")
        alias = h.directory / "alias.jsonl"
        with h.create():
            os.link(h.path, alias)  # another name of the same file (device, inode)
            with pytest.raises(SessionLockedError):
                h.open(alias)
            with pytest.raises(SessionLockedError):
                h.open(h.directory / "." / h.path.name)

    def test_lock_refuses_a_writer_in_another_process(self, sessionlog_harness: Harness) -> None:
        h = sessionlog_harness
        h.require("flock")
        with h.create(lock=True):
            answer = h.open_in_child()
            assert answer.startswith("locked:") and str(h.path) in answer, answer
        assert h.open_in_child() == "opened"

    # -- close -------------------------------------------------------------------------------

    def test_close_is_idempotent(self, sessionlog_harness: Harness) -> None:
        h = sessionlog_harness
        with h.create() as store:
            store.commit([_user("one")])
            store.close()
            store.close()
        store.close()
        with h.open() as store:
            assert _contents(store.load()) == ["one"]

    def test_closed_store_refuses_every_call(self, sessionlog_harness: Harness) -> None:
        store = sessionlog_harness.create()
        store.close()
        with pytest.raises(StoreClosedError):
            store.commit([_user("late")])
        with pytest.raises(StoreClosedError):
            store.commit([])
        with pytest.raises(StoreClosedError):
            store.load()
        with sessionlog_harness.open() as reopened:
            assert reopened.load().last_seq == 0

    # -- concurrency -------------------------------------------------------------------------

    def test_concurrent_commits_are_serialized(self, sessionlog_harness: Harness) -> None:
        workers, per_worker = 8, 25
        h = sessionlog_harness
        seqs: dict[int, list[int]] = {}
        errors: list[BaseException] = []
        with h.create() as store:
            start = threading.Barrier(workers)

            def work(worker: int) -> None:
                try:
                    start.wait()
                    seqs[worker] = [store.commit(_pair(worker, i))[0]["seq"] for i in range(per_worker)]
                except BaseException as error:
                    errors.append(error)

            threads = [threading.Thread(target=work, args=(worker,)) for worker in range(workers)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert not errors, errors
            state = store.load()
        self._check_workers(h, seqs, state, per_worker)

    def _check_workers(
        self, h: Harness, seqs: Mapping[int, list[int]], state: SessionState, per_worker: int
    ) -> None:
        """Each worker's commits in its order, all of them serialized, and so after reopening."""
        workers = len(seqs)
        assert state.last_seq == 2 * workers * per_worker
        assert sorted(seq for mine in seqs.values() for seq in mine) == list(range(1, state.last_seq + 1, 2))
        for worker, mine in seqs.items():
            assert mine == sorted(mine), f"worker {worker}'s commits were reordered"
            order = [text for text in _contents(state) if text.startswith(f"{worker}:")]
            assert order == [f"{worker}:{i}:{half}" for i in range(per_worker) for half in "ab"]
        if "raw" not in self.unsupported:
            _check_serialized(h.raw(), workers, per_worker)
            assert reduce_bytes(h.raw()) == state
        with h.open() as store:
            assert store.load() == state

    # -- poisoning ---------------------------------------------------------------------------

    @pytest.mark.parametrize("written", ["nothing", "half", "everything"])
    def test_failed_write_poisons_the_store(self, sessionlog_harness: Harness, written: str) -> None:
        h = sessionlog_harness
        h.require("file_ops")
        ops = RecordingOps()
        store = h.create(ops=ops)
        store.commit([_user("kept")])
        before = store.load()
        lost = [_user("lost"), _user("also lost")]
        size = len(orjson.dumps(lost)) + 200  # more than the line: "everything" lands whole
        ops.fail("write", partial={"nothing": None, "half": 20, "everything": size}[written])
        with pytest.raises(StorePoisonedError):
            store.commit(lost)
        writes = ops.calls["write"]
        for call in (lambda: store.commit([_user("later")]), store.load, lambda: store.commit([])):
            with pytest.raises(StorePoisonedError):
                call()
        assert ops.calls["write"] == writes, "a poisoned store must not write again"
        store.close()
        store.close()
        with h.open() as reopened:
            state = reopened.load()
            if written == "everything":
                assert _contents(state) == ["kept", "lost", "also lost"]
            else:
                assert state == before  # wholly absent: a partial line is a torn tail
            reopened.commit([_user("after reopen")])

    def test_failed_sync_poisons_the_store_and_is_never_retried(self, sessionlog_harness: Harness) -> None:
        h = sessionlog_harness
        h.require("file_ops")
        if h.info.durability != "power":
            pytest.skip(f"{h.backend} is in the {h.info.durability} class: it never syncs a commit")
        ops = RecordingOps()
        store = h.create(ops=ops)
        store.commit([_user("kept")])
        before = store.load()
        for name in ("fsync", "fdatasync", "syncfs"):
            ops.fail(name)
        syncs = ops.syncs()
        with pytest.raises(StorePoisonedError):
            store.commit([_user("maybe")])
        assert ops.syncs() == syncs + 1, "one failed sync, and no retry"
        for call in (lambda: store.commit([_user("later")]), store.load):
            with pytest.raises(StorePoisonedError):
                call()
        store.close()
        assert ops.syncs() == syncs + 1, "a failed sync is never retried, not even at close"
        with h.open() as reopened:
            state = reopened.load()
            assert _contents(state) in (["kept"], ["kept", "maybe"])  # wholly present or absent
            assert state.last_seq in (before.last_seq, before.last_seq + 1)


class AsyncStoreContract(StoreContract):
    """The invariant suite for an async backend (`sessionlog.open_async` / `create_async`): the
    same test bodies, each call of a store run to completion on the test's event loop
    (`AsyncHarness`), and concurrency as asyncio has it (tasks instead of threads)."""

    api = "async"

    def test_concurrent_commits_are_serialized(self, sessionlog_harness: Harness) -> None:
        workers, per_worker = 8, 25
        h = _async(sessionlog_harness)

        async def commit_from_tasks() -> tuple[list[list[int]], SessionState]:
            async with await h.create_async() as store:

                async def work(worker: int) -> list[int]:
                    return [(await store.commit(_pair(worker, i)))[0]["seq"] for i in range(per_worker)]

                seqs = await asyncio.gather(*(work(worker) for worker in range(workers)))
                return seqs, await store.load()

        seqs, state = h.run(commit_from_tasks())
        self._check_workers(h, dict(enumerate(seqs)), state, per_worker)

    def test_concurrent_commits_keep_call_order(self, sessionlog_harness: Harness) -> None:
        h = _async(sessionlog_harness)

        async def commit_at_once() -> tuple[list[list[dict[str, Any]]], SessionState]:
            async with await h.create_async() as store:
                committed = await asyncio.gather(*(store.commit([_user(f"m{i}")]) for i in range(50)))
                return committed, await store.load()

        committed, state = h.run(commit_at_once())
        assert [tx[0]["seq"] for tx in committed] == list(range(1, 51))
        assert _contents(state) == [f"m{i}" for i in range(50)]


def _async(harness: Harness) -> AsyncHarness:
    from .plugin import AsyncHarness

    assert isinstance(harness, AsyncHarness), type(harness)
    return harness


def contract_classes(
    registry: Registry | None = None,
    *,
    prefix: str = "Test",
    mixins: Mapping[str, type] | None = None,
    **attributes: Any,
) -> dict[str, type[ContractBase]]:
    """One test class per registered backend: `StoreContract` for sync ones, `AsyncStoreContract`
    for async ones, named `<prefix><CamelCaseName>`. Assign the result into a test module's
    globals and pytest collects every backend, including ones registered later. `mixins`:
    backend name -> a class mixed in first (byte hooks, `unsupported`); the built-in SQLite
    backends get `SQLiteRows` unless named there."""
    from ..opening import backends
    from .raw_rows import SQLiteRows

    chosen = {name: SQLiteRows for name in _SQLITE_BACKENDS} | dict(mixins or {})
    classes: dict[str, type[ContractBase]] = {}
    for name, info in backends(registry).items():
        base: type[ContractBase] = AsyncStoreContract if info.api == "async" else StoreContract
        bases = (chosen[name], base) if name in chosen else (base,)
        title = prefix + "".join(part.capitalize() for part in re.split(r"[^0-9A-Za-z]+", name) if part)
        namespace = {"backend": name, "registry": registry, "__doc__": f"{base.__name__} for {name!r}."}
        classes[title] = type(title, bases, {**namespace, **attributes})
    return classes


_SQLITE_BACKENDS = ("sqlite", "sqlite-normal", "sqlite-async", "sqlite-normal-async")

"""Hostile input: a line above the configurable maximum is a CorruptionError, refused before it is
copied (not memory exhaustion); deep nesting is a clear MALFORMED_JSON at every depth, never a
crashed interpreter; a session path that is a symlink is refused."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from conftest import FILE_BACKENDS
from sessionlog import CorruptionError, SessionExistsError, SessionPathError, ValidationError, reduce_bytes
from sessionlog.core.framing import DEFAULT_MAX_LINE_BYTES, MAX_NESTING_DEPTH, parse_line
from sessionlog.testing.sessions import generate_session

BACKENDS = FILE_BACKENDS
INFO = sessionlog.backends()
HEADER = {"provider": "p", "model": "m", "cwd": "/"}


def _header() -> bytes:
    return generate_session(1, 0).to_bytes()


def _user(content: str) -> dict[str, Any]:
    return {"kind": "entry", "entry": {"type": "message", "message": {"role": "user", "content": content}}}


def _session(
    backend: str,
    path: Path,
    transactions: list[list[dict[str, Any]]] = (),
    *,
    create: bool = False,
    **options: Any,
) -> list[Exception | None]:
    """Create or open the session, commit each transaction, close; what each commit raised."""
    outcomes: list[Exception | None] = []
    if INFO[backend].api == "sync":
        opener = sessionlog.create if create else sessionlog.open
        with opener(path, backend, **(HEADER if create else {}), **options) as store:
            for transaction in transactions:
                try:
                    store.commit(transaction)
                    outcomes.append(None)
                except ValidationError as error:
                    outcomes.append(error)
        return outcomes

    async def main() -> None:
        opener = sessionlog.create_async if create else sessionlog.open_async
        store = await opener(path, backend, **(HEADER if create else {}), **options)
        try:
            for transaction in transactions:
                try:
                    await store.commit(transaction)
                    outcomes.append(None)
                except ValidationError as error:
                    outcomes.append(error)
        finally:
            await store.close()

    asyncio.run(main())
    return outcomes


# -- long lines ---------------------------------------------------------------------------------


def test_a_line_over_the_maximum_is_refused_before_it_is_copied() -> None:
    line = b'{"kind":"entry","junk":"' + b"x" * (32 << 20) + b'"}\n'
    data = _header() + line
    tracemalloc.start()
    try:
        with pytest.raises(CorruptionError) as caught:
            reduce_bytes(data, max_line_bytes=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (caught.value.code, caught.value.line) == ("MALFORMED_JSON", 2)
    assert "exceeds the maximum of 1048576" in caught.value.detail
    assert peak < 4 << 20  # the 32 MiB line was neither copied nor parsed


def test_a_long_line_ending_in_cr_is_still_crlf_first() -> None:
    data = _header() + b'{"a":"' + b"x" * 5000 + b'"}\r\n'
    with pytest.raises(CorruptionError) as caught:
        reduce_bytes(data, max_line_bytes=1000)
    assert caught.value.code == "CRLF_NOT_ALLOWED"


def test_the_default_maximum_is_64_mib(tmp_path: Path) -> None:
    assert DEFAULT_MAX_LINE_BYTES == 64 << 20
    path = tmp_path / "big.jsonl"
    with path.open("wb") as file:
        file.write(_header())
        file.write(b'{"kind":"entry","content":"')
        file.write(b"y" * (64 << 20))
        file.write(b'"}\n')
    with pytest.raises(CorruptionError) as caught:
        sessionlog.open(path, "jsonl").close()
    assert (caught.value.code, caught.value.line, caught.value.path) == ("MALFORMED_JSON", 2, str(path))
    assert f"exceeds the maximum of {64 << 20}" in caught.value.detail


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_line_bytes_is_a_store_option(backend: str, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    long, short = [_user("z" * 4096)], [_user("fits")]
    refused, accepted = _session(backend, path, [long, short], create=True, max_line_bytes=4096)
    assert isinstance(refused, ValidationError) and accepted is None
    assert "above the maximum of 4096" in refused.detail  # it would not read back
    assert reduce_bytes(path.read_bytes()).last_seq == 1  # nothing of it was written
    assert _session(backend, path, [long]) == [None]  # the default maximum takes it
    with pytest.raises(CorruptionError) as caught:
        _session(backend, path, max_line_bytes=4096)
    assert (caught.value.code, caught.value.line) == ("MALFORMED_JSON", 3)
    for bad in (0, -1, "64", 1.5):
        with pytest.raises(ValueError):
            _session(backend, path, max_line_bytes=bad)
    assert _session(backend, path, [short]) == [None]  # every refusal released the file


# -- deep nesting -------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [1, 100, 200, MAX_NESTING_DEPTH])
def test_nesting_up_to_the_limit_parses(depth: int) -> None:
    assert parse_line(b"[" * depth + b"]" * depth, 2, 0) is not None
    value = parse_line(b'{"a":' * depth + b"1" + b"}" * depth, 2, 0)
    assert isinstance(value, dict)


@pytest.mark.parametrize("depth", [MAX_NESTING_DEPTH + 1, 1000, 1024, 1025, 5000, 100_000])
def test_deeper_nesting_is_malformed_json(depth: int) -> None:
    for raw in (b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth):
        with pytest.raises(CorruptionError) as caught:
            parse_line(raw, 7, 123)
        error = caught.value
        assert (error.code, error.line, error.offset) == ("MALFORMED_JSON", 7, 123)
        assert f"nesting deeper than {MAX_NESTING_DEPTH}" in error.detail


def _with_deep_arguments(depth: int) -> tuple[bytes, int]:
    """A valid session cut after its first toolStarted, whose arguments are nested `depth` deep."""
    session = generate_session(4, 40)
    lines = session.to_bytes().splitlines(keepends=True)
    for number, raw in enumerate(lines[1:], start=2):
        value = json.loads(raw)
        facts = value if isinstance(value, list) else [value]
        for fact in facts:
            if fact["kind"] == "record" and fact["record"]["type"] == "toolStarted":
                nested: Any = {}
                for _ in range(depth - 1):
                    nested = {"n": nested}
                fact["record"]["arguments"] = nested
                line = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
                return b"".join([*lines[: number - 1], line]), number
    raise AssertionError("no toolStarted in the generated session")


def test_deep_arguments_in_a_fact() -> None:
    fits, line = _with_deep_arguments(MAX_NESTING_DEPTH - 8)  # the fact and its record add depth
    state = reduce_bytes(fits)
    assert state.to_json()["operation"]["toolCalls"]  # and the state copies it without recursion trouble
    too_deep, line = _with_deep_arguments(MAX_NESTING_DEPTH + 1)
    with pytest.raises(CorruptionError) as caught:
        reduce_bytes(too_deep)
    assert (caught.value.code, caught.value.line) == ("MALFORMED_JSON", line)


def test_a_million_brackets_do_not_crash_the_interpreter(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    path.write_bytes(_header() + b"[" * 1_000_000 + b"]" * 1_000_000 + b"\n")
    script = (
        "import sys, sessionlog\n"
        "try:\n"
        "    sessionlog.open(sys.argv[1], 'jsonl')\n"
        "except sessionlog.CorruptionError as error:\n"
        "    print(error.code, error.line)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr  # a crashed interpreter would die by a signal
    assert done.stdout.split() == ["MALFORMED_JSON", "2"]


# -- paths --------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_symlinked_session_is_refused(backend: str, tmp_path: Path) -> None:
    real = tmp_path / "real.jsonl"
    _session(backend, real, [[_user("hello")]], create=True)
    before = real.read_bytes()
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    with pytest.raises(SessionPathError, match="symlink"):
        _session(backend, link)
    with pytest.raises((SessionPathError, SessionExistsError)):  # create never follows it either
        _session(backend, link, create=True)
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(tmp_path / "nowhere.jsonl")
    with pytest.raises((SessionPathError, SessionExistsError)):
        _session(backend, dangling, create=True)
    assert not (tmp_path / "nowhere.jsonl").exists()
    assert real.read_bytes() == before and os.path.islink(link)
    directory = tmp_path / "a-directory"
    directory.mkdir()
    with pytest.raises(SessionPathError):
        _session(backend, directory)
    assert _session(backend, real, [[_user("still mine")]]) == [None]


# -- a secret in a wrong field ------------------------------------------------------------------

# A 40-character key in the shape of an API key: its public format prefix `sk-proj-`, then 32
# characters that appear nowhere else (no hex digit, so no id or digest holds them by chance).
SECRET = "sk-proj-" + "".join(random.Random(21).choices("GHJKLMNPQRSTUVWXYZ", k=32))
SHOWN_AT_MOST = 8  # characters of it a message may show (core.errors.shown: min(8, a quarter))


def _leaks(text: str, secret: str = SECRET, allowed: int = SHOWN_AT_MOST) -> bool:
    """Whether `text` holds more than `allowed` consecutive characters of `secret`."""
    return any(secret[start : start + allowed + 1] in text for start in range(len(secret) - allowed))


def _error_texts(error: BaseException) -> list[str]:
    texts = [str(error), repr(error), *(str(arg) for arg in error.args), *(repr(arg) for arg in error.args)]
    if isinstance(error, sessionlog.ContractError):
        texts += [error.detail, json.dumps(error.to_json())]
    return texts


def _wrong_fields(value: Any, path: tuple[Any, ...] = ()) -> Any:
    """(where, value with the secret there): every leaf replaced, every object key renamed."""
    if isinstance(value, dict):
        for key, item in value.items():
            if path == () and key in ("seq", "timestamp"):
                continue  # assigned by the store, refused before any field is read
            yield (*path, "key", key), {(SECRET if k == key else k): v for k, v in value.items()}
            for where, changed in _wrong_fields(item, (*path, key)):
                yield where, {**value, key: changed}
    elif isinstance(value, list):
        for index, item in enumerate(value):
            for where, changed in _wrong_fields(item, (*path, index)):
                yield where, [*value[:index], changed, *value[index + 1 :]]
    else:
        yield path, SECRET


def _as_committed(transaction: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {key: value for key, value in fact.items() if key not in ("seq", "timestamp")} for fact in transaction
    ]


@pytest.mark.parametrize("profile", ["mixed", "bulk"])
def test_a_secret_committed_into_any_wrong_field_shows_at_most_its_public_prefix(
    profile: str, tmp_path: Path
) -> None:
    session = generate_session(21, 80, profile=profile)
    path = tmp_path / "s.jsonl"
    refused: set[str] = set()
    for number, transaction in enumerate(session.transactions):
        path.unlink(missing_ok=True)
        path.write_bytes(session.prefix(number + 1).to_bytes())
        store = sessionlog.open(path)
        try:
            for where, changed in _wrong_fields(_as_committed(transaction)):
                try:
                    store.commit(changed)
                except sessionlog.SessionLogError as error:
                    leaked = [text for text in _error_texts(error) if _leaks(text)]
                    assert not leaked, (where, leaked[0])
                    refused.add(
                        error.code if isinstance(error, sessionlog.ContractError) else type(error).__name__
                    )
                else:  # free text (a prompt, a tool's output): stored as it is; start again
                    store.close()
                    path.write_bytes(session.prefix(number + 1).to_bytes())
                    store = sessionlog.open(path)
        finally:
            store.close()
    assert {"INVALID_FACT", "INVALID_REFERENCE"} <= refused  # the test reached the field checks


def test_a_secret_in_a_wrong_field_of_a_stored_line_is_not_in_the_listing_or_the_index(
    tmp_path: Path,
) -> None:
    fact = {
        **_user("hi"),
        "seq": 1,
        "id": "018e2c8a-b87d-7c2c-9cc4-762800000002",
        "timestamp": 1,
        "kind": SECRET,
    }
    data = _header() + json.dumps(fact).encode() + b"\n"
    with pytest.raises(CorruptionError) as caught:
        reduce_bytes(data)
    assert not [text for text in _error_texts(caught.value) if _leaks(text)]
    repository = sessionlog.repository(tmp_path / "repo")
    session_id = json.loads(data.split(b"\n")[0])["id"]
    (tmp_path / "repo" / f"{session_id}.jsonl").write_bytes(data)
    (info,) = repository.list()
    repository.close()
    assert info.status == "corrupt" and info.error and not _leaks(info.error)
    for file in (tmp_path / "repo").iterdir():
        if not file.name.endswith(".jsonl"):
            assert not _leaks(file.read_bytes().decode("utf-8", "replace")), file.name


def _refused_quietly(call: Any) -> BaseException:
    """What `call()` raised (it must raise), checked to hold no more of the secret than allowed."""
    try:
        call()
    except (sessionlog.SessionLogError, ValueError, TypeError, RuntimeError) as error:
        leaked = [text for text in _error_texts(error) if _leaks(text)]
        assert not leaked, leaked[0]
        return error
    raise AssertionError(f"{call} accepted the secret")


def test_a_secret_given_to_the_runtime_in_a_wrong_argument_shows_at_most_its_public_prefix(
    tmp_path: Path,
) -> None:
    def read(arguments: dict[str, Any]) -> str:
        return "contents"

    _refused_quietly(lambda: sessionlog.Tool(SECRET, read, replay=SECRET))  # type: ignore[arg-type]
    _refused_quietly(lambda: sessionlog.Tool("read", read, replay=SECRET))  # type: ignore[arg-type]
    _refused_quietly(lambda: sessionlog.Tools([sessionlog.Tool(SECRET, read), sessionlog.Tool(SECRET, read)]))
    tools = [sessionlog.Tool("read", read, replay="safe")]
    with sessionlog.create(tmp_path / "s.jsonl", **HEADER) as store:
        session = sessionlog.Session(store, tools=tools, model="m")
        run = session.start("hello")
        attempt = run.attempt()
        _refused_quietly(lambda: attempt.settle("x", stop_reason=SECRET))
        _refused_quietly(lambda: attempt.settle("x", usage={"input": SECRET}))  # type: ignore[dict-item]
        _refused_quietly(lambda: store.commit([{**_user("x"), SECRET: b"not JSON"}]))
        _refused_quietly(lambda: store.commit([{**_user("x"), "extra": {"deeper": {SECRET: float("nan")}}}]))
        _refused_quietly(lambda: store.commit([{**_user("x"), "extra": [{SECRET + "2": 1 << 70}]}]))
        attempt.settle(None, [{"id": "call_1", "name": SECRET, "arguments": {}}])  # any name a model says
        (synthetic,) = run.start_tools() or [None]  # an unknown tool: settled, never run
        assert synthetic is None
    _refused_quietly(lambda: sessionlog.open(tmp_path / "s.jsonl", "jsonl", max_line_bytes=SECRET))  # type: ignore[arg-type]
    _refused_quietly(lambda: sessionlog.open(tmp_path / "s.jsonl", SECRET))
    _refused_quietly(lambda: sessionlog.repository(tmp_path / "repo", backend=SECRET))
    _refused_quietly(lambda: sessionlog.repository(f"sqlite:///{tmp_path / 'a.db'}", durability=SECRET))
    pytest.importorskip("psycopg", reason="the PostgreSQL repository's arguments need its driver")
    _refused_quietly(lambda: sessionlog.repository("postgresql://u@127.0.0.1:1/x", durability=SECRET))
    _refused_quietly(lambda: sessionlog.repository("postgresql://u@127.0.0.1:1/x", lease_seconds=SECRET))
    _refused_quietly(lambda: sessionlog.open(tmp_path / "s.jsonl", "jsonl", unsafe_no_lock=SECRET))

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

import sessionlog

# This user's snapshot key (core/snapshot_key.py) is the tests' own, made in a folder of theirs
# (set before the xdist workers and every subprocess start, so all of them share it), never the
# one in ~/.local/state of whoever runs them.
if "SESSIONLOG_STATE_DIR" not in os.environ:
    os.environ["SESSIONLOG_STATE_DIR"] = tempfile.mkdtemp(prefix="sessionlog-tests-state-")
    atexit.register(shutil.rmtree, os.environ["SESSIONLOG_STATE_DIR"], True)

# the conformance suite's fixtures (opt-in); seeds and reruns (tests/replay.py)
pytest_plugins = ["sessionlog.testing.plugin", "replay"]

# The shared contract (another project's data, read in place, never copied): ../shared/contract,
# or the folder SESSIONLOG_CONTRACT names. Absent, its tests are skipped, and said so loudly (the
# header and the summary count them); SESSIONLOG_REQUIRE_CONTRACT=1 (CI) makes that a failure.
CONTRACT = Path(
    os.environ.get("SESSIONLOG_CONTRACT") or Path(__file__).resolve().parents[2] / "shared" / "contract"
)
SHARED = CONTRACT / "schemas" / "session"
FIXTURES = SHARED / "fixtures"
ABSENT = f"the shared contract fixtures are absent ({FIXTURES}): point SESSIONLOG_CONTRACT at shared/contract"
PLANNER_FIXTURES = SHARED / "planner-fixtures"
OWN_FIXTURES = Path(__file__).resolve().parent / "fixtures"

# The backends whose session is a file at its path: the file harnesses (kill -9, power loss, I/O
# faults, hostile paths) read and damage those files. The SQLite backends have their own crash
# and full-disk tests (test_crash.py, test_repository.py), through the same database code.
FILE_BACKENDS = [name for name, info in sessionlog.backends().items() if info.plain_file]

# -- how long the crash and fault harnesses run ---------------------------------------------------
# Each harness runs twice over: a short run in the default test command (every kind of kill or
# fault, a few times), and a long one behind the `long` marker, which CI selects (`pytest -m
# long`); SESSIONLOG_SOAK=1 makes the long run a soak.
SOAK = os.environ.get("SESSIONLOG_SOAK") == "1"


def budgets(short: int, long: int, soak: int | None = None) -> list[Any]:
    """The sizes a harness test is parametrized with: `short` always, `long` (or `soak` under
    SESSIONLOG_SOAK=1) marked `long`."""
    big = soak if SOAK and soak is not None else long
    return [
        pytest.param(short, id=f"short-{short}"),
        pytest.param(big, id=f"long-{big}", marks=pytest.mark.long),
    ]


def wait_for(condition: Callable[[], Any], what: str, seconds: float = 120) -> None:
    """Poll until `condition()` is true: tests wait for conditions, never for a time. `seconds`
    only bounds a hang, however loaded the machine; the failure says what was waited for."""
    started = time.monotonic()
    while not condition():
        took = time.monotonic() - started
        assert took < seconds, f"waited {took:.0f} s for {what}"
        time.sleep(0.05)


needs_shared = pytest.mark.skipif(not FIXTURES.is_dir(), reason=ABSENT)


def shared_manifest(folder: Path) -> list[Any]:
    """Manifest entries of a shared fixture folder; when it is absent, one skipped case saying
    so (so that the summary counts it, instead of an empty parametrization nobody sees)."""
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return [pytest.param({"name": "absent"}, id="absent", marks=pytest.mark.skip(reason=ABSENT))]
    return json.loads(manifest.read_text())["fixtures"]  # type: ignore[no-any-return]


def pytest_configure(config: pytest.Config) -> None:
    if not FIXTURES.is_dir() and os.environ.get("SESSIONLOG_REQUIRE_CONTRACT"):
        raise pytest.UsageError(f"SESSIONLOG_REQUIRE_CONTRACT is set and {ABSENT}")


def pytest_report_header(config: pytest.Config) -> str:
    if FIXTURES.is_dir():
        return f"contract fixtures: {FIXTURES}"
    return f"CONTRACT FIXTURES ABSENT: {ABSENT}; every contract test is skipped"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIXTURES.is_dir():
        return
    skipped = [
        report
        for report in terminalreporter.stats.get("skipped", [])
        if "fixtures are absent" in str(getattr(report, "longrepr", ""))
    ]
    if not skipped:
        return  # no contract test was selected: nothing to say
    terminalreporter.write_line(
        f"{len(skipped)} contract tests were skipped, each standing for every fixture of the "
        f"contract: {ABSENT}",
        red=True,
        bold=True,
    )


# -- shared by the async tests -------------------------------------------------------------------

ASYNC_BACKENDS = ("jsonl-async", "jsonl-group", "jsonl-syncfs")
HEADER: dict[str, Any] = {
    "provider": "openrouter",
    "model": "test/model",
    "cwd": "/workspace",
    "environment_identity": "t",
}
T = TypeVar("T")


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(main())


# A configuration snapshot declaring `read` and `write`, shared by the core and recovery tests.
SNAPSHOT = {
    "model": "m",
    "systemPromptDigest": "sha256:" + "0" * 64,
    "tools": [
        {"name": "read", "definitionDigest": "sha256:" + "1" * 64},
        {"name": "write", "definitionDigest": "sha256:" + "2" * 64},
    ],
    "adapterIdentity": "adapter",
    "routingIdentity": "routing",
    "outputOptionsDigest": "sha256:" + "0" * 64,
}


# -- the command line, run in-process ---------------------------------------------------------------


class Run:
    """One in-process run of the command line."""

    def __init__(self, capsys: pytest.CaptureFixture[str], argv: list[str], registry: Any) -> None:
        from sessionlog.cli import main

        self.code = main([str(arg) for arg in argv], registry=registry)
        captured = capsys.readouterr()
        self.out, self.err = captured.out, captured.err

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Any:
    def run(*argv: Any, registry: Any = None) -> Run:
        return Run(capsys, list(argv), registry)

    return run


# -- PostgreSQL: one throwaway server for the whole run ------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Any:
    """`tiny_disk(size)`: a folder under `tmp_path` with a tmpfs of `size` mounted on it, to fill
    for real ENOSPC; the test is skipped with the reason where none can be mounted (not root).
    Unmounted when the test ends."""
    from sessionlog.testing.faults import mount_tiny_tmpfs, unmount

    mounted: list[Path] = []

    def mount(size: str = "256k", name: str = "tiny") -> Path:
        folder = tmp_path / name
        folder.mkdir()
        why = mount_tiny_tmpfs(folder, size)
        if why is not None:
            pytest.skip(f"no small filesystem to fill here: {why}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        unmount(folder)


def start_postgres() -> Any:
    """A throwaway PostgreSQL cluster (`sessionlog.testing.postgres`). Skipped with the reason when
    none can be had here, unless SESSIONLOG_REQUIRE_POSTGRES is set (CI): then it fails."""
    from sessionlog.testing.postgres import PostgresServer, PostgresUnavailable

    try:
        return PostgresServer.start()
    except (PostgresUnavailable, ModuleNotFoundError) as error:
        if os.environ.get("SESSIONLOG_REQUIRE_POSTGRES"):
            pytest.fail(f"PostgreSQL is required (SESSIONLOG_REQUIRE_POSTGRES) and cannot start: {error}")
        pytest.skip(f"no PostgreSQL server can be started here: {error}")


@pytest.fixture(scope="session")
def postgres_server() -> Any:
    """The tests' shared throwaway server (`start_postgres`)."""
    server = start_postgres()
    yield server
    server.stop()

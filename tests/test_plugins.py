"""Backends found through pluggy: a plugin registered from this module runs the whole conformance
suite with no other change; unknown names, the wrong API, builtins through the same hook,
entry-point plugins, independent registries."""

from __future__ import annotations

import asyncio
import errno
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, ClassVar

import pytest

import sessionlog
from conftest import FIXTURES
from sessionlog.backends import jsonl
from sessionlog.core.facts import user_message
from sessionlog.core.store import BackendInfo
from sessionlog.plugins.hookspecs import Register, hookimpl
from sessionlog.plugins.registry import Registry, plugin_manager
from sessionlog.testing import AsyncStoreContract, StoreContract, contract_classes
from sessionlog.testing.plugin import Harness

# -- a tiny in-memory backend, sync and async --------------------------------------------------

_STORED: dict[str, bytearray] = {}
_OPEN: set[str] = set()


class MemoryBackend:
    """The session's bytes in a dict: the whole backend contract, and nothing durable."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.closed = False

    def read(self) -> bytes:
        return bytes(_STORED[self.key])

    def truncate(self, length: int) -> None:
        del _STORED[self.key][length:]

    def append(self, line: bytes) -> None:
        _STORED[self.key] += line

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            _OPEN.discard(self.key)


class AsyncMemoryBackend:
    def __init__(self, key: str) -> None:
        self._sync = MemoryBackend(key)

    async def read(self) -> bytes:
        return self._sync.read()

    async def truncate(self, length: int) -> None:
        self._sync.truncate(length)

    async def append_batch(self, lines: list[bytes]) -> None:
        await asyncio.sleep(0)  # let concurrent commits queue up behind this batch
        self._sync.append(b"".join(lines))

    async def close(self) -> None:
        self._sync.close()


def _claim(path: Path, create: bytes | None, options: dict[str, Any]) -> str:
    if options:
        raise TypeError(f"unknown backend options: {', '.join(sorted(options))}")
    key = str(path)
    if create is not None:
        if key in _STORED:
            raise sessionlog.SessionExistsError(errno.EEXIST, f"a session already exists: {key}", key)
        _STORED[key] = bytearray(create)
    elif key not in _STORED:
        raise sessionlog.SessionNotFoundError(errno.ENOENT, f"no session at {key}", key)
    if key in _OPEN:
        raise sessionlog.SessionLockedError(f"{key} is already open for writing")
    _OPEN.add(key)
    return key


def open_memory(path: Path, *, create: bytes | None = None, **options: Any) -> MemoryBackend:
    return MemoryBackend(_claim(path, create, options))


async def open_memory_async(path: Path, *, create: bytes | None = None, **options: Any) -> AsyncMemoryBackend:
    return AsyncMemoryBackend(_claim(path, create, options))


MEMORY = BackendInfo(
    "memory", "process", "sync", "bytes in a dict (tests only: nothing survives the process)"
)
MEMORY_ASYNC = BackendInfo("memory-async", "process", "async", "bytes in a dict, async (tests only)")


@hookimpl
def register_backends(register: Register) -> None:
    register(MEMORY.name, open_memory, MEMORY)
    register(MEMORY_ASYNC.name, open_memory_async, MEMORY_ASYNC)


REGISTRY = Registry(plugin_manager(plugins=[sys.modules[__name__]]))


class MemoryCapabilities:
    """What the memory backends cannot do, and how the suite reaches their bytes."""

    registry: ClassVar[Registry | None] = REGISTRY
    fixture_dir: ClassVar[Path | None] = FIXTURES
    unsupported: ClassVar[dict[str, str]] = {
        "files": "the session is not a file",
        "flock": "no other process can see the dict",
        "file_ops": "no FileOps seam to inject write or sync failures",
    }

    def raw_bytes(self, path: Path) -> bytes:
        return bytes(_STORED[str(path)])

    def write_raw(self, path: Path, data: bytes) -> None:
        _STORED[str(path)] = bytearray(data)


class TestMemoryBackend(MemoryCapabilities, StoreContract):
    backend = "memory"


class TestMemoryAsyncBackend(MemoryCapabilities, AsyncStoreContract):
    backend = "memory-async"


def test_the_registered_plugin_is_picked_up_by_the_generated_suite() -> None:
    classes = contract_classes(REGISTRY)
    assert issubclass(classes["TestMemory"], StoreContract) and classes["TestMemory"].backend == "memory"
    assert issubclass(classes["TestMemoryAsync"], AsyncStoreContract)
    assert {"TestJsonl", "TestJsonlFsync"} <= set(classes)  # the builtins come along
    assert "TestMemory" not in contract_classes()  # the default registry knows nothing of it


# -- the registry --------------------------------------------------------------------------------


def test_backends_describe_their_durability_and_api() -> None:
    registered = sessionlog.backends()
    assert registered["jsonl"] == BackendInfo(
        "jsonl", "process", "sync", registered["jsonl"].description, plain_file=True
    )
    assert (registered["jsonl-fsync"].durability, registered["jsonl-fsync"].api) == ("power", "sync")
    for name, info in registered.items():
        assert info.name == name and info.durability in ("process", "power") and info.api in ("sync", "async")
    assert "nope" not in registered and registered.get("nope") is None


def test_unknown_backend_lists_the_names(tmp_path: Path) -> None:
    with pytest.raises(sessionlog.UnknownBackendError) as caught:
        sessionlog.open(tmp_path / "s.jsonl", backend="nope")
    error = caught.value
    assert isinstance(error, LookupError) and isinstance(error, sessionlog.SessionLogError)
    assert error.name == "nope" and {"jsonl", "jsonl-fsync"} <= set(error.known)
    assert "a string of 4 characters starting 'n'" in str(error) and "jsonl, " in str(error)  # shown()
    assert "jsonl-fsync" in str(error)
    with pytest.raises(sessionlog.UnknownBackendError, match="memory"):
        sessionlog.create(tmp_path / "s.jsonl", backend="nope", provider="p", model="m", registry=REGISTRY)
    with pytest.raises(LookupError):
        asyncio.run(sessionlog.open_async(tmp_path / "s.jsonl", backend="nope"))
    assert not (tmp_path / "s.jsonl").exists()


@pytest.mark.parametrize(("sync", "async_"), [("jsonl", "jsonl-async"), ("memory", "memory-async")])
def test_the_wrong_api_is_a_type_error(tmp_path: Path, sync: str, async_: str) -> None:
    path = tmp_path / "s.jsonl"
    registry = REGISTRY if sync == "memory" else None
    if async_ not in sessionlog.backends(registry):
        pytest.skip(f"{async_} is not registered in this build")
    with pytest.raises(TypeError, match="open_async"):
        sessionlog.create(path, backend=async_, provider="p", model="m", registry=registry)
    with pytest.raises(TypeError, match="open_async"):
        sessionlog.open(path, backend=async_, registry=registry)
    with pytest.raises(TypeError, match=r"sessionlog\.open / create"):
        asyncio.run(sessionlog.create_async(path, backend=sync, provider="p", model="m", registry=registry))
    with pytest.raises(TypeError, match=r"sessionlog\.open / create"):
        asyncio.run(sessionlog.open_async(path, backend=sync, registry=registry))
    assert not path.exists() and str(path) not in _STORED  # refused before anything was made


def test_the_suite_refuses_a_backend_of_the_other_api(tmp_path: Path) -> None:
    class Mismatched(StoreContract):
        backend = "memory-async"
        registry = REGISTRY

    with pytest.raises(TypeError, match="AsyncStoreContract"):
        Harness(Mismatched(), tmp_path)


def test_builtins_load_through_the_same_hook(tmp_path: Path) -> None:
    bare = Registry(plugin_manager(builtins=False, entry_points=False))
    assert len(bare) == 0 and "jsonl" not in bare
    with pytest.raises(sessionlog.UnknownBackendError, match="registered: none"):
        sessionlog.create(tmp_path / "s.jsonl", provider="p", model="m", registry=bare)
    manager = plugin_manager(entry_points=False)
    assert manager.get_plugin("sessionlog.backends.jsonl") is jsonl  # a default plugin, by module name
    assert {"jsonl", "jsonl-fsync"} <= set(Registry(manager))
    only_jsonl = Registry(plugin_manager(builtins=False, entry_points=False, plugins=[jsonl]))
    assert list(only_jsonl) == ["jsonl"]
    with sessionlog.create(tmp_path / "s.jsonl", provider="p", model="m", registry=only_jsonl) as store:
        store.commit([user_message("through the hook")])


def test_a_backend_registered_twice_is_refused() -> None:
    class Again:
        @hookimpl
        def register_backends(self, register: Register) -> None:
            register("jsonl", jsonl.open_jsonl, jsonl.INFO)

    with pytest.raises(ValueError, match="registered twice"):
        Registry(plugin_manager(entry_points=False, plugins=[Again()]))


_ENTRY_POINT_PLUGIN = """
from sessionlog.backends.jsonl import open_jsonl
from sessionlog.core.store import BackendInfo
from sessionlog.plugins.hookspecs import hookimpl

@hookimpl
def register_backends(register):
    register("ep-jsonl", open_jsonl, BackendInfo("ep-jsonl", "process", "sync", "jsonl, via an entry point"))
"""


def _fake_distribution(root: Path) -> None:
    """An installed distribution on sys.path whose entry point names a sessionlog plugin."""
    root.mkdir()
    (root / "fake_sessionlog_plugin.py").write_text(_ENTRY_POINT_PLUGIN)
    info = root / "fake_sessionlog_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-sessionlog-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[sessionlog]\nep-jsonl = fake_sessionlog_plugin\n")


def test_entry_point_plugins_are_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_distribution(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    registry = Registry(plugin_manager())
    assert registry["ep-jsonl"].description == "jsonl, via an entry point"
    assert "ep-jsonl" not in Registry(plugin_manager(entry_points=False))
    path = tmp_path / "s.jsonl"
    with sessionlog.create(path, backend="ep-jsonl", provider="p", model="m", registry=registry) as store:
        store.commit([user_message("hello")])
    assert contract_classes(registry)["TestEpJsonl"].backend == "ep-jsonl"


def test_registries_are_independent() -> None:
    default = sessionlog.backends()
    first = Registry(plugin_manager(plugins=[sys.modules[__name__]]))
    second = Registry(plugin_manager())
    assert "memory" in first and "memory" not in second and "memory" not in default
    assert first is not REGISTRY and first.factory("memory") is REGISTRY.factory("memory")
    assert sessionlog.backends() is default  # nothing was reloaded or mutated
    assert set(second) == set(default)


def test_the_pytest_plugin_is_opt_in(tmp_path: Path) -> None:
    """Installing sessionlog adds nothing to another project's pytest run: not the plugin, not
    sessionlog, not asyncio."""
    (tmp_path / "test_other.py").write_text(
        textwrap.dedent(
            """
            import sys

            def test_nothing_of_sessionlog_is_loaded(request):
                assert not request.config.pluginmanager.has_plugin("sessionlog.testing.plugin")
                assert "sessionlog" not in sys.modules
            """
        )
    )
    done = _pytest_in(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def _pytest_in(folder: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """A pytest run of its own in `folder`, as another project would run it."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *arguments],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_import_sessionlog_loads_no_asyncio() -> None:
    code = "import sys, sessionlog; print('asyncio' in sys.modules, 'aiofiles' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]


def test_a_third_party_runs_the_suite_with_one_line(tmp_path: Path) -> None:
    """Outside this repository: the opt-in plugin line, then one class."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["sessionlog.testing.plugin"]\n')
    (tmp_path / "test_mine.py").write_text(
        textwrap.dedent(
            """
            from sessionlog.testing import StoreContract

            class TestMine(StoreContract):
                backend = "jsonl"
            """
        )
    )
    done = _pytest_in(tmp_path, "-rs", "-k", "torn_tail or shared")
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout and "failed" not in done.stdout
    assert "no fixture_dir set on the contract class" in done.stdout  # a skip with its reason

"""pytest plugin, opt-in (`pytest_plugins = ["sessionlog.testing.plugin"]` in a conftest.py):
fixtures of the sessionlog conformance suite.

`sessionlog_harness` gives a test of a `StoreContract` / `AsyncStoreContract` subclass a
`Harness`: it builds stores of the class's `backend`, looked up in the class's `registry` (the
default registry when that is None), in the test's `tmp_path`, and reaches the stored bytes
through the class's `raw_bytes` / `write_raw` hooks. Sync stores it built are closed at teardown.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pytest

from ..core.store import BackendInfo, SessionStore
from ..opening import create, create_async, open, open_async
from ..plugins.registry import Registry, default_registry
from .blocking import Blocking

if TYPE_CHECKING:
    from ..core.async_store import AsyncSessionStore

_T = TypeVar("_T")
PROVIDER = "openrouter"
MODEL = "test/model"
CWD = "/workspace"
ENVIRONMENT = "suite"


class Contract(Protocol):
    """What a harness needs of a contract class (`suite.ContractBase` and its subclasses)."""

    api: str
    backend: str
    registry: Registry | None
    options: Mapping[str, Any]
    unsupported: Mapping[str, str]

    def session_path(self, directory: Path, name: str) -> Path: ...
    def raw_bytes(self, path: Path) -> bytes: ...
    def write_raw(self, path: Path, data: bytes) -> None: ...


# Opens a session with lock=True in a fresh interpreter, where the in-process writer guard
# cannot answer for the lock: prints "locked: <message>" or "opened".
_CHILD = """
import asyncio, importlib, sys
import sessionlog
from sessionlog.plugins.registry import Registry, plugin_manager

path, backend, module = sys.argv[1:4]
registry = Registry(plugin_manager(plugins=[importlib.import_module(module)])) if module else None
try:
    if sessionlog.backends(registry)[backend].api == "sync":
        sessionlog.open(path, backend=backend, registry=registry, lock=True).close()
    else:
        async def main():
            store = await sessionlog.open_async(path, backend=backend, registry=registry, lock=True)
            await store.close()
        asyncio.run(main())
except sessionlog.SessionLockedError as error:
    print("locked:", error)
else:
    print("opened")
"""


class _Harness:
    """Stores of one backend in one test's temporary directory."""

    api = "sync"

    def __init__(self, contract: Contract, directory: Path) -> None:
        self.contract = contract
        self.backend = contract.backend
        if not self.backend:
            raise TypeError(f"{type(contract).__name__} must set `backend` to a registered backend name")
        self.registry: Registry = contract.registry if contract.registry is not None else default_registry()
        self.info: BackendInfo = self.registry.info(self.backend)
        if self.info.api != self.api:
            mixin = "AsyncStoreContract" if self.info.api == "async" else "StoreContract"
            raise TypeError(f"backend {self.backend!r} is {self.info.api}: test it with {mixin}")
        self.directory = directory
        self.path = contract.session_path(directory, "session.jsonl")

    def new_path(self, name: str) -> Path:
        """Another session location in the same directory."""
        return self.contract.session_path(self.directory, name)

    def require(self, capability: str) -> None:
        """Skip the test, with the class's reason, when the backend lacks `capability`."""
        reason = self.contract.unsupported.get(capability)
        if reason is not None:
            pytest.skip(f"{self.backend}: no {capability!r} capability: {reason}")

    def _options(self, options: dict[str, Any]) -> dict[str, Any]:
        return {**self.contract.options, **options}

    def raw(self, path: Path | None = None) -> bytes:
        """Every byte the backend stores for the session."""
        self.require("raw")
        return self.contract.raw_bytes(path or self.path)

    def write_raw(self, data: bytes, path: Path | None = None) -> None:
        """Replace what the backend stores for the session (it must not be open)."""
        self.require("raw")
        self.contract.write_raw(path or self.path, data)

    def open_in_child(self, path: Path | None = None) -> str:
        """Open the session with `lock=True` from another process; "locked: ..." or "opened"."""
        module = ""
        if self.backend not in default_registry():
            module = self.registry.factory(self.backend).__module__
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(entry for entry in sys.path if entry))
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(path or self.path), self.backend, module],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(f"the child process failed:\n{done.stderr}")
        return done.stdout.strip()


class Harness(_Harness):
    """Sync stores; the ones it built are closed at teardown."""

    def __init__(self, contract: Contract, directory: Path) -> None:
        super().__init__(contract, directory)
        self._stores: list[Any] = []

    def create(self, path: Path | None = None, **options: Any) -> SessionStore:
        store = create(
            path or self.path,
            backend=self.backend,
            provider=PROVIDER,
            model=MODEL,
            cwd=CWD,
            environment_identity=ENVIRONMENT,
            registry=self.registry,
            **self._options(options),
        )
        self._stores.append(store)
        return store

    def open(self, path: Path | None = None, **options: Any) -> SessionStore:
        store = open(
            path or self.path, backend=self.backend, registry=self.registry, **self._options(options)
        )
        self._stores.append(store)
        return store

    def close_all(self) -> None:
        for store in self._stores:
            with contextlib.suppress(Exception):  # a store under test may fail to close: reported
                store.close()


class AsyncHarness(Harness):
    """The same test bodies for async backends: `create` and `open` give a `Blocking` store, whose
    every call runs the async store's coroutine to completion on this harness's event loop (one
    per test). `run` runs a coroutine there, for the tests that are async by nature
    (`create_async` / `open_async` give the stores themselves)."""

    api = "async"

    def __init__(self, contract: Contract, directory: Path) -> None:
        super().__init__(contract, directory)
        self.loop = asyncio.new_event_loop()

    def run(self, awaitable: Awaitable[_T]) -> _T:
        return self.loop.run_until_complete(awaitable)

    async def create_async(self, path: Path | None = None, **options: Any) -> AsyncSessionStore:
        return await create_async(
            path or self.path,
            backend=self.backend,
            provider=PROVIDER,
            model=MODEL,
            cwd=CWD,
            environment_identity=ENVIRONMENT,
            registry=self.registry,
            **self._options(options),
        )

    async def open_async(self, path: Path | None = None, **options: Any) -> AsyncSessionStore:
        return await open_async(
            path or self.path, backend=self.backend, registry=self.registry, **self._options(options)
        )

    def create(self, path: Path | None = None, **options: Any) -> Any:
        store = Blocking(self.run(self.create_async(path, **options)), self.loop)
        self._stores.append(store)
        return store

    def open(self, path: Path | None = None, **options: Any) -> Any:
        store = Blocking(self.run(self.open_async(path, **options)), self.loop)
        self._stores.append(store)
        return store

    def close_all(self) -> None:
        super().close_all()
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()


@pytest.fixture
def sessionlog_harness(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A `Harness` (or `AsyncHarness`) for the requesting contract class."""
    contract = request.instance
    if contract is None or not hasattr(contract, "backend"):
        raise TypeError("sessionlog_harness serves methods of StoreContract / AsyncStoreContract subclasses")
    harness = AsyncHarness(contract, tmp_path) if contract.api == "async" else Harness(contract, tmp_path)
    yield harness
    harness.close_all()

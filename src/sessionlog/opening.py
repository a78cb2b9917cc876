"""Opening sessions by backend name: `create`, `open`, `create_async`, `open_async`, `backends`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

# Import the subpackage `sessionlog.backends` before `sessionlog/__init__.py` binds the function
# `backends`: the first import of a subpackage sets the parent's attribute, so the registry's later
# import of `sessionlog.backends.jsonl` would otherwise replace the function with the package.
from . import backends as _backend_modules  # noqa: F401
from .core.commit import encode_header
from .core.errors import ContractError, SessionExistsError, ValidationError
from .core.framing import DEFAULT_MAX_LINE_BYTES
from .core.reducer import validate_header
from .core.store import BackendInfo, SessionStore, check_max_line_bytes
from .plugins.registry import Registry, default_registry

if TYPE_CHECKING:
    from .core.async_store import AsyncSessionStore


def backends(registry: Registry | None = None) -> Mapping[str, BackendInfo]:
    """Every registered backend: name -> BackendInfo (durability class, sync or async)."""
    return registry if registry is not None else default_registry()


def _resolve(backend: str, api: str, registry: Registry | None) -> tuple[Any, BackendInfo]:
    registry = registry if registry is not None else default_registry()
    info = registry.info(backend)
    if info.api != api:
        other = "open_async / create_async" if info.api == "async" else "open / create"
        raise TypeError(f"backend {backend!r} is {info.api}: use sessionlog.{other}")
    return registry.factory(backend), info


def new_header(
    provider: str, model: str, cwd: str | None, environment_identity: str | None, session_id: str | None
) -> bytes:
    """The header line of a new session, validated as a reader will: nothing is created unless
    it is one (ValidationError, code INVALID_HEADER)."""
    cwd = cwd if cwd is not None else os.getcwd()
    try:
        header = encode_header(
            session_id=session_id,
            cwd=cwd,
            provider=provider,
            model=model,
            environment_identity=environment_identity if environment_identity is not None else cwd,
        )
        validate_header(orjson.loads(header))
    except TypeError as error:
        raise ValidationError("INVALID_HEADER", 1, None, f"not encodable as JSON: {error}") from None
    except ContractError as error:
        raise ValidationError(error.code, 1, None, error.detail) from None
    return header


def create(
    path: str | os.PathLike[str],
    backend: str = "jsonl",
    *,
    provider: str,
    model: str,
    cwd: str | None = None,
    environment_identity: str | None = None,
    session_id: str | None = None,
    registry: Registry | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    exist_ok: bool = False,
    **options: Any,
) -> SessionStore:
    """Create a new session atomically; SessionExistsError if one is there already (with
    `exist_ok=True`, open that one instead, as `open` does). `max_line_bytes`: the longest line
    the store reads (a longer one is CorruptionError) and writes (a longer commit is
    ValidationError); default 64 MiB."""
    header = new_header(provider, model, cwd, environment_identity, session_id)
    try:
        return _open_sync(path, backend, header, registry, max_line_bytes, options)
    except SessionExistsError:
        if not exist_ok:
            raise
    return _open_sync(path, backend, None, registry, max_line_bytes, options)


def open(
    path: str | os.PathLike[str],
    backend: str = "jsonl",
    *,
    registry: Registry | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    **options: Any,
) -> SessionStore:
    """Open an existing session: repairs a torn tail, refuses a corrupted log (CorruptionError)."""
    return _open_sync(path, backend, None, registry, max_line_bytes, options)


def _open_sync(
    path: str | os.PathLike[str],
    backend: str,
    header: bytes | None,
    registry: Registry | None,
    max_line_bytes: int,
    options: dict[str, Any],
) -> SessionStore:
    factory, info = _resolve(backend, "sync", registry)
    check_max_line_bytes(max_line_bytes)  # every argument is checked before the disk is touched
    path = Path(path)
    return SessionStore.open_backend(
        factory(path, create=header, **options), path, info, max_line_bytes=max_line_bytes
    )


async def _open_async(
    path: str | os.PathLike[str],
    backend: str,
    header: bytes | None,
    registry: Registry | None,
    max_line_bytes: int,
    options: dict[str, Any],
) -> AsyncSessionStore:
    from .core.async_store import AsyncSessionStore

    factory, info = _resolve(backend, "async", registry)
    path = Path(path)
    check_max_line_bytes(max_line_bytes)  # every argument is checked before the disk is touched
    store_options, backend_options = AsyncSessionStore.split_options(options)
    AsyncSessionStore.check_options(store_options)
    opened = await factory(path, create=header, **backend_options)
    return await AsyncSessionStore.open_backend(
        opened, path, info, max_line_bytes=max_line_bytes, **store_options
    )


async def create_async(
    path: str | os.PathLike[str],
    backend: str = "jsonl-async",
    *,
    provider: str,
    model: str,
    cwd: str | None = None,
    environment_identity: str | None = None,
    session_id: str | None = None,
    registry: Registry | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    exist_ok: bool = False,
    **options: Any,
) -> AsyncSessionStore:
    """`create` for async backends."""
    header = new_header(provider, model, cwd, environment_identity, session_id)
    try:
        return await _open_async(path, backend, header, registry, max_line_bytes, options)
    except SessionExistsError:
        if not exist_ok:
            raise
    return await _open_async(path, backend, None, registry, max_line_bytes, options)


async def open_async(
    path: str | os.PathLike[str],
    backend: str = "jsonl-async",
    *,
    registry: Registry | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    **options: Any,
) -> AsyncSessionStore:
    """`open` for async backends."""
    return await _open_async(path, backend, None, registry, max_line_bytes, options)


def read_stored(path: str | os.PathLike[str], backend: str, registry: Registry | None = None) -> bytes:
    """Every stored byte of the session at `path`, read-only (a torn tail included, nothing cut):
    the file itself for a plain-file backend, else the backend's own read path, opened, read and
    closed, without the writer's hold where the backend can (`BackendInfo.opens_read_only`;
    otherwise it is opened as a writer would open it)."""
    from .backends.jsonl_file import read_session_file

    registry = registry if registry is not None else default_registry()
    info = registry.info(backend)
    if info.plain_file:
        return read_session_file(path)
    factory = registry.factory(backend)
    options = {"read_only": True} if info.opens_read_only else {}
    if info.api == "sync":
        opened = factory(Path(path), create=None, **options)
        try:
            return bytes(opened.read())
        finally:
            opened.close()

    async def read_async() -> bytes:
        opened = await factory(Path(path), create=None, **options)
        try:
            return bytes(await opened.read())
        finally:
            await opened.close()

    import asyncio

    return asyncio.run(read_async())

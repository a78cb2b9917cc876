"""Hook specifications. A plugin is any module or object with `@hookimpl` functions.

A third-party backend ships a module like::

    from sessionlog.plugins.hookspecs import hookimpl
    from sessionlog.core.store import BackendInfo

    @hookimpl
    def register_backends(register):
        register("mine", open_mine, BackendInfo("mine", "process", "sync", "my medium"))

and names it under the entry-point group `sessionlog` in its package metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

PROJECT = "sessionlog"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

Register = Callable[[str, Callable[..., Any], Any], None]


@hookspec
def register_backends(register: Register) -> None:
    """Call `register(name, factory, info)` once per backend this plugin provides.

    `factory(path, *, create: bytes | None, **options)` opens the session at `path`, or creates
    it atomically holding the header line `create`; sync backends return a `SyncBackend`, async
    ones are coroutines returning an `AsyncBackend`. `info` is a `BackendInfo`."""


@hookspec
def register_repositories(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Call `register(scheme, factory)` once per kind of repository this plugin provides:
    `sessionlog.repository("scheme://rest", **options)` calls `factory(rest, **options)`. A
    location without `://` is a directory (`file`)."""

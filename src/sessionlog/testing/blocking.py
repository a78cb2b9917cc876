"""Async objects driven from plain code, so that one test body runs through the sync and the
async API alike (as fsspec's abstract tests do): `Blocking(thing, loop)` runs every awaitable a
method of `thing` returns to completion on `loop`, and wraps what comes back when it is itself
an async store or repository. Calls come from the thread that owns `loop`, one at a time."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any


class Blocking:
    def __init__(self, thing: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._thing = thing
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._thing, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            result = value(*args, **kwargs)
            if inspect.isawaitable(result):
                result = self._loop.run_until_complete(result)
            return Blocking(result, self._loop) if _is_async(result) else result

        return call

    def __enter__(self) -> Blocking:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Blocking({self._thing!r})"


def _is_async(value: Any) -> bool:
    """An async store or repository: its `close` is a coroutine function."""
    return inspect.iscoroutinefunction(getattr(value, "close", None))

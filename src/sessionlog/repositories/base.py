"""What every repository offers on top of its own methods: the runtime's session, open or new."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..runtime import Session
    from ..runtime_async import AsyncSession
    from ..tools import Tool, Tools


class RepositoryBase:
    """Mixed into the sync repositories (`create` and `open` are theirs)."""

    def session(
        self,
        session_id: str | None = None,
        *,
        tools: Tools | Iterable[Tool],
        model: str,
        provider: str = "sessionlog",
        labels: Iterable[str] = (),
        **options: Any,
    ) -> Session:
        """The agent loop (`sessionlog.Session`) on session `session_id`, opened for writing, or
        on a new session when it is None (`provider`, `labels` for it). `options` go to `Session`."""
        from ..runtime import Session

        if session_id is None:
            store = self.create(provider=provider, model=model, labels=labels)  # type: ignore[attr-defined]
        else:
            store = self.open(session_id)  # type: ignore[attr-defined]
        return Session(store, tools=tools, model=model, **options)


class AsyncRepositoryBase:
    """The same for the async repositories."""

    async def session(
        self,
        session_id: str | None = None,
        *,
        tools: Tools | Iterable[Tool],
        model: str,
        provider: str = "sessionlog",
        labels: Iterable[str] = (),
        **options: Any,
    ) -> AsyncSession:
        from ..runtime_async import AsyncSession

        if session_id is None:
            store = await self.create(provider=provider, model=model, labels=labels)  # type: ignore[attr-defined]
        else:
            store = await self.open(session_id)  # type: ignore[attr-defined]
        return AsyncSession(store, tools=tools, model=model, **options)

"""sessionlog: durable agent sessions as an append-only transactional log.

Every accepted prompt, model attempt, tool intent, tool result, usage figure and outcome is a fact,
written before the effect it describes, in the canonical v2 session contract of tiny-agent.
"""

from typing import TYPE_CHECKING, Any

from . import schema
from .core.canonical import canonical, configuration_digest, source_digest
from .core.commit import encode_header
from .core.errors import (
    CommitOutcomeUnknownError,
    ConfigurationError,
    ContractError,
    CorruptionError,
    DurabilityUnavailableError,
    ReentrantCallError,
    RepositoryError,
    RepositoryNotFoundError,
    SessionChangedError,
    SessionExistsError,
    SessionLockedError,
    SessionLogError,
    SessionNotFoundError,
    SessionPathError,
    StoreClosedError,
    StoreForkedError,
    StorePoisonedError,
    UnknownBackendError,
    ValidationError,
)
from .core.ids import new_id
from .core.loading import reduce_bytes
from .core.planner import plan_recovery
from .core.state import SessionState, Usage
from .core.store import BackendInfo, SessionStore
from .opening import backends, create, create_async, open, open_async
from .recovery import (
    ToolStart,
    facts_for_plan,
    needs_caller,
    recover,
    recover_async,
    start_step_facts,
    start_tool_facts,
)
from .repositories import DirectoryRepository, SessionInfo, repository
from .repositories.keys import InvalidKeyError, KeyHeldError, KeyNotFoundError, KeySessions
from .runtime import Attempt, Run, RunBlockedError, RuntimeStateError, Session, ToolCall
from .runtime_blocked import Blocked
from .runtime_errors import RunOverError
from .runtime_reconcile import Reconciled
from .tools import Configuration, DidNotRun, Ran, Tool, Tools, Unknown

if TYPE_CHECKING:
    from .core.async_store import AsyncSessionStore
    from .repositories.aio import repository_async
    from .runtime_async import AsyncAttempt, AsyncRun, AsyncSession, AsyncToolCall


def __getattr__(name: str) -> Any:
    """What only async users need (and asyncio with it) loads on first use."""
    if name == "AsyncSessionStore":
        from .core.async_store import AsyncSessionStore

        return AsyncSessionStore
    if name == "repository_async":
        from .repositories.aio import repository_async

        return repository_async
    if name in ("AsyncSession", "AsyncRun", "AsyncAttempt", "AsyncToolCall"):
        from . import runtime_async

        return getattr(runtime_async, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AsyncAttempt",
    "AsyncRun",
    "AsyncSession",
    "AsyncSessionStore",
    "AsyncToolCall",
    "Attempt",
    "BackendInfo",
    "Blocked",
    "CommitOutcomeUnknownError",
    "Configuration",
    "ConfigurationError",
    "ContractError",
    "CorruptionError",
    "DidNotRun",
    "DirectoryRepository",
    "DurabilityUnavailableError",
    "InvalidKeyError",
    "KeyHeldError",
    "KeyNotFoundError",
    "KeySessions",
    "Ran",
    "Reconciled",
    "ReentrantCallError",
    "RepositoryError",
    "RepositoryNotFoundError",
    "Run",
    "RunBlockedError",
    "RunOverError",
    "RuntimeStateError",
    "Session",
    "SessionChangedError",
    "SessionExistsError",
    "SessionInfo",
    "SessionLockedError",
    "SessionLogError",
    "SessionNotFoundError",
    "SessionPathError",
    "SessionState",
    "SessionStore",
    "StoreClosedError",
    "StoreForkedError",
    "StorePoisonedError",
    "Tool",
    "ToolCall",
    "ToolStart",
    "Tools",
    "Unknown",
    "UnknownBackendError",
    "Usage",
    "ValidationError",
    "backends",
    "canonical",
    "configuration_digest",
    "create",
    "create_async",
    "encode_header",
    "facts_for_plan",
    "needs_caller",
    "new_id",
    "open",
    "open_async",
    "plan_recovery",
    "recover",
    "recover_async",
    "reduce_bytes",
    "repository",
    "repository_async",
    "schema",
    "source_digest",
    "start_step_facts",
    "start_tool_facts",
]

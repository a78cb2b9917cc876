"""sessionlog: durable agent sessions as an append-only transactional log.

Every accepted prompt, model attempt, tool intent, tool result, usage figure and outcome is a fact,
written before the effect it describes, in the canonical v2 session contract of tiny-agent.
"""

from .core.canonical import canonical, configuration_digest, source_digest
from .core.errors import (
    ContractError,
    CorruptionError,
    SessionExistsError,
    SessionLockedError,
    SessionLogError,
    SessionNotFoundError,
    StoreClosedError,
    StorePoisonedError,
    UnknownBackendError,
    ValidationError,
)
from .core.ids import new_id
from .core.loading import reduce_bytes
from .core.planner import plan_recovery
from .core.state import SessionState, Usage

__all__ = [
    "ContractError",
    "CorruptionError",
    "SessionExistsError",
    "SessionLockedError",
    "SessionLogError",
    "SessionNotFoundError",
    "SessionState",
    "StoreClosedError",
    "StorePoisonedError",
    "UnknownBackendError",
    "Usage",
    "ValidationError",
    "canonical",
    "configuration_digest",
    "new_id",
    "plan_recovery",
    "reduce_bytes",
    "source_digest",
]

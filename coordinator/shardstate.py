"""A partition's lifecycle states (coordinator.shard), which moves between them are allowed, and the
error a request to its groups gets in each. A table of its own: the exporter, the checkpointer and the
runtime read states without needing the shard's machinery.
"""

from enum import Enum
from typing import Final

from protocol.errors import ErrorCode


class ShardState(Enum):
    """INITIAL: created, not loaded; requests get COORDINATOR_LOAD_IN_PROGRESS. -> LOADING, CLOSED.
    LOADING: the log is being replayed; requests get COORDINATOR_LOAD_IN_PROGRESS. -> ACTIVE, READ_ONLY,
    FAILED, CLOSED.
    ACTIVE: serves reads and writes; timers armed. -> FAILED (a write failed), CLOSED.
    READ_ONLY: loaded, but the log cannot be written (disk full, read-only, permission): reads are
    served, writes get NOT_COORDINATOR (retriable); a probe retries. -> ACTIVE, FAILED, CLOSED.
    FAILED: requests get NOT_COORDINATOR; after a write or I/O error the shard reloads (-> LOADING);
    after corruption found on load it stays FAILED until an operator repairs the log. -> LOADING, CLOSED.
    CLOSED: shut down; requests get NOT_COORDINATOR. Final."""

    INITIAL = "initial"
    LOADING = "loading"
    ACTIVE = "active"
    READ_ONLY = "read_only"
    FAILED = "failed"
    CLOSED = "closed"


# The states each state may be entered from.
ALLOWED_FROM: Final[dict[ShardState, frozenset[ShardState]]] = {
    ShardState.INITIAL: frozenset(),
    ShardState.LOADING: frozenset({ShardState.INITIAL, ShardState.FAILED}),
    ShardState.ACTIVE: frozenset({ShardState.LOADING, ShardState.READ_ONLY}),
    ShardState.READ_ONLY: frozenset({ShardState.LOADING}),
    ShardState.FAILED: frozenset({ShardState.INITIAL, ShardState.LOADING, ShardState.ACTIVE,
                                  ShardState.READ_ONLY}),
    ShardState.CLOSED: frozenset({ShardState.INITIAL, ShardState.LOADING, ShardState.ACTIVE,
                                  ShardState.READ_ONLY, ShardState.FAILED}),
}

# What a request gets in a state that does not serve it: reads, then writes.
READ_ERRORS: Final = {
    ShardState.INITIAL: ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ShardState.LOADING: ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ShardState.FAILED: ErrorCode.NOT_COORDINATOR,
    ShardState.CLOSED: ErrorCode.NOT_COORDINATOR,
}
WRITE_ERRORS: Final = {**READ_ERRORS, ShardState.READ_ONLY: ErrorCode.NOT_COORDINATOR}

"""The version-independent requests and results of the group APIs, the group settings, and what group
operations need of a shard. API modules translate between these and each wire version."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from coordinator.request import Request
from coordinator.timers import Clock, Timers
from protocol.errors import ErrorCode


@dataclass(frozen=True)
class GroupConfig:
    initial_rebalance_delay_ms: int = 3000
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    max_size: int = 2**31 - 1
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    offsets_retention_check_interval_ms: int = 600_000


class ShardOps(Protocol):
    """What membership needs of a shard (the real Shard, or a test double)."""

    clock: Clock
    timers: Timers

    def write(self, req: Request | None, op: Callable[..., Any], *args: Any) -> Any: ...

    def schedule(self, key: str, delay_ms: int, op: Callable[..., Any], *args: Any) -> None: ...


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str
    client_host: str
    require_known_member_id: bool  # v4+: a new dynamic member first gets MEMBER_ID_REQUIRED
    skip_assignment_supported: bool  # v9+


@dataclass(slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str = ""
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)  # only the leader's
    skip_assignment: bool = False


@dataclass(slots=True)
class SyncResult:
    error: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol: str | None = None


@dataclass(slots=True)
class LeaveResult:
    error: ErrorCode
    members: list[tuple[str, str | None, ErrorCode]] = field(default_factory=list)

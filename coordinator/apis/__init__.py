"""One module per Kafka API, named by key. Each registers its handler here; the server refuses to
start if the protocol registry lists an API without a handler, so the two cannot drift apart.

A handler reads state and returns a ``Reply``: the response object, plus the futures it must wait for
(writes to become durable, or reads to see only durable state) with a fix-up to apply if one fails.
"""

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from coordinator.runtime import Runtime


@dataclass(frozen=True, slots=True)
class RequestContext:
    api_version: int
    correlation_id: int
    client_id: str
    client_host: str


@dataclass(slots=True)
class Reply:
    response: Any
    # (future, fix-up): when the future fails, the fix-up rewrites its part of the response as an error
    waits: list[tuple["asyncio.Future[None]", Callable[[], None]]] = field(default_factory=list)


Handler = Callable[[Runtime, RequestContext, Any], Reply]
HANDLERS: dict[int, Handler] = {}


def handles(api_key: int) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        HANDLERS[api_key] = fn
        return fn

    return register


def load_all() -> dict[int, Handler]:
    """Imports every API module (each registers itself) and returns the handler table."""
    from coordinator.apis import (  # noqa: F401
        k03_metadata,
        k08_offset_commit,
        k09_offset_fetch,
        k10_find_coordinator,
        k18_api_versions,
    )

    return HANDLERS

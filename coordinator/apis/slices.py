"""A request naming very many groups, handled a slice of them per event-loop pass.

A DescribeGroups or DeleteGroups frame of a few MB can name a million groups (an empty name is one
byte), and handling them in one go held the event loop for seconds, every other client waiting (a
fuzz campaign: 1M names, a bystander's round trip 2-3.7 s). Kafka runs each group's operation on its
own, on a pool of request threads. Here the handler does the first ``GROUP_SLICE`` names itself and
the rest follow, a slice per loop pass, while other clients' requests run in between; the same
client's next request waits until the last slice (its connection is held), so its requests still take
effect in order. The reply leaves once the last slice is done and every write it made is durable.
"""

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from coordinator.request import Request
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)

GROUP_SLICE: Final = 1024  # groups handled per loop pass (~1-5 ms)


def in_slices(req: Request, count: int, run: Callable[[int, int], None],
              finish: Callable[[], None] | None = None) -> None:
    """Calls ``run(start, end)`` over ``range(count)`` in slices of GROUP_SLICE, the first now, then
    ``finish()``. A later slice that fails (a bug) answers the whole request with the API's error
    response (UNKNOWN_SERVER_ERROR) rather than leaving it unanswered; the first one's failure is
    raised to the handler's caller, as any handler's."""
    end = min(GROUP_SLICE, count)
    run(0, end)
    if end == count:
        if finish is not None:
            finish()
        return
    req.wait()
    if req.sink is not None:
        req.sink.hold()
    asyncio.get_running_loop().call_soon(_next_slice, req, count, run, finish, end)


def _next_slice(req: Request, count: int, run: Callable[[int, int], None], finish: Callable[[], None] | None,
                start: int) -> None:
    end = min(start + GROUP_SLICE, count)
    try:
        run(start, end)
        if end < count:
            asyncio.get_running_loop().call_soon(_next_slice, req, count, run, finish, end)
            return
        if finish is not None:
            finish()
    except Exception:
        log.exception("%s: a slice of groups %d-%d failed", req.api.spec.name, start, end)
        _over(req, ErrorCode.UNKNOWN_SERVER_ERROR)
        return
    _over(req, None)


def _over(req: Request, error: ErrorCode | None) -> None:
    if req.sink is not None:
        req.sink.unhold()
    req.done(None, error)

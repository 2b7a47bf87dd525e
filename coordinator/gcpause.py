"""Cyclic garbage collection paused while any partition loads or any large request is in flight.

A load allocates a few objects per record (keys, values, the records replay applies) and keeps most of
them, so the young collections it triggers keep scanning objects that will live on: ~14% of a served
1M-record load's profile, even with what was loaded frozen out of the collector's sight as it grows. A
load makes hardly any cyclic garbage; what the event loop makes meanwhile is collected before each
freeze and once the last load ends.

A large request (a frame over the server's bulk size: 150,000 partitions, 100,000 groups) is the same
shape for as long as it lives: its decoded body, its answer and their parts are hundreds of thousands
of tracked objects that survive until its reply is written, and each young collection made while they
are young holds the GIL to scan them again (15-100 ms each, finding nothing, on the bulk thread or the
loop: every other client waits). The server therefore holds a pause from such a request's frame to its
reply's write or its connection's end, and drops the request before releasing, so the next collection
does not find it. A request can live long (a large JoinGroup parked for a rebalance, a commit waiting
on a stalled disk) and huge requests can follow each other, so the server's event loop asks every
second for one young collection once the pause has gone ``MAX_PAUSE_S`` without one: nothing keeps the
rest of the server's cyclic garbage from being freed for longer.
"""

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

MAX_PAUSE_S = 10.0

_lock = threading.Lock()
_holds = 0
_was_enabled = False
_since = 0.0  # when the current pause began or last had a collection (monotonic seconds)


def hold() -> None:
    """One more reason to keep the collector paused (a load or a large request); ``release`` ends it."""
    global _holds, _was_enabled, _since
    with _lock:
        if _holds == 0:
            _was_enabled = gc.isenabled()
            _since = time.monotonic()
            gc.disable()
        _holds += 1


def release(count: int = 1) -> None:
    """Ends ``count`` holds; the collector is enabled again when the last ends, only if it was before."""
    global _holds
    if not count:
        return
    with _lock:
        _holds -= count
        assert _holds >= 0, "more releases than holds"
        if _holds == 0 and _was_enabled:
            gc.enable()


def collect_if_overdue() -> bool:
    """One young collection if the pause has gone ``MAX_PAUSE_S`` without one (the event loop asks)."""
    global _since
    with _lock:
        overdue = _holds > 0 and time.monotonic() - _since > MAX_PAUSE_S
        if overdue:
            _since = time.monotonic()
    if overdue:
        gc.collect(1)
    return overdue


def held() -> int:
    """How many holds are in force (for tests)."""
    return _holds


@contextmanager
def gc_paused() -> Iterator[None]:
    """Holds the pause for the block; nested and concurrent blocks (one per loading partition) share it."""
    hold()
    try:
        yield
    finally:
        release()


def freeze_loaded() -> None:
    """Moves what a load has built so far out of the collector's sight: a full collection would rescan
    every cached offset again and again (measured 2x the whole load's CPU). The event loop keeps
    serving meanwhile, so its cyclic garbage is collected first: frozen, it would never be freed
    (~8 ms per 50,000 loaded records, ~10% of a load)."""
    global _since
    gc.collect(1)
    gc.freeze()
    _since = time.monotonic()

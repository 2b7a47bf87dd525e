"""Cyclic garbage collection paused while any partition loads.

A load allocates a few objects per record (keys, values, the records replay applies) and keeps most of
them, so the young collections it triggers keep scanning objects that will live on: ~15% of a 1M-record
load (profile and in-process runs), even with what was loaded frozen out of the collector's sight as it
grows. A load makes hardly any cyclic garbage; what the event loop makes meanwhile is collected once the
last load ends.
"""

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_loads = 0
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disables the collector for the block; nested and concurrent blocks (one per loading partition)
    share one pause, and the collector is enabled again when the last ends only if it was before."""
    global _loads, _was_enabled
    with _lock:
        if _loads == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _loads += 1
    try:
        yield
    finally:
        with _lock:
            _loads -= 1
            if _loads == 0 and _was_enabled:
                gc.enable()

"""Handing a worker thread's result back to the event loop.

Writer, loader and bulk threads finish work the loop then acts on. If the loop has closed meanwhile (a
stop that gave up on a stuck write), there is nobody left to tell: the result is dropped quietly rather
than raising from a thread at interpreter exit."""

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def on_loop(loop: asyncio.AbstractEventLoop, future: "concurrent.futures.Future[T]",
            callback: Callable[..., None], *args: Any) -> None:
    """Runs ``callback(*args, future)`` on ``loop`` once ``future`` is done."""

    def done(f: "concurrent.futures.Future[T]") -> None:
        try:
            loop.call_soon_threadsafe(lambda: callback(*args, f))
        except RuntimeError:  # the loop is closed: the process is stopping
            pass

    future.add_done_callback(done)

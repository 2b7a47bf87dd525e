"""The writer thread: runs, one at a time and in the order they come, the jobs that touch the logs'
files off the event loop (syncs, probes, reopening, compaction swaps), so none of them overlap.

It is an ``Executor`` (``submit``, ``loop.run_in_executor``) with one cheaper way in for the flusher,
which hands it a sync every flush cycle: ``post`` runs a function and calls a callback on the event
loop with its result (or the exception it raised), with no ``Future``, done-callback or closure in
between. A cycle's hand-off through ``concurrent.futures`` and ``handoff.on_loop`` cost ~15 us of the
event loop's CPU and ~29 us of the process's; this way ~12 and ~24 (uvloop, measured round trips).
The thread is a daemon, so that a Runtime that was never stopped does not keep the process alive;
a clean stop waits for the writer through the shards, and one that gave up on a stuck write exits
at once (coordinator.cli). Nothing was acknowledged that depends on a job still running.
"""

import asyncio
import functools
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)

# (function, its arguments, the Future of a submit or None; for a post: the loop, callback and its
# leading arguments)
_Job = tuple[Callable[..., Any], tuple[Any, ...], "Future[Any] | None", Any, Any, tuple[Any, ...]]


class WriterStopped(RuntimeError):
    """A posted job that never ran: the writer shut down first."""


class WriterThread(Executor):
    def __init__(self, name: str = "kcoord-writer") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> "Future[T]":
        future: Future[T] = Future()
        if kwargs:
            fn = functools.partial(fn, **kwargs)
        self._put((fn, args, future, None, None, ()))
        return future

    def post(self, fn: Callable[..., Any], args: tuple[Any, ...], loop: asyncio.AbstractEventLoop,
             callback: Callable[..., None], *callback_args: Any) -> None:
        """Runs ``fn(*args)`` on the writer thread, then ``callback(*callback_args, outcome)`` on ``loop``,
        where ``outcome`` is what ``fn`` returned or the exception it raised (``WriterStopped`` if the
        writer shut down before running it). Raises RuntimeError once the writer is shut down."""
        self._put((fn, args, None, loop, callback, callback_args))

    def _put(self, job: _Job) -> None:
        with self._lock:
            if self._stopped:
                raise RuntimeError("cannot schedule new work after the writer shut down")
            if self._thread is None:
                thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                thread.start()  # if this raises, the next job tries again
                self._thread = thread
            self._jobs.put(job)

    def _run(self) -> None:
        jobs = self._jobs
        while (job := jobs.get()) is not None:
            try:
                _run_one(*job)
            except Exception:  # the thread must outlive any one job: every later job would wait for ever
                log.exception("writer thread: a job's hand-off failed")
            job = None  # its references go now, not when the next job arrives

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new work from now on; with ``cancel_futures`` the jobs not yet started are dropped (a
        submitted one's Future is cancelled, a posted one's callback gets ``WriterStopped``)."""
        with self._lock:
            self._stopped = True
            if cancel_futures:
                while True:
                    try:
                        job = self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    if job is None:
                        continue
                    _, _, future, loop, callback, callback_args = job
                    if future is not None:
                        future.cancel()
                    else:
                        _deliver(loop, callback, callback_args, WriterStopped("the writer stopped"))
            self._jobs.put(None)
            thread = self._thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()


def _run_one(fn: Callable[..., Any], args: tuple[Any, ...], future: "Future[Any] | None", loop: Any,
             callback: Any, callback_args: tuple[Any, ...]) -> None:
    if future is not None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)
        return
    try:
        outcome = fn(*args)
    except BaseException as exc:
        outcome = exc
    _deliver(loop, callback, callback_args, outcome)


def _deliver(loop: asyncio.AbstractEventLoop, callback: Any, args: tuple[Any, ...], outcome: Any) -> None:
    try:
        loop.call_soon_threadsafe(callback, *args, outcome)
    except RuntimeError:  # the loop is closed: the process is stopping, nobody is left to tell
        pass

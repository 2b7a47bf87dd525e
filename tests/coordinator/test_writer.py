"""The writer thread (coordinator/writer.py): one thread, jobs in arrival order whichever way they came,
posted results delivered on the event loop, and a shutdown that leaves nobody waiting."""

import asyncio
import threading
from typing import Any

import pytest

from coordinator.writer import WriterStopped, WriterThread


async def test_jobs_run_one_at_a_time_in_arrival_order_whichever_way_they_came() -> None:
    loop = asyncio.get_running_loop()
    writer = WriterThread()
    ran: list[int] = []
    threads: set[str] = set()
    active = [0]
    overlapped = [False]
    delivered: asyncio.Queue[Any] = asyncio.Queue()

    def job(i: int) -> int:
        active[0] += 1
        overlapped[0] |= active[0] > 1
        threads.add(threading.current_thread().name)
        ran.append(i)
        active[0] -= 1
        return i * 10

    futures = []
    for i in range(40):
        if i % 3 == 0:
            futures.append(loop.run_in_executor(writer, job, i))
        else:
            writer.post(job, (i,), loop, lambda tag, outcome: delivered.put_nowait((tag, outcome)), f"p{i}")
    assert await asyncio.gather(*futures) == [i * 10 for i in range(0, 40, 3)]
    posted = [await delivered.get() for _ in range(40 - len(futures))]
    assert ran == list(range(40)) and not overlapped[0] and threads == {"kcoord-writer"}
    assert posted == [(f"p{i}", i * 10) for i in range(40) if i % 3]
    writer.shutdown()


async def test_a_posted_job_reports_its_exception_on_the_event_loop() -> None:
    loop = asyncio.get_running_loop()
    writer = WriterThread()
    got: asyncio.Future[tuple[Any, bool]] = loop.create_future()

    def fail() -> None:
        raise OSError(28, "No space left on device")

    writer.post(fail, (), loop, lambda outcome: got.set_result((outcome, threading.current_thread() is main)))
    main = threading.current_thread()
    outcome, on_loop_thread = await got
    assert isinstance(outcome, OSError) and outcome.errno == 28 and on_loop_thread
    assert writer.submit(pow, 2, 5).result(timeout=10) == 32  # the thread goes on after an exception
    writer.shutdown()


async def test_shutdown_cancels_what_has_not_started_and_refuses_new_work() -> None:
    loop = asyncio.get_running_loop()
    writer = WriterThread()
    started, release = threading.Event(), threading.Event()

    def hold() -> bool:
        started.set()
        return release.wait(10)

    running = writer.submit(hold)
    assert started.wait(10)
    waiting = writer.submit(pow, 2, 2)
    told: asyncio.Future[Any] = loop.create_future()
    writer.post(pow, (2, 3), loop, told.set_result)
    writer.shutdown(wait=False, cancel_futures=True)
    assert waiting.cancelled()
    assert isinstance(await told, WriterStopped)  # a posted job's caller is told it never ran
    with pytest.raises(RuntimeError):
        writer.submit(pow, 2, 4)
    with pytest.raises(RuntimeError):
        writer.post(pow, (2, 4), loop, told.set_result)
    release.set()
    assert running.result(timeout=10) is True  # the job that had started finishes
    writer.shutdown(wait=True)


def test_a_result_for_a_closed_loop_is_dropped_and_the_thread_goes_on() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    writer = WriterThread()
    writer.post(pow, (2, 3), loop, lambda outcome: None)
    assert writer.submit(pow, 3, 2).result(timeout=10) == 9
    writer.shutdown()


def test_a_thread_that_would_not_start_is_started_by_the_next_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in review: the old pool tried again on the next submit; a writer that remembered a thread
    that never started would leave every later job queued for ever."""
    start = threading.Thread.start
    calls = [0]

    def flaky(self: threading.Thread) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", flaky)
    writer = WriterThread()
    with pytest.raises(RuntimeError):
        writer.submit(pow, 2, 1)
    assert writer.submit(pow, 2, 3).result(timeout=10) == 8
    writer.shutdown()


def test_the_thread_outlives_a_failed_hand_off() -> None:
    class BrokenLoop:
        def call_soon_threadsafe(self, *args: Any) -> None:
            raise ValueError("not a loop")

    writer = WriterThread()
    writer.post(pow, (2, 3), BrokenLoop(), lambda outcome: None)  # type: ignore[arg-type]
    assert writer.submit(pow, 3, 3).result(timeout=10) == 27
    writer.shutdown()

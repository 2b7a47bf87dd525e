"""Time for the coordinator: an injected clock and keyed per-shard timers.

Handlers and shards never read the system clock themselves; they get a ``Clock``. The real one reads
wall-clock milliseconds (what Kafka stores in commit timestamps) and schedules on the event loop. Timer
deadlines are kept on its monotonic clock, as Kafka's purgatory keeps them on ``nanoTime``: kept in wall
time, a clock stepped back an hour (NTP, an operator) re-armed every armed timer for that hour when it
fired, so a crashed member was not expired and a rebalance waiting on it stalled (a fault campaign's
find). Tests use ``ManualClock`` and move time with ``advance()``, so session expiry, rebalance timeouts
and offset retention are tested at exact millisecond boundaries without sleeping.

Timers are keyed (``session:<member>``, ``retention``) so re-scheduling a key replaces its deadline.
Pushing a deadline later, which every heartbeat does, only updates a field: the armed callback finds
the new deadline when it fires and re-arms itself. Thousands of members heartbeating cost no heap churn.
"""

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any, Protocol


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def monotonic_ms(self) -> int: ...

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> Cancellable: ...


class SystemClock:
    """Wall-clock milliseconds; callbacks on the running event loop."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        """For timers: never steps, as the event loop's own clock does not."""
        return time.monotonic_ns() // 1_000_000

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> Cancellable:
        return asyncio.get_running_loop().call_later(max(delay_ms, 0) / 1000.0, callback)


class _ManualHandle:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock for tests: time stands still until ``advance``, which fires due callbacks in order."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms
        self._heap: list[tuple[int, int, _ManualHandle]] = []
        self._seq = itertools.count()

    def now_ms(self) -> int:
        return self._now

    def monotonic_ms(self) -> int:
        return self._now

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> Cancellable:
        handle = _ManualHandle(callback)
        heapq.heappush(self._heap, (self._now + max(delay_ms, 0), next(self._seq), handle))
        return handle

    def advance(self, ms: int) -> None:
        """Moves time forward by ``ms``, running every callback that falls due, at its due time."""
        end = self._now + ms
        while self._heap and self._heap[0][0] <= end:
            due, _, handle = heapq.heappop(self._heap)
            self._now = max(self._now, due)
            if not handle.cancelled:
                handle.callback()
        self._now = end


class _Timer:
    __slots__ = ("args", "deadline", "fire_at", "fn", "handle")

    def __init__(self, deadline: int, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.deadline = deadline
        self.fire_at = deadline
        self.fn = fn
        self.args = args
        self.handle: Cancellable | None = None

    def disarm(self) -> None:
        """Cancels the armed callback, if any, and drops it (no cycle left behind: ``Timers._fire``)."""
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


class Timers:
    """Keyed timers of one shard. A key holds at most one timer; scheduling it again replaces it."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._timers: dict[str, _Timer] = {}

    def schedule(self, key: str, delay_ms: int, fn: Callable[..., None], *args: Any) -> None:
        """Runs ``fn(*args)`` once ``delay_ms`` from now, unless the key is cancelled or rescheduled."""
        deadline = self._clock.monotonic_ms() + delay_ms
        timer = self._timers.get(key)
        if timer is not None and timer.handle is not None and timer.fire_at <= deadline:
            timer.deadline, timer.fn, timer.args = deadline, fn, args  # the armed callback re-arms
            return
        if timer is not None:
            timer.disarm()
        timer = _Timer(deadline, fn, args)
        self._timers[key] = timer
        self._arm(key, timer)

    def _arm(self, key: str, timer: _Timer) -> None:
        timer.fire_at = timer.deadline
        delay = timer.deadline - self._clock.monotonic_ms()
        timer.handle = self._clock.call_later(delay, lambda: self._fire(key, timer))

    def _fire(self, key: str, timer: _Timer) -> None:
        # The spent handle holds the callback, which holds the timer: dropped here, the timer, the
        # handle and the closure are freed by reference counting instead of waiting, as a cycle, for
        # the garbage collector (a fleet of members joining left ~8 such objects per timer).
        timer.handle = None
        if self._timers.get(key) is not timer:
            return
        if timer.deadline > self._clock.monotonic_ms():
            self._arm(key, timer)
            return
        del self._timers[key]
        timer.fn(*timer.args)

    def cancel(self, key: str) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.disarm()

    def cancel_all(self) -> None:
        for timer in self._timers.values():
            timer.disarm()
        self._timers.clear()

    def deadline(self, key: str) -> int | None:
        """The key's deadline on the clock's monotonic milliseconds."""
        timer = self._timers.get(key)
        return None if timer is None else timer.deadline

    def __contains__(self, key: str) -> bool:
        return key in self._timers

    def __len__(self) -> int:
        return len(self._timers)

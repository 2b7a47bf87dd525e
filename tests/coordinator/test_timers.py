"""Keyed timers (coordinator.timers): what they leave behind for the garbage collector, and the clock
their deadlines are kept on."""

import asyncio
import gc
from collections.abc import Callable

from coordinator.timers import Cancellable, ManualClock, SystemClock, Timers


def test_fired_cancelled_and_rearmed_timers_leave_no_cycles_for_the_collector() -> None:
    """A timer's handle holds its callback, which holds the timer: unless the spent or cancelled handle
    is dropped, every timer is a reference cycle only the collector frees (a fleet of members joining
    left ~8 objects per timer for it, and with them young collections that promote and rescan)."""
    clock = ManualClock()
    timers = Timers(clock)
    fired: list[int] = []
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(100):
            timers.schedule(f"k{i}", 10, fired.append, i)
        for i in range(50, 100):
            timers.cancel(f"k{i}")
        timers.schedule("later", 5, fired.append, -1)
        timers.schedule("later", 20, fired.append, -2)  # pushed later: the armed callback re-arms it
        timers.schedule("sooner", 20, fired.append, -3)
        timers.schedule("sooner", 5, fired.append, -4)  # brought forward: a new timer replaces it
        clock.advance(30)
        assert sorted(fired) == [-4, -2, *range(50)]
        assert "later" not in timers and "k0" not in timers
        assert gc.collect() == 0
    finally:
        if was_enabled:
            gc.enable()


class _SteppedBack:
    """The real clock, its wall time stepped back an hour once ``step`` is called (NTP, an operator)."""

    def __init__(self) -> None:
        self.real = SystemClock()
        self.offset = 0

    def step(self) -> None:
        self.offset = -3_600_000

    def now_ms(self) -> int:
        return self.real.now_ms() + self.offset

    def monotonic_ms(self) -> int:
        return self.real.monotonic_ms()

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> Cancellable:
        return self.real.call_later(delay_ms, callback)


async def test_a_wall_clock_stepped_back_does_not_hold_armed_timers() -> None:
    """Fault campaign: deadlines kept in wall time were re-armed for the size of a backward step when
    they fired, so a member that died within a session of the step was not expired for an hour."""
    clock = _SteppedBack()
    timers = Timers(clock)
    fired = asyncio.Event()
    timers.schedule("session", 50, fired.set)
    timers.schedule("session", 100, fired.set)  # a heartbeat pushing it later: re-armed when it fires
    clock.step()
    await asyncio.wait_for(fired.wait(), 5)  # an hour before the fix
    assert "session" not in timers

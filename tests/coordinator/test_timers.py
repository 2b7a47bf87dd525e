"""Keyed timers (coordinator.timers): what they leave behind for the garbage collector."""

import gc

from coordinator.timers import ManualClock, Timers


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

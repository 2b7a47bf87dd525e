import gc
import threading
import weakref
from collections.abc import Iterator

import pytest

from coordinator import gcpause
from coordinator.gcpause import collect_if_overdue, freeze_loaded, gc_paused, held, hold, release


@pytest.fixture(autouse=True)
def restore_gc() -> Iterator[None]:
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_overlapping_loads_share_one_pause() -> None:
    """Partitions load concurrently on a thread pool: the first to end must not re-enable the collector
    under the others."""
    gc.enable()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with gc_paused():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second() -> None:
        first_in.wait(5)
        with gc_paused():
            second_in.set()
            first_out.wait(5)
            seen.append(gc.isenabled())

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == [False]
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled() -> None:
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_an_error_inside_still_ends_the_pause() -> None:
    gc.enable()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("load failed")
    assert gc.isenabled()


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_freezing_during_a_load_first_frees_the_cycles_made_meanwhile() -> None:
    """The event loop keeps serving while a partition loads: cyclic garbage it made must not be frozen
    with the loaded state, where it would never be freed."""
    gc.enable()
    try:
        with gc_paused():
            refs = [weakref.ref(_Node()) for _ in range(1000)]
            assert all(r() is not None for r in refs)  # paused: nothing collects them
            freeze_loaded()
            assert all(r() is None for r in refs)
    finally:
        gc.unfreeze()


def test_a_long_pause_gets_a_young_collection_when_overdue(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large request can stay parked for minutes, and huge requests can follow each other: the rest of
    the server's cyclic garbage must still be freed now and then."""
    gc.enable()
    hold()
    try:
        refs = [weakref.ref(_Node()) for _ in range(100)]
        assert not collect_if_overdue()  # the pause is young: nothing collected
        assert all(r() is not None for r in refs)
        monkeypatch.setattr(gcpause, "MAX_PAUSE_S", 0.0)
        assert collect_if_overdue()
        assert all(r() is None for r in refs) and not gc.isenabled()
    finally:
        release()
    assert held() == 0 and gc.isenabled()
    assert not collect_if_overdue()  # no pause, nothing to do


def test_releasing_nothing_leaves_the_collector_alone() -> None:
    gc.enable()
    with gc_paused():  # a pause that began with the collector enabled ...
        pass
    gc.disable()  # ... then a caller outside any pause disabled it
    release(0)
    assert not gc.isenabled()

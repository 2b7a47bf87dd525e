"""bench.wakeup times real round trips between two processes, pinned on one CPU and across two."""

import os

import pytest

from bench.wakeup import describe, probe


def test_round_trips_on_one_cpu_and_across() -> None:
    before = os.sched_getaffinity(0)
    p = probe(round_trips=300)
    assert os.sched_getaffinity(0) == before  # the probe pins itself only while it measures
    assert p.same_cpu_us > 0 and p.round_trips == 300
    if len(before) > 1:
        assert p.cross_cpu_us is not None and p.cross_cpu_us > 0
        assert " us across CPUs" in describe(p)
    else:
        assert p.cross_cpu_us is None and "one CPU only" in describe(p)


def test_one_cpu_only_when_the_process_has_one() -> None:
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        p = probe(round_trips=100)
    finally:
        os.sched_setaffinity(0, before)
    assert p.cross_cpu_us is None and "one CPU only" in describe(p)


def test_too_few_round_trips_is_refused() -> None:
    """The first round trip is not measured: one would divide by zero."""
    with pytest.raises(ValueError):
        probe(round_trips=1)

"""The paced rows' account of their slowest 1% (single slow requests or queues), and their targets."""

import pytest

from bench.report import BURST_MIN, CLUSTER, paced_note, slow_bursts, targets
from bench.scenarios import FsyncProbe

RATE = 10_000.0  # requests/s: request i is ~i/10 ms into the window


def test_scattered_slow_requests_are_not_bursts() -> None:
    lat = [0.001] * 20_000
    for i in range(0, 15_000, 100):  # 150 slow ones (under 1%: the p99 is the usual 1 ms), 10 ms apart
        lat[i] = 0.005
    found = slow_bursts(lat, RATE)
    assert found is not None
    assert found["slow"] == 150 and found["bursts"] == 150 and found["long_bursts"] == 0
    assert found["in_long_bursts"] == 0.0 and found["longest_ms"] == 0.0


def test_a_queue_is_one_long_burst() -> None:
    lat = [0.001] * 20_000
    for i in range(5_000, 5_150):  # the server fell behind for 15 ms: every answer late, growing then draining
        lat[i] = 0.002 + 0.00001 * min(i - 5_000, 5_150 - i)
    lat[15_000] = 0.003  # and one stray slow one, far from it
    found = slow_bursts(lat, RATE)
    assert found is not None
    assert found["threshold_ms"] == pytest.approx(1.0)
    assert found["slow"] == 151 and found["long_bursts"] == 1 and found["bursts"] == 2
    assert found["in_long_bursts"] == pytest.approx(150 / 151)
    assert found["longest_ms"] == pytest.approx(14.9)


def test_too_few_requests_say_nothing() -> None:
    assert slow_bursts([0.001] * 99, RATE) is None
    assert slow_bursts([0.001] * 1_000, RATE) is None  # nothing over the p99
    assert slow_bursts([0.001] * 1_000, 0.0) is None


def test_the_paced_note_says_it() -> None:
    row = {"scenario": "commit-1-half", "server": "kcoord", "rate_target": RATE, "requests": 20_000, "late": 0,
           "late_after_ms": 0.2, "held": 0, "inflight": 16, "client": "C pacer"}
    lat = [0.001] * 20_000
    for i in range(5_000, 5_150):
        lat[i] = 0.004
    note = paced_note({**row, "slow_bursts": slow_bursts(lat, RATE)})
    assert f"100% came in 1 burst of {BURST_MIN} or more" in note and "the longest burst 15 ms" in note
    assert paced_note({**row, "slow_bursts": None}).endswith("outstanding on their connection")


def test_the_clusters_p99_target_is_reported_where_it_ran() -> None:
    probe = FsyncProbe("/tmp", 100, 0.2, 0.5, 1.0, 0.25)  # goal: 3 x 0.5 ms

    def half(server: str, p99_ms: float) -> dict[str, object]:
        return {"scenario": "commit-1-half", "server": server, "p99_ms": p99_ms}

    found = {t.name: t for t in targets([half("kcoord", 2.0), half(CLUSTER, 1.2)], {}, probe, [])}
    name = "p99 commit latency at half kcoord's peak"
    one, two = found[name], found[f"{name}, {CLUSTER}"]
    assert (one.met, two.met) == (False, True) and two.measured.startswith("1.20 ms")
    alone = [t.name for t in targets([half("kcoord", 2.0)], {}, probe, []) if t.name.startswith("p99")]
    assert alone == [name]  # no row for a cluster that did not run

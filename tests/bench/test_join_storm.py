"""bench.join_storm against a real kcoord and the librdkafka mock: every member is answered, and the
probe's OffsetFetch answers are counted while the storm runs."""

from pathlib import Path

import pytest

from bench.join_storm import run
from bench.peers import Kcoord, Mock, Peer


@pytest.mark.parametrize("name", ["kcoord", "mock"])
def test_every_member_is_answered_and_the_probe_was_served_throughout(tmp_path: Path, name: str) -> None:
    peer: Peer = Kcoord(tmp_path) if name == "kcoord" else Mock()
    try:
        result = run(peer, members=20)
    finally:
        problems = peer.close()
    assert not problems
    assert (result.peer, result.members, result.answered) == (name, 20, 20)
    # the storm waits out the 3 s initial rebalance delay: the probe, every 5 ms, was answered all along
    assert result.probe_requests > 100 and 0 < result.probe_p50_ms <= result.probe_p99_ms <= result.probe_max_ms

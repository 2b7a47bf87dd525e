"""bench.gateway_metadata against the librdkafka mock cluster and kcoord in front of it: every client of
a burst gets the whole topic list both ways, and the probe was answered throughout."""

from pathlib import Path

from bench.gateway_metadata import burst, servers


def test_a_burst_is_answered_whole_direct_and_through_kcoord(tmp_path: Path) -> None:
    with servers(300, tmp_path) as (direct, kcoord):
        results = [burst("direct", direct, 5), burst("kcoord", kcoord, 5)]
    for result in results:
        assert (result.clients, result.topics) == (5, 300)
        assert 0 < result.probe_p50_ms <= result.probe_p99_ms <= result.probe_max_ms
    # the same topics both ways; kcoord's broker list differs (its listeners, and its coordinator added)
    assert abs(results[0].answer_bytes - results[1].answer_bytes) < 200
    assert "Traceback" not in (tmp_path / "kcoord.log").read_text()

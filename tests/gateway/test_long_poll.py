"""A Fetch is a long poll: the broker holds it up to its max_wait_ms when there is nothing to return. kcoord's
--upstream-timeout-ms counts from when the upstream is due to answer, so a consumer whose fetch wait is
longer than that timeout is not cut off while the upstream does just what it was asked (a fault campaign
found every such consumer's connection closed, "did not answer within ...", once per long poll)."""

import re
import time
from pathlib import Path

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # defined here; confluent_kafka.admin does not re-export it
from kafka import KafkaConsumer, TopicPartition
from kafka.protocol.consumer.fetch import FetchRequest

from coordinator.gateway import rewrite
from tests.gateway.conftest import scrape, start_gateway
from tests.gateway.test_acks_zero import upstream_errors
from tests.tansu_process import TansuProcess


def fetches_answered(text: str) -> float:
    return sum(float(v) for v in re.findall(r'^kcoord_gateway_relayed_requests_total\{api="Fetch",[^}]*\} (\S+)$',
                                            text, re.M))


def test_a_fetch_held_for_its_max_wait_is_not_an_upstream_timeout(tmp_path: Path, tansu: TansuProcess) -> None:
    kcoord = start_gateway(tmp_path, tansu.bootstrap, "--upstream-timeout-ms", "1000")
    consumer = None
    try:
        admin = AdminClient({"bootstrap.servers": kcoord.bootstrap})
        for future in admin.create_topics([NewTopic("quiet", 1, 1)]).values():
            future.result(30)
        consumer = KafkaConsumer(bootstrap_servers=kcoord.bootstrap, fetch_max_wait_ms=3000,
                                 request_timeout_ms=30_000, enable_auto_commit=False)
        consumer.assign([TopicPartition("quiet", 0)])
        consumer.seek(TopicPartition("quiet", 0), 0)
        deadline = time.monotonic() + 90
        while True:  # idle long polls, each held ~3 s by Tansu: three of them answered, or a connection cut
            assert not consumer.poll(timeout_ms=500)
            text = scrape(kcoord)
            if fetches_answered(text) >= 3 or upstream_errors(kcoord) or time.monotonic() > deadline:
                break
        assert upstream_errors(kcoord) == 0, [line for line in kcoord.log_since_start().splitlines()
                                              if "did not answer" in line][:3]
        assert fetches_answered(scrape(kcoord)) >= 3
        producer = ck.Producer({"bootstrap.servers": kcoord.bootstrap})
        producer.produce("quiet", b"woken")
        assert producer.flush(30) == 0
        got: list[bytes] = []
        while not got and time.monotonic() < deadline:
            got = [r.value for records in consumer.poll(timeout_ms=500).values() for r in records]
        assert got == [b"woken"]
    finally:
        if consumer is not None:
            consumer.close()
        kcoord.stop()


@pytest.mark.parametrize("version", range(16))
def test_fetch_max_wait_read_from_every_version(version: int) -> None:
    """Read from kafka-python's encoding (a codec independent of kcoord's), with a client id of odd length
    and, from v12, the flexible header's tagged fields; from v15 the body no longer starts with a replica id."""
    request = FetchRequest(replica_id=-1, max_wait_ms=1234, min_bytes=1, topics=[])
    request.with_header(correlation_id=7, client_id="odd-id")
    frame = bytes(request.encode(version=version, header=True, framed=False))
    assert rewrite.fetch_max_wait_ms(frame, version) == 1234
    with pytest.raises(rewrite.RewriteError):
        rewrite.fetch_max_wait_ms(frame[:12], version)

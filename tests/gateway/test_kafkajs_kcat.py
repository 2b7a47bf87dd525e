"""kafkajs (admin.fetchOffsets and a consumer group) and kcat (``-G`` balanced consumer) through kcoord in
gateway mode. Both are installed by the tests themselves when missing (the ``kafkajs`` and ``kcat``
fixtures of tests/conftest.py); without npm or apt the tests skip with the reason."""

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # defined here; confluent_kafka.admin does not re-export it
from kafka import KafkaAdminClient

from tests.conftest import run_kafkajs
from tests.gateway.conftest import Upstream, start_gateway
from tests.kcoord_process import KcoordProcess

HERE = Path(__file__).resolve().parent
PARTITIONS = 4


@pytest.fixture(params=["mock", "tansu"])
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Upstream, KcoordProcess]]:
    up = Upstream(request.param, tmp_path)
    kcoord = start_gateway(tmp_path, up.bootstrap)
    yield up, kcoord
    if kcoord.proc is not None and kcoord.proc.poll() is None:
        kcoord.kill()
    up.stop()


def prepare(up: Upstream, kcoord: KcoordProcess, topic: str, values: list[str]) -> None:
    if up.kind == "tansu":
        admin = AdminClient({"bootstrap.servers": kcoord.bootstrap})
        for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
            future.result(30)
    producer = ck.Producer({"bootstrap.servers": kcoord.bootstrap})
    for i, v in enumerate(values):
        producer.produce(topic, value=v.encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0


def committed(kcoord: KcoordProcess, group: str, topic: str) -> dict[int, int]:
    admin = KafkaAdminClient(bootstrap_servers=kcoord.bootstrap, request_timeout_ms=10_000)
    try:
        return {tp.partition: om.offset for tp, om in admin.list_group_offsets([group])[group].items()
                if tp.topic == topic}
    finally:
        admin.close()


def node(kafkajs: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_kafkajs(kafkajs, HERE / "kafkajs_client.js", *args)


def test_kafkajs_group_and_fetch_offsets(kafkajs: Path, setup: tuple[Upstream, KcoordProcess]) -> None:
    up, kcoord = setup
    topic, group = "js-topic", "js-group"
    values = [f"js-{i}" for i in range(40)]
    prepare(up, kcoord, topic, values)
    result = node(kafkajs, "consume", kcoord.bootstrap, group, topic, str(len(values)))
    assert result.returncode == 0, result.stderr[-3000:]
    seen = {json.loads(line)["value"] for line in result.stdout.splitlines()}
    assert set(values) <= seen
    assert committed(kcoord, group, topic) == dict.fromkeys(range(PARTITIONS), 10)
    result = node(kafkajs, "fetch-offsets", kcoord.bootstrap, group, topic)
    assert result.returncode == 0, result.stderr[-3000:]
    [answer] = json.loads(result.stdout)
    assert answer["topic"] == topic
    assert {int(p["partition"]): int(p["offset"]) for p in answer["partitions"]} == dict.fromkeys(range(PARTITIONS), 10)


def test_kcat_balanced_consumer(kcat: str, setup: tuple[Upstream, KcoordProcess]) -> None:
    up, kcoord = setup
    topic, group = "kcat-topic", "kcat-group"
    values = [f"kcat-{i}" for i in range(40)]
    prepare(up, kcoord, topic, values)
    result = subprocess.run([kcat, "-b", kcoord.bootstrap, "-G", group, "-c", str(len(values)), "-f", "%s\\n",
                             "-X", "auto.offset.reset=earliest", "-q", topic], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert set(values) <= set(result.stdout.split())
    offsets = committed(kcoord, group, topic)
    assert sum(offsets.values()) == len(values), offsets

"""kafkajs (admin.fetchOffsets and a consumer group) and kcat (``-G`` balanced consumer) through kcoord in
gateway mode. Both are installed by the tests themselves when missing (kafkajs with npm into a cache
directory outside the repository, kcat with apt-get when running as root); without npm or apt the
tests skip with the reason."""

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # defined here; confluent_kafka.admin does not re-export it
from kafka import KafkaAdminClient

from tests.gateway.conftest import Upstream, start_gateway
from tests.kcoord_process import KcoordProcess

HERE = Path(__file__).resolve().parent
KAFKAJS_VERSION = "2.2.4"
CACHE = Path(os.environ.get("KCOORD_TEST_CACHE", Path.home() / ".cache" / "kcoord-tests"))
PARTITIONS = 4


@pytest.fixture(scope="session")
def kafkajs() -> Path:
    """A directory whose node_modules holds kafkajs (npm install on first use)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node/npm not installed: kafkajs tests need them")
    home = CACHE / f"kafkajs-{KAFKAJS_VERSION}"
    if not (home / "node_modules" / "kafkajs").exists():
        home.mkdir(parents=True, exist_ok=True)
        result = subprocess.run([npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(home),
                                 f"kafkajs@{KAFKAJS_VERSION}"], capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            pytest.skip(f"npm install kafkajs failed: {result.stderr[-500:]}")
    return home


@pytest.fixture(scope="session")
def kcat() -> str:
    found = shutil.which("kcat")
    if found is None and shutil.which("apt-get") and os.geteuid() == 0:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        install = ["apt-get", "install", "-y", "-q", "kcat"]
        if subprocess.run(install, capture_output=True, timeout=600, env=env).returncode != 0:
            # a fresh machine may have no package lists yet
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=600, env=env)
            subprocess.run(install, capture_output=True, timeout=600, env=env)
        found = shutil.which("kcat")
    if found is None:
        pytest.skip("kcat is not installed and could not be (apt-get install -y kcat needs root and Debian)")
    return found


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
    env = dict(os.environ, NODE_PATH=str(kafkajs / "node_modules"))
    return subprocess.run(["node", str(HERE / "kafkajs_client.js"), *args], capture_output=True, text=True,
                          timeout=120, env=env)


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

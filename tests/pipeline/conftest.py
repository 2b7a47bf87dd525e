"""One local Spark session for every pipeline test (starting one takes ~6 s), and one offsets log written
by a real kcoord through stock clients, shared by the job tests: kafka-python and confluent-kafka commits
over many groups, an aiokafka group with members (group-metadata records), deleted offsets and a deleted
group (tombstones), and a group committing for a few seconds with one partition left idle."""

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from tests.integration.test_groups import Member, settled
from tests.kcoord_process import KcoordProcess

Offsets = dict[tuple[str, int], tuple[int, str, int]]
SOURCE_PARTITIONS = 50
HISTORY_SECONDS = 3.0
MOVING = [("moving", 0), ("moving", 1)]
IDLE = ("idle", 0)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from pipeline.session import build_session

    session = build_session("local[2]", "kcoord-pipeline-tests", progress=False)
    yield session
    session.stop()


@dataclass
class CommittedLog:
    data_dir: Path
    groups: list[str]
    expected: dict[str, Offsets] = field(default_factory=dict)  # OffsetFetch per group, before kcoord stopped
    listed: set[str] = field(default_factory=set)  # ListGroups before kcoord stopped


def offset_fetch(admin: KafkaAdminClient, group: str) -> Offsets:
    found = admin.list_group_offsets(group)[group]
    return {(tp.topic, tp.partition): (om.offset, om.metadata or "", om.leader_epoch) for tp, om in found.items()}


def _kafka_python_commits(server: KcoordProcess, groups: list[str]) -> None:
    for i, group in enumerate(groups):
        consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, group_id=group, enable_auto_commit=False,
                                 request_timeout_ms=10_000)
        try:
            for rnd in range(3):
                consumer.commit({TopicPartition(f"t-{t}", p): OffsetAndMetadata(100 * rnd + 10 * p + i,
                                                                                 f"kp {group} ✓ {rnd}", rnd)
                                 for t in range(2) for p in range(3)}, timeout_ms=10_000)
        finally:
            consumer.close()


def _confluent_commits(server: KcoordProcess, groups: list[str]) -> None:
    for i, group in enumerate(groups):
        consumer = ck.Consumer({"bootstrap.servers": server.bootstrap, "group.id": group,
                                "enable.auto.commit": False, "broker.address.family": "v4"})
        try:
            for rnd in range(2):
                offsets = [ck.TopicPartition("orders", p, 1000 * rnd + p + i, metadata=f"ck {rnd}", leader_epoch=4)
                           for p in range(4)]
                consumer.commit(offsets=offsets, asynchronous=False)
        finally:
            consumer.close()


def _history(server: KcoordProcess) -> None:
    """Two partitions move every 100 ms for a few seconds; one keeps being re-committed at offset 7."""
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, group_id="hist", enable_auto_commit=False,
                             request_timeout_ms=10_000)
    try:
        start, n = time.monotonic(), 0
        while time.monotonic() - start < HISTORY_SECONDS:
            n += 1
            commits = {TopicPartition(*k): OffsetAndMetadata(n * (i + 1), "", -1) for i, k in enumerate(MOVING)}
            commits[TopicPartition(*IDLE)] = OffsetAndMetadata(7, "", -1)
            consumer.commit(commits, timeout_ms=10_000)
            time.sleep(0.1)
    finally:
        consumer.close()


@pytest.fixture(scope="session")
def committed_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CommittedLog]:
    root = tmp_path_factory.mktemp("committed")
    server = KcoordProcess(root / "data", "--offsets-partitions", str(SOURCE_PARTITIONS),
                           "--group-initial-rebalance-delay-ms", "300",
                           "--group-min-session-timeout-ms", "1000").start()
    kp_groups = [f"kp-{i}" for i in range(8)]
    ck_groups = [f"ck-{i}" for i in range(8)]
    log = CommittedLog(root / "data", [*kp_groups, *ck_groups, "members", "hist"])
    try:
        members = [Member(server, "aiokafka", "members", client_id=f"aio-{i}") for i in range(2)]
        settled(*members)
        _kafka_python_commits(server, kp_groups)
        _confluent_commits(server, ck_groups)
        for m in members:
            m.leave()  # the group becomes Empty: another group-metadata record
        admin = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=10_000)
        try:
            admin.alter_group_offsets("members", {TopicPartition("events", 0): OffsetAndMetadata(42, "", -1)})
            assert admin.delete_groups(["kp-7"])["kp-7"] == "OK"
            admin.delete_group_offsets("kp-6", [TopicPartition("t-0", 1)])
            _history(server)
            log.listed = {g["group_id"] for g in admin.list_groups()}
            log.expected = {g: offset_fetch(admin, g) for g in sorted(set(log.groups) | log.listed)}
        finally:
            admin.close()
        assert log.expected["kp-7"] == {} and ("t-0", 1) not in log.expected["kp-6"]
        assert server.stop() == 0
        yield log
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()

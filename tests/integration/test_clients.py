"""Stock clients against the real kcoord process: kafka-python 3.0.12, aiokafka 0.14, confluent-kafka 2.16.

What each client does here (observed on the wire, kcoord serves no JoinGroup yet):
* kafka-python: ApiVersions v4, FindCoordinator v6, OffsetCommit v8 (generation -1, member ""), OffsetFetch
  v8; ``api_version=(0, 11)`` / ``(0, 10, 1)`` / ``(0, 8, 2)`` use OffsetCommit v3 / v2 / v1 and OffsetFetch
  v3 / v1 / v1 (no leader epoch). Never committed: ``committed()`` None, ``list_group_offsets`` (-1, "", -1).
* aiokafka: ``commit()`` needs a subscription with an assignment, else IllegalStateError("Not
  subscribed to any topics"). ``subscribe()`` would need JoinGroup; manual ``assign()`` does not: it
  only uses FindCoordinator v1, OffsetCommit v3 (generation -1, member "") and OffsetFetch v3, so
  there is no leader epoch. ``committed()`` returns the offset only (None when never committed). Its
  metadata refresh for the assigned (non-existent) topics logs "Topic ... not found in cluster metadata".
* confluent-kafka: a Consumer with ``group.id`` commits explicit offsets without subscribe/assign
  (OffsetCommit v9, OffsetFetch v9, AdminClient OffsetFetch v9). Never committed reads as
  OFFSET_INVALID (-1001) with metadata None. Its Python binding sends commit metadata *with the C NUL
  terminator* ("m" goes on the wire as "m\\x00"): other clients read "m\\x00" back, confluent itself
  strips it, and 4096 characters are 4097 on the wire (OFFSET_METADATA_TOO_LARGE). A client quirk
  (Kafka stores the same bytes), asserted below as observed.
"""

import asyncio
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import confluent_kafka as ck
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import IllegalStateError
from aiokafka.structs import OffsetAndMetadata as AioOffsetAndMetadata
from aiokafka.structs import TopicPartition as AioTP
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import OffsetMetadataTooLargeError
from kafka.protocol.consumer.group import (
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.structs import OffsetAndMetadata

from tests.integration.test_bad_input import connect, encode, read_frame
from tests.kcoord_process import KcoordProcess

TIMEOUT = 10.0
NUL = "\x00"
T = TypeVar("T")

# (topic, partition) -> (offset, metadata, leader epoch): several topics, non-ASCII and non-BMP metadata
COMMITS: dict[tuple[str, int], tuple[int, str, int]] = {
    ("orders", 0): (100, "plain ascii", 5),
    ("orders", 7): (0, "", -1),
    ("payments", 3): (12_345_678_901_234, "naïve café ✓ ß €", 2),
    ("audit.log", 1): (42, "日本語 😀 🚀 emoji", 0),
    ("audit.log", 2): (7, "x" * 300, 11),
}
NEVER = ("orders", 9)  # never committed by anyone


def tp(key: tuple[str, int]) -> TopicPartition:
    return TopicPartition(*key)


def bounded(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Runs a blocking client call with a hard bound (confluent's sync commit takes no timeout)."""
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(fn, *args, **kwargs).result(TIMEOUT)
    finally:
        pool.shutdown(wait=False)


# -- kafka-python ----------------------------------------------------------------------------------

def kp_consumer(server: KcoordProcess, group: str, **kw: Any) -> KafkaConsumer:
    return KafkaConsumer(bootstrap_servers=server.bootstrap, group_id=group, enable_auto_commit=False,
                         request_timeout_ms=10_000, **kw)


def kp_commit(consumer: KafkaConsumer, commits: dict[tuple[str, int], tuple[int, str, int]]) -> None:
    consumer.commit({tp(k): OffsetAndMetadata(o, m, e) for k, (o, m, e) in commits.items()}, timeout_ms=10_000)


def kp_write(server: KcoordProcess, group: str, commits: dict[tuple[str, int], tuple[int, str, int]]) -> None:
    consumer = kp_consumer(server, group)
    try:
        kp_commit(consumer, commits)
    finally:
        consumer.close()


def kp_read(server: KcoordProcess, group: str, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], Any]:
    consumer = kp_consumer(server, group)
    try:
        got = {k: consumer.committed(tp(k), metadata=True, timeout_ms=10_000) for k in keys}
    finally:
        consumer.close()
    return {k: None if v is None else (v.offset, v.metadata, v.leader_epoch) for k, v in got.items()}


# -- confluent-kafka -------------------------------------------------------------------------------

def ck_consumer(server: KcoordProcess, group: str) -> ck.Consumer:
    return ck.Consumer({"bootstrap.servers": server.bootstrap, "group.id": group, "enable.auto.commit": False,
                        "socket.timeout.ms": 10_000, "broker.address.family": "v4"})


def ck_commit(consumer: ck.Consumer, commits: Mapping[tuple[str, int], tuple[int, str | None, int]]) -> None:
    offsets = [ck.TopicPartition(t, p, o, leader_epoch=e, **({} if m is None else {"metadata": m}))
               for (t, p), (o, m, e) in commits.items()]
    result: list[ck.TopicPartition] = bounded(consumer.commit, offsets=offsets, asynchronous=False)
    assert sorted((r.topic, r.partition, r.error) for r in result) == sorted((t, p, None) for t, p in commits)


def ck_write(server: KcoordProcess, group: str, commits: Mapping[tuple[str, int], tuple[int, str | None, int]]) -> None:
    consumer = ck_consumer(server, group)
    try:
        ck_commit(consumer, commits)
    finally:
        consumer.close()


def ck_row(r: ck.TopicPartition) -> tuple[int, str | None, int | None]:
    """(offset, metadata, epoch). Metadata written by another library lacks the NUL the confluent
    binding expects: it strdup()s past librdkafka's buffer and may append garbage (see foreign_match)."""
    assert r.error is None, r.error
    try:
        metadata = r.metadata
    except UnicodeDecodeError:
        metadata = "<over-read>"
    return r.offset, metadata, r.leader_epoch


def ck_read(server: KcoordProcess, group: str, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], Any]:
    consumer = ck_consumer(server, group)
    try:
        rows = consumer.committed([ck.TopicPartition(t, p) for t, p in keys], timeout=TIMEOUT)
    finally:
        consumer.close()
    return {(r.topic, r.partition): ck_row(r) for r in rows}


def foreign_match(got: dict[tuple[str, int], Any], expected: dict[tuple[str, int], Any]) -> bool:
    """confluent's view of other libraries' writes: offsets and epochs exact, metadata a prefix (the
    over-read, consistent with librdkafka#4649); kafka-python checks those exact bytes elsewhere."""
    assert got.keys() == expected.keys()
    for key, (offset, metadata, epoch) in expected.items():
        g_offset, g_metadata, g_epoch = got[key]
        assert (g_offset, g_epoch) == (offset, epoch), key
        if metadata == "":  # an empty string on the wire reads as None through confluent
            assert g_metadata is None, (key, g_metadata)
        else:
            assert g_metadata == "<over-read>" or g_metadata.startswith(metadata), (key, g_metadata)
    return True


def ck_admin_list(server: KcoordProcess, group: str, keys: Iterable[tuple[str, int]] | None = None) -> dict[Any, Any]:
    admin = AdminClient({"bootstrap.servers": server.bootstrap, "broker.address.family": "v4"})
    parts = None if keys is None else [ck.TopicPartition(t, p) for t, p in keys]
    futures = admin.list_consumer_group_offsets([ck.ConsumerGroupTopicPartitions(group, parts)],
                                                request_timeout=TIMEOUT)
    result = futures[group].result(TIMEOUT)
    assert result.group_id == group
    return {(r.topic, r.partition): ck_row(r) for r in result.topic_partitions}


def ck_epoch(epoch: int) -> int | None:
    return None if epoch < 0 else epoch


# -- aiokafka --------------------------------------------------------------------------------------

async def aio_consumer(server: KcoordProcess, group: str, keys: Iterable[tuple[str, int]]) -> AIOKafkaConsumer:
    consumer = AIOKafkaConsumer(bootstrap_servers=server.bootstrap, group_id=group, enable_auto_commit=False,
                                auto_offset_reset="none", request_timeout_ms=10_000)
    await asyncio.wait_for(consumer.start(), TIMEOUT)
    consumer.assign([AioTP(t, p) for t, p in keys])
    return consumer


async def aio_read(server: KcoordProcess, group: str, keys: list[tuple[str, int]]) -> dict[tuple[str, int], Any]:
    consumer = await aio_consumer(server, group, keys)
    try:
        return {k: await asyncio.wait_for(consumer.committed(AioTP(*k)), TIMEOUT) for k in keys}
    finally:
        await asyncio.wait_for(consumer.stop(), TIMEOUT)


async def aio_commit(server: KcoordProcess, group: str, commits: dict[tuple[str, int], tuple[int, str, int]]) -> None:
    consumer = await aio_consumer(server, group, commits)
    try:
        await asyncio.wait_for(consumer.commit({AioTP(*k): v[:2] for k, v in commits.items()}), TIMEOUT)
    finally:
        await asyncio.wait_for(consumer.stop(), TIMEOUT)


# -- tests -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("api_version", "keeps_epoch"), [(None, True), ((0, 11), False), ((0, 10, 1), False),
                                                          ((0, 8, 2), False)],
                         ids=["commit-v8-fetch-v8", "commit-v3-fetch-v3", "commit-v2-fetch-v1", "commit-v1-fetch-v1"])
def test_kafka_python_commit_and_committed(kcoord: KcoordProcess, api_version: Any, keeps_epoch: bool) -> None:
    consumer = kp_consumer(kcoord, "kp-group", api_version=api_version)
    try:
        kp_commit(consumer, COMMITS)
        for key, (offset, metadata, epoch) in COMMITS.items():
            got = consumer.committed(tp(key), metadata=True, timeout_ms=10_000)
            assert (got.offset, got.metadata, got.leader_epoch) == (offset, metadata, epoch if keeps_epoch else -1)
            assert consumer.committed(tp(key), timeout_ms=10_000) == offset
        assert consumer.committed(tp(NEVER), metadata=True, timeout_ms=10_000) is None
        kp_commit(consumer, {("orders", 0): (101, "second", 6)})  # overwrite
        assert consumer.committed(tp(("orders", 0)), timeout_ms=10_000) == 101
    finally:
        consumer.close()


def test_kafka_python_admin_list_group_offsets(kcoord: KcoordProcess) -> None:
    kp_write(kcoord, "kp-admin-a", COMMITS)
    kp_write(kcoord, "kp-admin-b", {("other", 0): (5, "b ✓", -1)})
    admin = KafkaAdminClient(bootstrap_servers=kcoord.bootstrap, request_timeout_ms=10_000)
    try:
        everything = admin.list_group_offsets(["kp-admin-a", "kp-admin-b", "kp-never-used"])
        assert everything == {
            "kp-admin-a": {tp(k): OffsetAndMetadata(*v) for k, v in COMMITS.items()},
            "kp-admin-b": {TopicPartition("other", 0): OffsetAndMetadata(5, "b ✓", -1)},
            "kp-never-used": {},
        }
        some = admin.list_group_offsets({"kp-admin-a": [tp(("payments", 3)), tp(NEVER)]})
        assert some == {"kp-admin-a": {tp(("payments", 3)): OffsetAndMetadata(*COMMITS[("payments", 3)]),
                                       tp(NEVER): OffsetAndMetadata(-1, "", -1)}}
    finally:
        admin.close()


def test_kafka_python_metadata_limit_counts_utf16_units(kcoord: KcoordProcess) -> None:
    """offset.metadata.max.bytes 4096 counts Java chars: 2048 emoji (8192 UTF-8 bytes) fit, 2049 do not;
    the oversized partition fails alone, the other one in the same request is committed."""
    consumer = kp_consumer(kcoord, "kp-limit")
    try:
        for n, (metadata, fits) in enumerate([("a" * 4096, True), ("a" * 4097, False),
                                              ("😀" * 2048, True), ("😀" * 2049, False)]):
            request = {("t", 0): (n, metadata, -1), ("t", 1): (n, "small", -1)}
            if fits:
                kp_commit(consumer, request)
            else:
                with pytest.raises(OffsetMetadataTooLargeError):
                    kp_commit(consumer, request)
            assert consumer.committed(TopicPartition("t", 1), timeout_ms=10_000) == n
            want = (n, metadata, -1) if fits else (n - 1, "a" * 4096 if n == 1 else "😀" * 2048, -1)
            got = consumer.committed(TopicPartition("t", 0), metadata=True, timeout_ms=10_000)
            assert (got.offset, got.metadata, got.leader_epoch) == want
    finally:
        consumer.close()


def test_aiokafka_commits_with_manual_assignment(kcoord: KcoordProcess) -> None:
    keys = list(COMMITS)

    async def scenario() -> dict[tuple[str, int], Any]:
        consumer = AIOKafkaConsumer(bootstrap_servers=kcoord.bootstrap, group_id="aio-group",
                                    enable_auto_commit=False, request_timeout_ms=10_000)
        await asyncio.wait_for(consumer.start(), TIMEOUT)
        try:
            with pytest.raises(IllegalStateError, match="Not subscribed"):
                await consumer.commit({AioTP("orders", 0): (1, "no assignment")})
            consumer.assign([AioTP(*k) for k in [*keys, NEVER]])
            half = keys[: len(keys) // 2]
            await asyncio.wait_for(consumer.commit({AioTP(*k): COMMITS[k][:2] for k in half}), TIMEOUT)
            rest = {AioTP(*k): AioOffsetAndMetadata(*COMMITS[k][:2]) for k in keys[len(half):]}
            await asyncio.wait_for(consumer.commit(rest), TIMEOUT)
            return {k: await asyncio.wait_for(consumer.committed(AioTP(*k)), TIMEOUT) for k in [*keys, NEVER]}
        finally:
            await asyncio.wait_for(consumer.stop(), TIMEOUT)

    got = asyncio.run(scenario())
    assert got == {**{k: v[0] for k, v in COMMITS.items()}, NEVER: None}
    # metadata round trip, read by another library; OffsetCommit v3 carries no leader epoch
    assert kp_read(kcoord, "aio-group", keys) == {k: (o, m, -1) for k, (o, m, _) in COMMITS.items()}


def test_confluent_commit_without_subscription_and_committed(kcoord: KcoordProcess) -> None:
    consumer = ck_consumer(kcoord, "ck-group")
    try:
        ck_commit(consumer, COMMITS)
        rows = consumer.committed([ck.TopicPartition(t, p) for t, p in [*COMMITS, NEVER]], timeout=TIMEOUT)
        got = {(r.topic, r.partition): ck_row(r) for r in rows}
    finally:
        consumer.close()
    assert got == {**{k: (o, m, ck_epoch(e)) for k, (o, m, e) in COMMITS.items()},
                   NEVER: (ck.OFFSET_INVALID, None, None)}


def test_confluent_admin_list_consumer_group_offsets(kcoord: KcoordProcess) -> None:
    ck_write(kcoord, "ck-admin", COMMITS)
    expected = {k: (o, m, ck_epoch(e)) for k, (o, m, e) in COMMITS.items()}
    assert ck_admin_list(kcoord, "ck-admin") == expected
    some = ck_admin_list(kcoord, "ck-admin", [("payments", 3), NEVER])
    assert some == {("payments", 3): expected[("payments", 3)], NEVER: (ck.OFFSET_INVALID, None, None)}
    assert ck_admin_list(kcoord, "ck-never-used") == {}


def test_confluent_metadata_carries_nul_terminator(kcoord: KcoordProcess) -> None:
    """confluent-kafka-python sends "m" as "m\\x00" (see module docstring); no metadata is stored as "",
    which confluent itself reads back as None (and its own "" comes back as "", being "\\x00" stored)."""
    consumer = ck_consumer(kcoord, "ck-nul")
    try:
        ck_commit(consumer, {("t", 0): (1, "m ✓", -1), ("t", 1): (2, None, -1), ("t", 2): (3, "a" * 4095, -1)})
        offsets = [ck.TopicPartition("t", 3, 4, metadata="a" * 4096)]
        with pytest.raises(ck.KafkaException) as info:
            bounded(consumer.commit, offsets=offsets, asynchronous=False)
        assert info.value.args[0].code() == ck.KafkaError.OFFSET_METADATA_TOO_LARGE
    finally:
        consumer.close()
    keys = [("t", 0), ("t", 1), ("t", 2), ("t", 3)]
    assert kp_read(kcoord, "ck-nul", keys) == {("t", 0): (1, "m ✓" + NUL, -1), ("t", 1): (2, "", -1),
                                               ("t", 2): (3, "a" * 4095 + NUL, -1), ("t", 3): None}
    assert ck_read(kcoord, "ck-nul", keys[:3]) == {("t", 0): (1, "m ✓", None), ("t", 1): (2, None, None),
                                                   ("t", 2): (3, "a" * 4095, None)}


def test_offsets_survive_graceful_restart_read_by_other_libraries(kcoord: KcoordProcess) -> None:
    keys = list(COMMITS)
    kept_open = kp_consumer(kcoord, "x-kp")
    try:
        kp_commit(kept_open, COMMITS)
        ck_write(kcoord, "x-ck", COMMITS)
        asyncio.run(aio_commit(kcoord, "x-aio", COMMITS))

        assert kcoord.stop() == 0, kcoord.log()  # SIGTERM: the graceful path
        kcoord.start()

        # kafka-python's writes, read by confluent (consumer and admin) and aiokafka
        from_kp = {k: (o, m, ck_epoch(e)) for k, (o, m, e) in COMMITS.items()}
        assert foreign_match(ck_read(kcoord, "x-kp", keys), from_kp)
        assert foreign_match(ck_admin_list(kcoord, "x-kp"), from_kp)
        assert asyncio.run(aio_read(kcoord, "x-kp", keys)) == {k: v[0] for k, v in COMMITS.items()}
        # confluent's writes, read by kafka-python (with the binding's NUL) and aiokafka
        assert kp_read(kcoord, "x-ck", keys) == {k: (o, m + NUL, e) for k, (o, m, e) in COMMITS.items()}
        assert asyncio.run(aio_read(kcoord, "x-ck", [*keys, NEVER])) == {
            **{k: v[0] for k, v in COMMITS.items()}, NEVER: None}
        # aiokafka's writes (no epoch), read by kafka-python and confluent
        assert kp_read(kcoord, "x-aio", keys) == {k: (o, m, -1) for k, (o, m, _) in COMMITS.items()}
        from_aio = {k: (o, m, None) for k, (o, m, _) in COMMITS.items()}
        assert foreign_match(ck_read(kcoord, "x-aio", keys), from_aio)

        # the consumer that was connected across the restart reconnects and keeps committing
        kp_commit(kept_open, {("orders", 0): (500, "after restart", 9)})
        assert kp_read(kcoord, "x-kp", [("orders", 0)]) == {("orders", 0): (500, "after restart", 9)}
    finally:
        kept_open.close()


def test_acknowledged_commits_survive_sigkill(kcoord: KcoordProcess) -> None:
    consumer = kp_consumer(kcoord, "crash-kp")
    try:
        for i in range(20):
            kp_commit(consumer, {("orders", i % 4): (i, f"commit {i} ✓", i)})
    finally:
        consumer.close()
    kcoord.kill()
    kcoord.start()
    expected = {("orders", p): (16 + p, f"commit {16 + p} ✓", 16 + p) for p in range(4)}
    assert kp_read(kcoord, "crash-kp", expected) == expected
    assert foreign_match(ck_read(kcoord, "crash-kp", expected), expected)


# -- simple-commit semantics on every version (raw requests) ---------------------------------------

def raw_commit_error(sock: Any, version: int, group: str, generation: int, member: str, corr: int) -> int:
    topic = OffsetCommitRequest.OffsetCommitRequestTopic
    part = topic.OffsetCommitRequestPartition(partition_index=0, committed_offset=10 + version,
                                              committed_leader_epoch=-1, commit_timestamp=-1,
                                              committed_metadata=f"v{version}")
    req = OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=generation, member_id=member,
                              group_instance_id=None, retention_time_ms=-1, topics=[topic(name="t", partitions=[part])])
    sock.sendall(encode(req, version, corr))
    resp = OffsetCommitResponse.decode(read_frame(sock), version=version, header=True)
    assert resp.header.correlation_id == corr
    (error,) = [p.error_code for t in resp.topics for p in t.partitions]
    return int(error)


def raw_fetch_partition(sock: Any, version: int, group: str, partition: int, corr: int) -> Any:
    if version >= 8:
        G = OffsetFetchRequest.OffsetFetchRequestGroup
        topics = [G.OffsetFetchRequestTopics(name="t", partition_indexes=[partition])]
        req = OffsetFetchRequest(groups=[G(group_id=group, topics=topics)], require_stable=False)
    else:
        topics = [OffsetFetchRequest.OffsetFetchRequestTopic(name="t", partition_indexes=[partition])]
        req = OffsetFetchRequest(group_id=group, topics=topics, require_stable=False)
    sock.sendall(encode(req, version, corr))
    resp = OffsetFetchResponse.decode(read_frame(sock), version=version, header=True)
    assert resp.header.correlation_id == corr
    if version >= 8:
        assert resp.groups[0].error_code == 0
        return resp.groups[0].topics[0].partitions[0]
    if version >= 2:
        assert resp.error_code == 0
    return resp.topics[0].partitions[0]


def test_simple_commit_generation_rules_every_version(kcoord: KcoordProcess) -> None:
    """Reference 5.2 step 6-7 and 19.5 (1, 2, 7): generation -1 commits create/extend a simple group
    on v0-v9; a generation for an absent group is ILLEGAL_GENERATION (v1-v8) / GROUP_ID_NOT_FOUND (v9);
    against the existing Empty group a real generation needs a known member (UNKNOWN_MEMBER_ID)."""
    with connect(kcoord) as sock:
        for v in range(10):
            never = raw_fetch_partition(sock, v, f"simple-v{v}", 0, corr=100 + v)  # epoch default -1 below v5
            assert (never.committed_offset, never.committed_leader_epoch, never.metadata, never.error_code) == (
                -1, -1, "", 0)
            assert raw_commit_error(sock, v, f"simple-v{v}", -1, "", corr=v) == 0
            got = raw_fetch_partition(sock, v, f"simple-v{v}", 0, corr=200 + v)
            assert (got.committed_offset, got.metadata, got.error_code) == (10 + v, f"v{v}", 0)
            if v >= 1:
                absent = raw_commit_error(sock, v, f"absent-v{v}", 5, "m", corr=300 + v)
                assert absent == (69 if v == 9 else 22), f"v{v}"
                assert raw_commit_error(sock, v, f"simple-v{v}", 5, "m", corr=400 + v) == 25
                assert raw_commit_error(sock, v, f"simple-v{v}", -1, "some-member", corr=500 + v) == 0

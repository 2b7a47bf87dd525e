"""Metadata answers rewritten at the byte level and their topics read later (coordinator.gateway.topiccache),
checked against a stock codec (kafka-python's encoder and decoder) at every version the gateway relays."""

import logging
import random
import struct
import uuid
from typing import Any

import pytest
from kafka.protocol.metadata import MetadataResponse as Stock

from coordinator.gateway import rewrite
from coordinator.gateway.topiccache import MAX_WAITING, TopicFacts
from tests.gateway.test_rewrite import Facts, stock_decode

Broker = Stock.MetadataResponseBroker
Topic = Stock.MetadataResponseTopic
Partition = Topic.MetadataResponsePartition
VERSIONS = range(0, rewrite.CAPS[rewrite.METADATA] + 1)


def upstream_answer(version: int, topics: list[Any], brokers: list[Any] | None = None) -> bytes:
    """A framed answer as an upstream broker sends it, encoded by kafka-python."""
    body = Stock(throttle_time_ms=3, brokers=brokers if brokers is not None else [
        Broker(node_id=1, host="10.0.0.1", port=9092, rack="rack-a"),
        Broker(node_id=2, host="10.0.0.2", port=9093, rack=None)],
        cluster_id="up-cluster", controller_id=2, topics=topics, authorized_operations=None)
    head = struct.pack(">i", 77) + (b"\x00" if version >= 9 else b"")
    payload = head + bytes(body.encode(version=version))
    return struct.pack(">i", len(payload)) + payload


def some_topics(rng: random.Random, count: int, null_names: bool) -> list[Any]:
    topics = []
    for i in range(count):
        partitions = [Partition(error_code=rng.choice([0, 0, 5, 9]), partition_index=p, leader_id=rng.randrange(-1, 4),
                                leader_epoch=rng.randrange(-1, 1000),
                                replica_nodes=rng.sample(range(300), rng.randrange(4)),
                                isr_nodes=rng.sample(range(300), rng.randrange(3)),
                                offline_replicas=rng.sample(range(300), rng.randrange(2)))
                      for p in range(rng.randrange(0, 40 if i else 200))]  # 200: past a one-byte array length
        name = None if null_names and i == 1 else f"tópico-{i}-{'x' * rng.randrange(150)}"
        topics.append(Topic(error_code=rng.choice([0, 0, 0, 3, 5]), name=name, topic_id=uuid.uuid4(),
                            is_internal=rng.random() < 0.2, partitions=partitions, authorized_operations=None))
    return topics


@pytest.mark.parametrize("version", VERSIONS)
def test_the_rewrite_changes_only_the_broker_list(version: int) -> None:
    rng = random.Random(version)
    frame = upstream_answer(version, some_topics(rng, 12, version >= 12))
    facts = Facts()
    out = rewrite.rewrite_metadata(frame, version, facts)
    before, after = stock_decode(frame, version), stock_decode(out, version)
    assert [(b.node_id, b.host, b.port) for b in after.brokers] == [
        (1, "kcoord.local", 40001), (2, "kcoord.local", 40002), (9, "kcoord.local", 40009)]
    if version >= 1:
        assert [b.rack for b in after.brokers] == ["rack-a", None, None]
    before.brokers = after.brokers
    assert after == before
    # everything after the broker list is the upstream's bytes, as they came
    tail = len(frame) - frame.index(b"10.0.0.2") - len(b"10.0.0.2") - 4 - (2 if version >= 1 else 0) - (
        1 if version >= 9 else 0)
    assert out[-tail:] == frame[-tail:]
    assert facts.learnt == [(1, "10.0.0.1", 9092), (2, "10.0.0.2", 9093)]
    assert (facts.cluster_id, facts.controller_id) == (("up-cluster" if version >= 2 else Facts.cluster_id),
                                                      (2 if version >= 1 else Facts.controller_id))


@pytest.mark.parametrize("version", VERSIONS)
def test_the_topics_read_later_are_what_a_stock_decoder_reads(version: int) -> None:
    rng = random.Random(100 + version)
    frame = upstream_answer(version, some_topics(rng, 30, version >= 12))
    facts = Facts()
    rewrite.rewrite_metadata(frame, version, facts)
    expected = {t.name: TopicFacts(t.topic_id if version >= 10 else uuid.UUID(int=0), len(t.partitions),
                                   bool(t.is_internal) if version >= 1 else False,
                                   tuple((p.partition_index, p.error_code, p.leader_id,
                                          p.leader_epoch if version >= 7 else -1) for p in t.partitions))
                for t in stock_decode(frame, version).topics if t.error_code == 0 and t.name is not None}
    assert facts.topics.facts() == expected


@pytest.mark.parametrize("version", [1, 9, 12])
def test_a_broker_list_that_cannot_be_read_is_refused(version: int) -> None:
    frame = upstream_answer(version, [])
    cut = frame.index(b"10.0.0.2") + 3
    with pytest.raises(rewrite.RewriteError):
        rewrite.rewrite_metadata(struct.pack(">i", cut - 4) + frame[4:cut], version, Facts())


@pytest.mark.parametrize("version", [1, 9, 12])
def test_topics_that_cannot_be_read_are_passed_on_and_not_learnt(version: int,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Relayed as they came, as Fetch and Produce answers are; the client's own decoder judges them. The
    cache keeps what it knew, and says why it learnt nothing."""
    known = {"orders": TopicFacts(uuid.UUID(int=5), 3, False)}
    facts = Facts(dict(known))
    good = upstream_answer(version, some_topics(random.Random(1), 3, False))
    torn = struct.pack(">i", len(good) - 14) + good[4:-10]
    out = rewrite.rewrite_metadata(torn, version, facts, every_topic=True)
    assert out.endswith(torn[-100:])
    with caplog.at_level(logging.WARNING):
        assert facts.topics.facts() == known
    assert "topics are not readable" in caplog.text


def test_an_answer_for_every_topic_replaces_the_answers_waiting(caplog: pytest.LogCaptureFixture) -> None:
    facts = Facts()
    for _ in range(5):
        facts.topics.note(b"never read", 0, 9, every_topic=False)
    frame = upstream_answer(9, [Topic(error_code=0, name="t", topic_id=uuid.uuid4(), is_internal=False,
                                      partitions=[], authorized_operations=None)])
    rewrite.rewrite_metadata(frame, 9, facts, every_topic=True)
    with caplog.at_level(logging.WARNING):
        assert list(facts.topics.facts()) == ["t"]
    assert not caplog.text  # the five unreadable answers before it were dropped unread


def test_answers_for_named_topics_are_read_once_enough_wait() -> None:
    """They are kept as bytes only up to MAX_WAITING answers: a stream of them does not grow without end."""
    facts = Facts()
    for i in range(MAX_WAITING + 1):
        rewrite.rewrite_metadata(upstream_answer(9, [Topic(error_code=0, name=f"t{i}", topic_id=uuid.uuid4(),
                                                           is_internal=False, partitions=[],
                                                           authorized_operations=None)]), 9, facts)
    assert not facts.topics._waiting
    assert len(facts.topics._facts) == MAX_WAITING + 1


def test_an_answer_for_every_topic_keeps_a_named_topic_in_error_as_it_was() -> None:
    """A topic named with LEADER_NOT_AVAILABLE still exists: its facts from before stay; one not named
    is gone, one UNKNOWN_TOPIC_OR_PARTITION is gone."""
    old = TopicFacts(uuid.UUID(int=5), 3, False, ((0, 0, 1, 1), (1, 0, 2, 1), (2, 0, 1, 1)))
    facts = Facts({"electing": old, "deleted": old, "unknown": old})
    frame = upstream_answer(12, [
        Topic(error_code=rewrite.LEADER_NOT_AVAILABLE, name="electing", topic_id=uuid.UUID(int=5), is_internal=False,
              partitions=[], authorized_operations=None),
        Topic(error_code=rewrite.UNKNOWN_TOPIC_OR_PARTITION, name="unknown", topic_id=uuid.UUID(int=0),
              is_internal=False, partitions=[], authorized_operations=None)])
    rewrite.rewrite_metadata(frame, 12, facts, every_topic=True)
    assert facts.topics.facts() == {"electing": old}

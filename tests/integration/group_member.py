"""One consumer-group member in a process of its own: a stock kafka-python or aiokafka consumer that
``subscribe()``s and reports on stdout, one JSON object per line, every assignment it gets (with its
member id and generation, read from the client's coordinator) and its own end.

kcoord hosts no data topics, so the stock assignors hand out nothing. The members here also offer
"fixed", an assignor (a supported plug-in point of both libraries) that deals out PARTITIONS partitions
of each subscribed topic round robin without looking at metadata, so assignments are visible. kafka-python
members offer ["range", "fixed"] and aiokafka ones ["fixed"]: the group must select "fixed".

    python -m tests.integration.group_member --client kafka-python --bootstrap H:P --group G --topics a,b
"""

import argparse
import asyncio
import collections
import json
import logging
import signal
import sys
import time
from typing import Any

PARTITIONS = 4


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "time": time.time(), **fields}), flush=True)


def deal(members: dict[str, list[str]]) -> dict[str, dict[str, list[int]]]:
    """member id -> topic -> partitions: every subscribed topic's partitions, round robin."""
    ordered = sorted(members)
    out: dict[str, dict[str, list[int]]] = {m: collections.defaultdict(list) for m in ordered}
    i = 0
    for topic in sorted({t for ts in members.values() for t in ts}):
        for partition in range(PARTITIONS):
            while topic not in members[ordered[i % len(ordered)]]:
                i += 1
            out[ordered[i % len(ordered)]][topic].append(partition)
            i += 1
    return out


def run_kafka_python(args: argparse.Namespace) -> None:
    from kafka import KafkaConsumer
    from kafka.consumer.subscription_state import ConsumerRebalanceListener
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment

    class Fixed(RoundRobinPartitionAssignor):  # type: ignore[misc]  # the library is untyped (Any)
        name = "fixed"

        @classmethod
        def assign(cls, cluster: Any, members: Any) -> dict[str, Any]:
            dealt = deal({m.member_id: list(m.metadata.topics) for m in members})
            return {m: ConsumerProtocolAssignment(0, sorted((t, ps) for t, ps in d.items()), b"")
                    for m, d in dealt.items()}

    consumer = KafkaConsumer(bootstrap_servers=args.bootstrap, group_id=args.group, client_id=args.client_id,
                             group_instance_id=args.instance_id, session_timeout_ms=args.session_ms,
                             heartbeat_interval_ms=args.heartbeat_ms, enable_auto_commit=False,
                             partition_assignment_strategy=(RangePartitionAssignor, Fixed))

    class Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # the library is untyped (Any)
        def on_partitions_revoked(self, revoked: Any) -> None:
            pass

        def on_partitions_assigned(self, assigned: Any) -> None:
            generation = consumer._coordinator._generation
            emit("assigned", partitions=sorted([tp.topic, tp.partition] for tp in assigned),
                 member_id=generation.member_id, generation=generation.generation_id)

    consumer.subscribe(args.topics.split(","), listener=Listener())
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    while not stop:
        consumer.poll(timeout_ms=100)
    consumer.close()  # LeaveGroup
    emit("closed")


async def run_aiokafka(args: argparse.Namespace) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.abc import ConsumerRebalanceListener
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

    class Fixed(RoundRobinPartitionAssignor):  # type: ignore[misc]  # the library is untyped (Any)
        name = "fixed"

        @classmethod
        def assign(cls, cluster: Any, members: Any) -> dict[str, Any]:
            dealt = deal({m: list(meta.subscription) for m, meta in members.items()})
            return {m: ConsumerProtocolMemberAssignment(0, sorted((t, ps) for t, ps in d.items()), b"")
                    for m, d in dealt.items()}

    consumer = AIOKafkaConsumer(bootstrap_servers=args.bootstrap, group_id=args.group, client_id=args.client_id,
                                group_instance_id=args.instance_id, session_timeout_ms=args.session_ms,
                                heartbeat_interval_ms=args.heartbeat_ms, enable_auto_commit=False,
                                partition_assignment_strategy=(Fixed,))

    class Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # the library is untyped (Any)
        async def on_partitions_revoked(self, revoked: Any) -> None:
            pass

        async def on_partitions_assigned(self, assigned: Any) -> None:
            coordinator = consumer._coordinator
            emit("assigned", partitions=sorted([tp.topic, tp.partition] for tp in assigned),
                 member_id=coordinator.member_id, generation=coordinator.generation)

    await consumer.start()
    consumer.subscribe(args.topics.split(","), listener=Listener())
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    while not stop.is_set():
        await consumer.getmany(timeout_ms=100)
    await consumer.stop()  # LeaveGroup
    emit("closed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", choices=["kafka-python", "aiokafka"], required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topics", required=True)
    parser.add_argument("--client-id", default="member")
    parser.add_argument("--instance-id", default=None)
    parser.add_argument("--session-ms", type=int, default=6000)
    parser.add_argument("--heartbeat-ms", type=int, default=500)
    parser.add_argument("--log", default=None, help="write the client library's log (INFO) to this file")
    args = parser.parse_args(argv)
    if args.log:
        logging.basicConfig(filename=args.log, level=logging.INFO,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
        logging.getLogger("kafka.cluster").setLevel(logging.CRITICAL)
    if args.client == "kafka-python":
        run_kafka_python(args)
    else:
        asyncio.run(run_aiokafka(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

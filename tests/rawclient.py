"""A minimal blocking Kafka client for tests that need exact versions, raw frames or pipelining.
Requests are built and responses parsed with kafka-python's protocol classes (a stock codec)."""

import socket
import struct
from typing import Any

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer.group import OffsetCommitRequest, OffsetFetchRequest

CommitTopic = OffsetCommitRequest.OffsetCommitRequestTopic
CommitPartition = CommitTopic.OffsetCommitRequestPartition


def commit_request(group: str, offsets: dict[tuple[str, int], int], metadata: str = "",
                   generation: int = -1, member: str = "") -> Any:
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), offset in offsets.items():
        by_topic.setdefault(topic, []).append(CommitPartition(partition_index=partition, committed_offset=offset,
                                                              committed_leader_epoch=-1, committed_metadata=metadata))
    topics = [CommitTopic(name=t, partitions=ps) for t, ps in by_topic.items()]
    return OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=generation, member_id=member,
                               group_instance_id=None, retention_time_ms=-1, topics=topics)


def fetch_request(group: str, partitions: dict[str, list[int]] | None) -> Any:
    topics = None if partitions is None else [
        OffsetFetchRequest.OffsetFetchRequestTopic(name=t, partition_indexes=ps) for t, ps in partitions.items()
    ]
    return OffsetFetchRequest(group_id=group, topics=topics, require_stable=False)


class RawClient:
    def __init__(self, port: int, timeout: float = 10.0, client_id: str = "kcoord-tests",
                 host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.correlation = 0
        self.client_id = client_id

    def send(self, request: Any, version: int) -> int:
        self.correlation += 1
        request.with_header(correlation_id=self.correlation, client_id=self.client_id)
        self.sock.sendall(bytes(request.encode(version=version, header=True, framed=True)))
        return self.correlation

    def encode(self, request: Any, version: int) -> tuple[int, bytes]:
        """A framed request for later sending (pipelining)."""
        self.correlation += 1
        request.with_header(correlation_id=self.correlation, client_id=self.client_id)
        return self.correlation, bytes(request.encode(version=version, header=True, framed=True))

    def read_frame(self) -> bytes:
        size = struct.unpack(">i", self._read_exactly(4))[0]
        return self._read_exactly(size)

    def receive(self, api_key: int, version: int) -> tuple[int, Any]:
        """``(correlation id, decoded response)`` of the next response on the wire, decoded with
        kafka-python's classes (a stock codec, independent of ours)."""
        response_class = response_class_for(api_key)
        frame = self.read_frame()
        correlation = struct.unpack(">i", frame[:4])[0]
        flexible = api_key != 18 and response_class.flexible_version_q(version)
        body = frame[5:] if flexible else frame[4:]
        return correlation, response_class.decode(body, version=version)

    def call(self, request: Any, version: int) -> Any:
        correlation = self.send(request, version)
        got, response = self.receive(request.API_KEY, version)
        assert got == correlation
        return response

    def _read_exactly(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(min(n, 1 << 20))
            if not chunk:
                raise ConnectionError("server closed the connection")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def response_class_for(api_key: int) -> Any:
    """kafka-python's response class for an API key."""
    for cls in _all_subclasses(ApiMessage):
        if getattr(cls, "API_KEY", None) == api_key and cls.__name__.endswith("Response"):
            return cls
    raise KeyError(api_key)


def _all_subclasses(cls: type) -> list[type]:
    out: list[type] = []
    sub: type
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out

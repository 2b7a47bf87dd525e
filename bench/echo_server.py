"""The Python ceiling: an asyncio + uvloop server that answers Kafka frames from a response cache.

It is what a Python server on this machine costs when it does little more than frame, look up and
write: every request is keyed by its bytes minus the correlation id, and a key seen before is answered
with the cached response bytes, correlation id patched in. A key seen for the first time is decoded
with kafka-python and answered properly (OffsetCommit stores the offsets in a dict, OffsetFetch reads
them; ApiVersions lists what it serves), and the answer is cached.

Offsets stay right: a cached commit still applies its offsets (kept with the cached answer, so no
decoding), and any change of a stored offset drops every cached fetch answer. What it does not do is
everything a coordinator must: no durability, no group generations or members, no routing to
offsets partitions, no validation beyond kafka-python's decoding. A ceiling, not a server.
Run: ``python -m bench.echo_server --listen 127.0.0.1:PORT``.
"""

import argparse
import asyncio
import struct
import sys
from typing import Any

from kafka.protocol.consumer.group import (
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.metadata.api_versions import ApiVersionsResponse

SERVED = {18: (0, 3), 8: (0, 9), 9: (0, 9)}  # ApiVersions, OffsetCommit, OffsetFetch
_HEAD = struct.Struct(">hhi")
_SIZE = struct.Struct(">i")

CommitTopic = OffsetCommitResponse.OffsetCommitResponseTopic
CommitPartition = CommitTopic.OffsetCommitResponsePartition
FetchTopic = OffsetFetchResponse.OffsetFetchResponseTopic
FetchPartition = FetchTopic.OffsetFetchResponsePartition
FetchGroup = OffsetFetchResponse.OffsetFetchResponseGroup
FetchGroupTopic = FetchGroup.OffsetFetchResponseTopics
FetchGroupPartition = FetchGroupTopic.OffsetFetchResponsePartitions

Key = tuple[str, str, int]  # group, topic, partition
Value = tuple[int, int, str | None]  # offset, leader epoch, metadata
Updates = tuple[tuple[Key, Value], ...]
Entry = tuple[bytes, bytes, Updates | None]  # size prefix, body after the correlation id, a commit's offsets


class Answers:
    """The response cache and the slow path that fills it."""

    def __init__(self) -> None:
        self.cache: dict[bytes, Entry] = {}
        self.offsets: dict[Key, Value] = {}
        self.fetch_keys: list[bytes] = []

    def apply(self, updates: Updates) -> None:
        """Stores a commit's offsets; if any changed, cached fetch answers may be stale: drop them."""
        offsets = self.offsets
        changed = False
        for key, value in updates:
            if offsets.get(key) != value:
                offsets[key] = value
                changed = True
        if changed:
            for fetch_key in self.fetch_keys:
                self.cache.pop(fetch_key, None)
            self.fetch_keys.clear()

    def slow(self, key: bytes, frame: bytes) -> Entry:
        api_key, version, _ = _HEAD.unpack_from(frame)
        if api_key not in SERVED or not SERVED[api_key][0] <= version <= SERVED[api_key][1]:
            raise ValueError(f"api {api_key} v{version} is not served")
        if api_key == 18:
            keys = [ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
                    for k, (lo, hi) in sorted(SERVED.items())]
            # header v0 whatever the version (KIP-511); the request body is not needed
            body, flexible = ApiVersionsResponse(error_code=0, api_keys=keys).encode(version=version), False
            updates: Updates | None = None
        elif api_key == 8:
            req: Any = OffsetCommitRequest.decode(frame, version=version, header=True)
            updates = tuple(((req.group_id, t.name, p.partition_index),
                             (p.committed_offset, p.committed_leader_epoch, p.committed_metadata))
                            for t in req.topics for p in t.partitions)
            self.apply(updates)
            body = self._commit(req).encode(version=version)
            flexible = OffsetCommitResponse.flexible_version_q(version)
        else:
            req = OffsetFetchRequest.decode(frame, version=version, header=True)
            body = self._fetch(req, version).encode(version=version)
            flexible = OffsetFetchResponse.flexible_version_q(version)
            self.fetch_keys.append(key)
            updates = None
        body = (b"\x00" if flexible else b"") + bytes(body)
        entry = (_SIZE.pack(4 + len(body)), body, updates)
        self.cache[key] = entry
        return entry

    def _commit(self, req: Any) -> Any:
        topics = []
        for t in req.topics:
            topics.append(CommitTopic(name=t.name, partitions=[
                CommitPartition(partition_index=p.partition_index, error_code=0) for p in t.partitions]))
        return OffsetCommitResponse(throttle_time_ms=0, topics=topics)

    def _parts(self, cls: Any, group: str, topic: str, partitions: list[int]) -> list[Any]:
        out = []
        for p in partitions:
            offset, epoch, metadata = self.offsets.get((group, topic, p), (-1, -1, ""))
            out.append(cls(partition_index=p, committed_offset=offset, committed_leader_epoch=epoch,
                           metadata=metadata, error_code=0))
        return out

    def _fetch(self, req: Any, version: int) -> Any:
        if version >= 8:
            groups = [
                FetchGroup(group_id=g.group_id, error_code=0, topics=[
                    FetchGroupTopic(name=t.name, partitions=self._parts(FetchGroupPartition, g.group_id, t.name,
                                                                        list(t.partition_indexes)))
                    for t in g.topics or []])
                for g in req.groups
            ]
            return OffsetFetchResponse(throttle_time_ms=0, groups=groups)
        topics = [FetchTopic(name=t.name, partitions=self._parts(FetchPartition, req.group_id, t.name,
                                                                 list(t.partition_indexes)))
                  for t in req.topics or []]
        return OffsetFetchResponse(throttle_time_ms=0, topics=topics, error_code=0)


class EchoProtocol(asyncio.Protocol):
    """Frames, looks up, answers: one write per read."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.transport: asyncio.Transport | None = None
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.buf:
            data = self.buf + data
        answers = self.answers
        cache = answers.cache
        out = []
        pos, end = 0, len(data)
        while end - pos >= 4:
            size = int.from_bytes(data[pos : pos + 4], "big")
            if end - pos - 4 < size:
                break
            start = pos + 4
            pos = start + size
            key = data[start : start + 4] + data[start + 8 : pos]
            entry = cache.get(key)
            if entry is not None:
                if entry[2] is not None:
                    answers.apply(entry[2])
            else:
                try:
                    entry = answers.slow(key, data[start:pos])
                except Exception as exc:  # anything we cannot answer: close, as a broker would
                    print(f"echo: closing a connection: {exc!r}", file=sys.stderr)
                    assert self.transport is not None
                    self.transport.close()
                    return
            out.append(entry[0])
            out.append(data[start + 4 : start + 8])
            out.append(entry[1])
        self.buf = data[pos:]
        if out:
            assert self.transport is not None
            self.transport.write(b"".join(out))


async def serve(host: str, port: int) -> None:
    answers = Answers()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: EchoProtocol(answers), host, port)
    print(f"echo listening on {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.echo_server", description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", default="127.0.0.1:9099", help="HOST:PORT (default 127.0.0.1:9099)")
    args = p.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    runner: Any = asyncio.run
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        pass
    try:
        runner(serve(host, int(port)))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

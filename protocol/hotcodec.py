"""OffsetCommit and OffsetFetch, the requests a consumer sends most, decoded from whole frames and their
responses encoded by hand-written code built with mypyc (setup.py), for every version kcoord serves.

Why: the generated codecs (protocol.codec) are straight-line Python, but a 1-partition commit or fetch
still spent ~8 us in its header, body and tag sections and ~3 us encoding its answer, about a fifth of
the request's event-loop time. Compiled, with byte arithmetic in ``i64``, the same work takes ~1-2 us.

Requests decode into the generated classes' objects, as the registry's other codecs do, except that
the two handlers take their requests straight from the frame: OffsetCommit's ``CommitRequest``
(``decode_commit``) and OffsetFetch's ``FetchRequest`` (``decode_fetch``); the
answers are encoded from the plain lists and tuples the two handlers answer with (coordinator/apis/k08
and k09), so no response objects are built at all. The registry and the handlers use this module
only when compiled (interpreted it is no faster than the generated code). The generated codecs stay
the reference: the tests check both ways of this module against them, on random messages and
answers and on malformed bytes (the same refusals, with the same bounds: varints of at most 5 bytes,
every length checked against the bytes left, nulls only where the version allows them).
"""

import time
from typing import Any, Final

from librt.strings import BytesWriter, write_i16_be, write_i32_be, write_i64_be
from mypy_extensions import i16, i32, i64, u8

from protocol.codec import MAX_COMPACT_STRING, DecodeError, EncodeError
from protocol.commit import CommitRequest, PartitionCommit
from protocol.offsetfetch import FetchGroup, FetchRequest, Requested
from protocol.schema import ZERO_UUID

OFFSET_COMMIT: Final = 8
OFFSET_FETCH: Final = 9
MAX_VERSION: Final = 9  # both APIs add topic ids in v10
_HEADER_FIXED: Final = 8  # api key, api version, correlation id
_ZERO_UUID: Final = ZERO_UUID
# A large request is decoded, and its response encoded, on the bulk thread; compiled code never lets
# the GIL go by itself (the interpreter's switch checks are in its bytecode loop), so loops over a
# large request's entries offer it every this many (``offer_gil``): encoding a 150k-partition fetch
# answer would otherwise hold the event loop for ~60 ms, preparing such a commit ~200 ms.
YIELD_EVERY: Final = 4096


def offer_gil(count: i64) -> None:
    """After the ``count``-th entry of a large loop: every YIELD_EVERY, other threads get the GIL
    (``sleep(0)`` drops it). Shared by the codecs here and the large-request work in coordinator."""
    if count % YIELD_EVERY == 0:
        time.sleep(0)


def compiled() -> bool:
    """Whether this module runs as mypyc's C extension rather than from its source."""
    return not __file__.endswith(".py")


def int16_at(data: bytes, pos: i64) -> i64:
    """The big-endian int16 at ``pos`` (unchecked: the caller knows the bytes are there). Shared with
    the loader's record decoder (storage/loadcodec.py), in the same compiled library. Each byte is
    made an i64 before it is shifted: shifting ``data[pos]`` itself is arithmetic on boxed ints, a call
    per operator when compiled."""
    b0: i64 = data[pos]
    b1: i64 = data[pos + 1]
    v = (b0 << 8) | b1
    return v - 0x10000 if v >= 0x8000 else v


def uint32_at(data: bytes, pos: i64) -> i64:
    b0: i64 = data[pos]
    b1: i64 = data[pos + 1]
    b2: i64 = data[pos + 2]
    b3: i64 = data[pos + 3]
    return (b0 << 24) | (b1 << 16) | (b2 << 8) | b3


def int32_at(data: bytes, pos: i64) -> i64:
    v = uint32_at(data, pos)
    return v - 0x100000000 if v >= 0x80000000 else v


def int64_at(data: bytes, pos: i64) -> i64:
    return int32_at(data, pos) * 0x100000000 + uint32_at(data, pos + 4)


# An offset-commit value's layout (reference section 7): version int16 | offset int64 at 2 | (v3 only)
# leader epoch int32 at 10 | metadata (int16 length + UTF-8) | commit timestamp int64 | (v1 only) expire
# timestamp int64. Known here once, for the fetch encoder below and the loader (storage/loadcodec.py),
# which keep a commit's value as these bytes.
def value_metadata_at(version: i64) -> i64:
    """Where the metadata's length field ends, i.e. its bytes start, in a v0-v3 offset-commit value."""
    return 16 if version == 3 else 12


def value_leader_epoch(raw: bytes, vpos: i64, version: i64) -> i64:
    """The leader epoch of the offset-commit value at ``vpos`` (-1: versions before 3 have none)."""
    return int32_at(raw, vpos + 10) if version == 3 else -1


class BoundedReader:
    """A position in a frame; every read is bounds-checked first, so malformed bytes raise DecodeError."""

    def __init__(self, buf: bytes, pos: i64) -> None:
        self.buf = buf
        self.pos: i64 = pos
        self.end: i64 = len(buf)

    def need(self, n: i64) -> None:
        if self.pos + n > self.end:
            raise DecodeError("message runs past the end of the frame")

    def int8(self) -> i64:
        self.need(1)
        v: i64 = self.buf[self.pos]
        self.pos += 1
        return v

    def int16(self) -> i64:
        self.need(2)
        v = int16_at(self.buf, self.pos)
        self.pos += 2
        return v

    def int32(self) -> i64:
        self.need(4)
        v = int32_at(self.buf, self.pos)
        self.pos += 4
        return v

    def int64(self) -> i64:
        self.need(8)
        v = int64_at(self.buf, self.pos)
        self.pos += 8
        return v

    def uvarint(self) -> i64:
        """At most 5 bytes, as Kafka's ``readUnsignedVarint``."""
        value: i64 = 0
        shift: i64 = 0
        for _b in range(5):
            if self.pos >= self.end:
                raise DecodeError("varint runs past the end of the frame")
            b: i64 = self.buf[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
        raise DecodeError("varint longer than 5 bytes")

    def count(self, flexible: bool, nullable: bool, what: str) -> i64:
        """An array's element count; -1 for null (only where ``nullable``), and no more elements than
        bytes left."""
        n: i64 = self.uvarint() - 1 if flexible else self.int32()
        if n < 0:
            if nullable and n == -1:
                return -1
            raise DecodeError(f"array {what} is null or negative ({n})")
        if n > self.end - self.pos:
            raise DecodeError(f"array {what} of {n} elements cannot fit in the bytes left")
        return n

    def string(self, flexible: bool, nullable: bool, what: str) -> str | None:
        n: i64 = self.uvarint() - 1 if flexible else self.int16()
        if n < 0:
            if nullable and n == -1:
                return None
            raise DecodeError(f"string {what} is null or negative ({n})")
        if flexible and n > MAX_COMPACT_STRING:
            raise DecodeError(f"string {what} too long")
        start = self.pos
        end = start + n
        if end > self.end:
            raise DecodeError(f"{what} runs past the end of the frame")
        self.pos = end
        try:
            return self.buf[start:end].decode()  # the plain call: compiled, the faster one
        except UnicodeDecodeError:  # as Kafka's readString: bytes that are not UTF-8 are replaced
            return self.buf[start:end].decode("utf-8", "replace")

    def text(self, flexible: bool, what: str) -> str:
        s = self.string(flexible, False, what)
        assert s is not None
        return s

    def skip_tags(self) -> None:
        """A tagged-field section: these messages define no tagged fields, so every tag is skipped."""
        n = self.uvarint()
        if not n:
            return
        if n > self.end - self.pos:
            raise DecodeError("more tagged fields than bytes left")
        for _tag in range(n):
            self.uvarint()
            size = self.uvarint()
            self.pos += size
            if self.pos > self.end:
                raise DecodeError("tagged field runs past the end of the frame")

    def header(self, flexible: bool) -> str:
        """The client id (an int16-length string in every header version; null, any negative length,
        reads as ""; bytes that are not UTF-8 are replaced, as Kafka's RequestHeader reads it) and, in
        header v2, the header's tagged fields."""
        self.pos = _HEADER_FIXED
        n = self.int16()
        client_id = ""
        if n >= 0:
            start = self.pos
            end = start + n
            if end > self.end:
                raise DecodeError("client id runs past the end of the frame")
            client_id = self.buf[start:end].decode("utf-8", "replace")
            self.pos = end
        if flexible:
            self.skip_tags()
        return client_id


class _Writer:
    """A response being encoded: size and header first (the size is filled in at the end). Written
    through librt's BytesWriter (mypyc's runtime library), whose appends and big-endian integer writes
    mypyc compiles to C: a list of ints or a bytearray costs a generic call per byte here."""

    def __init__(self, correlation_id: i64, flexible: bool) -> None:
        self.out = BytesWriter()
        self.flexible = flexible
        self.entries: i64 = 0
        write_i32_be(self.out, 0)
        self.int32(correlation_id)
        if flexible:
            self.out.append(0)

    def int16(self, v: i64) -> None:
        if v < -0x8000 or v > 0x7FFF:
            raise EncodeError(f"int16 out of range: {v}")
        write_i16_be(self.out, i16(v))

    def int32(self, v: i64) -> None:
        if v < -0x80000000 or v > 0x7FFFFFFF:
            raise EncodeError(f"int32 out of range: {v}")
        write_i32_be(self.out, i32(v))

    def int64(self, value: int) -> None:
        if value < -0x8000000000000000 or value > 0x7FFFFFFFFFFFFFFF:
            raise EncodeError(f"int64 out of range: {value}")
        write_i64_be(self.out, value)

    def uvarint(self, n: i64) -> None:
        out = self.out
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)

    def count(self, items: Any, what: str) -> None:
        if items is None:
            raise EncodeError(f"{what} is None but not nullable")
        n: i64 = len(items)
        if self.flexible:
            self.uvarint(n + 1)
        else:
            self.int32(n)

    def string(self, s: str | None, nullable: bool, what: str) -> None:
        if s is None:
            if not nullable:
                raise EncodeError(f"{what} is None but not nullable")
            if self.flexible:
                self.out.append(0)
            else:
                write_i16_be(self.out, -1)
            return
        self.raw_string(s.encode())

    def raw_string(self, raw: bytes) -> None:
        """A string already encoded as UTF-8."""
        n: i64 = len(raw)
        if self.flexible:
            self.uvarint(n + 1)
        else:
            self.int16(n)
        self.out.write(raw)

    def tags(self) -> None:
        if self.flexible:
            self.out.append(0)

    def entry(self) -> None:
        """One more partition (or group) written: every YIELD_EVERY, other threads get the GIL (sleep(0)
        drops it)."""
        self.entries += 1
        offer_gil(self.entries)

    def done(self) -> bytes:
        out = self.out
        size: i64 = len(out) - 4
        out[0] = u8((size >> 24) & 0xFF)
        out[1] = u8((size >> 16) & 0xFF)
        out[2] = u8((size >> 8) & 0xFF)
        out[3] = u8(size & 0xFF)
        return out.getvalue()


class OffsetCommitCodec:
    """OffsetCommit (key 8) requests v0-v9 and their responses, as the generated classes."""

    def __init__(self, request: Any) -> None:
        self.request = request
        self.topic = request.OffsetCommitRequestTopic
        self.partition = self.topic.OffsetCommitRequestPartition

    def decode_commit(self, frame: bytes, version: i64) -> tuple[str, CommitRequest]:
        """``(client id, request)`` straight from the frame, without the generated objects: what
        coordinator/apis/k08 serves from. A huge request offers the GIL every YIELD_EVERY partitions
        (it is decoded on the bulk thread)."""
        flexible = version >= 8
        r = BoundedReader(frame, 0)
        client_id = r.header(flexible)
        group_id = r.text(flexible, "group_id")
        generation: i64 = -1
        member_id = ""
        instance_id: str | None = None
        retention: i64 = -1
        if version >= 1:
            generation = r.int32()
            member_id = r.text(flexible, "member_id")
        if version >= 7:
            instance_id = r.string(flexible, True, "group_instance_id")
        if 2 <= version <= 4:
            retention = r.int64()
        seen: i64 = 0
        topics: list[tuple[str, list[PartitionCommit]]] = []
        for _t in range(r.count(flexible, False, "topics")):
            name = r.text(flexible, "name")
            partitions: list[PartitionCommit] = []
            for _p in range(r.count(flexible, False, "partitions")):
                index = r.int32()
                offset = r.int64()
                epoch: i64 = r.int32() if version >= 6 else -1
                timestamp: i64 = r.int64() if version == 1 else -1
                metadata = r.string(flexible, True, "committed_metadata")
                if flexible:
                    r.skip_tags()
                partitions.append((index, offset, epoch, timestamp, metadata))
                seen += 1
                offer_gil(seen)
            if flexible:
                r.skip_tags()
            topics.append((name, partitions))
        if flexible:
            r.skip_tags()
        return client_id, CommitRequest(version, group_id, generation, member_id, instance_id, retention, topics)

    def decode(self, frame: bytes, version: i64) -> tuple[str, Any]:
        """``(client id, the generated request object)``, as the registry's ``decode_request`` gives."""
        client_id, req = self.decode_commit(frame, version)
        topic_cls, partition_cls = self.topic, self.partition
        topics = [topic_cls(name, _ZERO_UUID, [partition_cls(*p) for p in partitions])
                  for name, partitions in req.topics]
        return client_id, self.request(req.group_id, req.generation, req.member_id, req.group_instance_id,
                                       req.retention_ms, topics)

    def encode_results(self, results: list[tuple[str, list[tuple[int, int]]]], version: i64,
                       correlation_id: i64) -> bytes:
        """The response to a commit from its ``(topic, [(partition, error code)])`` in request order,
        without the generated objects (a throttle time of 0): what coordinator/apis/k08 answers with."""
        w = _Writer(correlation_id, version >= 8)
        if version >= 3:
            w.int32(0)
        w.count(results, "topics")
        for name, partitions in results:
            w.string(name, False, "name")
            w.count(partitions, "partitions")
            for partition, error in partitions:
                w.int32(partition)
                w.int16(error)
                w.tags()
                w.entry()
            w.tags()
        w.tags()
        return w.done()


class OffsetFetchCodec:
    """OffsetFetch (key 9) requests v0-v9 and their responses, as the generated classes."""

    def __init__(self, request: Any) -> None:
        self.request = request
        self.topic = request.OffsetFetchRequestTopic
        self.group = request.OffsetFetchRequestGroup
        self.group_topic = self.group.OffsetFetchRequestTopics

    def _partitions(self, r: BoundedReader, flexible: bool) -> list[int]:
        out: list[int] = []
        for _i in range(r.count(flexible, False, "partition_indexes")):
            out.append(r.int32())
        return out

    def decode_fetch(self, frame: bytes, version: i64) -> tuple[str, FetchRequest]:
        """``(client id, request)`` straight from the frame, without the generated objects: what
        coordinator/apis/k09 serves from."""
        flexible = version >= 6
        r = BoundedReader(frame, 0)
        client_id = r.header(flexible)
        group_id = ""
        topics: Requested = []
        groups: list[FetchGroup] = []
        if version <= 7:
            group_id = r.text(flexible, "group_id")
            topics = self._topics(r, flexible, version >= 2)
        else:
            for _g in range(r.count(True, False, "groups")):
                gid = r.text(True, "group_id")
                member_id: str | None = None
                member_epoch: i64 = -1
                if version >= 9:
                    member_id = r.string(True, True, "member_id")
                    member_epoch = r.int32()
                group_topics = self._topics(r, True, True)
                r.skip_tags()
                groups.append(FetchGroup(gid, member_id, member_epoch, group_topics))
        require_stable = r.int8() != 0 if version >= 7 else False
        if flexible:
            r.skip_tags()
        return client_id, FetchRequest(version, group_id, topics, groups, require_stable)

    def _topics(self, r: BoundedReader, flexible: bool, nullable: bool) -> Requested:
        n = r.count(flexible, nullable, "topics")
        if n < 0:
            return None
        topics: list[tuple[str, list[int]]] = []
        for _i in range(n):
            name = r.text(flexible, "name")
            topics.append((name, self._partitions(r, flexible)))
            if flexible:
                r.skip_tags()
        return topics

    def decode(self, frame: bytes, version: i64) -> tuple[str, Any]:
        """``(client id, the generated request object)``, as the registry's ``decode_request`` gives."""
        client_id, req = self.decode_fetch(frame, version)
        if version <= 7:
            topic_cls = self.topic
            topics = None if req.topics is None else [topic_cls(name, parts) for name, parts in req.topics]
            return client_id, self.request(req.group_id, topics, [], req.require_stable)
        group_cls, group_topic_cls = self.group, self.group_topic
        groups = [group_cls(g.group_id, g.member_id, g.member_epoch,
                            None if g.topics is None else [group_topic_cls(name, _ZERO_UUID, parts)
                                                           for name, parts in g.topics])
                  for g in req.groups]
        return client_id, self.request("", [], groups, req.require_stable)

    def encode_answer(self, groups: list[Any], version: i64, correlation_id: i64) -> bytes:
        """The response from the handler's ``[group_id, error code, offsets]`` per group, without the
        generated objects (a throttle time of 0; v0-v7 answer for their one group, whose error is the
        top-level one from v2): what coordinator/apis/k09 answers with."""
        w = _Writer(correlation_id, version >= 6)
        if version >= 3:
            w.int32(0)
        if version <= 7:
            group = groups[0]
            _answer_topics(w, group[2], version >= 5)
            if version >= 2:
                w.int16(group[1])
        else:
            w.count(groups, "groups")
            for group in groups:
                w.string(group[0], False, "group_id")
                _answer_topics(w, group[2], True)
                w.int16(group[1])
                w.tags()
                w.entry()  # a request may name 100k groups, most with no offsets
        w.tags()
        return w.done()


def _answer_topics(w: _Writer, offsets: list[tuple[str, list[tuple[int, Any, int]]]], epochs: bool) -> None:
    """``(topic, [(partition, committed value or None, error code)])``. A committed value is the bytes
    of an offset-commit record value (v0-v3, as the commit path writes them and the loader keeps them:
    checked, sizes that add up, UTF-8 metadata), written here without decoding them, or an
    OffsetAndMetadata read by position (offset, leader epoch, metadata, ...)."""
    w.count(offsets, "topics")
    for name, partitions in offsets:
        w.string(name, False, "name")
        w.count(partitions, "partitions")
        for partition, value, error in partitions:
            w.int32(partition)
            if value is None:
                w.int64(-1)
                if epochs:
                    w.int32(-1)
                w.string("", True, "metadata")
            elif type(value) is bytes:
                _stored_value(w, value, epochs)
            else:
                w.int64(value[0])
                if epochs:
                    w.int32(value[1])
                w.string(value[2], True, "metadata")
            w.int16(error)
            w.tags()
            w.entry()
        w.tags()


def _stored_value(w: _Writer, raw: bytes, epochs: bool) -> None:
    """Offset, leader epoch (v3 only; -1 before) and metadata of an offset-commit value's bytes: what
    storage.loadcodec.loaded_value would decode, copied across instead."""
    version = int16_at(raw, 0)
    w.int64(int64_at(raw, 2))
    if epochs:
        w.int32(value_leader_epoch(raw, 0, version))
    mpos = value_metadata_at(version)
    mlen = int16_at(raw, mpos - 2)
    w.raw_string(raw[mpos : mpos + mlen])


def codec_for(key: int, request_class: Any) -> OffsetCommitCodec | OffsetFetchCodec | None:
    """The hand-written codec of API ``key`` (its generated request class given), if there is one."""
    if key == OFFSET_COMMIT:
        return OffsetCommitCodec(request_class)
    if key == OFFSET_FETCH:
        return OffsetFetchCodec(request_class)
    return None

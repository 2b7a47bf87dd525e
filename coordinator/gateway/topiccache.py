"""The topics relayed Metadata answers described, for answering while the upstream is away or slow.

The gateway rewrites only the broker list of a Metadata answer and passes its topics on as the upstream
wrote them: decoding and re-encoding them took ~0.25 s of the event loop for a 3,000-topic answer (a
review's find; a burst of such answers expired members' sessions). What the cache needs from those
topics is read from the same bytes later, when it is asked (``facts``), which is only while the upstream
is away or slow. Until then answers wait as bytes: an answer to a request for every topic replaces every
earlier one, so clients refreshing the whole cluster keep one answer waiting; answers for named topics
are read once enough of them wait.
"""

import logging
import struct
import uuid
from collections.abc import Iterator
from typing import NamedTuple

from protocol.codec import read_uvarint
from protocol.errors import ErrorCode
from protocol.hotcodec import BoundedReader
from protocol.registry import skip_tagged_fields

log = logging.getLogger(__name__)

NO_ID = uuid.UUID(int=0)
MAX_WAITING = 64  # answers for named topics kept as bytes before they are read
MAX_WAITING_BYTES = 64 << 20

_INT32 = struct.Struct(">i")
_PARTITION = struct.Struct(">hii")  # error code, index, leader
_PARTITION_EPOCH = struct.Struct(">hiii")  # ... and the leader epoch (v7+)


class TopicFacts(NamedTuple):
    """A topic as the upstream's last Metadata answer naming it described it: enough to answer for it
    while the upstream is away, or slow."""

    topic_id: uuid.UUID
    partitions: int
    is_internal: bool
    # that answer's partitions as (index, error code, leader, leader epoch): ~90 bytes each
    last_seen: tuple[tuple[int, int, int, int], ...] = ()


def _skip_partitions(r: BoundedReader, n: int, layout: struct.Struct, arrays: int,
                     flexible: bool) -> list[tuple[int, int, int, int]]:
    """``(index, error code, leader, leader epoch)`` of ``n`` partitions, their node arrays skipped; the
    one-byte lengths and empty tag sections of a flexible answer read inline (the answer's bulk)."""
    buf, pos, end, size = r.buf, r.pos, r.end, layout.size
    epoch = size == _PARTITION_EPOCH.size
    seen = []
    try:
        for _ in range(n):
            fields = layout.unpack_from(buf, pos)
            pos += size
            seen.append((fields[1], fields[0], fields[2], fields[3] if epoch else -1))
            for _ in range(arrays):
                if flexible:
                    count = buf[pos]
                    if count < 0x80:
                        pos += 1
                    else:
                        count, pos = read_uvarint(buf, pos)
                    count -= 1
                else:
                    (count,) = _INT32.unpack_from(buf, pos)
                    pos += 4
                if count > 0:
                    pos += 4 * count
            if flexible:
                if buf[pos] == 0:
                    pos += 1
                else:
                    pos = skip_tagged_fields(buf, pos)
            if pos > end:
                raise ValueError("a partition runs past the end of the answer")
    except IndexError:
        raise ValueError("the answer ends inside a partition") from None
    r.pos = pos
    return seen


def read_topics(buf: bytes, pos: int, version: int) -> Iterator[tuple[int, str | None, TopicFacts]]:
    """``(error code, name, facts)`` of each topic of a Metadata answer (v0-v12) whose topic array starts
    at ``pos``, read by the bounds and rules of every other decoder (``protocol.hotcodec.BoundedReader``).
    ValueError (or struct.error) for bytes that are not one."""
    r = BoundedReader(buf, pos)
    flexible = version >= 9
    layout = _PARTITION_EPOCH if version >= 7 else _PARTITION
    arrays = 3 if version >= 5 else 2  # replicas, in-sync replicas, offline replicas (v5+)
    for _ in range(r.count(flexible, False, "topics")):
        error = r.int16()
        name = r.string(flexible, version >= 12, "name")
        topic_id = NO_ID
        if version >= 10:
            r.need(16)
            topic_id = uuid.UUID(bytes=buf[r.pos:r.pos + 16])
            r.pos += 16
        is_internal = bool(r.int8()) if version >= 1 else False
        n = r.count(flexible, False, "partitions")
        seen = _skip_partitions(r, n, layout, arrays, flexible)
        if version >= 8:
            r.int32()  # authorized operations
        if flexible:
            r.skip_tags()
        yield error, name, TopicFacts(topic_id, n, is_internal, tuple(seen))


class TopicCache:
    """Name -> ``TopicFacts`` of every topic relayed answers described; a topic an answer calls unknown,
    or an answer to a request for every topic does not name, is forgotten (deleted upstream)."""

    def __init__(self, known: dict[str, TopicFacts] | None = None) -> None:
        self._facts: dict[str, TopicFacts] = dict(known or {})
        self._waiting: list[tuple[bytes, int, int, bool]] = []  # (answer, topics start, version, every topic)
        self._waiting_bytes = 0

    def note(self, answer: bytes, topics_start: int, version: int, every_topic: bool) -> None:
        """Remembers a relayed answer whose topic array starts at ``topics_start``, to be read when asked."""
        if every_topic:
            self._waiting.clear()
            self._waiting_bytes = 0
        self._waiting.append((answer, topics_start, version, every_topic))
        self._waiting_bytes += len(answer)
        if len(self._waiting) > MAX_WAITING or self._waiting_bytes > MAX_WAITING_BYTES:
            self._read_waiting()

    def facts(self) -> dict[str, TopicFacts]:
        """Every topic known, as the answers so far describe them."""
        if self._waiting:
            self._read_waiting()
        return self._facts

    def _read_waiting(self) -> None:
        waiting, self._waiting, self._waiting_bytes = self._waiting, [], 0
        for answer, start, version, every_topic in waiting:
            try:
                topics = list(read_topics(answer, start, version))
            except (ValueError, struct.error) as exc:
                # passed on to its client as it came; what it says of topics is not learnt
                log.warning("a relayed Metadata v%d answer's topics are not readable (%s): not remembered",
                            version, exc)
                continue
            if every_topic:
                named = {name for _, name, _ in topics}
                for gone in [name for name in self._facts if name not in named]:
                    del self._facts[gone]
            for error, name, facts in topics:
                if name is None:
                    continue
                if error == 0:
                    self._facts[name] = facts
                elif error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    self._facts.pop(name, None)

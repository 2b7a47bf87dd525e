"""OffsetCommit and OffsetFetch as pure functions of a shard's state: they return records and results,
never mutate (reference sections 5.2 and 6.2). Version-specific response shapes live in ``apis/``.

kcoord has no cluster metadata, so it cannot tell whether a topic exists: any legal topic name is
accepted (Kafka would answer UNKNOWN_TOPIC_OR_PARTITION for an unknown topic). A partition that can
never exist (a negative index, a name no Kafka topic can have) is refused with
UNKNOWN_TOPIC_OR_PARTITION before any group check, as Kafka filters unknown partitions first.
"""

from typing import Final

from librt.strings import BytesWriter, write_i16_be, write_i32_be, write_i64_be

from coordinator.state import ClassicGroup, GroupState, ShardData, StoredOffset
from protocol.commit import CommitRequest
from protocol.errors import ErrorCode
from protocol.hotcodec import YIELD_EVERY, offer_gil
from protocol.records import (
    OFFSET_VALUE_VERSION,
    OFFSET_VALUE_VERSION_WITH_EXPIRY,
    LiveRecord,
    OffsetKey,
    RecordError,
    offset_key_prefix,
)

# Enum members as C variables, not class attributes (tests/protocol/test_compiled.py says why).
_ERR_COORDINATOR_NOT_AVAILABLE: Final = ErrorCode.COORDINATOR_NOT_AVAILABLE
_ERR_FENCED_INSTANCE_ID: Final = ErrorCode.FENCED_INSTANCE_ID
_ERR_GROUP_ID_NOT_FOUND: Final = ErrorCode.GROUP_ID_NOT_FOUND
_ERR_ILLEGAL_GENERATION: Final = ErrorCode.ILLEGAL_GENERATION
_ERR_INVALID_GROUP_ID: Final = ErrorCode.INVALID_GROUP_ID
_ERR_NONE: Final = ErrorCode.NONE
_ERR_OFFSET_METADATA_TOO_LARGE: Final = ErrorCode.OFFSET_METADATA_TOO_LARGE
_ERR_REBALANCE_IN_PROGRESS: Final = ErrorCode.REBALANCE_IN_PROGRESS
_ERR_UNKNOWN_MEMBER_ID: Final = ErrorCode.UNKNOWN_MEMBER_ID
_ERR_UNKNOWN_TOPIC_OR_PARTITION: Final = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
_ERR_UNSTABLE_OFFSET_COMMIT: Final = ErrorCode.UNSTABLE_OFFSET_COMMIT
_GROUP_COMPLETING_REBALANCE: Final = GroupState.COMPLETING_REBALANCE
_GROUP_DEAD: Final = GroupState.DEAD
_GROUP_EMPTY: Final = GroupState.EMPTY

TopicErrors = list[tuple[str, list[tuple[int, ErrorCode]]]]

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
MAX_KEY_STRING_BYTES: Final = 32767  # record keys carry int16-length strings
KEY_PREFIXES_KEPT: Final = 1 << 14  # (group, topic) key prefixes remembered; all are forgotten beyond
# group -> topic -> key prefix, for legal topic names only: by group then topic, not by a (group, topic)
# tuple, whose making and hashing cost more than the two string lookups (strings keep their hash).
_key_prefixes: dict[str, dict[str, bytes]] = {}
_key_prefixes_held = [0]  # how many in all (a list: compiled, a module global is not rebound in a function)


def partition_error(topic: str, partition: int) -> ErrorCode:
    """UNKNOWN_TOPIC_OR_PARTITION for a partition that cannot exist in any Kafka cluster."""
    if partition < 0 or not legal_topic(topic):
        return _ERR_UNKNOWN_TOPIC_OR_PARTITION
    return _ERR_NONE


def group_id_error(group_id: str) -> ErrorCode:
    """INVALID_GROUP_ID for a group id that cannot be written into an offsets record key."""
    if len(group_id) * 3 > MAX_KEY_STRING_BYTES and len(group_id.encode()) > MAX_KEY_STRING_BYTES:
        return _ERR_INVALID_GROUP_ID
    return _ERR_NONE


def refuse_all(req: CommitRequest, error: ErrorCode) -> TopicErrors:
    """Every partition gets ``error``, except those that cannot exist, which keep their own error
    (``partition_error``). Offers the GIL as it goes, as ``prepare_commit`` does."""
    unknown = _ERR_UNKNOWN_TOPIC_OR_PARTITION
    out: TopicErrors = []
    seen = 0
    for name, parts in req.topics:
        legal = legal_topic(name)
        errors: list[tuple[int, ErrorCode]] = []
        for p in parts:
            partition = p[0]
            errors.append((partition, error if legal and partition >= 0 else unknown))
            seen += 1
            offer_gil(seen)
        out.append((name, errors))
    return out


def utf16_length(s: str) -> int:
    """Java ``String.length()``: UTF-16 code units, so a character outside the BMP counts twice."""
    if s.isascii():
        return len(s)
    return len(s.encode("utf-16-le", "surrogatepass")) // 2


def validate_commit(group: ClassicGroup | None, req: CommitRequest) -> ErrorCode:
    """The group-level checks, in Kafka's order; an error here applies to every partition."""
    if group is None:
        if req.generation < 0:
            return _ERR_NONE  # a simple commit creates the group
        return _ERR_GROUP_ID_NOT_FOUND if req.version >= 9 else _ERR_ILLEGAL_GENERATION
    if group.state is _GROUP_DEAD:
        return _ERR_COORDINATOR_NOT_AVAILABLE
    if req.generation < 0 and group.state is _GROUP_EMPTY:
        return _ERR_NONE
    if req.generation >= 0 or req.member_id or req.group_instance_id is not None:
        if req.group_instance_id is not None:
            owner = group.static_members.get(req.group_instance_id)
            if owner is None:
                return _ERR_UNKNOWN_MEMBER_ID
            if owner != req.member_id:
                return _ERR_FENCED_INSTANCE_ID
        if req.member_id not in group.members:
            return _ERR_UNKNOWN_MEMBER_ID
        if req.generation != group.generation:
            return _ERR_ILLEGAL_GENERATION
    elif group.state is not _GROUP_EMPTY:
        return _ERR_UNKNOWN_MEMBER_ID
    if group.state is _GROUP_COMPLETING_REBALANCE:
        return _ERR_REBALANCE_IN_PROGRESS
    return _ERR_NONE


class PreparedCommit:
    """The part of an OffsetCommit that does not depend on the group: one record (already encoded) per
    acceptable partition, and every partition's error in request order (NONE where a record is ready).
    Computed off the event loop for large requests. A plain class: compiled, a dataclass's generated
    ``__init__`` would stay an interpreted frame on every commit."""

    __slots__ = ("encoded", "first_error", "records", "request", "results")

    def __init__(self, request: CommitRequest, records: list[LiveRecord], encoded: list[tuple[bytes, bytes | None]],
                 results: TopicErrors, first_error: int = 0) -> None:
        self.request = request
        self.records = records
        self.encoded = encoded
        self.results = results
        self.first_error = first_error  # the first non-zero error in ``results`` (0: none refused)


def legal_topic(name: str) -> bool:
    """Kafka's topic name rule (``[a-zA-Z0-9._-]{1,249}``, not ``.`` or ``..``), a character loop: compiled, it costs a
    tenth of the regular expression's match."""
    n = len(name)
    if n == 0 or n > 249 or name == "." or name == "..":
        return False
    for ch in name:
        c = ord(ch)
        if not (97 <= c <= 122 or 65 <= c <= 90 or 48 <= c <= 57 or c == 46 or c == 95 or c == 45):
            return False
    return True


def _value_bytes(offset: int, leader_epoch: int, raw: bytes, commit_ts: int, expire: int) -> bytes:
    """``encode_offset_value`` of the value (protocol.records; the tests hold them equal), written
    straight into one buffer: v3 without an expiry, v1 with one. ``raw`` is the metadata's UTF-8."""
    w = BytesWriter()
    if expire == -1:
        write_i16_be(w, OFFSET_VALUE_VERSION)
        write_i64_be(w, offset)
        write_i32_be(w, leader_epoch)
    else:
        write_i16_be(w, OFFSET_VALUE_VERSION_WITH_EXPIRY)
        write_i64_be(w, offset)
    write_i16_be(w, len(raw))
    w.write(raw)
    write_i64_be(w, commit_ts)
    if expire != -1:
        write_i64_be(w, expire)
    return w.getvalue()


def _metadata_bytes(metadata: str, max_metadata: int) -> bytes | None:
    """The metadata's UTF-8, or None when it is over ``max_metadata`` (in UTF-16 units, as Kafka
    measures it)."""
    if utf16_length(metadata) > max_metadata:
        return None
    raw = metadata.encode()
    if len(raw) > MAX_KEY_STRING_BYTES:
        raise RecordError(f"string of {len(raw)} bytes does not fit an int16 length")
    return raw


def _key_prefix(group_id: str, topic: str) -> bytes | None:
    """``offset_key_prefix``, remembered here, or None if ``topic`` is not a legal topic name (a name
    remembered was checked once: the check's character loop cost ~1,300 instructions of every
    1-partition commit, the interpreted call and its caches ~0.6 us). Dictionary operations are
    atomic, so the bulk thread may use it too (at worst a prefix is made twice or the count is off)."""
    topics = _key_prefixes.get(group_id)
    if topics is not None:
        prefix = topics.get(topic)
        if prefix is not None:
            return prefix
    if not legal_topic(topic):
        return None
    prefix = offset_key_prefix(group_id, topic)  # first: if it raises, nothing is left behind
    if _key_prefixes_held[0] >= KEY_PREFIXES_KEPT:
        _key_prefixes.clear()
        _key_prefixes_held[0] = 0
        topics = None
    if topics is None:
        topics = _key_prefixes[group_id] = {}
    topics[topic] = prefix
    _key_prefixes_held[0] += 1
    return prefix


def _key_bytes(prefix: bytes, partition: int) -> bytes:
    w = BytesWriter()
    w.write(prefix)
    write_i32_be(w, partition)
    return w.getvalue()


def prepare_commit(req: CommitRequest, now_ms: int, max_metadata: int) -> PreparedCommit:
    expire = min(max(now_ms + req.retention_ms, INT64_MIN), INT64_MAX) if req.retention_ms != -1 else -1
    records: list[LiveRecord] = []
    encoded: list[tuple[bytes, bytes | None]] = []
    results: TopicErrors = []
    group_id = req.group_id
    ok = _ERR_NONE
    unknown_partition = _ERR_UNKNOWN_TOPIC_OR_PARTITION
    too_large = _ERR_OFFSET_METADATA_TOO_LARGE
    # The partitions of one commit nearly always share their metadata: each distinct one is measured
    # and encoded once (None: too large).
    metadata_bytes: dict[str, bytes | None] = {}
    last_meta = ""  # and the last one's bytes: a dictionary lookup saved on nearly every partition
    last_raw: bytes | None = None
    first_error = 0
    seen = 0
    for name, parts in req.topics:
        known = _key_prefix(group_id, name)
        unknown_topic = known is None
        prefix = known if known is not None else b""
        errors: list[tuple[int, ErrorCode]] = []
        for p in parts:
            partition, offset, leader_epoch, commit_ts, metadata = p
            seen += 1
            offer_gil(seen)  # compiled, preparing a 150k-partition commit (bulk thread) takes ~200 ms
            if unknown_topic or partition < 0:
                errors.append((partition, unknown_partition))
                first_error = first_error or unknown_partition
                continue
            if commit_ts == -1:
                commit_ts = now_ms
            meta = metadata or ""
            if last_raw is not None and meta == last_meta:
                raw: bytes | None = last_raw
            elif meta in metadata_bytes:
                raw = metadata_bytes[meta]
            else:
                raw = metadata_bytes[meta] = _metadata_bytes(meta, max_metadata)
            if raw is None:
                errors.append((partition, too_large))
                first_error = first_error or too_large
                continue
            last_meta, last_raw = meta, raw
            # The value's bytes are both what the record carries and what the cache keeps, as it keeps
            # a loaded value (coordinator.state.StoredOffset): no OffsetAndMetadata is built (compiled,
            # ``tuple.__new__`` of a NamedTuple was ~40% of preparing a partition).
            value = _value_bytes(offset, leader_epoch, raw, commit_ts, expire)
            records.append(((group_id, name, partition), value))  # a CommitPair
            encoded.append((_key_bytes(prefix, partition), value))
            errors.append((partition, ok))
        results.append((name, errors))
    return PreparedCommit(req, records, encoded, results, first_error)


def check_group(data: ShardData, prepared: PreparedCommit) -> tuple[list[LiveRecord], TopicErrors]:
    """The group-level checks against current state: the prepared records, or none and the group's
    error on every partition (partitions that cannot exist keep their own error)."""
    error = validate_commit(data.groups.get(prepared.request.group_id), prepared.request)
    if error is not _ERR_NONE:
        return [], refuse_all(prepared.request, error)
    return prepared.records, prepared.results


def commit_offsets(
    data: ShardData, req: CommitRequest, now_ms: int, max_metadata: int
) -> tuple[list[LiveRecord], TopicErrors]:
    """One OffsetCommit record per accepted partition, and every partition's error in request order."""
    return check_group(data, prepare_commit(req, now_ms, max_metadata))


# (partition, committed value as cached (``offset_value`` reads it) or None when never committed, error):
# plain tuples, as a fetch may cover hundreds of thousands of partitions. The compiled codec writes a
# cached value's bytes into the answer without decoding them (protocol.hotcodec).
PartitionOffset = tuple[int, StoredOffset | None, ErrorCode]
TopicOffsets = list[tuple[str, list[PartitionOffset]]]


def fetch_offsets(
    data: ShardData, group_id: str, topics: list[tuple[str, list[int]]] | None, require_stable: bool
) -> TopicOffsets:
    """Committed offsets of ``topics`` (None: every partition the group has an offset for). An unknown
    group or partition is not an error: it reads as "no offset". With ``require_stable`` a partition
    that an open transaction is writing answers UNSTABLE_OFFSET_COMMIT so the client retries."""
    committed = data.offsets.get(group_id, {})
    if topics is None:
        topics = _every_partition(committed, False)
    if not (require_stable and data.pending_count):
        return [(topic, _partition_offsets(committed, topic, partitions)) for topic, partitions in topics]
    result: TopicOffsets = []
    get = committed.get
    none = _ERR_NONE
    for topic, partitions in topics:
        entries: list[PartitionOffset] = []
        for p in partitions:
            if data.has_pending(OffsetKey(group_id, topic, p)):
                entries.append((p, None, _ERR_UNSTABLE_OFFSET_COMMIT))
            else:
                entries.append((p, get((topic, p)), none))
        result.append((topic, entries))
    return result


# A fetch of more offsets than this is answered from a copy of the group's (``OffsetsCopy``).
LARGE_FETCH: Final = 4096
COPY_MAX_RATIO: Final = 4  # ... unless the group holds over 4x what was asked for: then looked up at once


class OffsetsCopy:
    """A group's committed offsets, copied on the event loop (one C-level copy of its dict: ~2-5 ms for
    150k) for a large fetch, and the partitions asked for (None: all); grouping, sorting, the lookups
    and the response are made from the copy off the loop (``copied_offsets``, on the bulk thread).
    Made on the loop, the same answer held every other client for ~190-320 ms per fetch of all 150k
    offsets of a group (measured round trips of a bystander)."""

    __slots__ = ("committed", "topics")

    def __init__(self, committed: dict[tuple[str, int], StoredOffset],
                 topics: list[tuple[str, list[int]]] | None) -> None:
        self.committed = committed
        self.topics = topics


_NO_OFFSETS: Final[dict[tuple[str, int], StoredOffset]] = {}


def read_offsets(
    data: ShardData, group_id: str, topics: list[tuple[str, list[int]]] | None, require_stable: bool
) -> TopicOffsets | OffsetsCopy:
    """``fetch_offsets``, or for a large fetch (more than LARGE_FETCH offsets: every one of a large
    group, or that many partitions named, of a group holding at most COPY_MAX_RATIO times as many), with
    no pending transactional offset to check, a copy that ``copied_offsets`` turns into the same answer."""
    if not (require_stable and data.pending_count):
        committed = data.offsets.get(group_id, _NO_OFFSETS)
        if topics is None:
            large = len(committed) > LARGE_FETCH
        else:
            asked = 0
            for _, partitions in topics:
                asked += len(partitions)
            large = asked > LARGE_FETCH and len(committed) <= COPY_MAX_RATIO * asked
        if large:
            return OffsetsCopy(dict(committed), topics)
    return fetch_offsets(data, group_id, topics, require_stable)


def copied_offsets(copy: OffsetsCopy) -> TopicOffsets:
    """What ``fetch_offsets`` answers, from the copy (bulk thread: it offers the GIL as it goes, as
    compiled code otherwise keeps it)."""
    committed = copy.committed
    result: TopicOffsets = []
    topics = copy.topics if copy.topics is not None else _every_partition(committed, True)
    done = 0
    for topic, partitions in topics:
        entries: list[PartitionOffset] = []
        for start in range(0, len(partitions), YIELD_EVERY):
            chunk = partitions[start : start + YIELD_EVERY]
            entries.extend(_partition_offsets(committed, topic, chunk))
            before, done = done, done + len(chunk)
            if before // YIELD_EVERY != done // YIELD_EVERY:  # every YIELD_EVERY entries, however split
                offer_gil(YIELD_EVERY)
        result.append((topic, entries))
    return result


def _every_partition(committed: dict[tuple[str, int], StoredOffset], yielding: bool) -> list[tuple[str, list[int]]]:
    """The group's partitions by topic, both sorted (one stable order for every answer)."""
    by_topic: dict[str, list[int]] = {}
    seen = 0
    for topic, partition in committed:
        by_topic.setdefault(topic, []).append(partition)
        if yielding:
            seen += 1
            offer_gil(seen)
    return [(t, sorted(ps)) for t, ps in sorted(by_topic.items())]


def _partition_offsets(committed: dict[tuple[str, int], StoredOffset], topic: str,
                       partitions: list[int]) -> list[PartitionOffset]:
    get = committed.get
    none = _ERR_NONE
    return [(p, get((topic, p)), none) for p in partitions]

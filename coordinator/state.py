"""The in-memory state of one shard (one ``__consumer_offsets`` partition) and its only mutator.

``replay`` is called for every record the live write path appends *and* for every record the loader
reads back, so loading can never drift from live behaviour (Kafka's records + replay design).
Handlers only read this state; they return records, and the runtime replays them.

Compiled with mypyc by the install when a C compiler is present (setup.py: replaying 1M loaded records
took 0.37-0.49 s against 0.86-0.95 s interpreted), interpreted otherwise; tests/coordinator/test_state.py
runs both against the same records.
"""

from collections.abc import Iterable
from typing import Any, Final

from coordinator.groups.model import ClassicGroup, GroupCounts, GroupState
from protocol.records import (
    GroupMetadataRecord,
    LoadedRecord,
    OffsetAndMetadata,
    OffsetCommitRecord,
    OffsetKey,
)
from storage.loadcodec import loaded_value

__all__ = ["NO_PRODUCER", "ClassicGroup", "GroupState", "ShardData", "StoredOffset", "TopicPartition", "offset_value",
           "read_offset"]

NO_PRODUCER: Final = -1  # Final: compiled, a constant, not a lookup in the module's dict per record
INTERNED_PARTITIONS_MAX = 1 << 20
# Shared keys kept beyond twice the offsets cached: past that most of the table is keys of offsets that
# are gone (deleted or expired groups, on topics not committed to since), and it starts again.
INTERNED_SLACK: Final = 1024


TopicPartition = tuple[str, int]
# A cached offset: the value's bytes as the commit path wrote them or the compiled loader read them from
# the log (storage.loadcodec.loaded_value decodes them), or an OffsetAndMetadata (the interpreted loader,
# transactional offsets): a large log loads in less time and memory, a commit builds no value object, and
# a value is only decoded when something reads it. Read every cached offset through ``offset_value``.
StoredOffset = OffsetAndMetadata | bytes
_new = tuple.__new__
_OffsetCommitRecord: Final = OffsetCommitRecord  # a C static when compiled (replay checks every record)


def offset_value(value: StoredOffset) -> OffsetAndMetadata:
    """A cached offset as the OffsetAndMetadata it stands for."""
    if type(value) is bytes:
        return loaded_value(value)
    decoded: OffsetAndMetadata = value  # type: ignore[assignment]
    return decoded


def read_offset(value: StoredOffset | None) -> OffsetAndMetadata | None:
    """``offset_value`` of a lookup that may have found nothing."""
    return None if value is None else offset_value(value)


def _named(key: Any, group_id: str, topic: str, partition: object) -> OffsetKey:
    """The OffsetKey of a replayed commit (kept keys are named ones): its own when it has one, else made
    from its parts (the loader's flat commits have no key, the commit path's a plain tuple)."""
    if type(key) is OffsetKey:
        named: OffsetKey = key
        return named
    return _new(OffsetKey, (group_id, topic, partition))


class ShardData:
    """Groups, committed offsets and pending transactional offsets of one shard."""

    __slots__ = ("contested", "group_counts", "groups", "interned", "num_offsets", "offsets", "partitions",
                 "pending", "pending_count")

    def __init__(self) -> None:
        # Groups come and go only through ``put_group`` (``_add_group``) and ``_remove_group``, which keep
        # ``group_counts`` (what a metrics scrape reads) exact; ``ClassicGroup.transition`` moves them.
        self.groups: dict[str, ClassicGroup] = {}
        self.group_counts = GroupCounts()
        self.offsets: dict[str, dict[TopicPartition, StoredOffset]] = {}
        # producer id -> offsets written in its open transaction (made visible by a COMMIT marker)
        self.pending: dict[int, dict[OffsetKey, tuple[int, StoredOffset]]] = {}
        # (group, topic, partition) -> number of producers with a pending offset for it
        self.pending_count: dict[OffsetKey, int] = {}
        # log offset of the record in place (a plain commit, or a committed transactional offset) while a
        # transaction has that partition pending: its COMMIT marker only installs its offset if it was
        # written after this one
        self.contested: dict[OffsetKey, int] = {}
        self.num_offsets = 0
        # one shared (topic, partition) tuple per partition, used as the key in every group's dict:
        # a million cached offsets over a few thousand partitions would otherwise hold a million tuples
        # (~84 bytes of RSS each with the partition's int). Cleared when ``interned`` passes its bound, or
        # twice the offsets cached (and some): the keys of offsets that are gone are dropped with it; a
        # soak of 200k short-lived groups on topics of their own left ~80 MB of them behind (~400 B a
        # key with its topic's table), on 50 partitions up to 50M keys.
        # By topic, then partition: replay finds a key without building a tuple to look it up (with
        # the group and topic of the previous record reused: ~40% of replaying a loaded record).
        # (Typed Any: compiled by mypyc, a tuple[str, int] local is a C struct, boxed anew at every use.)
        self.partitions: dict[str, dict[Any, Any]] = {}
        self.interned = 0

    def replay(self, offset: int, record: LoadedRecord, producer_id: int = NO_PRODUCER) -> None:
        """Applies one record appended at log ``offset`` (see ``replay_records``)."""
        self.replay_records(offset, (record,), producer_id)

    def replay_records(
        self, first_offset: int, records: Iterable[LoadedRecord], producer_id: int = NO_PRODUCER
    ) -> None:
        """Applies records appended at consecutive log offsets from ``first_offset``: the only code that
        changes this state, for live writes and for loading alike. ``producer_id`` is set for records of
        a transactional batch, which stay pending until their COMMIT or ABORT marker. Written for a
        whole batch at a time: a 150k-partition commit replays in one pass on the event loop. An offset
        commit comes as an ``OffsetCommitRecord`` or, from the compiled loader, as plain tuples with the
        value's bytes (``LoadedCommit``); both are applied by the same lines and cached as they come."""
        offset = first_offset
        offsets = self.offsets
        pending_count = self.pending_count
        last_group_id: object = None
        last_group: dict[TopicPartition, StoredOffset] = {}
        last_topic: object = None
        by_partition: dict[Any, Any] = {}
        for record in records:
            if type(record) is _OffsetCommitRecord or type(record) is tuple:
                # typed tuples: compiled, their items are read in place (an Any is indexed and unpacked
                # through Python's generic protocols: ~30% of replaying a loaded record)
                key: Any
                value: StoredOffset | None
                if len(record) == 4:  # LoadedCommit, flat: no key tuple made and freed per record
                    loaded: tuple[str, str, object, Any] = record
                    group_id, topic, partition, value = loaded[0], loaded[1], loaded[2], loaded[3]
                    key = None
                else:
                    commit: tuple[Any, Any] = record
                    key, value = commit[0], commit[1]
                    parts: tuple[str, str, object] = key
                    group_id, topic, partition = parts[0], parts[1], parts[2]
                if value is None or producer_id != NO_PRODUCER:
                    last_group_id = None  # a tombstone may drop the group's dict: look it up again
                    named = _named(key, group_id, topic, partition)
                    if value is None:
                        self._delete_offset(named)
                    else:
                        self._add_pending(producer_id, named, offset, value)
                else:
                    if pending_count:
                        named = _named(key, group_id, topic, partition)
                        if named in pending_count:
                            self.contested[named] = offset
                    if group_id is not last_group_id:  # the records of one commit share group and topic
                        group = offsets.get(group_id)
                        if group is None:
                            group = self._new_offsets_group(group_id)
                        last_group_id, last_group = group_id, group
                    else:
                        group = last_group
                    if topic is not last_topic:
                        by_partition = self._topic_table(topic)
                        last_topic = topic
                    tp = by_partition.get(partition)
                    if tp is None:
                        tp = self._intern(by_partition, topic, partition)
                    size = len(group)
                    group[tp] = value
                    if len(group) != size:  # one lookup of the key instead of two
                        self.num_offsets += 1
            elif isinstance(record, GroupMetadataRecord):
                if record.value is None:
                    self._remove_group(record.group)
                    if record.group in self.offsets:
                        # A group's deletion is appended in slices when it has many offsets: a commit
                        # that landed between them keeps its offset, and the group it was made to stays
                        # as that commit alone would have left it (simple, Empty), not an offset of no group.
                        self.put_group(ClassicGroup(record.group))
                else:
                    self.put_group(ClassicGroup.from_record(record.group, record.value))
            offset += 1

    def replay_end_transaction(self, producer_id: int, commit: bool) -> None:
        """Applies a COMMIT (pending offsets become committed) or ABORT (they are dropped) marker. As in
        Kafka (OffsetMetadataManager.replayEndTransactionMarker), a committed offset is installed only if
        its record is newer than the one in place: a plain commit written after it, or another
        producer's transactional offset written after it and committed first, stays."""
        pending = self.pending.pop(producer_id, None)
        if not pending:
            return
        for key, (log_offset, value) in sorted(pending.items(), key=lambda kv: kv[1][0]):
            newer_commit = self.contested.get(key, -1) > log_offset
            self._release_pending(key)
            if commit and not newer_commit:
                self._put_offset(key, value)
                if key in self.pending_count:  # another producer's older record for it may commit later
                    self.contested[key] = log_offset

    def committed(self, group_id: str, topic: str, partition: int) -> OffsetAndMetadata | None:
        group = self.offsets.get(group_id)
        return None if group is None else read_offset(group.get((topic, partition)))

    def has_pending(self, key: OffsetKey) -> bool:
        return key in self.pending_count

    def put_group(self, group: ClassicGroup) -> None:
        """Adds ``group`` (replacing any of its id): replay, and a JoinGroup creating a group (whose record
        is not replayed live). From now on its state changes move ``group_counts``."""
        self._remove_group(group.group_id)
        self._add_group(group)

    # -- internals -----------------------------------------------------------------------------

    def _new_offsets_group(self, group_id: str) -> dict[TopicPartition, StoredOffset]:
        group: dict[TopicPartition, StoredOffset] = {}
        self.offsets[group_id] = group
        if group_id not in self.groups:
            # A commit to an unknown group creates a "simple" group: Empty, no protocol type.
            self._add_group(ClassicGroup(group_id))
        return group

    def _put_offset(self, key: OffsetKey, value: StoredOffset) -> None:
        group = self.offsets.get(key.group)
        if group is None:
            group = self._new_offsets_group(key.group)
        by_partition = self._topic_table(key.topic)
        tp = by_partition.get(key.partition)
        if tp is None:
            tp = self._intern(by_partition, key.topic, key.partition)
        if tp not in group:
            self.num_offsets += 1
        group[tp] = value

    def _topic_table(self, topic: str) -> dict[Any, Any]:
        """The shared keys of ``topic``'s partitions, by partition."""
        by_partition = self.partitions.get(topic)
        if by_partition is None:
            by_partition = self.partitions[topic] = {}
        return by_partition

    def _intern(self, by_partition: dict[Any, Any], topic: str, partition: object) -> Any:
        if self.interned >= INTERNED_PARTITIONS_MAX or self.interned >= 2 * self.num_offsets + INTERNED_SLACK:
            # start again, keeping the caller's table (replay goes on with it) registered and counted
            self.partitions.clear()
            by_partition.clear()
            self.partitions[topic] = by_partition
            self.interned = 0
        tp: Any = (topic, partition)
        by_partition[partition] = tp
        self.interned += 1
        return tp

    def _add_group(self, group: ClassicGroup) -> None:
        """``put_group`` for an id not in ``groups`` (a commit's new group: no lookup of one to replace)."""
        counts = self.group_counts
        self.groups[group.group_id] = group
        group.counts = counts
        counts.by_state[group.state] += 1

    def _remove_group(self, group_id: str) -> None:
        group = self.groups.pop(group_id, None)
        if group is not None:
            group.counts = None
            self.group_counts.moved(group.state, None)

    def _delete_offset(self, key: OffsetKey) -> None:
        group = self.offsets.get(key.group)
        if group is not None and group.pop((key.topic, key.partition), None) is not None:
            self.num_offsets -= 1
            if not group:
                del self.offsets[key.group]
        for pid in [p for p, offs in self.pending.items() if key in offs]:
            del self.pending[pid][key]
            self._release_pending(key)

    def _add_pending(self, producer_id: int, key: OffsetKey, offset: int, value: StoredOffset) -> None:
        offs = self.pending.setdefault(producer_id, {})
        if key not in offs:
            self.pending_count[key] = self.pending_count.get(key, 0) + 1
        offs[key] = (offset, value)

    def _release_pending(self, key: OffsetKey) -> None:
        n = self.pending_count.get(key, 0) - 1
        if n > 0:
            self.pending_count[key] = n
        else:
            self.pending_count.pop(key, None)
            self.contested.pop(key, None)

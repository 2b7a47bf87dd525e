"""An OffsetCommit request's content, whatever its version: what the handler and ``prepare_commit``
work on (coordinator/offsets.py).

The compiled codec (protocol/hotcodec.py) decodes a request frame straight into these tuples; without
it, the generated message objects are converted (``from_message``). Building the generated objects and
then these cost ~0.7 us per partition: a third of a 100-partition commit's event-loop time.
"""

from dataclasses import dataclass
from typing import Any

# One partition of a commit request: (partition, offset, leader epoch, commit timestamp (-1 unless a v1
# request set one), metadata). A plain tuple, not a NamedTuple: a commit may carry 150,000 of them, and
# compiled, building a NamedTuple (``tuple.__new__`` of the class) cost ~0.2 us more per partition than a
# tuple display, half of decoding a 100-partition request.
PartitionCommit = tuple[int, int, int, int, str | None]


@dataclass(slots=True, init=False)
class CommitRequest:
    """The version-independent content of an OffsetCommit request. Not frozen, though never changed:
    a frozen dataclass sets each field through ``object.__setattr__`` (1.4 us of every commit). The
    ``__init__`` is written out: compiled, the one ``dataclass`` generates stays an interpreted frame
    (~0.5 us of every commit); ``__eq__`` and ``__repr__`` are still generated (the tests use them)."""

    version: int
    group_id: str
    generation: int
    member_id: str
    group_instance_id: str | None
    retention_ms: int
    topics: list[tuple[str, list[PartitionCommit]]]

    def __init__(self, version: int, group_id: str, generation: int, member_id: str,
                 group_instance_id: str | None, retention_ms: int,
                 topics: list[tuple[str, list[PartitionCommit]]]) -> None:
        self.version = version
        self.group_id = group_id
        self.generation = generation
        self.member_id = member_id
        self.group_instance_id = group_instance_id
        self.retention_ms = retention_ms
        self.topics = topics


def from_message(version: int, req: Any) -> CommitRequest:
    """The request from its generated message object (the fields ``version`` does not have read as
    Kafka defaults them: no generation, member, instance, retention, epoch or timestamp)."""
    topics: list[tuple[str, list[PartitionCommit]]] = []
    for t in req.topics:
        parts: list[PartitionCommit] = []
        for p in t.partitions:
            epoch = p.committed_leader_epoch if version >= 6 else -1
            timestamp = p.commit_timestamp if version == 1 else -1
            parts.append((p.partition_index, p.committed_offset, epoch, timestamp, p.committed_metadata))
        topics.append((t.name, parts))
    return CommitRequest(
        version=version,
        group_id=req.group_id,
        generation=req.generation_id_or_member_epoch if version >= 1 else -1,
        member_id=(req.member_id or "") if version >= 1 else "",
        group_instance_id=req.group_instance_id if version >= 7 else None,
        retention_ms=req.retention_time_ms if 2 <= version <= 4 else -1,
        topics=topics,
    )

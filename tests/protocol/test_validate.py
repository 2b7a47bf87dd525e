import pytest
from kafka.protocol.consumer.group import OffsetCommitRequest, OffsetFetchRequest
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest

from protocol.validate import null_violation

CommitTopic = OffsetCommitRequest.OffsetCommitRequestTopic
CommitPartition = CommitTopic.OffsetCommitRequestPartition


def commit(group: str | None = "g", topic: str | None = "t", metadata: str | None = None) -> OffsetCommitRequest:
    part = CommitPartition(partition_index=0, committed_offset=1, committed_metadata=metadata)
    return OffsetCommitRequest(group_id=group, member_id="", group_instance_id=None,
                               topics=[CommitTopic(name=topic, partitions=[part])])


def test_nullable_fields_may_be_null() -> None:
    assert null_violation(OffsetCommitRequest, commit(metadata=None), 8) is None
    assert null_violation(OffsetFetchRequest, OffsetFetchRequest(group_id="g", topics=None), 2) is None
    assert null_violation(MetadataRequest, MetadataRequest(topics=None), 1) is None


@pytest.mark.parametrize(
    ("cls", "message", "version", "path"),
    [
        (OffsetCommitRequest, commit(group=None), 8, "group_id"),
        (OffsetCommitRequest, commit(topic=None), 2, "topics[0].name"),
        (OffsetFetchRequest, OffsetFetchRequest(group_id="g", topics=None), 1, "topics"),
        (MetadataRequest, MetadataRequest(topics=None), 0, "topics"),
        (FindCoordinatorRequest, FindCoordinatorRequest(key=None), 0, "key"),
    ],
)
def test_null_where_the_version_forbids_it(cls: object, message: object, version: int, path: str) -> None:
    assert null_violation(cls, message, version) == path

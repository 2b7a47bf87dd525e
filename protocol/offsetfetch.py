"""An OffsetFetch request's content: what coordinator/apis/k09 serves from, as protocol/commit.py is
OffsetCommit's.

The compiled codec (protocol/hotcodec.py) decodes a request frame straight into these; without it,
the generated message objects are converted (``from_message``). Each group's topics are already what a
read of its offsets takes (``Requested``). Building kafka-python's generated objects for a
1-partition fetch (a request, a group or topic list, a topic: interpreted constructors) and then
reading their fields by name cost ~9,000 instructions of the ~47,000 such a request took in all
(callgrind, ``bench.request_path``).
"""

from dataclasses import dataclass
from typing import Any

# The partitions asked for, by topic, or None for every partition the group has an offset for (v2+).
Requested = list[tuple[str, list[int]]] | None


@dataclass(slots=True, init=False)
class FetchGroup:
    """One group of a v8+ request. ``member_id`` and ``member_epoch`` (v9, KIP-848) are read but not
    checked: classic groups ignore them, as Kafka does."""

    group_id: str
    member_id: str | None
    member_epoch: int
    topics: Requested

    def __init__(self, group_id: str, member_id: str | None, member_epoch: int, topics: Requested) -> None:
        self.group_id = group_id
        self.member_id = member_id
        self.member_epoch = member_epoch
        self.topics = topics


@dataclass(slots=True, init=False)
class FetchRequest:
    """The content of an OffsetFetch request: v0-v7 name one group (``group_id``, ``topics``), v8+ a list
    (``groups``; ``group_id`` is then "" and ``topics`` []). Not frozen, and its ``__init__`` written
    out, for the reasons protocol/commit.py's CommitRequest gives."""

    version: int
    group_id: str
    topics: Requested
    groups: list[FetchGroup]
    require_stable: bool

    def __init__(self, version: int, group_id: str, topics: Requested, groups: list[FetchGroup],
                 require_stable: bool) -> None:
        self.version = version
        self.group_id = group_id
        self.topics = topics
        self.groups = groups
        self.require_stable = require_stable


def requested(topics: Any) -> Requested:
    """A generated message's topics (``name``, ``partition_indexes``) as a read takes them."""
    return None if topics is None else [(t.name, list(t.partition_indexes)) for t in topics]


def from_message(version: int, req: Any) -> FetchRequest:
    """The request from its generated message object (fields ``version`` does not have read as Kafka
    defaults them)."""
    if version >= 8:
        groups = [FetchGroup(g.group_id, g.member_id if version >= 9 else None,
                             g.member_epoch if version >= 9 else -1, requested(g.topics)) for g in req.groups]
        return FetchRequest(version, "", [], groups, bool(req.require_stable))
    return FetchRequest(version, req.group_id, requested(req.topics), [],
                        bool(req.require_stable) if version >= 7 else False)

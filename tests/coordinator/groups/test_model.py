"""coordinator.groups.model: what a group costs in memory, and the order Kafka breaks a protocol vote tie in."""

import tracemalloc

import pytest

from coordinator.groups.model import ClassicGroup, GroupMember, java_hashmap_order
from coordinator.request import Request
from tests.coordinator.harness import stand_in_api


def test_an_empty_group_takes_under_500_bytes() -> None:
    """Most groups a coordinator holds are a commit's simple groups: Empty, no members. Each took 783
    bytes (two empty sets of member ids at 216 bytes each); 479 with the ids kept as dict keys. Measured
    with tracemalloc over 20,000 groups, their ids and the list holding them included."""
    groups = []
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(20_000):
            groups.append(ClassicGroup(f"group-{i:08d}"))
        per_group = (tracemalloc.get_traced_memory()[0] - before) / len(groups)
    finally:
        tracemalloc.stop()
    assert per_group < 500, per_group


# Inserted keys -> the order a default java.util.HashMap iterates them, printed by OpenJDK 17.
JVM_ORDERS = [
    (["roundrobin", "range"], ["range", "roundrobin"]),
    (["range", "sticky"], ["sticky", "range"]),
    (["cooperative-sticky", "range"], ["range", "cooperative-sticky"]),
    (["cooperative-sticky", "roundrobin"], ["roundrobin", "cooperative-sticky"]),
    ([f"p{i}" for i in range(15)], [f"p{i}" for i in range(11)] + ["p12", "p11", "p14", "p13"]),  # resized to 32
    (["Aa", "BB", "range"], ["Aa", "BB", "range"]),  # Aa and BB collide: insertion order in the bucket
    (["BB", "Aa"], ["BB", "Aa"]),
]


@pytest.mark.parametrize(("inserted", "iterated"), JVM_ORDERS)
def test_java_hashmap_order_is_what_a_jvm_iterates(inserted: list[str], iterated: list[str]) -> None:
    assert java_hashmap_order(inserted) == iterated


def test_the_tally_follows_members_as_they_come_change_park_and_go() -> None:
    """Candidate protocols and parked joins are read from the tally a join keeps (a walk of every member
    per join made a rebalance of N members O(N^2)): it follows each way a member changes."""
    def member(member_id: str, *names: str) -> GroupMember:
        return GroupMember(member_id, None, "c", "/h", 1000, 1000, "consumer", [(n, b"") for n in names])

    group = ClassicGroup("g")
    assert group.tally is None and group.candidate_protocols() == set() and group.awaiting_join == 0
    a, b = member("a", "range", "roundrobin", "range"), member("b", "roundrobin")  # a lists range twice
    group.add(a)
    group.add(b)
    assert group.tally is not None and group.tally.supported == {"range": 1, "roundrobin": 2}
    assert group.candidate_protocols() == {"roundrobin"}
    group.set_protocols(b, [("range", b""), ("sticky", b"")])
    assert group.candidate_protocols() == {"range"} and group.tally.supported == {"range": 2, "roundrobin": 1,
                                                                                  "sticky": 1}
    req = Request(None, stand_in_api(), 9, 0, "c", "h")
    group.park_join(a, req)
    group.park_join(a, req)  # a retried join replaces the parked one: still one member waiting
    group.park_join(b, req)
    assert group.awaiting_join == 2
    assert group.take_join(a) is req and group.take_join(a) is None and group.awaiting_join == 1
    group.remove("b")  # leaves with its join parked
    assert group.awaiting_join == 0 and group.tally.supported == {"range": 1, "roundrobin": 1}
    group.remove("a")
    assert group.tally.supported == {} and group.candidate_protocols() == set()

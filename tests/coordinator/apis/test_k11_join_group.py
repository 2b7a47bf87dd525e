"""JoinGroup's handler module (coordinator/apis/k11_join_group.py): a member's host as Kafka records it."""

import socket

import pytest

from coordinator.apis.k11_join_group import client_host


@pytest.mark.parametrize(("peer", "host"), [
    ("127.0.0.1:50001", "/127.0.0.1"),
    ("::1:50001", "/0:0:0:0:0:0:0:1"),  # Java's Inet6Address never compresses: "::1" is not Kafka's form
    ("2001:db8::ab:0:1:9092", "/2001:db8:0:0:0:ab:0:1"),
    ("2001:0DB8:0:0:0:0:0:0A0B:9092", "/2001:db8:0:0:0:0:0:a0b"),  # lower case, no leading zeros
    ("::ffff:10.1.2.3:9092", "/10.1.2.3"),  # IPv4-mapped: Java's Inet4Address
    ("fe80::1%7:9092", "/fe80:0:0:0:0:0:0:1%7"),  # a scope by its number
])
def test_a_members_host_is_javas_inet_address_to_string(peer: str, host: str) -> None:
    assert client_host(peer) == host


def test_a_named_scope_is_given_by_its_number() -> None:
    """Python names a link-local peer's scope by its interface ("fe80::1%lo"); Java by its index."""
    index = socket.if_nametoindex("lo")
    assert client_host("fe80::1%lo:9092") == f"/fe80:0:0:0:0:0:0:1%{index}"

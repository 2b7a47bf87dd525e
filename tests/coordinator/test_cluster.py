"""Cluster mode's settings, partition ownership and the data directory's record of it (coordinator.cluster)."""

import json
import os
import socket
from pathlib import Path

import pytest

from coordinator.cluster import Node, layout, layout_refusal, owned_by, owned_partitions, shared_listener
from coordinator.config import ConfigError, parse_cluster
from coordinator.runtime import META_FILE, ConfigMismatch, check_data_dir
from protocol.partitioning import partition_for
from tests.coordinator.test_cli import parse

TWO = "1@127.0.0.1:9093,0@127.0.0.1:9092"


def test_cluster_is_parsed_sorted_by_id_and_gives_this_node_its_entry_as_advertised() -> None:
    cfg = parse(["--cluster", TWO, "--node-id", "1", "--listen", "0.0.0.0:9093"])
    assert cfg.cluster == (Node(0, "127.0.0.1", 9092), Node(1, "127.0.0.1", 9093))
    assert cfg.advertised == ("127.0.0.1", 9093)  # a wildcard listener is fine: the entry is what is advertised
    assert cfg.nodes == cfg.cluster
    assert parse(["--node-id", "4", "--listen", "127.0.0.1:1234"]).nodes == (Node(4, "127.0.0.1", 1234),)


def test_each_partition_has_one_owner_by_index_in_ascending_ids() -> None:
    cfg = parse(["--cluster", "7@h:1,3@h:2,5@h:3", "--node-id", "5"])
    assert [cfg.owner(p).node_id for p in range(7)] == [3, 5, 7, 3, 5, 7, 3]
    assert [p for p in range(50) if cfg.owns(p)] == owned_partitions([7, 3, 5], 5, 50)
    every = [owned_partitions([3, 5, 7], n, 50) for n in (3, 5, 7)]
    assert sorted(p for ps in every for p in ps) == list(range(50))
    standalone = parse([])
    assert all(standalone.owns(p) for p in range(50))


@pytest.mark.parametrize(("value", "says"), [
    ("0@h:1,0@g:2", "given twice"),
    ("0@h:1,1@h:1", "same HOST:PORT"),
    ("x@h:1", "not an integer"),
    ("0h:1", "ID@HOST:PORT"),
    ("0@0.0.0.0:1", "every interface"),
    ("0@h:0", "port 0"),
    (",", "no node"),
])
def test_a_bad_cluster_list_says_what_is_wrong(value: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_cluster(value)
    with pytest.raises(ConfigError, match="--cluster"):
        parse(["--cluster", value])


@pytest.mark.parametrize(("argv", "says"), [
    (["--cluster", TWO, "--node-id", "2"], "--node-id 2 is not among"),
    (["--cluster", TWO, "--upstream", "127.0.0.1:9"], "cannot be combined"),
    (["--cluster", TWO, "--offsets-partitions", "1"], "every node must own a partition"),
    (["--cluster", TWO, "--advertised-listener", "other:9092"], "differs from this node's entry"),
])
def test_cluster_settings_that_cannot_work_are_refused(argv: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse(argv)


def test_the_same_entry_given_as_advertised_listener_is_accepted() -> None:
    assert parse(["--cluster", TWO, "--advertised-listener", "127.0.0.1:9092"]).advertised == ("127.0.0.1", 9092)



@pytest.mark.parametrize("value", ["", " ", "none", "OFF"])
def test_an_empty_cluster_flag_undoes_the_environments_cluster(value: str) -> None:
    """KCOORD_CLUSTER set in the environment (a container image's, a unit file's) and a one-node run
    wanted: ``--cluster ''`` is one node, as ``--metrics-listen off`` undoes KCOORD_METRICS_LISTEN."""
    env = {"KCOORD_CLUSTER": TWO, "KCOORD_NODE_ID": "1", "KCOORD_LISTEN": "127.0.0.1:9093"}
    assert parse([], env).cluster == parse_cluster(TWO)
    alone = parse(["--cluster", value, "--listen", "127.0.0.1:9500"], env)
    assert alone.cluster == () and alone.nodes == (Node(1, "127.0.0.1", 9500),)
    assert all(alone.owns(p) for p in range(50))
    assert parse([], {"KCOORD_CLUSTER": value}).cluster == ()

def test_layouts_that_own_the_same_partitions_agree_and_others_are_refused() -> None:
    zero = layout(0, parse_cluster(TWO))
    assert zero == {"node_id": 0, "node_ids": [0, 1]}
    assert layout(0, ()) is None
    assert layout_refusal(zero, {"node_id": 5, "node_ids": [5, 9]}, 50) is None  # renumbered, same partitions
    assert layout_refusal(None, None, 50) is None
    moved = layout_refusal(zero, {"node_id": 1, "node_ids": [0, 1]}, 50)
    assert moved is not None and "would no longer be served" in moved and "served empty" in moved
    alone = layout_refusal(zero, None, 50)
    assert alone is not None and "would no longer" not in alone and "served empty" in alone
    assert owned_by(None, 3) == {0, 1, 2}
    with pytest.raises(ValueError):
        owned_by({"node_id": 2, "node_ids": [0, 1]}, 50)


@pytest.mark.parametrize("cluster", ['{"node_id": 0, "node_ids": [0, 0]}', '{"node_id": true, "node_ids": [0, 1]}',
                                     '{"node_id": 0, "node_ids": [0, false]}', '{"node_id": -1, "node_ids": [-1, 0]}'])
def test_a_recorded_layout_kcoord_never_writes_is_reported_as_damage(tmp_path: Path, cluster: str) -> None:
    """A hand-edited meta file: a node id twice, or json's true/false (Python counts them as 1 and 0), were
    taken as a layout, and the start refused as "written for another layout" with that nonsense in it."""
    data = tmp_path / "d"
    data.mkdir()
    (data / META_FILE).write_text(f'{{"offsets_partitions": 50, "cluster": {cluster}}}')
    with pytest.raises(ConfigMismatch, match="is damaged"):
        check_data_dir(data, 50, {"node_id": 0, "node_ids": [0, 1]})


def test_the_data_directory_records_its_node_and_refuses_another(tmp_path: Path) -> None:
    data = tmp_path / "node0"
    zero = layout(0, parse_cluster(TWO))
    close(check_data_dir(data, 50, zero))
    assert json.loads((data / META_FILE).read_text()) == {"offsets_partitions": 50, "cluster": zero}
    for other in ({"node_id": 1, "node_ids": [0, 1]}, None):
        with pytest.raises(ConfigMismatch, match="does not move partitions between nodes"):
            check_data_dir(data, 50, other)
    close(check_data_dir(data, 50, zero))  # the layout it was written for still starts


def close(lock: int | None) -> None:
    assert lock is not None
    os.close(lock)


def test_a_damaged_cluster_record_is_reported_as_damage(tmp_path: Path) -> None:
    data = tmp_path / "d"
    data.mkdir()
    (data / META_FILE).write_text(json.dumps({"offsets_partitions": 50, "cluster": {"node_id": "x"}}))
    with pytest.raises(ConfigMismatch, match="is damaged"):
        check_data_dir(data, 50, None)


def test_a_directory_without_record_holding_another_nodes_partition_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "d"
    (data / "__consumer_offsets-1").mkdir(parents=True)  # node 1's partition, placed by hand
    with pytest.raises(ConfigMismatch, match="partition 1, which another node"):
        check_data_dir(data, 50, layout(0, parse_cluster(TWO)))
    assert not (data / META_FILE).exists()


def test_a_groups_coordinator_is_the_owner_of_its_partition() -> None:
    cfg = parse(["--cluster", TWO])
    owners = {cfg.owner(partition_for(f"group-{i}", 50)).node_id for i in range(20)}
    assert owners == {0, 1}


def _cluster_node_directory(data: Path, node_id: int, nodes: str, partitions: int) -> None:
    """A cluster node's directory as its first start leaves it (the meta file, then the directory of each
    partition it owns, coordinator.runtime), with its meta file then removed: what an operator does when
    told the file is damaged ("restore it or remove it to re-create it")."""
    cluster = parse_cluster(nodes)
    close(check_data_dir(data, partitions, layout(node_id, cluster)))
    for p in owned_partitions([n.node_id for n in cluster], node_id, partitions):
        (data / f"__consumer_offsets-{p}").mkdir()
    (data / META_FILE).unlink()


@pytest.mark.parametrize(("partitions", "node_id", "nodes", "what"), [
    (51, 0, TWO, "another --offsets-partitions (every group re-mapped)"),
    (50, 0, "", "standalone on a cluster node's directory (gains the other node's partitions)"),
    (50, 0, "0@127.0.0.1:9092", "a one-node cluster (gains the other node's partitions)"),
])
def test_a_cluster_directory_whose_meta_file_was_removed_refuses_another_layout(
        tmp_path: Path, partitions: int, node_id: int, nodes: str, what: str) -> None:
    """Without its meta file a standalone directory still tells its partition count (the full set of
    partition directories); a cluster node's sparse set must tell its layout as surely, or the re-created
    meta file records whatever the next start says and the offsets it holds are re-mapped or joined by
    partitions whose offsets are on another node, without a refusal."""
    data = tmp_path / "node0"
    _cluster_node_directory(data, 0, TWO, 50)
    with pytest.raises(ConfigMismatch):
        check_data_dir(data, partitions, layout(node_id, parse_cluster(nodes)) if nodes else None)


def test_a_cluster_directory_whose_meta_file_was_removed_restarts_as_the_same_node(tmp_path: Path) -> None:
    data = tmp_path / "node0"
    _cluster_node_directory(data, 0, TWO, 50)
    close(check_data_dir(data, 50, layout(0, parse_cluster(TWO))))
    assert json.loads((data / META_FILE).read_text())["cluster"] == {"node_id": 0, "node_ids": [0, 1]}


def test_a_cluster_node_listening_on_port_0_is_refused() -> None:
    """In cluster mode a node advertises its --cluster entry, never the port the system picks for
    ``--listen HOST:0``: such a node listens where no client is ever sent (FindCoordinator and Metadata
    name the entry's port), so every group it owns is unreachable. Standalone, port 0 is advertised as
    the port bound, which stays accepted."""
    with pytest.raises(ConfigError, match="--listen"):
        parse(["--cluster", TWO, "--node-id", "0", "--listen", "127.0.0.1:0"])


@pytest.mark.parametrize("value", ["0 @ h:1,1 @ g:2", "0@ h:1,1@ g:2", "0@h :1,1@g :2"])
def test_spaces_in_a_cluster_entry_never_reach_an_advertised_host(value: str) -> None:
    """Spaces around the items are stripped ("0@h:1, 1@g:2"); spaces around the '@' or the ':' made the
    advertised host ' h' / 'h ', which every client then fails to resolve. Stripped or refused, never sent."""
    try:
        nodes = parse_cluster(value)
    except ValueError:
        return
    assert [n.host for n in nodes] == ["h", "g"]


def test_a_node_listening_on_another_nodes_entry_is_refused() -> None:
    """Node 1's line copied with --node-id 0 left unchanged: this process listens at node 1's address, so
    every client sent to node 1 (FindCoordinator for node 1's groups, from any node) reaches it, and it
    answers NOT_COORDINATOR for them all, for ever. A listener that is exactly another node's entry is a
    --node-id mistake, refused as Kafka refuses a second broker registering an id."""
    with pytest.raises(ConfigError, match="--node-id"):
        parse(["--cluster", TWO, "--node-id", "0", "--listen", "127.0.0.1:9093"])


class Lookups:
    """A resolver standing in for DNS: each name's addresses, a name missing from it fails as an
    unpublished one does; records what was asked."""

    def __init__(self, names: dict[str, set[str]]) -> None:
        self.names = names
        self.asked: list[str] = []

    def __call__(self, host: str) -> set[str]:
        self.asked.append(host)
        if host not in self.names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.names[host]


def test_two_entries_resolving_to_one_listener_are_named_together() -> None:
    """``0@localhost:9092,1@127.0.0.1:9092`` passes the spelling check, and two nodes would be one
    listener: whichever binds it answers for both, NOT_COORDINATOR for half of every group it is sent."""
    lookup = Lookups({"localhost": {"127.0.0.1", "::1"}, "127.0.0.1": {"127.0.0.1"}, "::1": {"::1"},
                      "kc-2.example": {"10.0.0.2"}})
    refusal, notes = shared_listener(parse_cluster("0@localhost:9092,1@127.0.0.1:9092,2@kc-2.example:9092"), lookup)
    assert refusal is not None and "0@localhost:9092 and 1@127.0.0.1:9092" in refusal and "127.0.0.1" in refusal
    assert notes == []
    ipv6 = shared_listener(parse_cluster("0@[::1]:9092,1@localhost:9092"), lookup)[0]
    assert ipv6 is not None and "0@[::1]:9092 and 1@localhost:9092" in ipv6


def test_only_hosts_sharing_a_port_are_resolved_each_once() -> None:
    lookup = Lookups({"a": {"10.0.0.1"}, "b": {"10.0.0.2"}, "c": {"10.0.0.1"}})
    assert shared_listener(parse_cluster("0@a:9092,1@b:9092,2@a:9093,3@c:9094"), lookup) == (None, [])
    assert sorted(lookup.asked) == ["a", "b"]  # c's port is its own; a is asked once
    one_host = Lookups({})
    assert shared_listener(parse_cluster("0@h:9092,1@h:9093,2@h:9094"), one_host) == (None, [])
    assert one_host.asked == []  # --processes' nodes: one host, consecutive ports


def test_a_host_that_does_not_resolve_yet_is_left_unchecked_not_refused() -> None:
    """In Kubernetes a StatefulSet pod's name is published once the pod runs: a node starting before
    its peers cannot resolve them, and must start all the same."""
    lookup = Lookups({"kc-0.example": {"10.0.0.1"}})
    refusal, notes = shared_listener(parse_cluster("0@kc-0.example:9092,1@kc-1.example:9092"), lookup)
    assert refusal is None
    assert len(notes) == 1 and "1@kc-1.example:9092" in notes[0] and "not checked" in notes[0]
    long_label = "x" * 64 + ".example"  # passes parse_cluster; the resolver raises UnicodeError, no OSError
    refusal, notes = shared_listener(parse_cluster(f"0@127.0.0.1:9092,1@{long_label}:9092"))
    assert refusal is None and len(notes) == 1 and long_label in notes[0]


def test_a_resolver_that_does_not_answer_does_not_hold_the_start() -> None:
    """getaddrinfo has no timeout of its own: with the DNS server down (a Kubernetes node's CoreDNS not
    up yet) each name took the resolver's retries, one name after the other, before the node listened
    (three pods' names: over the startup probe's minute). The lookups are bounded, and a host not
    answered in time is left unchecked as one that does not resolve."""
    import threading
    import time

    never = threading.Event()
    answered = Lookups({"kc-0.example": {"10.0.0.1"}})

    def hung(host: str) -> set[str]:
        if host != "kc-0.example":
            never.wait(15)  # a lookup retried against a server that does not answer
        return answered(host)

    started = time.monotonic()
    try:
        refusal, notes = shared_listener(parse_cluster("0@kc-0.example:9092,1@kc-1.example:9092,2@kc-2.example:9092"),
                                         hung)
    finally:
        never.set()
    assert time.monotonic() - started < 5
    assert refusal is None and len(notes) == 2 and all("not checked" in n for n in notes)
    assert "1@kc-1.example:9092" in notes[0] and "2@kc-2.example:9092" in notes[1]


@pytest.mark.parametrize("count", ["Infinity", "1e999", "0", "-3"])
def test_a_recorded_partition_count_that_is_no_count_is_reported_as_damage(tmp_path: Path, count: str) -> None:
    """json reads Infinity and 1e999 as the float infinity, whose int() raised OverflowError past the
    damage check: the start ended with a traceback and exit status 1. A count below 1 was taken at its
    word: "holds an offsets topic of -3 partitions ... Start with -3."."""
    data = tmp_path / "d"
    data.mkdir()
    (data / META_FILE).write_text(f'{{"offsets_partitions": {count}}}')
    with pytest.raises(ConfigMismatch, match="is damaged"):
        check_data_dir(data, 50, None)

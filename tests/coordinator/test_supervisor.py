"""The nodes ``--processes`` makes of one setting (coordinator.supervisor.node_configs)."""

from pathlib import Path

from coordinator.cluster import Node
from coordinator.supervisor import node_configs
from tests.coordinator.test_cli import parse


def test_node_i_takes_the_ports_plus_i_and_a_directory_of_its_own() -> None:
    config = parse(["--processes", "3", "--listen", "0.0.0.0:9092", "--advertised-listener", "coord.example:19092",
                    "--metrics-listen", "0.0.0.0:9404", "--data-dir", "/var/lib/kcoord"])
    nodes = node_configs(config)
    expected = tuple(Node(i, "coord.example", 19092 + i) for i in range(3))
    assert [(c.node_id, c.port, c.advertised, c.data_dir, c.metrics_listen, c.processes) for c in nodes] == [
        (i, 9092 + i, ("coord.example", 19092 + i), Path(f"/var/lib/kcoord/node-{i}"), ("0.0.0.0", 9404 + i), 1)
        for i in range(3)]
    assert all(c.cluster == expected for c in nodes)


def test_metrics_on_any_free_port_stay_so_for_every_node() -> None:
    config = parse(["--processes", "2", "--metrics-listen", "127.0.0.1:0"])
    assert [c.metrics_listen for c in node_configs(config)] == [("127.0.0.1", 0), ("127.0.0.1", 0)]
    assert [c.metrics_listen for c in node_configs(parse(["--processes", "2", "--metrics-listen", "off"]))] == [
        None, None]

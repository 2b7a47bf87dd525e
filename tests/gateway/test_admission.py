"""Gateway mode under a low open-files limit: each admitted client connection opens a link per
upstream broker on its first relayed request, after admission looked at its descriptor. Those links
must not take the descriptors the logs need (a review found 9 of 10 partitions read-only)."""

import os
import time
from pathlib import Path

from kafka.protocol.metadata import MetadataRequest

from protocol.partitioning import partition_for
from tests.gateway.mock_cluster import MockCluster
from tests.kcoord_process import KcoordProcess
from tests.rawclient import RawClient, commit_request

PARTITIONS = 10


def test_upstream_links_leave_descriptors_for_the_logs(tmp_path: Path) -> None:
    mock = MockCluster(3)
    server = KcoordProcess(tmp_path / "data", "--upstream", mock.bootstrap, "--offsets-partitions", str(PARTITIONS),
                           open_files=256)
    clients: list[RawClient] = []
    try:
        server.start()
        assert server.proc is not None
        committer = RawClient(server.port)
        for _ in range(135):
            try:
                clients.append(RawClient(server.port))
            except OSError:
                break
        relayed = refused = 0
        for client in clients:  # a relayed request each: the client's upstream links open
            try:
                client.call(MetadataRequest[1](topics=None), 1)
                relayed += 1
            except (ConnectionError, OSError):
                refused += 1
        time.sleep(0.5)
        assert relayed > 0 and refused > 0
        assert len(os.listdir(f"/proc/{server.proc.pid}/fd")) < 250
        groups: dict[int, str] = {}
        n = 0
        while len(groups) < PARTITIONS:
            groups.setdefault(partition_for(f"g{n}", PARTITIONS), f"g{n}")
            n += 1
        for group in groups.values():  # each partition's first write opens its segment
            reply = committer.call(commit_request(group, {("t", 0): 5}), 8)
            assert reply.topics[0].partitions[0].error_code == 0, group
        log = server.log_since_start()
        assert "no file descriptor to spare for a link to upstream" in log
        assert "Too many open files" not in log and " ERROR " not in log
        committer.close()
    finally:
        for client in clients:
            client.close()
        if server.proc is not None:
            server.stop()
        mock.stop()

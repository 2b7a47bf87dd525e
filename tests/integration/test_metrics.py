"""The metrics listener of a real kcoord process: /metrics counts what stock clients did, /healthz and
/readyz tell a live but unready server apart, and ``--log-format json`` writes one object per line."""

import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.errors import NoError
from kafka.structs import OffsetAndMetadata, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from coordinator.groups.model import GroupState
from protocol.partitioning import partition_for
from storage.segments import list_segments
from tests.integration.test_groups import Member, settled
from tests.kcoord_process import REPO, KcoordProcess, free_port
from tests.rawclient import RawClient, commit_request

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
GROUP_STATES = [s.value for s in GroupState]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def scrape(server: KcoordProcess) -> Samples:
    status, text = get(server.metrics_url + "/metrics")
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_what_stock_clients_did(kcoord: KcoordProcess) -> None:
    consumer = KafkaConsumer(bootstrap_servers=kcoord.bootstrap, group_id="metered", enable_auto_commit=False)
    parts = [TopicPartition("events", p) for p in range(3)]
    for offset in range(1, 5):
        consumer.commit({tp: OffsetAndMetadata(offset * 10, "", -1) for tp in parts})
    assert all(consumer.committed(tp) == 40 for tp in parts)
    consumer.close()
    client = RawClient(kcoord.port)  # one refused commit: metadata over the 4096 limit
    refused = client.call(commit_request("metered", {("events", 0): 99}, metadata="x" * 5000), 8)
    assert refused.topics[0].partitions[0].error_code == 12
    client.close()
    with socket.create_connection(("127.0.0.1", kcoord.port)) as bad:  # a negative frame size
        bad.sendall(struct.pack(">i", -7))
        bad.settimeout(10)
        assert bad.recv(1) == b""

    samples = scrape(kcoord)
    assert value(samples, "kcoord_offset_commits_total") == 12  # 4 commits x 3 partitions
    assert value(samples, "kcoord_offset_fetches_total") >= 3
    commits = {labels: v for (name, labels), v in samples.items()
               if name == "kcoord_requests_total" and dict(labels)["api"] == "OffsetCommit"}
    assert sum(v for labels, v in commits.items() if dict(labels)["error"] == "NONE") == 4
    assert value(samples, "kcoord_requests_total", api="OffsetCommit", version="8",
                 error="OFFSET_METADATA_TOO_LARGE") == 1
    assert value(samples, "kcoord_request_duration_seconds_count", api="OffsetCommit") == 5
    assert value(samples, "kcoord_connections_aborted_total", reason="frame") == 1
    assert value(samples, "kcoord_offsets") == 3
    assert value(samples, "kcoord_groups", state="Empty") == 1
    assert value(samples, "kcoord_flush_records_sum") == 12  # records made durable, by group commit
    assert value(samples, "kcoord_fsync_duration_seconds_count") >= 1
    group_partition = str(partition_for("metered", 50))
    assert value(samples, "kcoord_partition_state", partition=group_partition, state="active") == 1
    assert value(samples, "kcoord_log_size_bytes", partition=group_partition) > 0
    assert value(samples, "kcoord_ready") == 1
    assert value(samples, "kcoord_build_info", event_loop="uvloop", python=sys.version.split()[0],
                 version=_installed_version()) == 1
    assert value(samples, "process_resident_memory_bytes") > 0
    # --sync-mode journal (the default): the commits' logs are synced behind the journal by checkpoints
    deadline = time.monotonic() + 10
    while value(samples, "kcoord_checkpoints_total", outcome="ok") < 1:
        assert time.monotonic() < deadline, "no checkpoint within 10 s of the commits"
        time.sleep(0.1)
        samples = scrape(kcoord)
    assert value(samples, "kcoord_checkpoint_duration_seconds_count") >= 1
    assert value(samples, "kcoord_checkpoints_total", outcome="failed") == 0
    assert value(samples, "kcoord_journal_segments") >= 1
    assert value(samples, "kcoord_checkpoint_age_seconds") < 10



def test_every_abort_reason_is_exported_at_zero_before_the_first(kcoord: KcoordProcess) -> None:
    """A labelled counter series that first appears at 1 is no increase to Prometheus (increase() and
    rate() need a sample before it): the alert on ``reason="server_error"`` never fired for a single
    internal error, as an operator's audit saw with a real Prometheus. So every reason is there at 0."""
    samples = scrape(kcoord)
    aborted = {dict(labels)["reason"]: v for (name, labels), v in samples.items()
               if name == "kcoord_connections_aborted_total"}
    assert aborted == dict.fromkeys(("frame", "header", "unknown_api", "unsupported_version", "malformed",
                                     "too_slow", "server_error", "stopping", "max_connections",
                                     "file_descriptors"), 0.0)  # "upstream" only in gateway mode
    with socket.create_connection(("127.0.0.1", kcoord.port)) as bad:  # a negative frame size
        bad.sendall(struct.pack(">i", -7))
        bad.settimeout(10)
        assert bad.recv(1) == b""
    samples = scrape(kcoord)
    assert value(samples, "kcoord_connections_aborted_total", reason="frame") == 1
    assert value(samples, "kcoord_connections_aborted_total", reason="server_error") == 0


def test_offset_deletions_count_offsets_removed_not_partitions_named(kcoord: KcoordProcess) -> None:
    """OffsetDelete answers NONE for a partition the group has no offset for (as Kafka does): it counted
    as a deletion, so asking for 10 partitions of a group holding one offset counted 10, and asking again
    10 more (an operator's audit). Kafka's OffsetDeletions counts the offsets removed."""
    consumer = KafkaConsumer(bootstrap_servers=kcoord.bootstrap, group_id="pruned", enable_auto_commit=False)
    consumer.commit({TopicPartition("events", p): OffsetAndMetadata(7, "", -1) for p in (0, 1)})
    consumer.close()
    admin = KafkaAdminClient(bootstrap_servers=kcoord.bootstrap)
    try:
        named = [TopicPartition("events", p) for p in range(10)]
        for _ in range(2):
            answered = admin.delete_group_offsets("pruned", named)
            assert set(answered) == set(named) and all(e is NoError for e in answered.values())
    finally:
        admin.close()
    samples = scrape(kcoord)
    assert value(samples, "kcoord_offsets") == 0
    assert value(samples, "kcoord_offset_deletions_total") == 2
    assert value(samples, "kcoord_requests_total", api="OffsetDelete", version="0", error="NONE") == 2


def group_states(server: KcoordProcess) -> tuple[dict[str, str], dict[str, str]]:
    """Each group's state as ListGroups names it, and as DescribeGroups then describes it. Two requests,
    not one snapshot: a group may move between them (a second killed member's session expiring, which
    ends the rebalance the first one's started; a loaded machine widens the gap enough to see it)."""
    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap)
    try:
        listed = {g["group_id"]: g["group_state"] for g in admin.list_groups()}
        described = admin.describe_groups(list(listed)) if listed else {}
    finally:
        admin.close()
    return listed, {g: d["group_state"] for g, d in described.items()}


def listed_states(server: KcoordProcess) -> dict[str, float] | None:
    """Groups by state, when ListGroups and DescribeGroups agree on every group; None while they differ."""
    listed, described = group_states(server)
    if described != listed:
        return None
    counts = dict.fromkeys(GROUP_STATES, 0.0)
    for state in listed.values():
        counts[state] += 1
    return counts


def scraped_states(server: KcoordProcess) -> dict[str, float]:
    samples = scrape(server)
    return {state: value(samples, "kcoord_groups", state=state) for state in GROUP_STATES}


def states_reach(server: KcoordProcess, **expected: float) -> None:
    """Waits until ListGroups and DescribeGroups agree on ``expected`` (states not named: none), asked on
    both sides of a scrape; then the scraped ``kcoord_groups`` must say the same (no group changed state
    between two answers that agree). Answers that keep disagreeing fail it at the deadline."""
    wanted = {**dict.fromkeys(GROUP_STATES, 0.0), **expected}
    deadline = time.monotonic() + 30
    while True:
        before = listed_states(server)
        scraped = scraped_states(server)
        if before == wanted and listed_states(server) == wanted:
            assert scraped == wanted
            return
        assert time.monotonic() < deadline, f"ListGroups, DescribeGroups: {group_states(server)}; wanted {wanted}"
        time.sleep(0.2)


def ck_commit(server: KcoordProcess, group: str) -> None:
    consumer = ck.Consumer({"bootstrap.servers": server.bootstrap, "group.id": group, "enable.auto.commit": False,
                            "broker.address.family": "v4"})
    consumer.commit(offsets=[ck.TopicPartition("events", 0, 5)], asynchronous=False)
    consumer.close()


def ck_delete(server: KcoordProcess, *groups: str) -> None:
    admin = AdminClient({"bootstrap.servers": server.bootstrap, "broker.address.family": "v4"})
    for group, done in admin.delete_consumer_groups(list(groups), request_timeout=30).items():
        assert done.result() is None, group


def test_scraped_group_states_equal_list_and_describe_through_joins_leaves_deletes_and_a_restart(
        server: KcoordProcess) -> None:
    """``kcoord_groups`` is counted as groups change (not by a walk at each scrape, which at 200k groups
    held the GIL for 120-600 ms beside the event loop): it must stay what ListGroups and DescribeGroups
    report as stock members join and leave, confluent-kafka commits and deletes, and kcoord reloads."""
    live = [Member(server, "kafka-python", "live", client_id="kp-a"), Member(server, "kafka-python", "live",
                                                                             client_id="kp-b")]
    leaving = Member(server, "aiokafka", "leaving", client_id="aio")
    try:
        settled(*live)
        leaving.next_assignment()
        ck_commit(server, "simple-a")  # simple groups: Empty
        ck_commit(server, "simple-b")
        states_reach(server, Stable=2, Empty=2)
        leaving.leave()  # LeaveGroup: its group is left Empty
        states_reach(server, Stable=1, Empty=3)
        ck_delete(server, "simple-b", "leaving")
        states_reach(server, Stable=1, Empty=1)
        server.restart()  # the counts are rebuilt by loading the log; the members stay on
        states_reach(server, Stable=1, Empty=1)
        for member in live:
            member.kill()  # no LeaveGroup: their sessions expire, and the group is left Empty
        states_reach(server, Empty=2)
        ck_delete(server, "live", "simple-a")
        states_reach(server)
    finally:
        for member in (*live, leaving):
            if member.proc.poll() is None:
                member.kill()


def test_readyz_is_not_ready_when_every_partition_has_failed(tmp_path: Path) -> None:
    """A review's find: once a failed partition no longer made /readyz 503, a server whose every
    partition had failed answered 200 "ready" while it served nothing."""
    server = KcoordProcess(tmp_path / "data", "--offsets-partitions", "1").start()
    client = RawClient(server.port)
    for offset in range(3):
        client.call(commit_request("broken", {("t", 0): offset}), 8)
    client.close()
    server.stop()
    segment = list_segments(tmp_path / "data" / "__consumer_offsets-0")[0].path
    data = bytearray(segment.read_bytes())
    data[70] ^= 0xFF
    segment.write_bytes(bytes(data))
    server.start()
    status, body = get(server.metrics_url + "/readyz")
    assert status == 503 and json.loads(body)["failed"] == [0]
    assert value(scrape(server), "kcoord_ready") == 0
    server.stop()

def _installed_version() -> str:
    import importlib.metadata
    return importlib.metadata.version("kcoord")


def test_readyz_names_a_failed_partition_and_stays_ready_for_the_others(tmp_path: Path) -> None:
    """A campaign's find: one failed partition made /readyz 503 for good, and with deploy/'s one replica
    the Service then had no endpoint, turning away every group's clients though 49 partitions served.
    A failed partition is listed (and pages: deploy/prometheus), the server stays ready."""
    server = KcoordProcess(tmp_path / "data").start()
    client = RawClient(server.port)
    for offset in range(3):  # three batches, so damage to the first one is not a torn tail
        client.call(commit_request("broken", {("t", 0): offset}), 8)
    client.close()
    assert get(server.metrics_url + "/readyz")[0] == 200
    server.stop()
    partition = partition_for("broken", 50)
    segment = list_segments(tmp_path / "data" / f"__consumer_offsets-{partition}")[0].path
    data = bytearray(segment.read_bytes())
    data[70] ^= 0xFF  # inside the first batch's records: its CRC no longer matches
    segment.write_bytes(bytes(data))
    server.start()
    status, body = get(server.metrics_url + "/readyz")
    assert status == 200
    assert json.loads(body)["failed"] == [partition]
    other = RawClient(server.port)  # the other partitions' groups are served
    assert other.call(commit_request("fine", {("t", 0): 1}), 8).topics[0].partitions[0].error_code == 0
    other.close()
    status, body = get(server.metrics_url + "/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok"
    samples = scrape(server)
    assert value(samples, "kcoord_partition_state", partition=str(partition), state="failed") == 1
    assert value(samples, "kcoord_ready") == 1
    assert get(server.metrics_url + "/nothing-here")[0] == 404
    server.stop()


def test_a_metrics_port_in_use_fails_the_start_before_creating_anything(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "coordinator.cli", "serve", "--listen",
                                 f"127.0.0.1:{free_port()}", "--metrics-listen", f"127.0.0.1:{port}", "--data-dir",
                                 str(tmp_path / "data")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--metrics-listen" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()


def test_json_log_format_writes_one_object_per_line(tmp_path: Path) -> None:
    server = KcoordProcess(tmp_path / "data", "--log-format", "json").start()
    client = RawClient(server.port)
    client.call(commit_request("logged", {("t", 0): 1}), 8)
    client.close()
    with socket.create_connection(("127.0.0.1", server.port)) as bad:
        bad.sendall(struct.pack(">i", -7))
        bad.settimeout(10)
        bad.recv(1)
    time.sleep(0.2)
    assert server.stop() == 0
    lines = [json.loads(line) for line in server.log().splitlines() if line.strip()]
    assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert any("partitions loaded" in line["message"] for line in lines)
    warning: Any = next(line for line in lines if "closing connection" in line["message"])
    assert warning["level"] == "WARNING" and warning["logger"] == "coordinator.server"
    assert warning["time"].endswith("Z")


def test_idle_metrics_connections_are_closed_and_do_not_block_scrapes(kcoord: KcoordProcess) -> None:
    """A fault campaign's find: every connection to the metrics listener held a thread, and one that
    sent half a request held it for ever (200 of them, 200 threads); a burst of connects also waited
    on a listen backlog of 5. Now an idle connection is closed (coordinator.exporter.METRICS_IDLE_S),
    and past 32 open connections each new one closes the oldest."""
    from urllib.parse import urlsplit

    assert kcoord.proc is not None
    url = urlsplit(kcoord.metrics_url)
    idle = []
    for _ in range(100):
        sock = socket.create_connection((url.hostname, url.port), timeout=60)
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")  # half a request, never finished
        idle.append(sock)
    assert get(kcoord.metrics_url + "/healthz")[0] == 200  # answered meanwhile
    threads_during = len(os.listdir(f"/proc/{kcoord.proc.pid}/task"))
    assert all(sock.recv(1024) == b"" for sock in idle)  # closed by the server, not by us
    for sock in idle:
        sock.close()
    deadline = time.monotonic() + 30
    while len(os.listdir(f"/proc/{kcoord.proc.pid}/task")) >= threads_during - 25 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(os.listdir(f"/proc/{kcoord.proc.pid}/task")) < threads_during - 25  # their threads ended


def test_a_load_in_progress_shows_the_records_it_has_replayed_so_far(tmp_path: Path) -> None:
    """Fault campaign: a restart loading 2M records per partition (28 s) showed no progress anywhere:
    kcoord_partition_loaded_records was only set once a load ended, so an operator paged by
    KcoordPartitionStuckLoading, whose text points at that gauge to tell a slow load from a stuck one,
    saw nothing move. While a partition loads it now says how many records that load has replayed."""
    from tests.integration.test_durability import _write_big_partition

    records = 300_000
    partition = str(_write_big_partition(tmp_path / "data", "big-group", records))
    server = KcoordProcess(tmp_path / "data").start(loaded=False)
    try:
        during: list[float] = []
        deadline = time.monotonic() + 120
        while True:
            samples = scrape(server)
            state = next(s for s in ("initial", "loading", "active", "read_only", "failed")
                         if value(samples, "kcoord_partition_state", partition=partition, state=s) == 1)
            if state == "loading":
                during.append(value(samples, "kcoord_partition_loaded_records", partition=partition))
            elif state != "initial":
                break
            assert time.monotonic() < deadline, "the partition never finished loading"
        assert state == "active"
        assert during and max(during) > 0, during
        assert during == sorted(during) and max(during) < records, during
        assert value(scrape(server), "kcoord_partition_loaded_records", partition=partition) == records
    finally:
        server.stop()


def test_a_journal_found_damaged_at_the_start_shows_in_the_metrics(tmp_path: Path) -> None:
    """Fault campaign: bytes in the middle of the journal damaged after a kill -9, and the restart
    served every group ~300 acknowledged commits back (the entries after the damage are not applied,
    and the logs' copies of them were set aside), said in one WARNING, while every metric stayed
    green: all partitions active, ready, nothing to alert on. kcoord_journal_damaged_segments counts
    the segments the start found so (KcoordJournalDamaged)."""
    server = KcoordProcess(tmp_path / "data", "--offsets-partitions", "1", "--checkpoint-interval-ms", "3600000")
    server.start()
    try:
        assert scrape(server).get(("kcoord_journal_damaged_segments", ())) == 0  # exported, at 0
        client = RawClient(server.port)
        for offset in range(200):
            assert client.call(commit_request("g", {("t", 0): offset}), 8).topics[0].partitions[0].error_code == 0
        client.close()
        server.kill()
        segment = max((tmp_path / "data" / "journal").glob("*.journal"), key=lambda p: p.stat().st_size)
        raw = bytearray(segment.read_bytes())
        raw[len(raw) // 2: len(raw) // 2 + 16] = bytes(16)
        segment.write_bytes(bytes(raw))
        server.start()
        assert "yet valid entries of it follow" in server.log_since_start()
        assert value(scrape(server), "kcoord_journal_damaged_segments") == 1
    finally:
        server.stop()

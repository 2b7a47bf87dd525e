"""``kcoord groups`` end to end: the real CLI in a subprocess against a running kcoord with a live group
(members in their own processes) and a group that only has committed offsets, and against a
Kafka-compatible broker (Tansu) to show it is not tied to kcoord."""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.structs import OffsetAndMetadata, TopicPartition

from tests.integration.test_group_admin import simple_offsets
from tests.integration.test_groups import Member
from tests.kcoord_process import REPO, KcoordProcess, free_port
from tests.rawclient import RawClient
from tests.tansu_process import TansuProcess


def groups(server: KcoordProcess | TansuProcess, *args: str, json_out: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "coordinator.cli", "groups", "--bootstrap", server.bootstrap,
           *(["--json"] if json_out else []), *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)


def parsed(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def quiet(server: KcoordProcess) -> Iterator[str]:
    simple_offsets(server, "quiet", {("t", 0): 5, ("t", 1): 6, ("u", 0): 7})
    yield "quiet"


def test_list_describe_and_offsets(server: KcoordProcess, live_group: list[Member], quiet: str) -> None:
    assert parsed(groups(server, "list")) == [
        {"group": "live", "protocol_type": "consumer", "state": "Stable", "type": "classic"},
        {"group": "quiet", "protocol_type": "", "state": "Empty", "type": "classic"},
    ]
    described = parsed(groups(server, "describe", "live"))
    assert (described["state"], described["protocol"]) == ("Stable", "fixed")
    assert sorted(p for m in described["members"] for p in m["partitions"]) == [f"events-{p}" for p in range(4)]
    no_log = {"log_end_offset": None, "lag": None}  # standalone: no topic's log to measure the lag against
    assert parsed(groups(server, "offsets", "quiet")) == [
        {"topic": "t", "partition": 0, "offset": 5, "metadata": "", **no_log},
        {"topic": "t", "partition": 1, "offset": 6, "metadata": "", **no_log},
        {"topic": "u", "partition": 0, "offset": 7, "metadata": "", **no_log},
    ]
    header, *rows = groups(server, "offsets", "quiet", json_out=False).stdout.splitlines()
    assert header.split() == ["GROUP", "TOPIC", "PARTITION", "OFFSET", "LOG-END-OFFSET", "LAG", "METADATA"]
    assert rows[0].split() == ["quiet", "t", "0", "5", "-", "-"]
    table = groups(server, "describe", "live", json_out=False)
    assert table.returncode == 0
    header, *rows = table.stdout.splitlines()
    assert header.split()[:3] == ["GROUP", "STATE", "PROTOCOL"] and len(rows) == 2


def test_reset_offsets_is_refused_while_the_group_has_members(server: KcoordProcess, live_group: list[Member],
                                                              quiet: str) -> None:
    refused = groups(server, "reset-offsets", "live", "--topic", "events", "--partitions", "0", "--to-offset", "0")
    assert refused.returncode == 1 and "only be reset while the group has no members" in refused.stderr
    done = parsed(groups(server, "reset-offsets", "quiet", "--topic", "t", "--to-offset", "100"))
    assert done == [{"topic": "t", "partition": 0, "previous": 5, "offset": 100},
                    {"topic": "t", "partition": 1, "previous": 6, "offset": 100}]

    def offsets() -> dict[tuple[str, int], int]:
        return {(o["topic"], o["partition"]): o["offset"] for o in parsed(groups(server, "offsets", "quiet"))}

    assert offsets() == {("t", 0): 100, ("t", 1): 100, ("u", 0): 7}
    # --shift-by moves the committed offsets; standalone, with no log to stay within, only not below 0
    dry = parsed(groups(server, "reset-offsets", "quiet", "--topic", "u", "--shift-by", "-10", "--dry-run"))
    assert dry == [{"topic": "u", "partition": 0, "previous": 7, "offset": 0}]
    assert offsets() == {("t", 0): 100, ("t", 1): 100, ("u", 0): 7}
    shifted = parsed(groups(server, "reset-offsets", "quiet", "--topic", "t", "--partitions", "1", "--shift-by", "-4"))
    assert shifted == [{"topic": "t", "partition": 1, "previous": 100, "offset": 96}]
    assert offsets() == {("t", 0): 100, ("t", 1): 96, ("u", 0): 7}
    # the log's ends and times need the cluster's brokers (gateway mode: tests/gateway/test_reset_offsets.py)
    for target in (["--to-earliest"], ["--to-latest"], ["--to-datetime", "2026-11-28T10:00:00"]):
        result = groups(server, "reset-offsets", "quiet", "--topic", "t", *target)
        assert result.returncode == 1 and "a standalone kcoord hosts no topics" in result.stderr, result.stderr
    for flag, why in (("--to-offset=-5", "'-5' is not an offset"), (f"--to-offset={2**63}", "is not an offset"),
                      (f"--shift-by={2**63}", "is not a shift"),
                      ("--to-datetime=1969-12-31T23:59:59.999", "before 1970")):
        refused = groups(server, "reset-offsets", "quiet", "--topic", "t", flag)
        assert refused.returncode == 2 and why in refused.stderr, refused.stderr
    big = parsed(groups(server, "reset-offsets", "quiet", "--topic", "t", "--partitions", "1",
                        f"--shift-by={2**63 - 1}", "--dry-run"))
    assert big == [{"topic": "t", "partition": 1, "previous": 96, "offset": 2**63 - 1}]  # at most int64's largest
    no_offset = groups(server, "reset-offsets", "quiet", "--topic", "t", "--partitions", "0,3", "--shift-by", "1")
    assert no_offset.returncode == 1 and "no committed offset to shift for t-3" in no_offset.stderr
    assert offsets() == {("t", 0): 100, ("t", 1): 96, ("u", 0): 7}
    # a partition the coordinator refuses (no topic can have this name) fails the command: it used to
    # print the new offset and exit 0 with nothing stored (helper-63's find)
    bad = groups(server, "reset-offsets", "quiet", "--topic", "bad topic", "--partitions", "0", "--to-offset", "42")
    assert bad.returncode == 1 and "bad topic-0: UnknownTopicOrPartitionError" in bad.stderr, bad


def test_delete_offsets_and_groups(server: KcoordProcess, live_group: list[Member], quiet: str) -> None:
    assert parsed(groups(server, "delete-offsets", "quiet", "--topic", "u")) == [
        {"topic": "u", "partition": 0, "deleted": True}]
    subscribed = groups(server, "delete-offsets", "live", "--topic", "events", "--partitions", "0")
    assert subscribed.returncode == 1 and "GroupSubscribedToTopic" in subscribed.stderr
    busy = groups(server, "delete", "live")
    assert busy.returncode == 1 and "NonEmptyGroup" in busy.stderr
    assert parsed(groups(server, "delete", "quiet")) == {"group": "quiet", "deleted": True}
    missing = groups(server, "delete", "quiet")
    assert missing.returncode == 1 and "GroupIdNotFound" in missing.stderr
    assert [g["group"] for g in parsed(groups(server, "list"))] == ["live"]


def test_an_unreachable_coordinator_is_a_clear_error() -> None:
    """Within the --timeout-ms asked (2 s here; the subprocess is given 20): kafka-python's own bootstrap
    timeout is 30 s, and the command used to wait all of it whatever the option said."""
    result = subprocess.run([sys.executable, "-m", "coordinator.cli", "groups", "--bootstrap",
                             f"127.0.0.1:{free_port()}", "--timeout-ms", "2000", "list"],
                            cwd=REPO, capture_output=True, text=True, timeout=20)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "kcoord groups" in result.stderr


@pytest.fixture
def tansu(tmp_path: Path) -> Iterator[TansuProcess]:
    broker = TansuProcess(tmp_path).start()
    yield broker
    broker.stop()


def test_against_a_kafka_compatible_broker(tansu: TansuProcess) -> None:
    """Tansu refuses commits for topics it lacks, drops commit metadata and has no OffsetDelete."""
    admin = KafkaAdminClient(bootstrap_servers=tansu.bootstrap, request_timeout_ms=10_000)
    created = admin.create_topics([NewTopic("t", 2, 1)]).get("topics", [])
    assert [t["error_code"] for t in created] == [0]
    admin.alter_group_offsets("elsewhere", {TopicPartition("t", 0): OffsetAndMetadata(5, "", -1),
                                             TopicPartition("t", 1): OffsetAndMetadata(6, "", -1)})
    admin.close()
    assert "elsewhere" in [g["group"] for g in parsed(groups(tansu, "list"))]
    assert parsed(groups(tansu, "offsets", "elsewhere")) == [  # Tansu answers null metadata; "t" is empty
        {"topic": "t", "partition": 0, "offset": 5, "metadata": None, "log_end_offset": 0, "lag": -5},
        {"topic": "t", "partition": 1, "offset": 6, "metadata": None, "log_end_offset": 0, "lag": -6}]
    # Whatever a broker lacks or answers oddly ends as one clear line and exit 1, never a traceback.
    for action in (["describe", "elsewhere"], ["delete-offsets", "elsewhere", "--topic", "t"]):
        result = groups(tansu, *action)
        assert result.returncode in (0, 1) and "Traceback" not in result.stderr, result.stderr
    assert parsed(groups(tansu, "delete", "elsewhere")) == {"group": "elsewhere", "deleted": True}
    assert "elsewhere" not in [g["group"] for g in parsed(groups(tansu, "list"))]


def _one_member(server: KcoordProcess, group: str, assignment: bytes) -> RawClient:
    """A "consumer" group of one member (a raw client, open until the caller closes it), given ``assignment``."""
    from kafka.protocol.consumer.group import JoinGroupRequest, SyncGroupRequest

    member = RawClient(server.port)
    protocol = JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")
    join = JoinGroupRequest(group_id=group, session_timeout_ms=30000, rebalance_timeout_ms=5000, member_id="",
                            group_instance_id=None, protocol_type="consumer", protocols=[protocol], reason=None)
    joined = member.call(join, 3)
    assert joined.error_code == 0
    sync = SyncGroupRequest(group_id=group, generation_id=joined.generation_id, member_id=joined.member_id,
                            group_instance_id=None, protocol_type=None, protocol_name=None,
                            assignments=[SyncGroupRequest.SyncGroupRequestAssignment(
                                member_id=joined.member_id, assignment=assignment)])
    assert member.call(sync, 2).error_code == 0
    return member


def test_describe_shows_an_assignment_that_is_not_a_consumers(server: KcoordProcess) -> None:
    """A "consumer" group whose leader handed out bytes that are no consumer assignment (a fault
    campaign's find: `describe` died with an AttributeError): the member is shown, marked."""
    member = _one_member(server, "odd", b"\x01" * 600)
    described = parsed(groups(server, "describe", "odd"))
    assert [m["partitions"] for m in described["members"]] == [["(not a consumer assignment)"]]
    table = groups(server, "describe", "odd", json_out=False)
    assert table.returncode == 0 and "Traceback" not in table.stderr
    member.close()


def test_describe_lists_a_members_partitions_in_number_order(server: KcoordProcess) -> None:
    """By topic, then partition number: sorted as text, `describe` listed t-0, t-1, t-10, t-2 (a client
    sweep's find)."""
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

    assignment = ConsumerProtocolMemberAssignment(0, [("t", [10, 2, 1, 0]), ("b", [3])], b"").encode()
    member = _one_member(server, "numbered", assignment)
    described = parsed(groups(server, "describe", "numbered"))
    assert [m["partitions"] for m in described["members"]] == [["b-3", "t-0", "t-1", "t-2", "t-10"]]
    _, row = groups(server, "describe", "numbered", json_out=False).stdout.splitlines()
    assert row.split()[-1] == "b-3,t-0,t-1,t-2,t-10"
    member.close()


def test_describe_of_a_group_of_another_protocol_type_says_what_it_is(server: KcoordProcess) -> None:
    """A Kafka Connect group (its members' metadata is Connect's, not a consumer subscription): kafka-python's
    "Buffer underrun" was all `describe` said (an admin-API campaign's find). Kafka's own tool refuses such
    a group too, saying it is not a consumer group; `list` still shows it."""
    from kafka.protocol.consumer.group import JoinGroupRequest, LeaveGroupRequest, SyncGroupRequest

    worker = RawClient(server.port)
    url = b"http://worker-1:8083"
    connect_metadata = b"\x00\x00" + len(url).to_bytes(2, "big") + url + (7).to_bytes(8, "big")
    protocol = JoinGroupRequest.JoinGroupRequestProtocol(name="sessioned", metadata=connect_metadata)
    join = JoinGroupRequest(group_id="connect-cluster", session_timeout_ms=30000, rebalance_timeout_ms=5000,
                            member_id="", group_instance_id=None, protocol_type="connect", protocols=[protocol],
                            reason=None)
    joined = worker.call(join, 3)
    assert joined.error_code == 0
    refused = "connect-cluster is not a consumer group (its protocol type is 'connect')"
    described = groups(server, "describe", "connect-cluster")  # CompletingRebalance: no metadata to trip on
    assert described.returncode == 1 and refused in described.stderr, described.stderr  # a review's find
    assignment = b"\x00\x01\x00\x00" + len(b"w1").to_bytes(2, "big") + b"w1"  # Connect's: version, error, leader...
    sync = SyncGroupRequest(group_id="connect-cluster", generation_id=joined.generation_id, member_id=joined.member_id,
                            group_instance_id=None, protocol_type=None, protocol_name=None,
                            assignments=[SyncGroupRequest.SyncGroupRequestAssignment(
                                member_id=joined.member_id, assignment=assignment)])
    assert worker.call(sync, 2).error_code == 0  # Stable: DescribeGroups now carries the members' metadata
    described = groups(server, "describe", "connect-cluster")
    assert described.returncode == 1 and "Traceback" not in described.stderr
    assert refused in described.stderr, described.stderr
    listed = {"group": "connect-cluster", "protocol_type": "connect", "state": "Stable", "type": "classic"}
    assert listed in parsed(groups(server, "list"))
    leave = LeaveGroupRequest(group_id="connect-cluster", members=[
        LeaveGroupRequest.MemberIdentity(member_id=joined.member_id, group_instance_id=None, reason=None)])
    assert worker.call(leave, 3).error_code == 0  # Empty: a reset would have gone ahead
    for action in (["describe", "connect-cluster"], ["reset-offsets", "connect-cluster", "--topic", "t",
                                                     "--to-offset", "0"]):
        result = groups(server, *action)
        assert result.returncode == 1 and refused in result.stderr, result.stderr
    worker.close()


def test_output_into_a_closed_pipe_stops_quietly(server: KcoordProcess) -> None:
    """``kcoord groups offsets G | head`` (a client sweep saw a BrokenPipeError traceback), with more
    output than a pipe holds."""
    simple_offsets(server, "wide", {("a-rather-long-topic-name", p): p for p in range(4000)})
    cmd = f"{sys.executable} -m coordinator.cli groups --bootstrap {server.bootstrap} offsets wide | head -n 1"
    result = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert result.stdout.split()[:3] == ["GROUP", "TOPIC", "PARTITION"], result.stdout
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr
    # Less output than a pipe holds, into a reader gone at once, with stdout block-buffered as a user has
    # it: the last buffer is written at exit (a review: exit 120 and "Exception ignored ... BrokenPipeError").
    simple_offsets(server, "narrow", {("t", 0): 1})
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    cmd = f"{sys.executable} -m coordinator.cli groups --bootstrap {server.bootstrap} offsets narrow | true"
    for _ in range(3):
        result = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=REPO, capture_output=True, text=True,
                                timeout=60, env=env)
        assert result.returncode == 0 and "BrokenPipe" not in result.stderr, (result.returncode, result.stderr)


def test_describe_of_a_group_that_does_not_exist_says_so(server: KcoordProcess) -> None:
    """As Kafka's tool says it (an audit's find: a Dead row and nothing more)."""
    result = groups(server, "describe", "nobody-here", json_out=False)
    assert result.returncode == 0 and "Dead" in result.stdout
    assert result.stderr.strip() == "kcoord groups describe: consumer group 'nobody-here' does not exist"
    result = groups(server, "offsets", "nobody-here", json_out=False)
    assert result.returncode == 0 and result.stdout.split() == ["GROUP", "TOPIC", "PARTITION", "OFFSET",
                                                                "LOG-END-OFFSET", "LAG", "METADATA"]
    assert result.stderr.strip() == "kcoord groups offsets: consumer group 'nobody-here' does not exist"
    simple_offsets(server, "only-offsets", {("t", 0): 1})  # a group known by its offsets alone: no note
    assert groups(server, "offsets", "only-offsets", json_out=False).stderr == ""


def test_ctrl_c_ends_it_with_one_line() -> None:
    """An audit's find: SIGINT while waiting for a silent coordinator printed a KeyboardInterrupt traceback."""
    import signal
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent.settimeout(60)
        cmd = [sys.executable, "-m", "coordinator.cli", "groups", "--bootstrap", f"127.0.0.1:{silent.getsockname()[1]}",
               "--timeout-ms", "30000", "list"]
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        conn, _ = silent.accept()  # the admin client connected: waiting for an answer that never comes
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        conn.close()
    assert proc.returncode == 130, err
    assert err.strip() == "kcoord groups list: interrupted"


def test_describe_shows_static_members_instance_ids(server: KcoordProcess) -> None:
    """As Kafka's tool, a GROUP-INSTANCE-ID column when a member has one (an audit's find: only --json had it)."""
    from kafka.protocol.consumer.group import JoinGroupRequest, SyncGroupRequest

    member = RawClient(server.port)
    protocol = JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")
    join = JoinGroupRequest(group_id="statics", session_timeout_ms=30000, rebalance_timeout_ms=5000, member_id="",
                            group_instance_id="instance-7", protocol_type="consumer", protocols=[protocol], reason=None)
    joined = member.call(join, 5)
    assert joined.error_code == 0
    sync = SyncGroupRequest(group_id="statics", generation_id=joined.generation_id, member_id=joined.member_id,
                            group_instance_id="instance-7", protocol_type=None, protocol_name=None, assignments=[])
    assert member.call(sync, 3).error_code == 0
    header, row = groups(server, "describe", "statics", json_out=False).stdout.splitlines()
    assert header.split() == ["GROUP", "STATE", "PROTOCOL", "MEMBER", "GROUP-INSTANCE-ID", "CLIENT", "HOST",
                              "PARTITIONS"]
    assert row.split()[3:5] == [joined.member_id, "instance-7"]
    member.close()


def test_the_table_lines_up_names_as_a_terminal_shows_them(server: KcoordProcess) -> None:
    """Padding by length put every column after a CJK group name (two terminal columns a character)
    out of line with the header."""
    from wcwidth import wcswidth

    simple_offsets(server, "消费者组", {("t", 0): 1})
    simple_offsets(server, "plain", {("t", 0): 2})
    result = groups(server, "list", json_out=False)
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    state_at = wcswidth(header[: header.index("STATE")])
    assert sorted(r.split()[0] for r in rows) == ["plain", "消费者组"]
    for row in rows:
        assert wcswidth(row[: row.index("Empty")]) == state_at, result.stdout

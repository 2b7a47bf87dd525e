"""Consumer groups with stock clients, each member in a process of its own (tests/integration/group_member.py):
kafka-python and aiokafka members sharing one group, leaving cleanly and dying, a static member
restarting, a stale generation's commit, and kcoord itself restarting under the group (also between a
rebalance's joins and its leader's SyncGroup, with scripted members)."""

import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kcoord_process import REPO, KcoordProcess, free_port
from tests.rawclient import RawClient, commit_request

SESSION_MS = 2000
TIMEOUT = 30.0


class Member:
    """A member process and the events it reports."""

    def __init__(self, server: KcoordProcess, client: str, group: str, topics: str = "events",
                 instance_id: str | None = None, client_id: str | None = None, session_ms: int = SESSION_MS) -> None:
        self.client = client
        cmd = [sys.executable, "-m", "tests.integration.group_member", "--client", client, "--bootstrap",
               server.bootstrap, "--group", group, "--topics", topics, "--session-ms", str(session_ms),
               "--heartbeat-ms", "300", "--client-id", client_id or client]
        if instance_id is not None:
            cmd += ["--instance-id", instance_id]
        self.log_path = server.data_dir.parent / f"member-{client}-{client_id or client}-{group}.log"
        cmd += ["--log", str(self.log_path)]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.last: dict[str, Any] | None = None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def next_assignment(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            event = self.events.get(timeout=max(deadline - time.monotonic(), 0.01))
            if event["event"] == "assigned":
                self.last = event
                return event

    def assignment_after(self, generation: int, timeout: float = TIMEOUT) -> dict[str, Any]:
        """The first assignment of a generation later than ``generation``."""
        while True:
            event = self.next_assignment(timeout)
            if event["generation"] > generation:
                return event

    def no_new_assignment(self, seconds: float) -> bool:
        try:
            while True:
                event = self.events.get(timeout=seconds)
                if event["event"] == "assigned":
                    return False
        except queue.Empty:
            return True

    def leave(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(TIMEOUT)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(TIMEOUT)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[KcoordProcess]:
    proc = KcoordProcess(tmp_path / "data", "--group-initial-rebalance-delay-ms", "500",
                         "--group-min-session-timeout-ms", "1000").start()
    yield proc
    if proc.proc is not None and proc.proc.poll() is None:
        proc.kill()


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for m in started:
        if m.proc.poll() is None:
            m.kill()


def settled(*group: Member) -> list[dict[str, Any]]:
    """Waits until every member reports an assignment of one and the same generation."""
    events = [m.next_assignment() for m in group]
    while len({e["generation"] for e in events}) > 1:
        newest = max(e["generation"] for e in events)
        events = [e if e["generation"] == newest else m.assignment_after(e["generation"])
                  for m, e in zip(group, events, strict=True)]
    return events


def partitions(*events: dict[str, Any]) -> list[list[Any]]:
    return sorted(p for e in events for p in e["partitions"])


ALL = [["events", p] for p in range(4)]


def describe(server: KcoordProcess, group: str) -> dict[str, Any]:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap)
    try:
        result: dict[str, Any] = admin.describe_groups([group])[group]
        return result
    finally:
        admin.close()


def test_kafka_python_and_aiokafka_members_share_one_group(server: KcoordProcess, members: list[Member]) -> None:
    members += [Member(server, "kafka-python", "mixed"), Member(server, "aiokafka", "mixed")]
    first = settled(*members)
    assert partitions(*first) == ALL  # disjoint, complete
    assert len({e["member_id"] for e in first}) == 2
    group = describe(server, "mixed")
    assert (group["group_state"], group["protocol_type"], group["protocol_data"]) == ("Stable", "consumer", "fixed")
    assert {m["member_id"] for m in group["members"]} == {e["member_id"] for e in first}
    # Heartbeats keep the generation: no rebalance over several session timeouts.
    assert all(m.no_new_assignment(3 * SESSION_MS / 1000) for m in members)
    assert describe(server, "mixed")["group_state"] == "Stable"


def test_a_member_leaving_and_a_member_dying_each_make_a_new_generation(server: KcoordProcess,
                                                                        members: list[Member]) -> None:
    # The survivor is the aiokafka member: alone, a kafka-python member would (rightly) get its first
    # choice, "range", which assigns nothing without topic metadata.
    a, b = Member(server, "aiokafka", "g"), Member(server, "kafka-python", "g")
    c = Member(server, "kafka-python", "g", client_id="kp2")
    members += [a, b, c]
    start = settled(a, b, c)
    c.leave()  # LeaveGroup on close
    after_leave = [a.assignment_after(start[0]["generation"]), b.assignment_after(start[1]["generation"])]
    assert after_leave[0]["generation"] == after_leave[1]["generation"] > start[0]["generation"]
    assert partitions(*after_leave) == ALL
    b.kill()  # no LeaveGroup: its session must run out
    died = time.monotonic()
    alone = a.assignment_after(after_leave[0]["generation"])
    assert alone["partitions"] == ALL
    assert time.monotonic() - died >= SESSION_MS / 1000 * 0.9  # not before its session timeout


def test_a_static_member_restarted_within_its_session_keeps_its_assignment(server: KcoordProcess,
                                                                          members: list[Member]) -> None:
    dynamic = Member(server, "kafka-python", "static-g")
    static = Member(server, "aiokafka", "static-g", instance_id="instance-1")
    members += [dynamic, static]
    before = settled(dynamic, static)
    static.kill()  # a crash: no LeaveGroup
    again = Member(server, "aiokafka", "static-g", instance_id="instance-1")
    members.append(again)
    back = again.next_assignment()
    assert back["partitions"] == before[1]["partitions"]
    assert back["generation"] == before[1]["generation"]  # no rebalance
    assert back["member_id"] != before[1]["member_id"] and back["member_id"].startswith("instance-1-")
    assert dynamic.no_new_assignment(2 * SESSION_MS / 1000)


def test_a_commit_from_a_stale_generation_is_refused(server: KcoordProcess, members: list[Member]) -> None:
    first = Member(server, "kafka-python", "stale")
    members.append(first)
    old = first.next_assignment()
    second = Member(server, "aiokafka", "stale")
    members.append(second)
    settled(first, second)
    client = RawClient(server.port)
    refused = client.call(commit_request("stale", {("events", 0): 5}, generation=old["generation"],
                                         member=old["member_id"]), 8)
    assert refused.topics[0].partitions[0].error_code == 22  # ILLEGAL_GENERATION
    simple = client.call(commit_request("stale", {("events", 0): 5}), 8)
    assert simple.topics[0].partitions[0].error_code == 25  # a simple commit to a live group: UNKNOWN_MEMBER_ID
    client.close()


@pytest.mark.parametrize("how", ["sigterm", "kill-9"])
def test_the_group_survives_a_kcoord_restart_and_its_members_stay(server: KcoordProcess, members: list[Member],
                                                                 how: str) -> None:
    # aiokafka members: kafka-python 3.0.12 sometimes stops issuing requests altogether when its
    # coordinator refuses connections just after an assignment (auto-commit off; cf. dpkp/kafka-python
    # #2695), which would test the client, not whether the group survives. Sessions are long enough to
    # find the restarted coordinator again; a member that missed it would be expired and rejoin.
    members += [Member(server, "aiokafka", "survivor", session_ms=10_000, client_id="aio-1"),
                Member(server, "aiokafka", "survivor", session_ms=10_000, client_id="aio-2")]
    before = settled(*members)
    if how == "sigterm":
        assert server.stop() == 0
    else:
        server.kill()
    server.start()
    # The group comes back Stable with the same members and generation, from its log.
    group = describe(server, "survivor")
    assert group["group_state"] == "Stable"
    assert {m["member_id"] for m in group["members"]} == {e["member_id"] for e in before}
    # ... and its members carry on in it: still two of them, Stable, after more than a session.
    time.sleep(12)
    group = describe(server, "survivor")
    assert group["group_state"] == "Stable" and len(group["members"]) == 2
    assert all(m.proc.poll() is None for m in members)


@pytest.mark.parametrize("version", [3, 5, 6])
def test_a_32767_byte_client_id_gets_a_member_id_every_answer_can_carry(server: KcoordProcess, version: int) -> None:
    """Kafka's member id is ``<client id>-<uuid>``: from a client id at the header's limit that is too
    long for an int16 string. The JoinGroup answer could not be encoded (a traceback, the connection
    closed), the member stayed in the group and broke every DescribeGroups of it, and on v6+ the id was
    handed out and then refused as malformed when the member sent it back. The client id part is cut."""
    from kafka.protocol.admin.groups import DescribeGroupsRequest
    from kafka.protocol.consumer.group import JoinGroupRequest

    group = f"long-client-id-v{version}"
    protocol = JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"x")

    def join(member_id: str) -> Any:
        return JoinGroupRequest(group_id=group, session_timeout_ms=30000, rebalance_timeout_ms=5000,
                                member_id=member_id, group_instance_id=None, protocol_type="consumer",
                                protocols=[protocol], reason=None)

    member = RawClient(server.port, client_id="c" * 32767)
    answer = member.call(join(""), version)
    if version >= 4:  # KIP-394: the id first, then a join with it
        assert answer.error_code == 79
        answer = member.call(join(answer.member_id), version)
    assert answer.error_code == 0
    assert answer.member_id.startswith("ccc") and len(answer.member_id.encode()) <= 32767
    described = RawClient(server.port).call(DescribeGroupsRequest(groups=[group], include_authorized_operations=False),
                                            4)
    assert described.groups[0].error_code == 0
    assert [m.member_id for m in described.groups[0].members] == [answer.member_id]
    assert "Traceback" not in server.log()


def test_a_member_connected_over_ipv6_is_described_with_its_host_as_kafka_writes_it(tmp_path: Path) -> None:
    """Kafka records a member's host as Java's InetAddress.toString(), which writes an IPv6 address
    uncompressed: a member on ::1 is "/0:0:0:0:0:0:0:1" in DescribeGroups (kafka-consumer-groups.sh's HOST)
    and in the group's record. kcoord said "/::1"."""
    from kafka import KafkaAdminClient
    from kafka.protocol.consumer.group import JoinGroupRequest

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    port = free_port()
    server = KcoordProcess(tmp_path / "data", "--listen", f"[::1]:{port}", "--advertised-listener",
                           f"[::1]:{port}", "--group-initial-rebalance-delay-ms", "0", port=port)
    server.start(wait=False)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                member = RawClient(port, client_id="v6", host="::1")
                break
            except OSError:
                assert time.monotonic() < deadline, server.log()
                time.sleep(0.05)
        server.wait_loaded()
        protocol = JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"x")
        answer = member.call(JoinGroupRequest(group_id="v6", session_timeout_ms=30000, rebalance_timeout_ms=5000,
                                              member_id="", group_instance_id=None, protocol_type="consumer",
                                              protocols=[protocol], reason=None), 3)
        assert answer.error_code == 0
        admin = KafkaAdminClient(bootstrap_servers=f"[::1]:{port}")
        try:
            described = admin.describe_groups(["v6"])["v6"]
        finally:
            admin.close()
        assert [(m["member_id"], m["client_host"]) for m in described["members"]] == [
            (answer.member_id, "/0:0:0:0:0:0:0:1")]
    finally:
        server.stop()


def test_nothing_behind_a_parked_join_starts_before_it_is_answered(server: KcoordProcess) -> None:
    """Kafka reads a connection's next request only once the last is answered (reference 1.1). A
    commit of the old generation sent behind a JoinGroup that waits for its rebalance is therefore
    checked against the generation the rebalance made (ILLEGAL_GENERATION, nothing stored), and a
    LeaveGroup behind it leaves after the join succeeded. Started at once, the commit was stored
    mid-rebalance and the leave made the join fail UNKNOWN_MEMBER_ID (a conformance sweep's find)."""
    from kafka.protocol.consumer.group import JoinGroupRequest, LeaveGroupRequest, SyncGroupRequest

    from tests.rawclient import fetch_request

    group = "muted-behind-join"

    def join(member_id: str, metadata: bytes) -> Any:
        return JoinGroupRequest(group_id=group, session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
                                member_id=member_id, group_instance_id=None, protocol_type="consumer",
                                protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range",
                                                                                     metadata=metadata)],
                                reason=None)

    def sync(member_id: str, generation: int, assignments: list[str]) -> Any:
        return SyncGroupRequest(group_id=group, generation_id=generation, member_id=member_id,
                                group_instance_id=None, protocol_type="consumer", protocol_name="range",
                                assignments=[SyncGroupRequest.SyncGroupRequestAssignment(member_id=m, assignment=b"")
                                             for m in assignments])

    a, b, admin = RawClient(server.port), RawClient(server.port), RawClient(server.port)
    member_a = a.call(join("", b"a"), 5).member_id
    member_b = b.call(join("", b"b"), 5).member_id
    correlation_b = b.send(join(member_b, b"b"), 5)
    first = a.call(join(member_a, b"a"), 5)
    assert first.error_code == 0 and b.receive(11, 5)[0] == correlation_b
    generation = first.generation_id
    leader, follower = (a, b) if first.leader == member_a else (b, a)
    follower_id = member_b if follower is b else member_a
    correlation_f = follower.send(sync(follower_id, generation, []), 3)
    assert leader.call(sync(first.leader, generation, [member_a, member_b]), 3).error_code == 0
    got, synced = follower.receive(14, 3)
    assert got == correlation_f and synced.error_code == 0

    # b rejoins with new metadata (a rebalance: it waits for a), a commit of the old generation behind it
    correlation_join = b.send(join(member_b, b"b2"), 5)
    correlation_commit = b.send(commit_request(group, {("t", 0): 5}, generation=generation, member=member_b), 8)
    time.sleep(0.5)
    committed = admin.call(fetch_request(group, {"t": [0]}), 5).topics[0].partitions[0].committed_offset
    assert committed == -1  # not started: Kafka has not read it yet
    rejoined = a.call(join(member_a, b"a"), 5)
    assert rejoined.error_code == 0 and rejoined.generation_id == generation + 1
    got, answer = b.receive(11, 5)
    assert got == correlation_join and answer.error_code == 0
    got, answer = b.receive(8, 8)
    assert got == correlation_commit and answer.topics[0].partitions[0].error_code == 22  # ILLEGAL_GENERATION
    assert admin.call(fetch_request(group, {"t": [0]}), 5).topics[0].partitions[0].committed_offset == -1

    # a LeaveGroup behind a join that waits: the join succeeds (once a rejoins), then b leaves
    correlation_join = b.send(join(member_b, b"b3"), 5)
    correlation_leave = b.send(LeaveGroupRequest(group_id=group, members=[
        LeaveGroupRequest.MemberIdentity(member_id=member_b, group_instance_id=None, reason=None)]), 3)
    time.sleep(0.5)
    assert a.call(join(member_a, b"a"), 5).error_code == 0
    got, answer = b.receive(11, 5)
    assert got == correlation_join and answer.error_code == 0 and answer.member_id == member_b
    got, answer = b.receive(13, 3)
    assert got == correlation_leave and answer.error_code == 0
    for client in (a, b, admin):
        client.close()


@pytest.mark.parametrize("how", ["sigterm", "kill-9"])
def test_a_stop_while_the_group_completes_a_rebalance(server: KcoordProcess, how: str) -> None:
    """kcoord stops after a rebalance's joins are answered and before the leader's SyncGroup (a scripted
    leader that never syncs: real clients sync too fast to be caught there; a churn campaign's gap).
    As in Kafka, the new generation is recorded only with the leader's assignment, so the group comes
    back as its log has it: the previous generation, Stable, with its assignment. The new generation's
    SyncGroups are refused (its members rejoin), nothing committed is lost, and the group rebalances
    again to a generation past the one it loaded."""
    from kafka.protocol.consumer.group import HeartbeatRequest, JoinGroupRequest, SyncGroupRequest

    from tests.rawclient import fetch_request

    group = "stopped-mid-rebalance"

    def join(member_id: str) -> Any:
        return JoinGroupRequest(group_id=group, session_timeout_ms=30_000, rebalance_timeout_ms=10_000,
                                member_id=member_id, group_instance_id=None, protocol_type="consumer",
                                protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"m")],
                                reason=None)

    def sync(member_id: str, generation: int, assignments: dict[str, bytes]) -> Any:
        return SyncGroupRequest(group_id=group, generation_id=generation, member_id=member_id,
                                group_instance_id=None, protocol_type="consumer", protocol_name="range",
                                assignments=[SyncGroupRequest.SyncGroupRequestAssignment(member_id=m, assignment=a)
                                             for m, a in assignments.items()])

    def both_join(a: RawClient, b: RawClient, member_a: str, member_b: str) -> Any:
        correlation = b.send(join(member_b), 5)
        joined = a.call(join(member_a), 5)
        got, other = b.receive(11, 5)
        assert joined.error_code == 0 and got == correlation and other.error_code == 0
        assert other.generation_id == joined.generation_id
        return joined

    a = RawClient(server.port)
    member_a = a.call(join(""), 5).member_id  # KIP-394: the id first
    first = a.call(join(member_a), 5)
    assert (first.error_code, first.leader) == (0, member_a)
    assert a.call(sync(member_a, first.generation_id, {member_a: b"gen-1"}), 3).assignment == b"gen-1"
    committed = a.call(commit_request(group, {("t", 0): 41}, generation=first.generation_id, member=member_a), 8)
    assert committed.topics[0].partitions[0].error_code == 0

    b = RawClient(server.port)
    member_b = b.call(join(""), 5).member_id
    second = both_join(a, b, member_a, member_b)  # the rebalance's joins answered: CompletingRebalance
    assert second.generation_id == first.generation_id + 1
    assert describe(server, group)["group_state"] == "CompletingRebalance"
    a.close()
    b.close()
    if how == "sigterm":
        assert server.stop() == 0
    else:
        server.kill()
    server.start()

    loaded = describe(server, group)
    assert loaded["group_state"] == "Stable"
    assert [m["member_id"] for m in loaded["members"]] == [member_a]
    a, b = RawClient(server.port), RawClient(server.port)
    assert a.call(sync(member_a, second.generation_id, {member_a: b"x", member_b: b"y"}), 3).error_code == 22
    assert b.call(sync(member_b, second.generation_id, {}), 3).error_code == 25  # UNKNOWN_MEMBER_ID
    assert a.call(HeartbeatRequest(group_id=group, generation_id=first.generation_id, member_id=member_a,
                                   group_instance_id=None), 3).error_code == 0  # still the loaded generation's
    fetched = a.call(fetch_request(group, {"t": [0]}), 5).topics[0].partitions[0].committed_offset
    assert fetched == 41

    member_b = b.call(join(""), 5).member_id
    third = both_join(a, b, member_a, member_b)
    assert third.generation_id == first.generation_id + 1  # the stopped one was never recorded, as in Kafka
    leader = a if third.leader == member_a else b
    follower, follower_id = (b, member_b) if leader is a else (a, member_a)
    correlation = follower.send(sync(follower_id, third.generation_id, {}), 3)
    assert leader.call(sync(third.leader, third.generation_id, {member_a: b"A", member_b: b"B"}), 3).error_code == 0
    got, synced = follower.receive(14, 3)
    assert got == correlation and synced.assignment == (b"B" if follower is b else b"A")
    assert describe(server, group)["group_state"] == "Stable"
    assert "Traceback" not in server.log()
    a.close()
    b.close()

"""What kcoord logs while its upstream is away: client connections it closes for the upstream's sake are
counted, each one, in kcoord_connections_aborted_total{reason="upstream"}, but logged once, then once a
minute while the outage lasts (a fault campaign counted 80-100 such WARNING lines a second from five
clients that retried their bootstrap while the upstream had not answered yet)."""

import re
import time
from pathlib import Path

import confluent_kafka as ck

from tests.gateway.conftest import node_ports, scrape, start_gateway
from tests.gateway.test_faults import produce_request_closed
from tests.kcoord_process import KcoordProcess, free_port
from tests.tansu_process import TansuProcess

CLOSES = 30  # client connections closed for the upstream before the log is read


def refused_for_upstream(kcoord: KcoordProcess) -> float:
    found = re.search(r'^kcoord_connections_aborted_total\{reason="upstream"\} (\S+)$', scrape(kcoord), re.M)
    return float(found.group(1)) if found else 0.0


def wait_refused(kcoord: KcoordProcess, at_least: float, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while refused_for_upstream(kcoord) < at_least:
        assert time.monotonic() < deadline, f"only {refused_for_upstream(kcoord)} connections closed for the upstream"
        time.sleep(0.2)


def eager_producer(bootstrap: str) -> ck.Producer:
    """A stock client that reconnects at once after its connection closes (the backoffs are its own
    settings), as many clients of a busy gateway together do."""
    return ck.Producer({"bootstrap.servers": bootstrap, "reconnect.backoff.ms": 10, "reconnect.backoff.max.ms": 50,
                        "message.timeout.ms": 120_000, "log_level": 0})  # (librdkafka logs each close)


def closing_lines(kcoord: KcoordProcess, why: str) -> int:
    return sum(1 for line in kcoord.log_since_start().splitlines() if "closing connection" in line and why in line)


def test_clients_turned_away_before_the_upstream_answers_are_logged_once_a_minute(tmp_path: Path) -> None:
    kcoord = start_gateway(tmp_path, f"127.0.0.1:{free_port()}")  # nothing listens there
    producer = eager_producer(kcoord.bootstrap)
    try:
        producer.produce("t", b"v")
        producer.poll(0)
        wait_refused(kcoord, CLOSES)
        lines = closing_lines(kcoord, "no upstream broker has answered yet")
        assert 1 <= lines <= 3, lines  # the first at once, then one a minute (a slow run may pass one)
    finally:
        producer.purge()
        kcoord.stop()


def test_clients_closed_for_an_unreachable_upstream_broker_are_logged_once_a_minute(
        tmp_path: Path, tansu: TansuProcess) -> None:
    kcoord = start_gateway(tmp_path, tansu.bootstrap)
    try:
        (port,) = node_ports(kcoord).values()
        assert tansu.proc is not None
        tansu.proc.kill()
        tansu.proc.wait(10)
        before = refused_for_upstream(kcoord)
        for _ in range(CLOSES):  # each relayed on a new link to the broker, which cannot be reached
            assert produce_request_closed(port)
        wait_refused(kcoord, before + CLOSES)
        lines = closing_lines(kcoord, "cannot connect to upstream")
        assert 1 <= lines <= 3, lines
    finally:
        kcoord.stop()

"""A real Prometheus (Debian's package, loopback only) scraping real kcoord processes with the
deploy/ configuration, alert rules and dashboard:

- ``healthy``: a kcoord that stock clients committed to (kafka-python) plus one connection it had to
  abort (a negative frame size);
- ``broken``: a kcoord with a failed offsets partition (damage in its log) whose commits therefore get
  NOT_COORDINATOR, and whose sync helper process was killed;
- ``dead``: a target where nothing listens;
- the Kubernetes scrape job (deploy/k8s/prometheus-scrape.yml) with its pod discovery replaced by the
  labels discovery would give the healthy pod, so its relabelling finds the annotated port for real.

PromQL over the HTTP API must then count what the clients did, every dashboard expression must
evaluate and return series, and every alert expression must evaluate and select exactly the
instances (and partitions) it is meant for. `promtool check metrics` checks the exposition itself."""

import json
import os
import re
import signal
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kafka import KafkaConsumer
from kafka.structs import OffsetAndMetadata, TopicPartition

from protocol.partitioning import partition_for
from storage.segments import list_segments
from tests.deploy.conftest import DEPLOY, load_yaml
from tests.integration.test_sync_helper import children
from tests.kcoord_process import KcoordProcess, free_port
from tests.rawclient import RawClient, commit_request

SCRAPE_S = 1
RATE_INTERVAL = "1m"  # $__rate_interval: with 1 s scrapes any window of a few samples works
COMMITS, PARTITIONS = 4, 3
BROKEN_GROUP = "broken"
DASHBOARD = DEPLOY / "grafana" / "kcoord.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"


@dataclass
class Stack:
    url: str
    healthy: KcoordProcess
    broken: KcoordProcess
    dead: str  # host:port of a target where nothing listens
    broken_partition: int

    def instance(self, server: KcoordProcess) -> str:
        return f"127.0.0.1:{server.metrics_port}"

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as err:  # 400/422: a bad expression; the body says why
            body = json.load(err)
        return body

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = self.api("query", query=expr)
        assert body["status"] == "success", f"{expr}\n{body}"
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, expr: str, expected: float, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while (got := self.value(expr)) != expected:
            assert time.monotonic() < deadline, f"{expr} = {got}, expected {expected}"
            time.sleep(0.25)


def break_a_partition(server: KcoordProcess, data: Path) -> int:
    """Three commits (three batches), then a flipped byte inside the first batch: on the next start
    that partition fails to load (damage before the recovery point) and the others serve."""
    client = RawClient(server.port)
    for offset in range(3):
        client.call(commit_request(BROKEN_GROUP, {("t", 0): offset}), 8)
    client.close()
    assert server.stop() == 0
    partition = partition_for(BROKEN_GROUP, 50)
    segment = list_segments(data / f"__consumer_offsets-{partition}")[0].path
    raw = bytearray(segment.read_bytes())
    raw[70] ^= 0xFF
    segment.write_bytes(bytes(raw))
    server.start()
    return partition


def kill_the_sync_helper(server: KcoordProcess) -> None:
    """Commits on a partition that serves, until the sync helper has made a sync; then SIGKILL it."""
    assert server.proc is not None
    client = RawClient(server.port)
    for offset in range(3):  # the first cycle makes the log's segment: the writer thread's; then the helper's
        assert client.call(commit_request("helped", {("t", 0): offset}), 8).topics[0].partitions[0].error_code == 0
    client.close()
    (helper,) = children(server.proc.pid)
    os.kill(helper, signal.SIGKILL)


def prometheus_config(healthy: KcoordProcess, broken: KcoordProcess, dead: str) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with 1 s intervals and these targets, plus the Kubernetes job
    whose discovery is replaced by the labels a kcoord pod would be discovered with."""
    config: dict[str, Any] = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    config["global"].update(scrape_interval=f"{SCRAPE_S}s", evaluation_interval=f"{SCRAPE_S}s")
    config["rule_files"] = [str(ALERTS)]
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "kcoord"
    job["static_configs"] = [{"targets": [f"127.0.0.1:{healthy.metrics_port}", f"127.0.0.1:{broken.metrics_port}",
                                          dead]}]
    (k8s,) = load_yaml(DEPLOY / "k8s" / "prometheus-scrape.yml")["scrape_configs"]
    assert k8s["job_name"] == "kcoord"
    k8s["job_name"] = "kcoord-k8s"  # beside the static job; the relabelling is the file's own
    del k8s["kubernetes_sd_configs"]

    def pod(address: str, scrape: str, name: str) -> dict[str, Any]:
        return {"targets": [address], "labels": {
            "__meta_kubernetes_pod_label_app_kubernetes_io_name": "kcoord",
            "__meta_kubernetes_pod_annotation_prometheus_io_scrape": scrape,
            "__meta_kubernetes_pod_annotation_prometheus_io_port": str(healthy.metrics_port),
            "__meta_kubernetes_pod_annotation_prometheus_io_path": "/metrics",
            "__meta_kubernetes_namespace": "prod", "__meta_kubernetes_pod_name": name}}

    # discovery gives one target per declared container port: the client port, here
    k8s["static_configs"] = [pod(f"127.0.0.1:{healthy.port}", "true", "kcoord-0"),
                             pod(f"127.0.0.1:{healthy.port}", "false", "not-scraped-0")]
    config["scrape_configs"].append(k8s)
    return config


def commit_as_stock_client(server: KcoordProcess) -> None:
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, group_id="metered", enable_auto_commit=False)
    parts = [TopicPartition("events", p) for p in range(PARTITIONS)]
    for offset in range(1, COMMITS + 1):
        consumer.commit({tp: OffsetAndMetadata(offset * 10, "", -1) for tp in parts})
    assert all(consumer.committed(tp) == COMMITS * 10 for tp in parts)
    consumer.close()
    with socket.create_connection(("127.0.0.1", server.port)) as bad:  # a negative frame size: aborted
        bad.sendall(struct.pack(">i", -7))
        bad.settimeout(10)
        assert bad.recv(1) == b""


def commit_to_the_failed_partition(server: KcoordProcess, n: int) -> None:
    client = RawClient(server.port)
    for offset in range(n):
        reply = client.call(commit_request(BROKEN_GROUP, {("t", 0): 100 + offset}), 8)
        assert reply.topics[0].partitions[0].error_code == 16  # NOT_COORDINATOR
    client.close()


@pytest.fixture(scope="module")
def stack(prometheus: str, promtool: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("prometheus")
    for name in ("healthy", "broken"):
        (tmp / name).mkdir()
    healthy = KcoordProcess(tmp / "healthy" / "data").start()
    broken = KcoordProcess(tmp / "broken" / "data").start()
    proc: subprocess.Popen[bytes] | None = None
    try:
        partition = break_a_partition(broken, tmp / "broken" / "data")
        kill_the_sync_helper(broken)
        dead = f"127.0.0.1:{free_port()}"
        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump(prometheus_config(healthy, broken, dead)))
        check = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True,
                               timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
        port = free_port()
        log = open(tmp / "prometheus.log", "wb")
        proc = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}",
                                 "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, (tmp / "prometheus.log").read_text()
                assert time.monotonic() < deadline, "Prometheus not ready in 60 s"
                time.sleep(0.2)
        s = Stack(url, healthy, broken, dead, partition)
        # Scraped once before the clients act, as a server running for a while is: a first abort, say,
        # must then be an increase (test_a_single_abort_is_an_increase_to_the_alert_on_server_errors).
        s.wait_for(f'up{{job="kcoord", instance="{s.instance(healthy)}"}}', 1)
        commit_as_stock_client(healthy)
        s.wait_for(f'kcoord_offset_commits_total{{job="kcoord", instance="{s.instance(healthy)}"}}',
                   COMMITS * PARTITIONS)
        # Refused commits in two rounds: a counter series is only exported from its first increment
        # on, so rate() sees an increase only once a scrape has seen the series before it.
        refused = f'sum(kcoord_requests_total{{instance="{s.instance(broken)}", error="NOT_COORDINATOR"}})'
        commit_to_the_failed_partition(broken, 5)
        s.wait_for(refused, 5)
        commit_to_the_failed_partition(broken, 5)
        s.wait_for(refused, 10)
        time.sleep(3 * SCRAPE_S)  # a few more samples, for rate() and for the rules' next evaluations
        yield s
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        for server in (healthy, broken):
            if server.proc is not None and server.proc.poll() is None:
                server.stop()


def test_promql_counts_what_the_stock_client_did(stack: Stack) -> None:
    h = f'job="kcoord", instance="{stack.instance(stack.healthy)}"'
    assert stack.value(f"kcoord_offset_commits_total{{{h}}}") == COMMITS * PARTITIONS
    assert stack.value(f'sum(kcoord_requests_total{{{h}, api="OffsetCommit", error="NONE"}})') == COMMITS
    assert stack.value(f'sum(kcoord_requests_total{{{h}, api="OffsetCommit", error!="NONE"}})') is None
    assert stack.value(f"kcoord_offset_fetches_total{{{h}}}") == PARTITIONS  # committed() per partition
    assert stack.value(f"kcoord_offsets{{{h}}}") == PARTITIONS
    assert stack.value(f'kcoord_groups{{{h}, state="Empty"}}') == 1
    assert stack.value(f'kcoord_connections_aborted_total{{{h}, reason="frame"}}') == 1
    assert stack.value(f"kcoord_ready{{{h}}}") == 1
    assert stack.value(f'sum(kcoord_partition_state{{{h}, state="active"}})') == 50
    assert stack.value(f"kcoord_flush_records_sum{{{h}}}") == COMMITS * PARTITIONS
    assert stack.value(f"up{{{h}}}") == 1
    assert stack.value(f'up{{instance="{stack.dead}"}}') == 0
    b = f'job="kcoord", instance="{stack.instance(stack.broken)}"'
    assert stack.value(f"kcoord_ready{{{b}}}") == 1  # a failed partition pages; the others are served
    failed = stack.query(f'kcoord_partition_state{{{b}, state="failed"}} == 1')
    assert [r["metric"]["partition"] for r in failed] == [str(stack.broken_partition)]


def test_a_single_abort_is_an_increase_to_the_alert_on_server_errors(stack: Stack) -> None:
    """The healthy server aborted one connection (a bad frame) after its first scrape. Its series was
    exported only from that abort on, at 1, so increase() saw nothing and KcoordConnectionServerErrors
    would not have fired for a single internal error (an operator's audit): the alert's own expression,
    aimed at the reason the test can cause, must select the server."""
    (rule,) = [r for r in alert_rules() if r["alert"] == "KcoordConnectionServerErrors"]
    assert 'reason="server_error"' in rule["expr"]
    expr = rule["expr"].replace('reason="server_error"', 'reason="frame"')
    got = {series["metric"]["instance"] for series in stack.query(expr)}
    assert got == {stack.instance(stack.healthy)}, expr


def test_the_kubernetes_scrape_job_finds_the_annotated_port(stack: Stack) -> None:
    targets = [t for t in stack.api("targets")["data"]["activeTargets"] if t["labels"]["job"] == "kcoord-k8s"]
    assert len(targets) == 1, targets  # the pod annotated prometheus.io/scrape: "false" is dropped
    (target,) = targets
    assert target["scrapeUrl"] == f"http://127.0.0.1:{stack.healthy.metrics_port}/metrics"
    assert target["health"] == "up", target["lastError"]
    assert target["labels"]["pod"] == "kcoord-0" and target["labels"]["namespace"] == "prod"
    assert stack.value('kcoord_offset_commits_total{job="kcoord-k8s"}') == COMMITS * PARTITIONS


def test_promtool_check_metrics_passes_on_the_exposition(stack: Stack, promtool: str) -> None:
    for server in (stack.healthy, stack.broken):
        with urllib.request.urlopen(server.metrics_url + "/metrics", timeout=10) as resp:
            exposition = resp.read()
        assert b"kcoord_requests_total" in exposition
        result = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, timeout=60)
        assert result.returncode == 0 and not result.stdout and not result.stderr, result.stdout + result.stderr


def grafana_expressions() -> list[tuple[str, str]]:
    """(panel title, expr) of every dashboard query, Grafana's variables substituted: all jobs, all
    instances, and the rate interval."""
    out = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = (target["expr"].replace("$__rate_interval", RATE_INTERVAL)
                    .replace("$instance", ".+").replace("$job", "kcoord"))
            assert "$" not in expr, expr
            out.append((panel["title"], expr))
    return out


def test_every_dashboard_query_evaluates_and_returns_series(stack: Stack) -> None:
    exprs = grafana_expressions()
    assert len(exprs) >= 40
    now = time.time()
    for title, expr in exprs:
        assert stack.query(expr), f"{title}: no series for {expr}"
        body = stack.api("query_range", query=expr, start=str(now - 20), end=str(now), step="1")
        assert body["status"] == "success", f"{title}: {expr}\n{body}"


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def test_every_alert_expression_selects_what_it_is_meant_for(stack: Stack) -> None:
    healthy, broken = stack.instance(stack.healthy), stack.instance(stack.broken)
    expected = {
        "KcoordDown": {stack.dead},
        "KcoordAbsent": set(),
        "KcoordPartitionStuckLoading": set(),
        "KcoordPartitionFailed": {f"{broken} partition {stack.broken_partition}"},
        "KcoordPartitionReadOnly": set(),
        "KcoordCommitErrors": {broken},  # every commit it got was NOT_COORDINATOR
        "KcoordCommitsRefused": {broken},
        "KcoordLogWriteErrors": set(),
        "KcoordConnectionServerErrors": set(),
        "KcoordConnectionsRefused": set(),  # no cap reached here (the rule's unit tests: alerts_test.yml)
        "KcoordEventLoopStalled": set(),  # a frozen disk: unit tests, tests/integration/test_frozen_disk.py
        "KcoordSyncHelperDown": {broken},  # killed by the fixture
        "KcoordSyncStuck": set(),
        "KcoordCheckpointsStalled": set(),  # a real Prometheus, real servers: their checkpoints complete
        "KcoordJournalDamaged": set(),  # damage found at a start: tests/integration/test_metrics.py
        "KcoordClusterDisagreement": set(),  # standalone servers agree with themselves (cluster mode: test_cluster)
        "KcoordRestarting": set(),  # each server started once (the rule's unit tests: alerts_test.yml)
    }
    timing = {"KcoordFsyncSlow", "KcoordEventLoopLag"}  # depend on this machine's load: evaluated only
    rules = alert_rules()
    assert {r["alert"] for r in rules} == expected.keys() | timing
    for rule in rules:
        got = set()
        for series in stack.query(rule["expr"]):
            labels = series["metric"]
            got.add(f"{labels['instance']} partition {labels['partition']}" if "partition" in labels
                    else labels.get("instance", ""))
        if rule["alert"] in timing:
            assert not got & {stack.dead}, (rule["alert"], got)
            continue
        assert got == expected[rule["alert"]], (rule["alert"], got)
        assert healthy not in got


def test_every_metric_the_rules_and_dashboard_name_exists(stack: Stack) -> None:
    known = set(stack.api("label/__name__/values")["data"])
    text = ALERTS.read_text() + DASHBOARD.read_text()
    named = set(re.findall(r"\b((?:kcoord|process|python)_[a-z_]+)\b", text))
    missing = {n for n in named if n not in known and f"{n}_bucket" not in known}  # a histogram's base name
    assert len(named) > 30 and not missing, sorted(missing)


def test_prometheus_loads_and_evaluates_the_rules(stack: Stack) -> None:
    groups = stack.api("rules")["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == len(alert_rules())
    for rule in rules:
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
        assert not rule["lastEvaluation"].startswith("0001-"), rule["name"]  # evaluated at least once
    pending = {(a["labels"]["alertname"], a["labels"].get("instance")) for a in stack.api("alerts")["data"]["alerts"]}
    assert ("KcoordDown", stack.dead) in pending
    assert ("KcoordPartitionFailed", stack.instance(stack.broken)) in pending

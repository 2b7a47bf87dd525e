"""Gateway figures for /metrics: relayed requests and bytes per API and upstream node, relay latency,
upstream errors. Counted in plain dicts on the event loop (a labelled prometheus-client child costs
microseconds per request) and turned into metric families when scraped, as coordinator/metrics.py does."""

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from protocol.registry import REGISTRY

# Relayed APIs kcoord has no codec registered for (their names, for labels).
NAMES = {0: "Produce", 1: "Fetch", 2: "ListOffsets", 4: "LeaderAndIsr", 19: "CreateTopics", 20: "DeleteTopics",
         21: "DeleteRecords", 22: "InitProducerId", 23: "OffsetForLeaderEpoch", 24: "AddPartitionsToTxn",
         25: "AddOffsetsToTxn", 26: "EndTxn", 28: "TxnOffsetCommit", 32: "DescribeConfigs", 33: "AlterConfigs",
         35: "DescribeLogDirs", 37: "CreatePartitions", 44: "IncrementalAlterConfigs", 60: "DescribeCluster",
         61: "DescribeProducers", 65: "DescribeTransactions", 66: "ListTransactions", 71: "GetTelemetrySubscriptions",
         72: "PushTelemetry"}


def _api_name(key: int) -> str:
    spec = REGISTRY.get(key)
    return spec.name if spec is not None else NAMES.get(key, str(key))


class GatewayMetrics(Collector):
    def __init__(self) -> None:
        # (api key, upstream node) -> [requests, request bytes, reply bytes, seconds]
        self.relayed_by: dict[tuple[int, int], list[float]] = {}
        self.errors: Counter[tuple[int, str]] = Counter()  # (upstream node, kind) -> n
        self.upstream_brokers: Callable[[], int] = lambda: 0
        self.upstream_reachable: Callable[[], bool] = lambda: False
        self.metadata_from_cache = 0

    def relayed(self, api_key: int, node: int, sent: int, received: int, seconds: float) -> None:
        row = self.relayed_by.get((api_key, node))
        if row is None:
            row = self.relayed_by[(api_key, node)] = [0, 0, 0, 0.0]
        row[0] += 1
        row[1] += sent
        row[2] += received
        row[3] += seconds

    def upstream_error(self, node: int, why: str) -> None:
        """``why`` is a free sentence; it is reduced to a fixed word for the label."""
        kind = ("timeout" if "did not answer" in why else "connect" if "cannot connect" in why
                else "closed" if "closed" in why else why if " " not in why else "other")
        self.errors[(node, kind)] += 1

    def collect(self) -> Iterator[Metric]:
        rows = dict(self.relayed_by)
        labels = ["api", "upstream_node"]
        families = [
            CounterMetricFamily("kcoord_gateway_relayed_requests", "Requests relayed to the upstream cluster, by "
                                "API and the upstream node they went to (-1: the bootstrap listener's choice).",
                                labels=labels),
            CounterMetricFamily("kcoord_gateway_relayed_request_bytes", "Request bytes relayed upstream.",
                                labels=labels),
            CounterMetricFamily("kcoord_gateway_relayed_reply_bytes", "Reply bytes relayed back to clients.",
                                labels=labels),
            CounterMetricFamily("kcoord_gateway_relay_seconds", "Time from relaying a request to having its reply.",
                                labels=labels),
        ]
        for (key, node), row in sorted(rows.items()):
            for family, value in zip(families, row, strict=True):
                family.add_metric([_api_name(key), str(node)], value)
        yield from families
        errors = CounterMetricFamily("kcoord_gateway_upstream_errors", "Upstream links that failed (their clients' "
                                     "connections were closed), by node and kind.", labels=["upstream_node", "kind"])
        for (node, kind), n in sorted(self.errors.items()):
            errors.add_metric([str(node), kind], n)
        yield errors
        yield CounterMetricFamily("kcoord_gateway_metadata_from_cache", "Metadata requests answered from the "
                                  "gateway's own view because the upstream did not answer.",
                                  value=self.metadata_from_cache)
        yield GaugeMetricFamily("kcoord_gateway_upstream_brokers", "Upstream brokers known (each has a listener).",
                                value=self.upstream_brokers())
        yield GaugeMetricFamily("kcoord_gateway_upstream_reachable", "1 if the last discovery round (every "
                                "--upstream-refresh-ms) got an answer from an upstream broker, else 0.",
                                value=1 if self.upstream_reachable() else 0)

"""The metrics seam's own arithmetic: histogram buckets, and what ``outcome`` reads off a response."""

import json
import logging

import pytest

from coordinator.apis import APIS, load_all, outcome
from coordinator.apis import k09_offset_fetch as k09
from coordinator.apis.k08_offset_commit import CommitAnswer
from coordinator.apis.k09_offset_fetch import FetchAnswer
from coordinator.exporter import _buckets
from coordinator.logfmt import JsonFormatter
from coordinator.metrics import Histogram, Metrics
from protocol.errors import ErrorCode
from protocol.records import OffsetAndMetadata

load_all()


def test_histogram_buckets_are_cumulative_with_inf_last() -> None:
    hist = Histogram((0.001, 0.01, 0.1))
    for v in (0.0005, 0.001, 0.002, 0.05, 3.0):
        hist.observe(v)
    assert _buckets(hist) == [("0.001", 2.0), ("0.01", 3.0), ("0.1", 4.0), ("+Inf", 5.0)]
    assert hist.total == pytest.approx(3.0535)


def test_requests_are_counted_by_api_version_and_error_with_their_items() -> None:
    m = Metrics()
    m.request(8, 9, 0, 3, 0.002)
    m.request(8, 9, 0, 1, 0.004)
    m.request(8, 9, 22, 0, 0.001)
    assert m.requests == {(8, 9, 0): 2, (8, 9, 22): 1}
    assert m.done[8] == 4 and m.done[9] == 0
    assert sum(m.request_seconds[8].counts) == 3


def _commit_response(errors: list[int]) -> object:
    cls = APIS[8].spec.response.cls
    topic = cls.OffsetCommitResponseTopic
    part = topic.OffsetCommitResponsePartition
    return cls(throttle_time_ms=0, topics=[topic(name="t", partitions=[
        part(partition_index=i, error_code=e) for i, e in enumerate(errors)])])


def test_outcome_counts_successful_leaves_and_reports_the_first_error() -> None:
    for errors, expected in (([0, 0, 0], (0, 3)), ([0, 25, 0, 22], (25, 2)), ([], (0, 0))):
        response = _commit_response(errors)
        assert outcome(response) == expected
        # OffsetCommit answers with tuples (k08's CommitAnswer): its own outcome agrees
        assert APIS[8].outcome(CommitAnswer([("t", [(i, ErrorCode(e)) for i, e in enumerate(errors)])])) == expected


def test_a_commits_counted_outcome_is_dropped_when_its_write_fails() -> None:
    """The preparation counts a commit's outcome; a failed write's fix-up changes the errors, and the
    outcome is then walked from the fixed answer."""
    answer = CommitAnswer([("t", [(0, ErrorCode.NONE), (1, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                                  (2, ErrorCode.NONE)])], (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 2))
    assert APIS[8].outcome(answer) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 2)
    answer.written_failed(ErrorCode.NOT_COORDINATOR)
    assert APIS[8].outcome(answer) == (ErrorCode.NOT_COORDINATOR, 0)


def test_outcome_skips_the_leaves_of_a_failed_parent() -> None:
    """The generic walker over the generated objects, and OffsetFetch's own over the tuples its handler
    answers with (k09's FetchAnswer), of the same answers."""
    value = OffsetAndMetadata(1, -1, "", 0, -1)
    for version, groups, expected in (
        (9, [["a", 0, [("t", [(0, value, 0)])]], ["b", 14, []], ["c", 0, [("t", [(0, None, 0)])]]], (14, 2)),
        (9, [], (0, 0)),
        (7, [["g", 0, [("t", [(0, value, 0), (1, value, 0)])]]], (0, 2)),
        (7, [["g", 14, []]], (14, 0)),
        (7, [["g", 0, [("t", [(0, value, 0), (1, None, 3)])]]], (3, 1)),
        (1, [["g", 0, [("t", [(0, None, 16), (1, value, 0)])]]], (16, 1)),
    ):
        answer = FetchAnswer(groups)
        assert APIS[9].outcome(answer) == expected
        if version >= 2 and groups:  # v0-v1 have no top-level error for the walker to find first
            assert outcome(k09.message(answer, version)) == expected


def test_json_log_lines_carry_extra_fields_and_exceptions() -> None:
    record = logging.LogRecord("coordinator.shard", logging.ERROR, __file__, 1, "partition %d: %s", (3, "gone"),
                               None)
    record.partition = 3
    try:
        raise OSError(28, "No space left on device")
    except OSError:
        import sys
        record.exc_info = sys.exc_info()
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "partition 3: gone" and line["level"] == "ERROR"
    assert line["logger"] == "coordinator.shard" and line["partition"] == 3
    assert "No space left on device" in line["exception"] and line["time"].endswith("Z")


def test_the_latency_bucket_is_the_bounds_bucket() -> None:
    """metrics.latency_bucket (the request histogram's, bounds as constants) agrees with the general
    search over LATENCY_BUCKETS: at, just below and just above every bound, and far outside them."""
    from coordinator import metrics

    values = [0.0, -1.0, 1e-9, 100.0, float("inf"), float("nan")]
    for b in metrics.LATENCY_BUCKETS:
        values += [b, b * (1 - 1e-9), b * (1 + 1e-9)]
    for v in values:
        assert metrics.latency_bucket(v) == metrics.bucket(metrics.LATENCY_BUCKETS, v), v

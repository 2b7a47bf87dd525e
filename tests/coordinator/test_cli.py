import io
from pathlib import Path

import pytest

from coordinator.cli import dump_log, main
from coordinator.config import config_from_args
from protocol.records import (
    GroupMetadata,
    GroupMetadataRecord,
    OffsetAndMetadata,
    OffsetCommitRecord,
    OffsetKey,
    encode_record,
)
from storage.batch import build_batch
from storage.log import PartitionLog, list_segments


def write_partition(directory: Path) -> None:
    plog = PartitionLog(directory)
    topic = "testTopic-development"
    records = [
        OffsetCommitRecord(OffsetKey("testGroup", topic, 0), OffsetAndMetadata(11, -1, "", 1478243992053)),
        OffsetCommitRecord(OffsetKey("testGroup", topic, 0), OffsetAndMetadata(12, 3, "m", 1478243992086)),
        OffsetCommitRecord(OffsetKey("testGroup", topic, 1), None),
        GroupMetadataRecord("testGroup", GroupMetadata("consumer", 2, "range", None, 1)),
    ]
    plog.append(build_batch(0, [encode_record(r) for r in records], 1), len(records) - 1)
    plog.sync()
    plog.close()


def test_dump_log_prints_like_kafkas_offsets_formatter(tmp_path: Path) -> None:
    write_partition(tmp_path)
    out = io.StringIO()
    assert dump_log(tmp_path, out) == 0
    assert out.getvalue().splitlines() == [
        "[testGroup,testTopic-development,0]::OffsetAndMetadata[11,NO_METADATA,1478243992053]",
        "[testGroup,testTopic-development,0]::OffsetAndMetadata[12,m,1478243992086]",
        "[testGroup,testTopic-development,1]::NULL",
        "testGroup::GroupMetadata[consumer,2,range,None,members=[]]",
    ]


def test_dump_log_reports_damage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_partition(tmp_path)
    segment = list_segments(tmp_path)[0].path
    data = bytearray(segment.read_bytes())
    data[80] ^= 0xFF
    segment.write_bytes(bytes(data))
    assert main(["dump-log", str(segment)]) == 1
    assert "CRC mismatch" in capsys.readouterr().out


def parse(argv: list[str]) -> object:
    import argparse

    from coordinator.config import add_serve_arguments

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return config_from_args(parser.parse_args(argv))


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCOORD_OFFSETS_PARTITIONS", "7")
    monkeypatch.setenv("KCOORD_LISTEN", "0.0.0.0:19000")
    cfg = parse(["--advertised-listener", "PLAINTEXT://kcoord.example:9093", "--node-id", "3"])
    assert (cfg.offsets_partitions, cfg.host, cfg.port) == (7, "0.0.0.0", 19000)  # type: ignore[attr-defined]
    assert cfg.advertised == ("kcoord.example", 9093)  # type: ignore[attr-defined]
    assert cfg.node_id == 3  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--listen", "nohost"], "HOST:PORT"),
        (["--listen", "h:99999"], "outside 0-65535"),
        (["--offsets-partitions", "0"], "outside"),
        (["--segment-bytes", "ten"], "not an integer"),
        (["--log-level", "loud"], "invalid choice"),
        (["--offset-metadata-max-bytes", "20000"], "outside [0, 10922]"),
    ],
)
def test_bad_values_are_clear_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_environment_value_is_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KCOORD_NODE_ID", "-4")
    with pytest.raises(SystemExit):
        parse([])
    assert "outside" in capsys.readouterr().err

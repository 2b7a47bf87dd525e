import argparse
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.cli import dump_log, main
from coordinator.config import Config, ConfigError, add_serve_arguments, config_from_args
from protocol.records import (
    GroupMetadata,
    GroupMetadataRecord,
    OffsetAndMetadata,
    OffsetCommitRecord,
    OffsetKey,
    Record,
    encode_record,
)
from storage.batchwriter import build_batch
from storage.log import PartitionLog
from storage.segments import list_segments
from tests.kcoord_process import REPO
from tests.storage.test_journal import P, acknowledged, batch, opened


def write_partition(directory: Path) -> None:
    plog = PartitionLog(directory)
    topic = "testTopic-development"
    records: list[Record] = [
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


def parse(argv: list[str], environ: dict[str, str] | None = None) -> Config:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return config_from_args(parser.parse_args(argv), environ or {})


def test_flags_and_environment() -> None:
    env = {"KCOORD_OFFSETS_PARTITIONS": "7", "KCOORD_LISTEN": "0.0.0.0:19000", "KCOORD_NODE_ID": "9"}
    cfg = parse(["--advertised-listener", "PLAINTEXT://kcoord.example:9093", "--node-id", "3"], env)
    assert (cfg.offsets_partitions, cfg.host, cfg.port) == (7, "0.0.0.0", 19000)
    assert cfg.advertised == ("kcoord.example", 9093)
    assert cfg.node_id == 3  # a flag beats its variable
    assert cfg.sync_helper and not parse(["--sync-helper", "OFF"]).sync_helper
    assert not parse([], {"KCOORD_SYNC_HELPER": "off"}).sync_helper


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--listen", "nohost"], "--listen='nohost': expected HOST:PORT"),
        (["--listen", "h:99999"], "outside 0-65535"),
        (["--advertised-listener", "kc.example:0"], "port 0 cannot be advertised"),
        (["--advertised-listener", "0.0.0.0:9092"], "0.0.0.0 cannot be advertised: it means every interface"),
        (["--advertised-listener", "[::]:9092"], ":: cannot be advertised"),
        (["--listen", "0.0.0.0:9092"], "--listen 0.0.0.0:9092 listens on every interface, which is no address "
                                       "clients can be given: also give --advertised-listener"),
        (["--listen", "[::]:9092"], "--listen :::9092 listens on every interface"),
        (["--listen", "[::0]:9092"], "--listen ::0:9092 listens on every interface"),
        (["--listen", "[0:0:0:0:0:0:0:0]:9092"], "listens on every interface"),
        (["--listen", "[::ffff:0.0.0.0]:9092"], "listens on every interface"),
        (["--listen", "0:9092"], "--listen 0:9092 listens on every interface"),  # "0" binds 0.0.0.0 too
        (["--advertised-listener", "0.0:9092"], "0.0 cannot be advertised"),
        (["--advertised-listener", "[::0]:9092"], "::0 cannot be advertised"),
        (["--listen", "0.0.0.0:9092", "--advertised-listener", "kc.example:9092", "--upstream", "b:9092",
          "--broker-advertised-host", "0.0.0.0"], "--broker-advertised-host 0.0.0.0 means every interface"),
        (["--offsets-partitions", "0"], "--offsets-partitions='0': 0 is outside"),
        (["--segment-bytes", "ten"], "not an integer"),
        (["--log-level", "loud"], "--log-level='loud': 'loud' is not one of DEBUG, INFO, WARNING, ERROR"),
        (["--offset-metadata-max-bytes", "20000"], "outside [0, 10922]"),
        (["--max-frame-bytes", "64"], "64 is outside [8192,"),
        (["--max-frame-bytes", "100000", "--max-buffered-bytes", "90000"], "must be at least --max-frame-bytes"),
        (["--shutdown-timeout-ms", "-1"], "outside [0, 3600000]"),
        (["--sync-helper", "yes"], "--sync-helper='yes': 'yes' is not on or off"),
    ],
)
def test_bad_values_are_clear_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(argv)


def test_a_wildcard_listener_is_advertised_only_under_a_name_clients_reach() -> None:
    """Kafka refuses to start advertising the 0.0.0.0 meta-address; kcoord gave it to clients in
    FindCoordinator and Metadata, where they connected nowhere (a gateway audit's find)."""
    cfg = parse(["--listen", "0.0.0.0:9092", "--advertised-listener", "kc.example:19092"])
    assert (cfg.host, cfg.advertised) == ("0.0.0.0", ("kc.example", 19092))


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("KCOORD_NODE_ID", "-4", "KCOORD_NODE_ID='-4': -4 is outside"),
    ("KCOORD_LOG_LEVEL", "bogus", "KCOORD_LOG_LEVEL='bogus': 'bogus' is not one of"),
    ("KCOORD_MAX_FRAME_BYTES", "64", "KCOORD_MAX_FRAME_BYTES='64'"),
])
def test_bad_environment_values_name_the_variable(variable: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse([], {variable: value})


def test_cli_reports_a_bad_variable_without_a_traceback(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCOORD_LOG_LEVEL", "bogus")
    with pytest.raises(SystemExit) as exc:
        main(["serve"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "KCOORD_LOG_LEVEL='bogus'" in err and "Traceback" not in err


def test_metrics_listener_and_log_format_options() -> None:
    assert parse([], {}).metrics_listen == ("127.0.0.1", 9404)
    assert parse(["--metrics-listen", "0.0.0.0:9500"], {}).metrics_listen == ("0.0.0.0", 9500)
    assert parse([], {"KCOORD_METRICS_LISTEN": "off"}).metrics_listen is None
    assert parse(["--log-format", "JSON"], {}).log_format == "json"
    with pytest.raises(ConfigError, match=re.escape("KCOORD_LOG_FORMAT='xml'")):
        parse([], {"KCOORD_LOG_FORMAT": "xml"})


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("kcoord ")


def test_dump_log_of_a_data_directory_prints_every_partition(tmp_path: Path) -> None:
    write_partition(tmp_path / "__consumer_offsets-3")
    write_partition(tmp_path / "__consumer_offsets-10")
    (tmp_path / "__consumer_offsets-4").mkdir()
    out = io.StringIO()
    assert dump_log(tmp_path, out) == 0
    lines = out.getvalue().splitlines()
    assert [line for line in lines if line.startswith("#")] == [
        "# __consumer_offsets-3", "# __consumer_offsets-4", "# __consumer_offsets-10"]
    assert len(lines) == 3 + 2 * 4


def test_dump_log_says_when_the_journal_holds_batches_the_logs_may_lack(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal, plog = opened(tmp_path)
    acknowledged(journal, plog, [batch(0), batch(1)])  # durable in the journal; the logs synced at checkpoints
    plog.close()
    journal.close(remove=False)  # as a kill -9 leaves it
    segment = next((tmp_path / f"__consumer_offsets-{P}").glob("*.log"))
    for target in (tmp_path, segment.parent, segment):
        main(["dump-log", str(target)])  # (the test batches' records are not offsets records: errors listed)
        assert f"{tmp_path / 'journal'} holds 2 batches that these logs may lack" in capsys.readouterr().err
    journal, plog = opened(tmp_path)  # a start writes them into the log; a clean stop leaves no journal
    plog.sync()
    plog.close()
    journal.close(remove=True)
    main(["dump-log", str(tmp_path)])
    assert "holds" not in capsys.readouterr().err


def test_dump_log_of_a_directory_without_logs_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["dump-log", str(tmp_path)])
    assert exc.value.code == 2
    assert "holds no log segments" in capsys.readouterr().err


def test_dump_log_into_a_closed_pipe_stops_quietly(tmp_path: Path) -> None:
    for p in range(3):
        write_partition(tmp_path / f"__consumer_offsets-{p}")
    cmd = f"{sys.executable} -m coordinator.cli dump-log {tmp_path} | head -n 1"
    result = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=REPO, capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.stdout == "# __consumer_offsets-0\n"
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr


def test_gateway_options() -> None:
    assert parse([], {}).upstream == ()  # standalone unless asked
    cfg = parse(["--upstream", "a:9092, PLAINTEXT://b:9093", "--broker-port-base", "19000",
                 "--broker-advertised-host", "kc.example"], {"KCOORD_UPSTREAM_TIMEOUT_MS": "5000"})
    assert cfg.upstream == (("a", 9092), ("b", 9093))
    assert (cfg.broker_port_base, cfg.broker_host, cfg.upstream_timeout_ms) == (19000, "kc.example", 5000)
    assert parse([], {"KCOORD_UPSTREAM": "[::1]:9092"}).upstream == (("::1", 9092),)
    with pytest.raises(ConfigError, match=re.escape("--upstream='[::1:9092'")):
        parse(["--upstream", "[::1:9092"])
    with pytest.raises(ConfigError, match=re.escape("--upstream=','")):
        parse(["--upstream", ","])
    with pytest.raises(ConfigError, match=re.escape("--upstream-timeout-ms='5'")):
        parse(["--upstream-timeout-ms", "5"])


@pytest.mark.parametrize(("argv", "why"), [
    (["--bootstrap", "nohost:x", "list"], "port 'x' is not a number"),
    (["--bootstrap", "127.0.0.1:9092,oops", "list"], "expected HOST:PORT"),
    (["--bootstrap", "127.0.0.1:0", "list"], "port 0"),
    (["--bootstrap", "[::1:29150", "list"], "expected HOST:PORT or [IPv6]:PORT"),  # unbalanced: a review's find
    (["--bootstrap", "[::1]x:29150", "list"], "expected HOST:PORT or [IPv6]:PORT"),
    (["--bootstrap", "[]:29150", "list"], "expected HOST:PORT or [IPv6]:PORT"),
    (["--timeout-ms", "-5", "list"], "-5 is outside"),
    (["--timeout-ms", "soon", "list"], "'soon' is not an integer"),
    # an audit's finds: out of range failed on the wire with a traceback, negative only there, an empty list
    # read as "every partition with an offset", and a second --topic or --partitions silently won
    (["reset-offsets", "g", "--topic", "t", "--partitions", "2147483648", "--to-offset", "3"], "from 0 to 2147483647"),
    (["delete-offsets", "g", "--topic", "t", "--partitions", "0,-1"], "from 0 to 2147483647"),
    (["delete-offsets", "g", "--topic", "t", "--partitions", " , "], "is not a comma-separated list"),
    (["reset-offsets", "g", "--topic", "a", "--topic", "b", "--to-offset", "0"], "--topic given twice"),
    (["delete-offsets", "g", "--topic", "a", "--partitions", "0", "--partitions", "1"], "--partitions given twice"),
])
def test_groups_usage_errors_exit_2_saying_why(argv: list[str], why: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad --bootstrap was the admin client's ValueError traceback (exit 1), and a negative --timeout-ms
    was taken and reported as "cannot reach" (an admin-API campaign's finds)."""
    from coordinator.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["groups", *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err, err


def test_serving_loads_neither_the_admin_nor_the_pipeline_commands() -> None:
    """Their modules cost a restart ~20 ms of imports; `kcoord --help` and `kcoord groups` still have them."""
    probe = ("import sys\nfrom coordinator.cli import main\n"
             "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in ('coordinator.groups_cli', 'pipeline.cli', 'wcwidth') if m in sys.modules))")

    def loaded(*argv: str) -> str:
        done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, cwd=REPO,
                              timeout=60)
        return done.stdout.strip().splitlines()[-1]

    assert loaded("serve", "--no-such-flag") == "[]"  # parsed (and refused) without them
    assert "coordinator.groups_cli" in loaded("--help") and "coordinator.groups_cli" in loaded("groups", "--help")


def test_the_settings_are_read_without_the_storage_and_protocol_stacks() -> None:
    """coordinator.config is what the container's HEALTHCHECK imports every 15 s: it loaded storage.log
    (the record codecs, compression libraries) and kafka-python's classes, ~0.5 s and ~20 MB a check."""
    from storage.log import DEFAULT_SEGMENT_BYTES

    assert Config().segment_bytes == DEFAULT_SEGMENT_BYTES  # config keeps its own copy of the default
    probe = ("import sys, coordinator.config\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'kafka', 'aiokafka', 'storage', 'asyncio'}))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr

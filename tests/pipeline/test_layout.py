"""Finding an offsets log: kcoord data dirs, Kafka log dirs (other topics and -delete dirs ignored), one
partition dir, several dirs, file:// URIs through pyarrow; the recovery point; kcoord's own names."""

from pathlib import Path

import pytest

from coordinator import runtime
from pipeline.layout import META_FILE, OFFSETS_TOPIC, LayoutError, files_for, find_segments, local_path, location
from tests.pipeline.logs import commit, plain_batches, write_partition


def test_names_agree_with_the_service() -> None:
    assert (OFFSETS_TOPIC, META_FILE) == (runtime.OFFSETS_TOPIC, runtime.META_FILE)


def make_log(root: Path, partition: int) -> None:
    write_partition(root / f"__consumer_offsets-{partition}", plain_batches([[commit("g", "t", 0, 1)]]))


def test_a_kafka_log_dir_with_other_topics(tmp_path: Path) -> None:
    make_log(tmp_path, 3)
    make_log(tmp_path, 12)
    (tmp_path / "__consumer_offsets-3.8f1e-delete").mkdir()
    (tmp_path / "orders-0").mkdir()
    (tmp_path / "__consumer_offsets-12" / "00000000000000000000.index").write_bytes(b"\0" * 8)
    segs = find_segments([str(tmp_path)])
    assert [(s.log_partition, Path(s.path).name, s.last) for s in segs] == [
        (3, "00000000000000000000.log", True), (12, "00000000000000000000.log", True)]
    assert all(s.durable_below == s.size for s in segs)  # the recovery point covers what was synced


def test_several_dirs_one_partition_dir_and_file_uris(tmp_path: Path) -> None:
    make_log(tmp_path / "a", 0)
    make_log(tmp_path / "b", 1)
    assert [s.log_partition for s in find_segments([str(tmp_path / "a"), str(tmp_path / "b")])] == [0, 1]
    assert [s.log_partition for s in find_segments([str(tmp_path / "b" / "__consumer_offsets-1")])] == [1]
    uri = f"file://{tmp_path / 'a'}"
    segs = find_segments([uri])
    assert segs[0].path.startswith("file://")
    assert files_for(segs[0].path).read(segs[0].path, 0, 8) == (tmp_path / "a" / "__consumer_offsets-0" /
                                                                "00000000000000000000.log").read_bytes()[:8]


def test_a_partition_in_two_dirs_or_none_at_all_is_refused(tmp_path: Path) -> None:
    make_log(tmp_path / "a", 0)
    make_log(tmp_path / "b", 0)
    with pytest.raises(LayoutError, match="partition 0 is in both"):
        find_segments([str(tmp_path / "a"), str(tmp_path / "b")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(LayoutError, match="no __consumer_offsets"):
        find_segments([str(tmp_path / "empty")])


def test_swap_names_agree_with_the_service_and_a_kafka_swap_is_refused(tmp_path: Path) -> None:
    from pipeline import layout
    from storage import segments

    assert layout._KCOORD_SWAP.pattern == segments._SWAP_RE.pattern
    assert layout._KCOORD_SWAP.match(segments.swap_name(3, 17))
    make_log(tmp_path, 0)
    (tmp_path / "__consumer_offsets-0" / "00000000000000000000.log.swap").write_bytes(b"")
    with pytest.raises(LayoutError, match="interrupted compaction swap"):
        find_segments([str(tmp_path)])


def test_file_localhost_is_local_and_other_hosts_are_not() -> None:
    """RFC 8089: ``file://localhost/p`` names this machine's ``/p``, as ``file:///p`` does."""
    assert location("file://localhost/data/x") == "file:///data/x"
    assert location("FILE://LOCALHOST/data/x") == "file:///data/x"
    assert location("FILE:///data/x") == "file:///data/x"
    assert location("file:/data/x") == "file:///data/x"  # the short form, as Hadoop prints local paths
    assert location("file://localhost") == "file:///"
    assert location("file://localhost.example/data") == "file://localhost.example/data"
    assert location("FILE://elsewhere/data") == "file://elsewhere/data"
    assert location("hdfs://localhost/data") == "hdfs://localhost/data"
    assert location("/data") == "/data"
    assert location("local:///data/x") == location("local:/data/x") == "file:///data/x"  # pyarrow's alias
    for given in ("file://localhost/data/x", "File:/data/x", "FILE:///data/x"):
        assert local_path(location(given)) == Path("/data/x")
    assert local_path("file://elsewhere/data") is None
    assert local_path("s3a://bucket/data") is None
    assert local_path("relative/data") == Path("relative/data")


def test_a_data_dir_uri_is_the_directory_pyarrow_reads() -> None:
    """pyarrow decodes a file URI's percent-escapes (``file:///a%20b`` lists ``/a b``): the check for a
    running kcoord must look at that directory, not at one named ``a%20b``. A plain path is a name."""
    from pyarrow import fs

    for given in ("file:///data/a%20b", "file:///data/%C3%A9t%C3%A9", "file:///data/x%25y"):
        assert local_path(given, decoded=True) == Path(fs.FileSystem.from_uri(given)[1])
    assert local_path("file:///data/a%20b", decoded=True) == Path("/data/a b")
    assert local_path("file:///data/a%20b") == Path("/data/a%20b")  # as Hadoop takes an --out
    assert local_path("/data/a%20b", decoded=True) == Path("/data/a%20b")
    assert local_path("file://elsewhere/a%20b", decoded=True) is None


@pytest.mark.parametrize("given", ["file:///data/x#frag", "file:///data/x?q", "file:///data/x?",
                                   "file:/data/x#", "file:///data/x?/__consumer_offsets-0"])
def test_a_file_uri_with_a_query_or_a_fragment_is_refused(given: str) -> None:
    """pyarrow drops them (``file:///data/x#frag`` lists ``/data/x``) while the check for a running
    kcoord and Hadoop keep them in the name: such a --data-dir read a locked directory unchecked."""
    from pyarrow import fs

    assert fs.FileSystem.from_uri(given)[1].startswith("/data/x")
    for form in (given, given.replace("file:///", "file://localhost/"), given.replace("file:", "local:")):
        with pytest.raises(LayoutError, match="cannot have a query or a fragment"):
            location(form)
    assert location("file:///data/x%3Fq%23f") == "file:///data/x%3Fq%23f"  # escaped, they are names
    assert location("/data/x?q#f") == "/data/x?q#f"  # a plain path is a name


def test_the_refusal_is_a_usage_error_that_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from pipeline.cli import add_jobs

    parser = argparse.ArgumentParser(prog="kcoord pipeline")
    add_jobs(parser)
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["snapshot", "--data-dir", "file:///data/x#frag", "--out", "/tmp/out"])
    assert exited.value.code == 2
    assert "cannot have a query or a fragment" in capsys.readouterr().err


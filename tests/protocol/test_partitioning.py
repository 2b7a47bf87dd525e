import pytest

from protocol.partitioning import java_string_hash, kafka_abs, partition_for

# Reference section 4 (cross-checked there against a JVM's String.hashCode).
VECTORS = [
    ("testGroup", -1202336499, 49),
    ("", 0, 0),
    ("my-group", -1906497762, 12),
    ("group-1", 293427299, 49),
    ("test-group", 627841412, 12),
    ("console-consumer-12345", 158455506, 6),
    ("a", 97, 47),
    ("test", 3556498, 48),
    ("Aa", 2112, 12),
    ("BB", 2112, 12),
    ("groupA", -1237460574, 24),
    ("groupB", -1237460573, 23),
    ("__consumer_offsets", -970371369, 19),
]


@pytest.mark.parametrize(("group", "hash_code", "partition"), VECTORS)
def test_reference_vectors(group: str, hash_code: int, partition: int) -> None:
    assert java_string_hash(group) == hash_code
    assert partition_for(group, 50) == partition


def test_other_partition_counts() -> None:
    assert partition_for("testGroup", 10) == 9
    assert partition_for("testGroup", 3) == 0
    assert partition_for("group-1", 3) == 2
    assert partition_for("anything", 1) == 0


def test_supplementary_characters_count_as_two_utf16_units() -> None:
    # U+1F600 is the surrogate pair D83D DE00 in Java: 31 * 0xD83D + 0xDE00
    assert java_string_hash("\U0001F600") == 31 * 0xD83D + 0xDE00


def test_integer_min_value_maps_to_zero() -> None:
    assert kafka_abs(-(2**31)) == 0
    assert kafka_abs(-5) == 5
    # "polygenelubricants" is a well-known Java string whose hashCode is Integer.MIN_VALUE
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert partition_for("polygenelubricants", 50) == 0


def test_partition_count_must_be_positive() -> None:
    with pytest.raises(ValueError):
        partition_for("g", 0)

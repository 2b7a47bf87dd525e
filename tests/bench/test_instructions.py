"""bench.instructions counts the request path's instructions with callgrind: a real count, in the range
a 1-partition fetch takes (tens of thousands: start-up cancels out between its two runs)."""

import shutil

import pytest

from bench import instructions


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
def test_a_1_partition_fetch_counts_tens_of_thousands_of_instructions() -> None:
    assert 5_000 < instructions.per_request("fetch-1", 1_000) < 500_000

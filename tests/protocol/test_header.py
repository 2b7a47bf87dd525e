"""``protocol.header``: every request's header peek. Compiled by the install where it can be (setup.py),
so every test runs against the built module and against its source."""

from types import ModuleType

import pytest

import protocol.header as installed
from tests.interpreted import assert_compiled, build, interpreted

PURE = interpreted(installed)


@pytest.fixture(params=["compiled", "interpreted"])
def header(request: pytest.FixtureRequest) -> ModuleType:
    return build(request.param, installed, PURE)


def test_compiled_when_the_machine_can_compile() -> None:
    assert_compiled(installed, PURE)


def test_the_peek_reads_api_key_version_and_correlation_id_signed(header: ModuleType) -> None:
    assert header.peek_header(b"\x00\x08\x00\x09\x00\x00\x01\x00rest") == (8, 9, 256)
    assert header.peek_header(b"\xff\xff\x80\x00\xff\xff\xff\xff") == (-1, -32768, -1)
    assert type(header.peek_header(bytes(8))) is tuple


@pytest.mark.parametrize("frame", [b"", b"\x00\x08\x00\x09\x00\x00\x01"])
def test_a_frame_without_a_whole_header_is_refused(header: ModuleType, frame: bytes) -> None:
    with pytest.raises(header.HeaderError):
        header.peek_header(frame)


def test_response_headers(header: ModuleType) -> None:
    assert header.response_header(7, flexible=False) == b"\x00\x00\x00\x07"
    assert header.response_header(-1, flexible=True) == b"\xff\xff\xff\xff\x00"

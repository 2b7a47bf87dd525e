"""coordinator.gateway.upstream's links on their own, against a real socket server that stalls."""

import asyncio
import logging

import pytest

from coordinator.gateway import upstream
from coordinator.gateway.upstream import LinkOwner, UpstreamLink

METADATA_V0 = b"\x00\x03\x00\x00\x00\x00\x00\x01\xff\xff\x00\x00\x00\x00"


def test_link_failures_are_logged_once_a_minute_even_when_each_link_connects(caplog: pytest.LogCaptureFixture) -> None:
    """A stalled upstream accepts every link, then each fails after --upstream-timeout-ms: a review
    found the once-a-minute limit reset by every link that connected, so every failure was logged.
    Only an upstream that answers discovery again lets the next failure through at once."""

    async def main() -> None:
        server = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)  # reads and answers nothing
        port = server.sockets[0].getsockname()[1]
        for _ in range(5):
            link = UpstreamLink(("127.0.0.1", port), LinkOwner(), 30.0)
            link.send(METADATA_V0, lambda reply: None)
            await asyncio.sleep(0.05)  # connected, the request sent
            link.fail(f"upstream 127.0.0.1:{port} did not answer within 30 s")  # as the gateway's sweeper does
        upstream.upstream_reached_again()
        link = UpstreamLink(("127.0.0.1", port), LinkOwner(), 30.0)
        link.send(METADATA_V0, lambda reply: None)
        await asyncio.sleep(0.05)
        link.fail("after the upstream came back")
        server.close()
        await server.wait_closed()

    upstream.upstream_reached_again()
    with caplog.at_level(logging.INFO, logger=upstream.__name__):
        asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records if "replies outstanding" in r.getMessage()]
    assert len(lines) == 2 and "after the upstream came back" in lines[1], lines


def test_the_timeout_counts_from_when_a_request_is_due_behind_a_long_poll() -> None:
    """A request the broker may hold (a Fetch's max wait) is overdue only once the timeout has passed after
    that hold, and so is every request sent behind it on the link (the broker takes it up once it has
    answered); a request on its own is overdue the timeout after it was sent, as before."""

    async def main() -> None:
        server = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)  # reads and answers nothing
        port = server.sockets[0].getsockname()[1]
        link = UpstreamLink(("127.0.0.1", port), LinkOwner(), 1.0)
        loop = asyncio.get_running_loop()
        sent = loop.time()
        first = link.send(METADATA_V0, lambda reply: None, holds_s=3.0)
        second = link.send(METADATA_V0, lambda reply: None)
        assert first.due >= sent + 3.0 and second.due == first.due
        assert not link.overdue(first.due + 0.9)  # past the timeout after it was sent, within it after the hold
        assert link.overdue(first.due + 1.1)
        alone = UpstreamLink(("127.0.0.1", port), LinkOwner(), 1.0)
        request = alone.send(METADATA_V0, lambda reply: None)
        assert not alone.overdue(request.due + 0.9) and alone.overdue(request.due + 1.1)
        link.close()
        alone.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())

"""The C paced load generator of the benchmarks (bench/pacer.c through bench/cpacer.py) against a real
kcoord: it paces, times and hands every distinct answer to the harness's checker, so a wrong answer
is counted, not timed as if it were right."""

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import replace

import pytest

from bench import cpacer
from bench.client import PACER_TICK, Checker, Load, Sample, Slot, prime
from bench.client import measure as client_measure
from bench.report import paced_note
from bench.wire import Template, Tolerance, Versions
from tests.kcoord_process import KcoordProcess

VERSIONS = Versions(commit=8, fetch=9)
TEMPLATES = [Template(f"pacer-{g}", (g % 4,), 1000 + g) for g in range(8)]


def paced(server: KcoordProcess, load: Load, checker: Checker, rate: float = 2000) -> Sample:
    program = cpacer.binary()
    if program is None:
        pytest.skip("no C compiler")
    return asyncio.run(cpacer.measure(program, "127.0.0.1", server.port, load, checker, connections=2, inflight=4,
                                      warmup=0.2, duration=0.5, server_cpu=lambda: None, rate=rate))


def answering(delay_s: float) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """A connection handler that answers each frame with its correlation id and no body, after
    ``delay_s`` (none: at once)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = int.from_bytes(await reader.readexactly(4), "big")
                frame = await reader.readexactly(size)
                if delay_s:
                    await asyncio.sleep(delay_s)
                writer.write((4).to_bytes(4, "big") + frame[4:8])
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
        except asyncio.CancelledError:  # the test's loop closing under a connection still open
            writer.close()

    return handle


def test_paced_commits_and_fetches_are_timed_and_checked(kcoord: KcoordProcess) -> None:
    commits = [Slot("commit", t) for t in TEMPLATES]
    asyncio.run(prime("127.0.0.1", kcoord.port, Checker(commits, VERSIONS, Tolerance()), range(len(commits))))
    slots = commits + [Slot("fetch", t) for t in TEMPLATES]
    load = Load(tuple(slots), tuple(range(len(slots))))
    sample = paced(kcoord, load, Checker(slots, VERSIONS, Tolerance()))
    assert sample.client == cpacer.NAME
    assert not sample.errors and sample.unanswered == 0
    assert sample.responses > 0  # answered (all phases) and checked
    assert sample.requests <= 2000 * 0.7 + 1  # paced: never more than due by the window's end
    assert len(sample.latencies) == sample.requests and all(t > 0 for t in sample.latencies)


def test_a_wrong_answer_is_counted_as_an_error(kcoord: KcoordProcess) -> None:
    commits = [Slot("commit", t) for t in TEMPLATES]
    asyncio.run(prime("127.0.0.1", kcoord.port, Checker(commits, VERSIONS, Tolerance()), range(len(commits))))
    wrong = [Slot("fetch", replace(t, offset=t.offset + 1)) for t in TEMPLATES]  # not what was committed
    sample = paced(kcoord, Load(tuple(wrong), tuple(range(len(wrong)))), Checker(wrong, VERSIONS, Tolerance()))
    assert sum(sample.errors.values()) >= len(wrong)


def test_requests_held_back_by_the_in_flight_limit_are_counted() -> None:
    """A server slower than the pace: requests wait for answers before they go out, and the report says
    so (``held``) rather than blaming the pacer's tick for them."""
    program = cpacer.binary()
    if program is None:
        pytest.skip("no C compiler")
    slots = [Slot("fetch", t) for t in TEMPLATES]
    load = Load(tuple(slots), tuple(range(len(slots))))

    async def run() -> Sample:
        server = await asyncio.start_server(answering(0.05), "127.0.0.1", 0)  # 4 in flight: 80 answers/s
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await cpacer.measure(program, "127.0.0.1", port, load, Checker(slots, VERSIONS, Tolerance()),
                                        connections=2, inflight=4, warmup=0.2, duration=0.5,
                                        server_cpu=lambda: None, rate=2000)

    sample = asyncio.run(run())
    assert sample.held > 500  # ~1,000 due in the window, ~80 answered
    assert sample.held <= 2000 * 0.5 + 1


@pytest.mark.parametrize("generator", ["c", "asyncio"])
def test_a_request_goes_out_when_it_is_due_not_one_interval_later(generator: str) -> None:
    """Request k is due at t0 + k / rate. Both generators dealt only the requests strictly before
    ``(now - t0) * rate``, so each went out, and was timed from its due time, one interval late: 0.2 ms
    on every request at 5,000 req/s (the C pacer reported all of them late, the mock's p50 included it).
    At 20 req/s that interval is 50 ms, far above what an immediate answer takes on loopback."""
    program = cpacer.binary() if generator == "c" else None
    if generator == "c" and program is None:
        pytest.skip("no C compiler")
    slots = [Slot("fetch", t) for t in TEMPLATES]
    load = Load(tuple(slots), tuple(range(len(slots))))

    async def run() -> Sample:
        server = await asyncio.start_server(answering(0.0), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        checker = Checker(slots, VERSIONS, Tolerance())
        async with server:
            if program is not None:
                return await cpacer.measure(program, "127.0.0.1", port, load, checker, connections=2, inflight=4,
                                            warmup=0.2, duration=1.0, server_cpu=lambda: None, rate=20.0)
            return await client_measure("127.0.0.1", port, load, checker, connections=2, inflight=4, warmup=0.2,
                                        duration=1.0, server_cpu=lambda: None, rate=20.0)

    sample = asyncio.run(run())
    assert 15 <= len(sample.latencies) <= 25
    assert sorted(sample.latencies)[len(sample.latencies) // 2] < 0.025


def test_late_is_reported_against_the_threshold_of_the_generator_that_ran() -> None:
    """The C pacer calls a request late two 0.1 ms passes after it was due, the asyncio one two 1 ms
    passes after: the report said 0.2 ms for both."""
    tick = re.search(r"#define TICK_NS (\d+)L", cpacer.SOURCE.read_text())
    assert tick is not None and cpacer.LATE_AFTER_S == pytest.approx(2 * int(tick.group(1)) / 1e9)
    assert Sample().late_after_s == pytest.approx(2 * PACER_TICK)
    row = {"scenario": "commit-1-half", "server": "kcoord", "rate_target": 1000.0, "requests": 10, "late": 1,
           "held": 0, "inflight": 16}
    for client, after_s, said in (("asyncio", Sample().late_after_s, "(2 ms)"), (cpacer.NAME, cpacer.LATE_AFTER_S,
                                                                               "(0.2 ms)")):
        assert said in paced_note({**row, "client": client, "late_after_ms": after_s * 1e3})

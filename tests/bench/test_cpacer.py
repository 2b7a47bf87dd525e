"""The C paced load generator of the benchmarks (bench/pacer.c through bench/cpacer.py) against a real
kcoord: it paces, times and hands every distinct answer to the harness's checker, so a wrong answer
is counted, not timed as if it were right."""

import asyncio
from dataclasses import replace

import pytest

from bench import cpacer
from bench.client import Checker, Load, Sample, Slot, prime
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

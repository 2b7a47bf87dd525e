"""Instructions per request of kcoord's request path, counted by valgrind (callgrind), not timed.

On this shared 2-core VM the CPU per request that ``bench.request_path`` times moves by +-20% between
runs (7.6 and 6.9 us per 1-partition fetch, minutes apart, same tree), which hides a change of a few
percent. An instruction count does not move with the machine's window: the same tree gives the same
count within ~1% for fetches (commits vary more, ~+-3%: how many commits share a flush cycle
depends on the writer thread's timing). This runs ``bench.request_path`` under callgrind twice, with
``--requests`` N and 3N, and reports the difference over 2N: the start-up (imports, schemas, the
data directory) cancels out. The sync helper is off (its process is not the one counted).

    python -m bench.instructions [--scenarios fetch-1,commit-1] [--requests N]

Needs valgrind. Slow: ~50x the requests' own time, ~1 minute per scenario at the default N.
Instructions are not time (cache misses and system calls cost more than their count), so the
harness stays the judge; use this to see whether a change to the request path does less work.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def count(scenario: str, requests: int) -> int:
    """Instructions callgrind counts for one ``bench.request_path`` run of ``requests`` requests."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-m", "bench.request_path",
           "--runs", "1", "--scenarios", scenario, "--requests", str(requests), "--sync-helper", "off"]
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict layouts in both runs
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    found = _REFS.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def per_request(scenario: str, requests: int) -> float:
    """Instructions per ``--requests`` unit: the difference between runs of ``requests`` and 3x as many,
    over 2x."""
    return (count(scenario, 3 * requests) - count(scenario, requests)) / (2 * requests)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="fetch-1,commit-1", help="bench.request_path scenarios")
    parser.add_argument("--requests", type=int, default=10_000,
                        help="requests of the smaller run (the larger has 3x as many; 100-partition scenarios "
                             "take 1/20 of them, as bench.request_path does)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed")
    for scenario in args.scenarios.split(","):
        divisor = 20 if scenario.endswith("-100") else 1  # of --requests, what such a run makes
        print(f"{scenario:<12} {per_request(scenario, args.requests) * divisor:>10,.0f} instructions per request",
              flush=True)


if __name__ == "__main__":
    main()

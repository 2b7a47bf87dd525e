#!/usr/bin/env python3
"""The container's HEALTHCHECK: exit 0 when kcoord's ``/readyz`` answers 200 (no offsets partition still
loading; a failed one is alerted on, not unhealthy), 1 otherwise (loading, stopping, the event loop
stalled, or nothing listening).

It asks the metrics listener named by ``KCOORD_METRICS_LISTEN`` (HOST:PORT; a wildcard host is asked on
127.0.0.1, ``[::]`` on ``[::1]``). With ``KCOORD_PROCESSES=N`` the container runs N nodes, node i's
listener on that port + i, and every one is asked: one node not ready leaves its share of the groups
unserved, so the container is unhealthy, and the output names the node. The nodes are asked at once, so
the check takes one timeout however many they are (Docker's --timeout bounds the whole check). With the
listener ``off`` there is nothing to ask: it reports healthy and says so. The settings are those of the
running kcoord, PID 1 in the container (the entrypoint execs it; ``KCOORD_HEALTHCHECK_PID`` names
another): its command line and environment read with kcoord's own parser, so ``docker run IMAGE serve
--processes 4`` is checked as four nodes, as ``KCOORD_PROCESSES=4`` is (under ``docker run --init``, the
init's child). Where there is no ``kcoord serve`` to read, the healthcheck's own environment is. No
curl: the image has none.
"""

import argparse
import os
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def readyz_url(listen: str, node: int = 0) -> str | None:
    """Where node ``node`` answers /readyz (None: the listener is off)."""
    if listen.strip().lower() in ("off", "none", "disabled"):  # kcoord's words for no listener
        return None
    host, _, port = listen.rpartition(":")
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "[::]": "[::1]"}.get(host, host)
    return f"http://{host}:{int(port) + node}/readyz"


def node_count(value: str) -> int:
    """``KCOORD_PROCESSES``: unset or empty is one process, as kcoord reads it (a bad value, which kcoord
    refuses to start with, is taken as one too)."""
    try:
        return max(1, int(value.strip() or "1"))
    except ValueError:
        return 1


def ask(url: str, timeout: float) -> tuple[bool, str]:
    """(ready, what was answered)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return True, resp.read().decode(errors="replace").strip()
    except urllib.error.HTTPError as err:  # 503: the body lists the partitions loading or failed
        return False, f"{url}: {err.code} {err.read().decode(errors='replace').strip()}"
    except (OSError, ValueError) as err:
        return False, f"{url}: {err}"


def serve_args(pid: int) -> list[str] | None:
    """The flags of ``kcoord serve`` if ``pid`` runs it: ``kcoord`` (or ``-m coordinator.cli``) right before
    ``serve``, not merely a ``serve`` somewhere (the entrypoint's shell before its exec, an init's argv,
    another program's arguments)."""
    argv = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    at = argv.index("serve") if "serve" in argv else 0
    return argv[at + 1:] if at and Path(argv[at - 1]).name in ("kcoord", "coordinator.cli") else None


def kcoord_serve(pid: int) -> tuple[int, list[str]] | None:
    """(pid, the flags of its ``kcoord serve``) for ``pid``, or under an init (``docker run --init``:
    docker-init or tini as PID 1) for its child that runs ``kcoord serve``; None when neither does."""
    if (flags := serve_args(pid)) is not None:
        return pid, flags
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            child = int(stat.parent.name)
            if int(stat.read_text().rpartition(")")[2].split()[1]) == pid and (flags := serve_args(child)) is not None:
                return child, flags
        except (OSError, ValueError, IndexError):  # gone meanwhile, or not ours to read
            continue
    return None


def running_settings(pid: int) -> tuple[str, int] | None:
    """(metrics listener, nodes) of the ``kcoord serve`` running as ``pid`` (or as its child), as it read
    them from its flags and its environment; None where there is none (or it cannot be read, or kcoord is
    not importable)."""
    try:
        found = kcoord_serve(pid)
        if found is None:
            return None
        pid, flags = found
        environ = dict(item.decode(errors="replace").split("=", 1)
                       for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in item)
        from coordinator.config import ConfigError, add_serve_arguments, config_from_args
    except (OSError, ImportError):
        return None
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    add_serve_arguments(parser)
    try:
        args, _ = parser.parse_known_args(flags)
        config = config_from_args(args, environ)
    except (argparse.ArgumentError, ConfigError, ValueError, SystemExit):  # kcoord refuses to start with these
        return None
    if config.metrics_listen is None or config.metrics_listen[1] == 0:  # port 0: each node's is the system's
        return "off", config.processes                                    # choice, nothing to ask
    host, port = config.metrics_listen
    return (f"[{host}]" if ":" in host else host) + f":{port}", config.processes


def main() -> int:
    running = running_settings(int(os.environ.get("KCOORD_HEALTHCHECK_PID") or "1"))
    if running is not None:
        listen, nodes = running
    else:
        listen = os.environ.get("KCOORD_METRICS_LISTEN") or "127.0.0.1:9404"  # empty is unset, as kcoord reads it
        nodes = node_count(os.environ.get("KCOORD_PROCESSES", ""))
    if readyz_url(listen) is None:
        print(f"metrics listener off ({listen}): nothing to check")
        return 0
    timeout = float(os.environ.get("KCOORD_HEALTHCHECK_TIMEOUT_S", "4"))
    try:
        urls = [str(readyz_url(listen, i)) for i in range(nodes)]
    except ValueError as err:
        print(f"metrics listener {listen!r}: {err}")
        return 1
    with ThreadPoolExecutor(max_workers=nodes) as pool:  # one thread each: all asked at once, however many
        answers = list(pool.map(lambda url: ask(url, timeout), urls))
    if nodes == 1:
        print(answers[0][1])
        return 0 if answers[0][0] else 1
    for i, (_, said) in enumerate(answers):
        print(f"node {i}: {said}")
    unready = [i for i, (ready, _) in enumerate(answers) if not ready]
    if unready:
        print(f"not ready: node{'s' if len(unready) > 1 else ''} {', '.join(map(str, unready))} of {nodes}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

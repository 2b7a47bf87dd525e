"""``kcoord serve --processes N``: cluster mode on one host in one command. One Python process does its
work on one core; N of them, each a node of a cluster (coordinator.cluster), use N. This process only
starts and watches them: node i listens on PORT+i (advertised as the advertised port + i), keeps its
data in DATA_DIR/node-i and serves metrics on METRICS_PORT+i (any free port for each, given 0); its log
lines carry ``node-i``.

A node that dies (kill -9, the OOM killer) is started again after a backoff (1 s, doubling to 30 s while
it keeps dying within a minute); its groups get errors clients retry meanwhile, the other nodes serve on.
A node refused at its first start (exit status 2: a setting or its data directory) stops them all with 2,
as a single process would; one refused when started again (its port taken meanwhile) is tried again, with
the backoff, while the others serve on. SIGTERM, SIGINT or SIGHUP stop every node (each finishes its pending writes
within --shutdown-timeout-ms) and the exit status is the worst of theirs. A node whose supervisor dies
gets SIGTERM from the kernel (PR_SET_PDEATHSIG), so no node outlives it unwatched.
"""

import ctypes
import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Callable
from typing import Any, Final

from coordinator.cluster import Node
from coordinator.config import Config
from coordinator.runtime import META_FILE, OFFSETS_TOPIC

log = logging.getLogger("kcoord")

RESTART_BACKOFF_S: Final = 1.0
MAX_BACKOFF_S: Final = 30.0
STABLE_AFTER_S: Final = 60.0  # a node that ran this long before dying starts again after the least backoff
PR_SET_PDEATHSIG: Final = 1
REFUSED: Final = 2


def node_configs(config: Config) -> list[Config]:
    """Each node's settings: the cluster of ``config.processes`` nodes on consecutive ports."""
    host, port = config.advertised
    nodes = tuple(Node(i, host, port + i) for i in range(config.processes))
    metrics = config.metrics_listen
    return [dataclasses.replace(config, processes=1, node_id=i, port=config.port + i, advertised_host=host,
                                advertised_port=port + i, cluster=nodes, data_dir=config.data_dir / f"node-{i}",
                                metrics_listen=None if metrics is None else (metrics[0], metrics[1] and metrics[1] + i))
            for i in range(config.processes)]


def _die_with_parent() -> None:
    """Linux: SIGTERM when the supervisor dies, whatever kills it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _node_main(run: Callable[[Config], int], config: Config, supervisor: int) -> None:
    """Forked with the stop signals blocked (Supervisor._start): none may run the supervisor's inherited
    handler here. Reset to the defaults, then unblocked: one already sent stops the node before it starts."""
    _die_with_parent()
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    if os.getppid() != supervisor or signal.sigpending() & set(STOP_SIGNALS):
        os._exit(0)  # the supervisor died before PR_SET_PDEATHSIG was set, or stops every node: nothing began
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    os._exit(run(config))  # as the single process's exit status; no interpreter teardown of the fork


class Supervisor:
    """Starts, watches and stops the nodes; ``run(config)`` is what one node runs (the CLI's server)."""

    def __init__(self, config: Config, run: Callable[[Config], int]) -> None:
        self.configs = node_configs(config)
        self._run = run
        self._context: Any = multiprocessing.get_context("fork")  # no thread runs yet: forking is safe
        self._procs: list[Any] = [None] * len(self.configs)
        self._started = [0.0] * len(self.configs)
        self._restarts = [0] * len(self.configs)  # starts after the first: a refusal then stops no other node
        self._backoff = [RESTART_BACKOFF_S] * len(self.configs)
        self._due: dict[int, float] = {}  # node -> when it starts again
        self._stopping = False

    def _start(self, i: int) -> None:
        proc = self._context.Process(target=_node_main, args=(self._run, self.configs[i], os.getpid()),
                                     name=f"kcoord-node-{i}")
        # Blocked from before the fork until the node is known to _stop_all: a stop arriving meanwhile
        # neither misses the new node here nor runs this process's handler in it (_node_main).
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            if self._stopping:  # a stop came between run()'s look at _stopping and the block: nothing would end it
                return
            proc.start()
            self._procs[i], self._started[i] = proc, time.monotonic()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def _stop_all(self, signum: int = signal.SIGTERM, frame: Any = None) -> None:
        if not self._stopping:
            log.info("stopping %d nodes", len(self._procs))
        self._stopping = True
        for proc in self._procs:
            if proc is not None and proc.exitcode is None:
                os.kill(proc.pid, signal.SIGTERM)

    def run(self) -> int:
        root = self.configs[0].data_dir.parent
        held = [p.name for p in (root / META_FILE, *root.glob(f"{OFFSETS_TOPIC}-*")) if p.exists()]
        if held:
            # One kcoord's own directory (a single process's, or a --cluster node's): the nodes would start
            # empty beside it, serving no offset.
            log.error("%s holds the offsets of one kcoord process (%s; a standalone one's or a --cluster node's): the "
                      "nodes of --processes keep theirs in %s/node-i and would serve none of them; give another "
                      "--data-dir (the offsets stay with that process: kcoord does not move partitions between "
                      "nodes)", root, held[0], root)
            return REFUSED
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._stop_all)
        log.info("cluster of %d nodes on one host: %s", len(self.configs), ", ".join(
            f"node {c.node_id} at {c.host}:{c.port} (data in {c.data_dir})" for c in self.configs))
        for i in range(len(self.configs)):
            self._start(i)
        worst = 0
        while True:
            running = [p for p in self._procs if p is not None and p.exitcode is None]
            if self._stopping and not running:
                return worst
            multiprocessing.connection.wait([p.sentinel for p in running], timeout=0.2)
            for i, proc in enumerate(self._procs):
                if proc is None or proc.exitcode is None:
                    continue
                self._procs[i] = None
                code = proc.exitcode
                if self._stopping:  # how the stop went; an end the node was restarted from is not one
                    worst = max(worst, 1 if code < 0 else code)
                    continue
                if code == REFUSED and not self._restarts[i]:  # a setting or a directory: wrong for every node
                    log.error("node %d was refused at its start (exit status 2): stopping every node", i)
                    self._stop_all()
                    worst = REFUSED
                    continue
                self._schedule_restart(i, code)
            now = time.monotonic()
            for i, due in list(self._due.items()):
                if self._stopping:
                    self._due.clear()
                elif now >= due:
                    del self._due[i]
                    self._restarts[i] += 1
                    self._start(i)

    def _schedule_restart(self, i: int, code: int) -> None:
        ran = time.monotonic() - self._started[i]
        if ran >= STABLE_AFTER_S:
            self._backoff[i] = RESTART_BACKOFF_S
        delay = self._backoff[i]
        self._backoff[i] = min(delay * 2, MAX_BACKOFF_S)
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        log.error("node %d ended (%s) after %.1f s: starting it again in %.0f s", i, how, ran, delay)
        self._due[i] = time.monotonic() + delay

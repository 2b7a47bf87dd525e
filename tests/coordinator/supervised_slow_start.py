"""A Supervisor of 2 nodes whose start (fork to the node's own signal handling) is slowed down, as on a
loaded host; each node then waits for a signal. Used by tests/coordinator/test_supervisor.py."""

import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

import coordinator.supervisor as supervisor
from coordinator.config import Config

real = supervisor._die_with_parent


def slow_die_with_parent() -> None:
    """The window between a node's fork and _node_main's resets, made 1.5 s for the nodes in SLOW_NODES."""
    if multiprocessing.current_process().name.rsplit("-", 1)[1] in os.environ.get("SLOW_NODES", "0,1").split(","):
        time.sleep(1.5)
    real()


def wait_for_signal(config: Config) -> int:
    Path(sys.argv[1], f"node-{config.node_id}.ran").write_text(str(os.getpid()))
    while True:
        signal.pause()


supervisor._die_with_parent = slow_die_with_parent
config = Config(processes=2, port=29311, data_dir=Path(sys.argv[1]))
sys.exit(supervisor.Supervisor(config, wait_for_signal).run())

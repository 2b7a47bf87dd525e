"""A Supervisor of 2 nodes whose start (fork to the node's own signal handling) is slowed down, as on a
loaded host; each node then waits for a signal. Used by tests/coordinator/test_supervisor.py."""

import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

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


class SlowForkOf:
    """The supervisor's fork context, its Process for node SLOW_FORK_OF made 1.5 s late: the window between
    run()'s look at whether it is stopping and _start blocking the stop signals, widened."""

    def __init__(self, real_context: Any, node: str) -> None:
        self.real_context, self.node = real_context, node

    def Process(self, **kwargs: Any) -> Any:  # multiprocessing's name
        if kwargs["name"].rsplit("-", 1)[1] == self.node:
            Path(sys.argv[1], "about-to-fork").write_text(self.node)
            time.sleep(1.5)
        return self.real_context.Process(**kwargs)


supervisor._die_with_parent = slow_die_with_parent
config = Config(processes=2, port=29311, data_dir=Path(sys.argv[1]))
watcher = supervisor.Supervisor(config, wait_for_signal)
if slow_fork := os.environ.get("SLOW_FORK_OF"):
    watcher._context = SlowForkOf(watcher._context, slow_fork)
sys.exit(watcher.run())

"""Which new connections the server takes: enough file descriptors stay free for the logs.

Every connection holds a descriptor, and so does every partition's active segment (opened when the
partition is first written), a compaction's files, a probe, the metrics listener's connections and,
in gateway mode, each client connection's upstream links; the metrics listener has a cap of its own
(``METRICS_MAX_CONNECTIONS``, kept in the reserve). A flood of connections that used up the
process's open-files limit would make the next segment roll or first write of a partition fail, and
that partition would go read-only. So a connection whose descriptor number is within
``fd_reserve(partitions)`` of the limit is closed at once (descriptors are handed out lowest first, so
the number is a count of what the process holds, upstream links included). ``--max-connections``
caps the client connections themselves, as Kafka's ``max.connections`` does; both refusals close the
new connection at once, which every client treats as a broken connection and retries after its
backoff, while the connections already open keep being served.

Kafka's broker instead stops accepting at its cap, leaving connections waiting in the listen backlog:
with a client's usual connect timeout that looks like a hung coordinator, and the refused client
learns nothing. An immediate close is what Kafka does for its per-address cap.
"""

import logging
import resource

from coordinator.logfmt import Repeated
from coordinator.metrics import AbortReason

log = logging.getLogger(__name__)

METRICS_MAX_CONNECTIONS = 32  # the metrics listener's open connections (coordinator.exporter)
FD_RESERVE_BASE = 64 + METRICS_MAX_CONNECTIONS  # the loop, the helper, the metrics listener, probes
FD_RESERVE_PER_PARTITION = 2  # the active segment, and a cleaner's or probe's file beside it
REFUSAL_LOG_INTERVAL_S = 60.0


def fd_reserve(partitions: int) -> int:
    return FD_RESERVE_BASE + FD_RESERVE_PER_PARTITION * partitions


class Admission:
    """The server's two caps, and a refusal logged once, then at most once a minute with a count
    (coordinator.logfmt.Repeated)."""

    def __init__(self, partitions: int, max_connections: int | None,
                 open_files_limit: int | None = None) -> None:
        if open_files_limit is None:
            open_files_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.max_connections = max_connections
        reserve = fd_reserve(partitions)
        unlimited = open_files_limit == resource.RLIM_INFINITY or open_files_limit < 0
        # Never below half the limit: with a tiny limit, serving some clients beats serving none.
        self.highest_fd = None if unlimited else max(open_files_limit - reserve, open_files_limit // 2)
        if not unlimited and open_files_limit - reserve < open_files_limit // 2:
            log.warning("the open-files limit (%d) is low for %d offsets partitions: connections are taken up "
                        "to descriptor %d, leaving fewer than the %d the logs may need; raise it (ulimit -n)",
                        open_files_limit, partitions, self.highest_fd, reserve)
        self._refusals = Repeated(log, REFUSAL_LOG_INTERVAL_S)

    def refusal(self, fd: int, open_connections: int) -> AbortReason | None:
        """Why a new connection on descriptor ``fd`` must be closed (a metric label), or None."""
        if self.max_connections is not None and open_connections >= self.max_connections:
            reason: AbortReason = "max_connections"
            why = f"{open_connections} client connections are open (--max-connections {self.max_connections})"
        elif self.highest_fd is not None and fd > self.highest_fd:
            reason = "file_descriptors"
            why = (f"its file descriptor ({fd}) is past {self.highest_fd}, the last one connections may take "
                   f"under the open-files limit (the rest are kept for the logs)")
        else:
            return None
        self._refusals.report(logging.WARNING, "closing a new connection at once: %s", why)
        return reason

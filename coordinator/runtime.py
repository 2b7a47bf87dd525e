"""All shards of this node: creation, independent loading, routing by group id, and shutdown."""

import asyncio
import contextlib
import errno
import json
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

from coordinator.checkpointer import Checkpointer
from coordinator.cluster import OFFSETS_TOPIC as OFFSETS_TOPIC  # re-exported: the modules above read it here
from coordinator.cluster import layout, layout_refusal, unrecorded_refusal
from coordinator.compaction import Compactor
from coordinator.config import Config
from coordinator.flusher import Flusher
from coordinator.groups.hooks import GroupHooks
from coordinator.metrics import Metrics
from coordinator.peercheck import PeerCheck
from coordinator.request import ShardUnavailable
from coordinator.shard import Shard
from coordinator.shardlifecycle import PROBE_INTERVAL_S
from coordinator.shardstate import ShardState
from coordinator.timers import Clock, SystemClock
from coordinator.writer import WriterThread
from protocol.errors import ErrorCode
from protocol.partitioning import partition_for
from storage.dirlock import DirectoryInUse, lock_directory
from storage.journal import JOURNAL_DIR, Journal, left_over
from storage.journalsync import JournalSync
from storage.log import PartitionLog
from storage.segments import fsync_path
from storage.sync import SYNCFS, make_sync
from storage.synchelper import SyncHelper

# Enum members as C variables, not class attributes (tests/protocol/test_compiled.py says why).
_SHARD_ACTIVE: Final = ShardState.ACTIVE
_SHARD_FAILED: Final = ShardState.FAILED
_SHARD_READ_ONLY: Final = ShardState.READ_ONLY
_ERR_NOT_COORDINATOR: Final = ErrorCode.NOT_COORDINATOR

log = logging.getLogger(__name__)

LogFactory = Callable[[Path, int], PartitionLog]  # tests pass one that injects faults
JournalFactory = Callable[[Path], Journal]  # likewise
META_FILE: Final = "kcoord.meta.json"
LOADER_THREADS: Final = 2


PARTITION_CACHE = 1 << 16  # group ids whose partition is remembered (cleared when full)


class ConfigMismatch(Exception):
    """The data directory cannot serve this start: written with another partition count (groups would
    re-hash and their offsets would be stranded; Kafka forbids this too, KAFKA-14418), its record of it
    damaged, in use by another process, or not a directory that can be created. The CLI exits 2."""


def check_data_dir(data_dir: Path, partitions: int, cluster: dict[str, object] | None = None) -> int | None:
    """Creates the data directory or checks the one there: not in use by another process (the
    returned descriptor holds its lock, storage.dirlock), writable, and holding the same partition
    count and, in cluster mode, the same partitions of it (both recorded in ``kcoord.meta.json``;
    ``cluster``: coordinator.cluster.layout)."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # mkdir's "File exists" would not say that it is a file
        raise ConfigMismatch(f"data directory {data_dir} (--data-dir / KCOORD_DATA_DIR) is a file, or lies under "
                             "one: give a directory") from None
    except OSError as refused:  # compiled: one name per exception type in a function
        raise ConfigMismatch(f"cannot create the data directory {data_dir} (--data-dir / KCOORD_DATA_DIR): "
                             f"{refused.strerror or refused}") from None
    try:
        lock = lock_directory(data_dir)
    except DirectoryInUse as exc:
        raise ConfigMismatch(f"data directory {exc}: two servers on one data directory overwrite each other's "
                             "logs; stop the other one first") from None
    try:
        _check_contents(data_dir, partitions, cluster)
    except BaseException:
        if lock is not None:
            os.close(lock)
        raise
    return lock


def _check_contents(data_dir: Path, partitions: int, cluster: dict[str, object] | None) -> None:
    meta = data_dir / META_FILE
    probe = data_dir / ".kcoord-write-probe"
    try:
        with open(probe, "wb") as f:
            f.write(b"\0")
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as exc:
        with contextlib.suppress(OSError):
            probe.unlink()
        if exc.errno in (errno.ENOSPC, errno.EDQUOT) and meta.exists():
            # A full disk is not a wrong setting: what is durable can still be served, read-only, and
            # every partition resumes writing by itself once space is freed.
            log.warning("data directory %s: %s; partitions serve reads only until space is freed", data_dir,
                        exc.strerror)
        else:
            raise ConfigMismatch(f"data directory {data_dir} is not writable ({exc.strerror}); "
                                 "kcoord needs to write its logs there") from exc
    if meta.exists():
        try:
            content = json.loads(meta.read_text())
            recorded = int(content["offsets_partitions"])
            if recorded < 1:  # no count kcoord writes: "start with 0" would be no advice
                raise ValueError(f"offsets_partitions is {recorded}, not a partition count")
            refusal = layout_refusal(content.get("cluster"), cluster, recorded)
        # compiled: not the OSError's name. OverflowError: a count of Infinity or 1e999 (json reads both as inf)
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as damaged:
            raise ConfigMismatch(f"{meta} is damaged ({damaged!r}); restore it or remove it to re-create it") \
                from damaged
        if recorded != partitions:
            raise ConfigMismatch(
                f"{data_dir} holds an offsets topic of {recorded} partitions; "
                f"--offsets-partitions {partitions} would re-map every group. Start with {recorded}."
            )
        if refusal is not None:
            raise ConfigMismatch(f"{data_dir} {refusal}")
        return
    nodes = sorted(p.parent.name for p in data_dir.glob(f"node-*/{META_FILE}"))
    if nodes:  # kcoord serve --processes N kept its nodes' offsets there: a start here would serve none
        raise ConfigMismatch(f"{data_dir} is the data directory of kcoord serve --processes (its nodes' offsets are "
                             f"in {', '.join(nodes)}): start it with --processes again, or give another --data-dir")
    # Only ``__consumer_offsets-N``: a Kafka directory copied in may carry ``-N.<id>-delete`` ones too.
    existing = [int(n) for p in data_dir.glob(f"{OFFSETS_TOPIC}-*")
                if p.is_dir() and (n := p.name.rsplit("-", 1)[1]).isdigit()]
    highest = max(existing, default=-1)
    if highest >= partitions:
        raise ConfigMismatch(f"{data_dir} has partition {highest}, beyond --offsets-partitions {partitions}")
    if len(existing) == highest + 1 > 1 and highest + 1 != partitions:
        # Every partition's directory is made at the first start, right after the meta file: a full set
        # without it still tells the count (more partitions re-map every group as surely as fewer). A
        # sparse set is logs placed by hand (a partition copied from Kafka, a benchmark's): allowed.
        raise ConfigMismatch(f"{data_dir} has no {META_FILE} but holds the logs of an offsets topic of "
                             f"{highest + 1} partitions; --offsets-partitions {partitions} would re-map every "
                             f"group. Start with {highest + 1}.")
    refusal = unrecorded_refusal(set(existing), partitions, cluster)
    if refusal is not None:
        raise ConfigMismatch(f"{data_dir} has no {META_FILE} and {refusal}")
    tmp = meta.with_suffix(".tmp")
    recorded_now: dict[str, object] = {"offsets_partitions": partitions}
    if cluster is not None:
        recorded_now["cluster"] = cluster
    with open(tmp, "w") as f:
        f.write(json.dumps(recorded_now) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, meta)
    fsync_path(data_dir)


class Runtime:
    """Owns the shards and the thread pools: one writer thread (every sync, probe, reopening and
    compaction swap; the flusher appends on the loop and makes all shards' pending batches durable
    together on it) and a small loader pool, so one huge partition loading does not hold up the
    others."""

    def __init__(self, config: Config, metrics: Metrics | None = None, clock: Clock | None = None,
                 log_factory: LogFactory = PartitionLog, journal_factory: JournalFactory = Journal) -> None:
        self.config = config
        self._partitions: dict[str, int] = {}
        self.group_config = config.groups()
        self.metrics = metrics or Metrics()
        self.clock: Clock = clock or SystemClock()
        self.shards: list[Shard] = []  # the partitions this node owns (every one but in cluster mode), ascending
        self.groups: list[GroupHooks] = []  # the group side of each shard
        # by partition: None where another node of the cluster coordinates its groups
        self._by_partition: list[Shard | None] = []
        self._groups_by_partition: list[GroupHooks | None] = []
        self._routes: tuple[list[Shard | None], list[GroupHooks | None]] = ([], [])
        self.peer_check: PeerCheck | None = None  # cluster mode
        self._peer_checks: asyncio.Task[None] | None = None
        # gateway mode: whether ListGroups on the listener of a node names kcoord's groups
        self.lists_groups: Callable[[int | None], bool] | None = None
        self._log_factory = log_factory
        self._journal_factory = journal_factory
        self._writer = WriterThread()
        self.flusher = Flusher(self._writer, make_sync(config.sync_mode), self.metrics,
                               SyncHelper() if config.sync_helper else None)
        self._loader = ThreadPoolExecutor(max_workers=LOADER_THREADS, thread_name_prefix="kcoord-loader")
        self._cleaner_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kcoord-cleaner")
        self.compactors: list[Compactor] = []
        self._loads: list[asyncio.Task[None]] = []
        self._cleaner: asyncio.Task[None] | None = None
        self._clean_soon = asyncio.Event()  # set by a shard's wake_cleaner (a failed write, a full disk)
        self._load_report: asyncio.Task[None] | None = None
        self._lock: int | None = None  # the data directory's lock, held until stopped (storage.dirlock)
        self.journal: Journal | None = None  # --sync-mode journal (storage.journal)
        self.checkpointer: Checkpointer | None = None
        self._checkpoints: asyncio.Task[None] | None = None

    def open(self) -> None:
        """Checks the data directory and creates every shard (INITIAL). Separate from ``start`` so a
        server can refuse to start (port in use) before anything is created on disk."""
        cfg = self.config
        self._lock = check_data_dir(cfg.data_dir, cfg.offsets_partitions, layout(cfg.node_id, cfg.cluster))
        if cfg.sync_mode == "journal":
            if SYNCFS is None:
                log.warning("--sync-mode journal needs syncfs (Linux 5.8+) for its checkpoints: using per-file "
                            "syncs instead")
            else:
                self.journal = self._journal_factory(cfg.data_dir)
                journal_sync = JournalSync(self.journal, SYNCFS)
                self.flusher.use_sync(journal_sync)
                self.checkpointer = Checkpointer(journal_sync, self.shards, cfg.checkpoint_interval_ms / 1000)
        if self.journal is None and (left := left_over(cfg.data_dir)):
            # Its batches may be all a power cut left of acknowledged commits; and a later start in
            # journal mode would write them over the logs again, taking back everything committed since.
            if self._lock is not None:
                os.close(self._lock)
                self._lock = None
            raise ConfigMismatch(
                f"{cfg.data_dir / JOURNAL_DIR} holds {left} batches that a --sync-mode journal run left (it did not "
                f"stop cleanly): start once with --sync-mode journal, which writes them into the logs (a clean stop "
                f"then leaves none), before running without the journal")
        self._by_partition = [None] * cfg.offsets_partitions
        self._groups_by_partition = [None] * cfg.offsets_partitions
        for p in range(cfg.offsets_partitions):
            if not cfg.owns(p):  # cluster mode: another node coordinates its groups (coordinator.cluster)
                continue
            plog = self._open_log(cfg.data_dir / f"{OFFSETS_TOPIC}-{p}", cfg.segment_bytes)
            shard = Shard(p, plog, self._writer, self.flusher, self._loader, self.metrics, self.clock, None,
                          self._open_log)
            groups = GroupHooks(shard, self.group_config, self.metrics)
            shard.hooks = groups
            shard.wake_cleaner = self._clean_soon.set
            self.shards.append(shard)
            self.groups.append(groups)
            self._by_partition[p] = shard
            self._groups_by_partition[p] = groups
            self.compactors.append(Compactor(shard, self._cleaner_thread, self.metrics))
        self._routes = (self._by_partition, self._groups_by_partition)
        if cfg.cluster:  # no group is coordinated until the peers are known to agree (coordinator.peercheck)
            self.peer_check = PeerCheck(cfg, self._route)
            self._route(False)

    def _route(self, agreed: bool) -> None:
        """Cluster mode: routes requests to this node's shards while its peers agree with its view of the
        cluster; otherwise every group gets NOT_COORDINATOR (swapped lists: nothing on the request path)."""
        if agreed:
            self._by_partition, self._groups_by_partition = self._routes
        else:
            self._by_partition = [None] * len(self._routes[0])
            self._groups_by_partition = [None] * len(self._routes[1])

    @property
    def coordinated(self) -> list[Shard]:
        """The shards whose groups this node coordinates now: none while cluster mode withholds them."""
        return self.shards if self._by_partition is self._routes[0] else []

    def _open_log(self, directory: Path, segment_bytes: int) -> PartitionLog:
        """The log factory's log, writing to the journal too when there is one."""
        plog = self._log_factory(directory, segment_bytes)
        if self.journal is not None:
            plog.journal = self.journal
            plog.partition = int(directory.name.rsplit("-", 1)[1])
        return plog

    def start(self) -> None:
        """Starts loading every shard and returns at once, so the server can listen (and answer
        COORDINATOR_LOAD_IN_PROGRESS) while they load."""
        if not self.shards:
            self.open()
        # Smallest logs first: many partitions become ACTIVE quickly while a big one is still loading.
        order = sorted(self.shards, key=lambda s: s.log.size_bytes)
        loop = asyncio.get_running_loop()
        self.flusher.start()
        self._loads = [s.start() for s in order]
        self._cleaner = loop.create_task(self._clean_periodically())
        if self.peer_check is not None:
            self._peer_checks = loop.create_task(self.peer_check.run())
        if self.checkpointer is not None:
            self._checkpoints = loop.create_task(self.checkpointer.run())
        self._load_report = loop.create_task(self._report_loaded(loop.time()))

    async def _report_loaded(self, started: float) -> None:
        await self.wait_loaded()
        states = self.states()
        log.info("all %d partitions loaded in %d ms (%d active, %d read-only, %d failed)", len(self.shards),
                 (asyncio.get_running_loop().time() - started) * 1000, states[_SHARD_ACTIVE],
                 states[_SHARD_READ_ONLY], states[_SHARD_FAILED])

    async def _clean_periodically(self) -> None:
        """Kafka's cleaner backoff: look at every partition each interval; each shard decides. Sooner (a
        second after, so the other partitions' probes and reloads have had a turn) once a partition's
        write fails, its log cannot be written for want of room, or its writes work again after
        failing: compaction is what gives a full disk room back, and writers filled freed room within
        seconds, long before the next pass (a fault campaign's find)."""
        while True:
            try:
                await asyncio.wait_for(self._clean_soon.wait(), self.config.log_cleaner_backoff_ms / 1000)
                await asyncio.sleep(PROBE_INTERVAL_S)
            except TimeoutError:
                pass
            self._clean_soon.clear()
            for compactor in self.compactors:
                try:
                    await compactor.compact(self.config.delete_retention_ms)
                except Exception:  # one partition's trouble must not stop cleaning the others
                    log.exception("partition %d: compaction failed", compactor.shard.partition)

    def partition_of(self, group_id: str) -> int:
        """Group ids repeat on every commit, and the Java hash in Python showed up in profiles (bench/).
        A dict of str to int, not an lru_cache: its key tuples and list nodes were ~130k tracked objects
        for a 100k-group fetch, which the collector then scanned for ~45 ms on the loop."""
        cache = self._partitions
        partition = cache.get(group_id)
        if partition is None:
            if len(cache) >= PARTITION_CACHE:
                cache.clear()
            partition = cache[group_id] = partition_for(group_id, self.config.offsets_partitions)
        return partition

    def shard_for(self, group_id: str) -> Shard:
        """The shard of ``group_id``; ShardUnavailable(NOT_COORDINATOR) where another node owns it."""
        return self.shard_at(self.partition_of(group_id))

    def shard_at(self, partition: int) -> Shard:
        shard = self._by_partition[partition]
        if shard is None:
            raise ShardUnavailable(_ERR_NOT_COORDINATOR)
        return shard

    def groups_for(self, group_id: str) -> GroupHooks:
        groups = self._groups_by_partition[self.partition_of(group_id)]
        if groups is None:
            raise ShardUnavailable(_ERR_NOT_COORDINATOR)
        return groups

    async def wait_loaded(self) -> None:
        await asyncio.gather(*self._loads)

    def states(self) -> dict[ShardState, int]:
        counts = {s: 0 for s in ShardState}
        for shard in self.shards:
            counts[shard.state] += 1
        return counts

    async def stop(self, deadline: float) -> bool:
        """Closes every shard by ``deadline`` (event-loop time): pending batches get until then to
        become durable; then the threads are released without waiting for a stuck one. False if one
        was stuck."""
        if self._cleaner is not None:
            self._cleaner.cancel()
        if self._checkpoints is not None:
            self._checkpoints.cancel()
        if self._peer_checks is not None:
            self._peer_checks.cancel()
        for compactor in self.compactors:
            compactor.stop()
        closed = await asyncio.gather(*(s.close(deadline) for s in self.shards))
        checkpointed = await self._checkpoint_ended(deadline)
        for task in self._loads:
            task.cancel()
        self._cleaner_thread.shutdown(wait=False, cancel_futures=True)  # a running clean stops at its next batch
        self._writer.shutdown(wait=False, cancel_futures=True)
        if self.checkpointer is not None:
            self.checkpointer.close()
        if not checkpointed:  # its thread still uses the journal and the directory: the process is about to end
            return False
        self.flusher.close()
        self._loader.shutdown(wait=False, cancel_futures=True)
        if self.journal is not None:
            # Every log synced and holding its journal batches, and its recovery point recorded: the journal
            # has nothing they lack (its synced ends were the only record of a log's synced tail when a
            # close could not record the recovery point, a full disk: a review's find).
            self.journal.close(remove=all(closed) and all(
                s.log.recovered and s.log.synced_offset == s.log.durable_offset and s.log.claim_recorded()
                for s in self.shards))
        if self._lock is not None and all(closed):  # a stuck write keeps it: the process is about to end
            os.close(self._lock)
            self._lock = None
        return all(closed)

    async def _checkpoint_ended(self, deadline: float) -> bool:
        """Waits until ``deadline`` for a checkpoint under way at the stop to end (coordinator.checkpointer:
        its thread renames and deletes journal segments); False if it has not."""
        task = self._checkpoints
        if task is None or task.done():
            return True
        done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - asyncio.get_running_loop().time()))
        if not done:
            log.error("a checkpoint's sync was still under way at the stop's deadline: exiting without it (the "
                      "journal keeps what it had not synced)")
        return bool(done)

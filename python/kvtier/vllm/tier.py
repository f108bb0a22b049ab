"""``kvtier.vllm.FsTier``: a secondary tier for vLLM's tier manager, on
vLLM's own file-system layout, with lookups, stores and loads run natively.

vLLM loads it with no patch, from its tier config::

    "secondary_tiers": [{"type": "FsTier", "module_path": "kvtier.vllm",
                         "root_dir": "/mnt/kv-cache"}]

It takes the settings of vLLM's own fs tier (``root_dir``,
``n_read_threads``, ``n_write_threads``, ``enable_kv_events``,
``locality``), and writes and reads the same files, so vLLM's fs tier and
this one share a directory. The directory is vLLM's: the tier builds the
``FileMapper`` of the vLLM that runs it and checks, at construction, that
kvtier's layout names every block as that ``FileMapper`` does.

- Lookups: kvtier's native prober (``Lookup.vllm_fs``); ``tier.lookup`` is
  the native call itself, answering vLLM's ``LookupResult`` members.
- Stores and loads: ``kvtier._native.VllmTransfers``, native I/O threads
  that copy between the primary tier's memory (through the buffer
  protocol) and vLLM's raw block files, without the GIL. Loads are served
  first by the read threads; a load stops at its first bad block, keeps the
  blocks before it (``successful_keys``) and marks only the failed tail a
  miss; a short (damaged) file is removed.
- Completion: ``get_finished_jobs`` polls without blocking; every job is
  reported exactly once, after its I/O no longer touches the primary
  memory (kvtier's save core keeps that books).

Needs vLLM (0.32 or later); the rest of ``kvtier.vllm`` does not.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    make_offload_key,
)
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector
from vllm.v1.kv_offload.tiering.base import (
    JobResult,
    RequestOffloadingContext,
    ScheduleEndContext,
    SecondaryTierManager,
    TransferJob,
)

from .._native import Lookup, VllmTransfers, check_settings, vllm_block_path
from ._layout import check_root_dir, rank_dir_of
from ._lookup import AsyncLookupManager
from ._transfers import open_transfers
from .metrics import Figures, lookup_figures, metric_definitions
from .regions import remove_orphaned_regions_once

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
        OffloadingConnectorStats,
    )
    from vllm.v1.kv_offload.base import OffloadingMetricMetadata, OffloadingSpec

logger = logging.getLogger("kvtier.vllm")

__all__ = ["FsTier"]



# Keys whose paths the construction-time layout check compares: one-, two-
# and many-byte hashes (the fan-out slices differently) in several groups.
_LAYOUT_PROBES = (
    (b"\x01", 0),
    (b"\xab\xcd", 7),
    (bytes(range(32)), 2**32 - 1),
    (b"\xff" * 16, 1),
)


class _Pool:
    """``_pool``: a read-only view of the native I/O threads, in the shape
    of vLLM's ``DualQueueThreadPool`` (queued loads and stores, threads)."""

    class _Queue:
        def __init__(self, transfers: VllmTransfers, loads: bool) -> None:
            self._transfers, self._loads = transfers, loads

        def __len__(self) -> int:
            loads, stores = self._transfers.queued()
            return loads if self._loads else stores

    class _Thread:
        def __init__(self, transfers: VllmTransfers, index: int) -> None:
            self._transfers, self._index = transfers, index

        def is_alive(self) -> bool:
            return self._index < self._transfers.threads_alive

    def __init__(self, transfers: VllmTransfers, threads: int) -> None:
        self._load_q = self._Queue(transfers, loads=True)
        self._store_q = self._Queue(transfers, loads=False)
        self._threads = [self._Thread(transfers, i) for i in range(threads)]


class FsTier(SecondaryTierManager):
    """vLLM's file-system secondary tier, natively (see the module's docs).

    Arguments after ``tier_type`` are those of vLLM's
    ``FileSystemTierManager``, plus ``lookup_concurrency`` (lookup groups
    probed at once, default 4), ``lookup_timeout`` (seconds a group's
    probe may take before its keys are misses, default 2; ``None``: no
    limit), ``shutdown_grace`` (seconds that stores still queued at
    ``shutdown()`` get to start, default 2; see ``shutdown``) and
    ``stale_temp_age`` (at start, temporary block files left by writers
    that died mid-store and older than this many seconds are swept in the
    background, default 600: younger ones may be another live engine's;
    ``None``: no sweep).

    ``capacity_bytes`` bounds the bytes of the tier's block files (default
    ``None``: unbounded, as vLLM's fs tier). With a budget the tier scans
    its directory at start (the newest blocks that fit are kept, older ones
    deleted, stale temporary files swept), every store first makes room by
    evicting blocks (``eviction_policy``: ``"lru"``, the default, or
    ``"s3fifo"``), a store that cannot get room fails as a job (nothing is
    lost; the block is computed again when needed), and loads pin their
    blocks. Each step the lookups learn which blocks were stored and which
    evicted (a hit whose block was evicted becomes a miss before any load
    is tried; a store that completes while a lookup's probe is running
    makes it a hit, whatever the probe answers later), and evictions are
    ``removed`` KV events. A block deleted by another process is still
    found by its failed load, and only the failed tail is marked a miss.

    Engines sharing one directory (or an engine and ``kvtier trim``) each
    keep their own books; ``rescan_interval`` (seconds, default ``None``:
    never) reconciles them with the directory on a thread: blocks the others
    wrote are counted, blocks they deleted forgotten (the lookups learn of
    both), and blocks over the budget deleted, so the directory stays within
    ``capacity_bytes`` plus what the engines write in about one interval.
    ``capacity_stats()``
    gives the counters (resident and reserved bytes, evictions, refusals,
    ENOSPC, startup trims)::

        {"type": "FsTier", "module_path": "kvtier.vllm", "root_dir": "/mnt/kv",
         "capacity_bytes": 50 * 2**30}
    """

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: "OffloadingSpec",
        primary_kv_view: memoryview,
        tier_type: str,
        root_dir: str,
        n_read_threads: int = 16,
        n_write_threads: int = 16,
        enable_kv_events: bool = False,
        locality: Optional[str] = None,
        backpressure_detector: Optional[BackpressureDetector] = None,
        lookup_concurrency: int = 4,
        lookup_timeout: Optional[float] = 2.0,
        shutdown_grace: float = 2.0,
        stale_temp_age: Optional[float] = 600.0,
        capacity_bytes: Optional[int] = None,
        eviction_policy: Optional[str] = None,
        rescan_interval: Optional[float] = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        # Every setting is checked first, by kvtier's one set of rules, and
        # before anything on disk changes: a bad one leaves the directory as
        # it was and starts no thread.
        settings = {
            "n_read_threads": n_read_threads,
            "n_write_threads": n_write_threads,
            "lookup_concurrency": lookup_concurrency,
            "lookup_timeout": lookup_timeout,
            "shutdown_grace": shutdown_grace,
            "stale_temp_age": stale_temp_age,
            # guard: N8-capacity-bytes-reaches-the-tier
            "capacity_bytes": capacity_bytes,
            "eviction_policy": eviction_policy,
            # guard: N13-rescan-interval-reaches-the-tier
            "rescan_interval": rescan_interval,
        }
        # guard: N14-settings-are-checked-before-the-scan
        settings = check_settings(settings)
        self._shutdown_grace = settings["shutdown_grace"]
        root_dir = check_root_dir(root_dir)
        self._closed = False
        # Blocks whose load failed and whose lookups were marked a miss.
        self._load_failures = 0
        self.locality = Locality(locality) if locality is not None else None
        self.events: Optional[list[OffloadingEvent]] = None
        if enable_kv_events:
            if offloading_spec.kv_events_config.enable_kv_cache_events:
                self.events = []
            else:
                logger.warning(
                    "enable_kv_events is set on tier %r but KV cache events are disabled "
                    "globally; the tier emits no events",
                    tier_type,
                )
        # vLLM's own mapper, with the arguments vLLM's fs tier gives it, so
        # the directory is the one vLLM's fs tier uses for this run.
        self.file_mapper = FileMapper.from_offloading_spec(
            root_dir=root_dir,
            offloading_spec=offloading_spec,
            blocks_per_file=offloading_spec.blocks_per_chunk,
            parallel_agnostic=True,
        )
        rank_dir = rank_dir_of(self.file_mapper.base_path, self.file_mapper.rank)
        # The layout is checked before anything on disk changes too.
        _check_layout(self.file_mapper, rank_dir)
        # guard: N14-settings-are-checked-before-the-scan
        lookup = Lookup.vllm_fs(
            rank_dir, concurrency=settings["lookup_concurrency"], group_timeout=settings["lookup_timeout"]
        )
        try:
            # With a budget, the scan at construction sweeps the stale
            # temporary files; without one they are swept in the background
            # (all of them are kept when stale_temp_age is None).
            self._transfers = open_transfers(
                rank_dir,
                primary_kv_view,
                load_threads=settings["n_read_threads"],
                store_threads=settings["n_write_threads"],
                settings=settings,
            )
        # guard: N14-settings-are-checked-before-the-scan
        except BaseException:
            lookup.shutdown()
            raise
        _write_run_config(self.file_mapper)
        # The lookups learn of every store and deletion (see _settle_changes).
        # guard: N11-the-tier-records-its-changes
        self._transfers.record_changes(True)
        if settings["capacity_bytes"] is not None:
            report = self._transfers.scan_report()
            logger.info(
                "tier %r: %d bytes budget, %d blocks (%d bytes) found, %d trimmed, %d stale temporary "
                "files swept, in %.2f s",
                tier_type,
                settings["capacity_bytes"],
                report["blocks"],
                report["bytes"],
                report["trimmed"],
                report["swept"],
                report["seconds"],
            )
            if report["failed"]:
                logger.warning(
                    "tier %r: %d files the startup scan meant to delete could not be deleted: they stay on disk",
                    tier_type,
                    report["failed"],
                )
        # guard: N3-the-native-lookup-answers-vllms-verdicts
        lookup.set_verdicts(LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY)
        # The groups' times to verdict, for /metrics (see get_stats).
        lookup.time_verdicts(True)
        self._figures = Figures(tier_type)
        self._lookup_manager = AsyncLookupManager(tier_type, lookup=lookup)
        # The scheduler calls the native lookup itself: no Python frame, no
        # translation of its answer.
        self.lookup = lookup.lookup  # type: ignore[method-assign]
        # Buffered I/O: kvtier's transfers do not use O_DIRECT.
        self._use_o_direct = False
        self._pool = _Pool(self._transfers, settings["n_read_threads"] + settings["n_write_threads"])
        # What engines killed at SIGTERM left in /dev/shm (see regions.py).
        remove_orphaned_regions_once()

    # The scheduler's calls.

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:  # type: ignore[override]
        """HIT, MISS or RETRY (next step); replaced per instance by the
        native call, which answers the same."""
        return self._lookup_manager.native.lookup(key, req_context)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookup_manager.cleanup(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookup_manager.flush()

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._transfers.submit_store(job_metadata.job_id, job_metadata.keys, job_metadata.chunk_ids)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._transfers.submit_load(job_metadata.job_id, job_metadata.keys, job_metadata.chunk_ids)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        """The jobs done since the last call, each once; a failed load keeps
        the blocks before its first bad one and marks the rest a miss."""
        results = []
        totals = self._figures.totals
        for job_id, is_load, success, keys, done, seconds in self._transfers.finished():
            transfer_bytes = len(keys) * self.block_size_bytes if keys else None
            moved = len(keys) if success else done
            if is_load:
                totals["load_bytes"] += moved * self.block_size_bytes
                totals["load_failures"] += len(keys) - moved
            else:
                totals["store_bytes"] += moved * self.block_size_bytes
                totals["store_failures"] += len(keys) - moved
            successful_keys = None
            if is_load and not success:
                # A request needs its blocks as a prefix: from the first bad
                # block on, the blocks are recomputed, so their lookups miss
                # (after shutdown there are no lookups left to correct, and
                # the closed lookup would cut the report short).
                # guard: N6-no-miss-marked-after-shutdown
                if not self._closed:
                    self._load_failures += len(keys) - done
                    # guard: N1-a-failed-load-gives-up-only-its-tail
                    self._lookup_manager.mark_miss(keys[done:])
                # guard: N1-a-failed-load-keeps-its-leading-blocks
                successful_keys = tuple(keys[:done]) or None
            # guard: N2-events-only-for-stores-that-succeeded
            elif success and keys and not is_load and self.events is not None:
                self.events.append(
                    OffloadingEvent(keys=keys, medium=self.medium, removed=False, locality=self.locality)
                )
            results.append(
                JobResult(
                    job_id=job_id,
                    success=success,
                    successful_keys=successful_keys,
                    transfer_time=seconds,
                    transfer_bytes=transfer_bytes,
                )
            )
        self._settle_changes()
        return results

    def _settle_changes(self) -> None:
        """Tells the lookups which blocks the transfers stored and which the
        budget deleted, in the order it happened; a deletion is also a
        ``removed`` event for vLLM's KV events."""
        changes = self._transfers.take_changes()
        # guard: N9-no-settle-after-shutdown
        if not changes or self._closed:
            return
        run: list[OffloadKey] = []
        present = changes[0][1]
        for key, now in changes:
            if now != present:
                self._settle_run(run, present)
                run, present = [], now
            run.append(key)
        self._settle_run(run, present)

    def _settle_run(self, keys: list[OffloadKey], present: bool) -> None:
        self._lookup_manager.settle(keys, present)
        # guard: N10-evictions-are-removed-events
        if not present and self.events is not None:
            self.events.append(OffloadingEvent(keys=keys, medium=self.medium, removed=True, locality=self.locality))

    def capacity_stats(self) -> Optional[dict[str, int]]:
        """The byte budget's counters and gauges (``None`` without
        ``capacity_bytes``)."""
        return self._transfers.capacity_stats()

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        """kvtier's figures for vLLM's Prometheus endpoint (see
        ``kvtier.vllm.metrics``): the budget, the lookups, the transfers."""
        return metric_definitions()

    def get_stats(self) -> Optional[OffloadingConnectorStats]:
        """The figures' changes since the last report (vLLM's tier manager
        asks every step)."""
        figures = self._figures
        if self._closed:
            return figures.report()
        lookups, seconds = lookup_figures(self._lookup_manager.native)
        return figures.report(self._transfers.capacity_stats(), lookups, seconds)

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events is not None:
            yield from self.events
            self.events.clear()

    def drain_jobs(self) -> None:
        """Blocks (without the GIL) until no transfer touches the primary
        memory; the results come with the next ``get_finished_jobs``."""
        self._transfers.drain()

    def shutdown(self) -> None:
        """Stops the lookups and the transfers, and lets go of the primary
        tier's memory, so vLLM's primary tier can release it next.

        vLLM calls this without draining the tier first. Stores still
        queued get ``shutdown_grace`` seconds to start, so the blocks an
        engine was writing as it stopped reach the directory for the next
        engine; those still queued after it, and every queued load (nobody
        will use its blocks), are dropped, logged with their count, and
        reported as failed by a later ``get_finished_jobs``. Running
        transfers finish. A dropped store loses nothing but a cache entry:
        no partial file is left, and the block is computed again. The wait
        is bounded by the grace plus the longest single transfer. The
        default grace fits inside the 5 s vLLM gives its engine processes
        after SIGTERM before it kills them; raise it with vLLM's own
        shutdown timeout."""
        # A second shutdown (vLLM's tests shut a tier down, then their
        # fixture does again) finds the lookup closed: nothing to report.
        # guard: N12-only-the-first-shutdown-reports
        if not self._closed:
            stats = self._lookup_manager.native.stats()
            logger.info(
                "tier %r: the stores and deletions the tier saw settled %d lookups as hits and %d as "
                "misses; %d blocks failed to load",
                self.tier_type,
                stats["settled_hits"],
                stats["settled_misses"],
                self._load_failures,
            )
            capacity = self._transfers.capacity_stats()
            if capacity is not None and capacity["reconciles"]:
                logger.info(
                    "tier %r: %d reconciles with the directory adopted %d blocks other processes wrote "
                    "and forgot %d they deleted",
                    self.tier_type,
                    capacity["reconciles"],
                    capacity["adopted"],
                    capacity["forgotten"],
                )
        self._closed = True
        self._lookup_manager.shutdown()
        loads, stores = self._transfers.shutdown(self._shutdown_grace)
        self._figures.totals["shutdown_dropped"] += loads + stores
        if loads or stores:
            logger.warning(
                "tier %r shut down with %d queued stores (after a %.1f s grace) and %d "
                "queued loads dropped",
                self.tier_type,
                stores,
                self._shutdown_grace,
                loads,
            )

    # Read-only views, in the shape of vLLM's fs tier's private state.

    @property
    def _store_job_keys(self) -> dict[int, list[OffloadKey]]:
        """Store jobs in flight and their keys, while events are on (as
        vLLM's fs tier keeps them)."""
        if self.events is None:
            return {}
        return {job_id: keys for job_id, is_load, keys in self._transfers.in_flight() if not is_load}

    def __repr__(self) -> str:
        return f"FsTier({self.tier_type!r}, {self._transfers!r})"


def _write_run_config(file_mapper: FileMapper) -> None:
    """Writes the run's settings next to its blocks, as vLLM's fs tier does
    (the same file, so either tier can create it)."""
    config_path = file_mapper.get_config_file_path()
    os.makedirs(os.path.dirname(config_path), exist_ok=True)
    if not os.path.exists(config_path):
        with open(config_path, "w") as f:
            json.dump(file_mapper.get_run_config(), f, indent=2, sort_keys=True)


def _check_layout(file_mapper: FileMapper, rank_dir: str) -> None:
    """Refuses to run when kvtier's layout and the running vLLM's disagree:
    the tier would look for, and write, blocks where vLLM does not."""
    for block_hash, group in _LAYOUT_PROBES:
        key = make_offload_key(block_hash, group)
        ours, theirs = os.fspath(vllm_block_path(rank_dir, key)), file_mapper.get_file_name(key)
        # guard: N4-a-layout-vllm-does-not-share-is-refused
        if os.path.normpath(ours) != os.path.normpath(theirs):
            raise RuntimeError(
                f"kvtier's vLLM layout names block {key.hex()} {ours!r} where this vLLM "
                f"names it {theirs!r}: this vLLM's fs layout is not one kvtier knows"
            )


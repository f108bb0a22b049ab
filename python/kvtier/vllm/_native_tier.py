"""The part of kvtier's vLLM secondary tiers that does not depend on where
the blocks are: ``NativeTier`` answers vLLM's tier manager from a native
lookup (``kvtier._native.Lookup``) and native transfers
(``kvtier._native.VllmTransfers``), whichever directory or bucket they were
opened on (``FsTier``, ``ObjectTier``).

- Lookups: ``tier.lookup`` is the native call itself, answering vLLM's
  ``LookupResult`` members.
- Stores and loads: native I/O threads copy between the primary tier's
  memory (through the buffer protocol) and the tier, without the GIL. A
  load stops at its first bad block, keeps the blocks before it
  (``successful_keys``) and marks only the failed tail a miss.
- Completion: ``get_finished_jobs`` polls without blocking; every job is
  reported exactly once, after its I/O no longer touches the primary
  memory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
)
from vllm.v1.kv_offload.tiering.base import (
    JobResult,
    RequestOffloadingContext,
    ScheduleEndContext,
    SecondaryTierManager,
    TransferJob,
)

from .._native import Lookup, VllmTransfers
from ._lookup import AsyncLookupManager
from .metrics import Figures, lookup_figures, metric_definitions
from .regions import remove_orphaned_regions_once

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
        OffloadingConnectorStats,
    )
    from vllm.v1.kv_offload.base import OffloadingMetricMetadata, OffloadingSpec

logger = logging.getLogger("kvtier.vllm")


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



class NativeTier(SecondaryTierManager):
    """A secondary tier whose lookups and transfers are native (see the
    module's docs). A subclass checks its settings, opens its lookup and
    transfers, and hands them to ``_adopt``."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def _init_events(
        self, offloading_spec: "OffloadingSpec", tier_type: str, enable_kv_events: bool, locality: Optional[str]
    ) -> None:
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

    def _adopt(self, tier_type: str, lookup: Lookup, transfers: VllmTransfers, threads: int) -> None:
        """Takes the opened lookup and transfers: changes recorded for the
        lookups, vLLM's verdicts, the figures, the pool's view."""
        self._transfers = transfers
        # The lookups learn of every store and deletion (see _settle_changes).
        # guard: N11-the-tier-records-its-changes
        self._transfers.record_changes(True)
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
        self._pool = _Pool(self._transfers, threads)
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
                "tier %r: lookups answered %d hits and %d misses; %d groups timed out, %d failed, "
                "%d lookups overdue",
                self.tier_type,
                stats["hits"],
                stats["misses"],
                stats["timeouts"],
                stats["backend_errors"],
                stats["deadline_misses"],
            )
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
            totals, block = self._figures.totals, max(1, self.block_size_bytes)
            logger.info(
                "tier %r: loaded %d blocks (%d failed) and stored %d (%d failed)",
                self.tier_type,
                totals["load_bytes"] // block,
                totals["load_failures"],
                totals["store_bytes"] // block,
                totals["store_failures"],
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


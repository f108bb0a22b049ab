"""The connector's worker side: one per rank (a separate process from the
scheduler's in a real engine).

Each step it takes the scheduler's metadata: the step in kvtier's
sequence-checked wire form (``SaveStep``), the blocks to dump and the
blocks to load. The save core (``SaveTracker``) keeps the books: a
preemption waits only for the preempted requests' dumps, a finished
request is reported in ``finished_sending`` once, after every dump that
reads its blocks ended (whether it succeeded or failed), and each step
closes with a ``WorkerReport`` the scheduler side aggregates.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional

from .._native import SaveStep, SaveTracker
from ._conn_common import ConnectorSettings, StorageConnectorMetadata, StorageWorkerMetadata
from ._dumps import DumpEngine
from .metrics import Figures

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("kvtier.vllm")


class WorkerSide:
    """The worker side of ``StorageConnector`` (see the module's docs)."""

    def __init__(self, settings: ConnectorSettings, rank: int) -> None:
        self.settings = settings
        self.rank = rank
        # guard: K5-blocking-save-waits-for-its-dumps
        self.blocking = settings.blocking_save
        self.tracker = SaveTracker()
        self.engine: Optional[DumpEngine] = None
        self._meta: Optional[StorageConnectorMetadata] = None
        self._step: Optional[SaveStep] = None
        self._begun: Optional[int] = None
        self._forgotten: set[str] = set()
        self._load_errors: set[int] = set()
        self._failed_keys: list[bytes] = []
        self._reports: list[bytes] = []
        self._step_dumps: list[Any] = []
        self.figures = Figures(f"connector_r{rank}")

    def attach(self, tensors: list[tuple["torch.Tensor", int]], groups: list[list[tuple[int, int]]]) -> None:
        """Takes the KV cache (``register_kv_caches``)."""
        # guard: K11-the-connectors-budget-reaches-its-transfers
        # guard: K14-rescan-interval-reaches-the-dumps
        self.engine = DumpEngine(
            self.settings.rank_dir(self.rank),
            tensors,
            groups,
            staging_bytes=self.settings.staging_bytes,
            copy_threads=self.settings.copy_threads,
            io_threads=self.settings.io_threads,
            stale_temp_age=self.settings.stale_temp_age,
            capacity_bytes=self.settings.capacity_bytes,
            eviction_policy=self.settings.eviction_policy,
            rescan_interval=self.settings.rescan_interval,
            target=self.settings.target,
            index=self.settings.index,
            index_lease=self.settings.index_lease,
            # The scheduler's lookups probe rank 0's directory: its changes
            # settle them (see worker_meta).
            # guard: K12-rank-0-records-its-changes
            record_changes=self.rank == 0,
        )
        logger.info(
            "kvtier connector worker %d: %d KV tensors, %d bytes per block, %d staging slots",
            self.rank,
            len(tensors),
            self.engine.cell_bytes,
            self.engine.dump_slots_total,
        )

    def _begin(self, meta: StorageConnectorMetadata) -> None:
        """Takes the step once (whichever of ``handle_preemptions`` and
        ``bind_connector_metadata`` comes first): fences the preempted
        requests' dumps, records the step's dumping requests."""
        step = SaveStep.decode(meta.step)
        if self._begun == step.step:
            return
        self._forgotten.update(meta.forget)
        self._poll()
        self.tracker.begin_step(step)
        self._step, self._begun = step, step.step

    # vLLM's calls, in the order a step makes them.

    def handle_preemptions(self, meta: StorageConnectorMetadata) -> None:
        self._begin(meta)

    def bind(self, meta: StorageConnectorMetadata) -> None:
        self._begin(meta)
        self._meta = meta

    def start_load_kv(self) -> None:
        """Loads the step's blocks into the KV cache and waits for them:
        the forward pass that follows reads them."""
        meta, engine = self._meta, self.engine
        if meta is None or engine is None:
            return
        for _req_id, keys, blocks in meta.loads:
            result = engine.load(keys, blocks)
            if result.failed_blocks:
                # guard: K4-failed-loads-are-reported
                self._load_errors.update(result.failed_blocks)
                self._failed_keys.extend(result.failed_keys)

    def wait_for_save(self) -> None:
        """Submits the step's dumps and returns without waiting for them
        (``blocking_save``: waits, vLLM's synchronous reference)."""
        meta, engine = self._meta, self.engine
        if meta is None:
            return
        dumps = []
        for req_id, keys, blocks in meta.saves:
            if engine is None or engine.closed:
                self.tracker.submit_failed([req_id], "the connector has no KV cache to dump")
                continue
            limit = engine.max_dump_blocks
            for start in range(0, len(keys), limit):
                try:
                    dump = engine.dump(keys[start : start + limit], blocks[start : start + limit])
                except Exception as error:
                    self.tracker.submit_failed([req_id], str(error))
                    continue
                self.tracker.submit(dump, [req_id])
                dumps.append(dump)
        if self.blocking:
            for dump in dumps:
                if engine is not None:
                    engine.wait(dump)
        self._poll()

    def get_finished(self) -> set[str]:
        """The step's close: requests whose dumps all ended, each once."""
        self._poll()
        step = self._step
        if step is None:
            return set()
        report = self.tracker.finish_step(self.rank, step)
        self._step = None
        self._reports.append(report.encode())
        finished = set(report.finished)
        # Requests whose finish vLLM never announced to the connector (a
        # wrapper that did not forward request_finished): their blocks were
        # freed already, and vLLM knows no such request any more.
        # guard: K6-unannounced-finishes-are-not-reported
        gone = finished & self._forgotten
        self._forgotten -= gone
        return finished - gone

    def load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def worker_meta(self) -> Optional[StorageWorkerMetadata]:
        changes = self.engine.take_changes() if self.engine is not None else []
        if not self._reports and not self._failed_keys and not changes:
            return None
        meta = StorageWorkerMetadata(
            reports=self._reports,
            failed_keys=self._failed_keys,
            changed_keys=[key for key, _ in changes],
            changed_present=[present for _, present in changes],
        )
        self._reports, self._failed_keys = [], []
        return meta

    def clear(self) -> None:
        self._meta = None

    def _poll(self) -> None:
        if self.engine is not None:
            self.engine.pump()
        self.tracker.poll()

    def report_figures(self) -> Any:
        """kvtier's figures for vLLM's /metrics (see ``kvtier.vllm.metrics``):
        the dumps, the loads and the rank's budget."""
        engine, figures = self.engine, self.figures
        if engine is None:
            return None
        stats, cell = engine.stats, engine.cell_bytes
        figures.totals.update(
            store_bytes=stats["dumped_blocks"] * cell,
            store_failures=stats["dump_failed_blocks"],
            load_bytes=stats["loaded_blocks"] * cell,
            load_failures=stats["load_failed_blocks"],
        )
        return figures.report(engine.capacity_stats())

    def shutdown(self) -> None:
        """Bounded: copies in flight finish, their writes get
        ``shutdown_grace`` seconds to start, queued dumps are dropped (a
        dropped dump is a later cache miss, never a partial file); then no
        thread runs and no buffer is held."""
        engine, self.engine = self.engine, None
        if engine is None:
            return
        dropped, writes = engine.shutdown(self.settings.shutdown_grace)
        self.figures.totals["shutdown_dropped"] += dropped + writes
        if dropped or writes:
            logger.warning(
                "kvtier connector worker %d shut down with %d queued dumps and %d writes dropped",
                self.rank,
                dropped,
                writes,
            )
        # Every task is done now (ended or dropped): reap them.
        self.tracker.poll()

    def stats(self) -> dict[str, int]:
        stats = dict(self.tracker.stats())
        if self.engine is not None:
            stats.update(self.engine.stats)
            stats["dumps_in_flight"] = self.engine.in_flight()
            # The byte budget's counters, as capacity_<name>.
            capacity = self.engine.capacity_stats() or {}
            stats.update({f"capacity_{name}": value for name, value in capacity.items()})
        return stats

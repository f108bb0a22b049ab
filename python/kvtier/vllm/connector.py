"""``kvtier.vllm.StorageConnector``: a vLLM KV connector that dumps KV
blocks from the engine's KV cache to files and loads them back, with
deferred dumps: saving never blocks the model step.

vLLM loads it with no patch::

    from vllm.config import KVTransferConfig

    KVTransferConfig(
        kv_connector="StorageConnector",
        kv_connector_module_path="kvtier.vllm.connector",
        kv_role="kv_both",
        kv_connector_extra_config={"root_dir": "/mnt/kv"},
    )

How it runs:

- Lookups (scheduler): ``get_num_new_matched_tokens`` asks kvtier's async
  lookup for the request's blocks past those computed, one group per
  request; it answers ``None`` while the tier is being probed (vLLM asks
  again next step), then the tokens of the leading blocks the tier holds.
- Dumps (workers): ``wait_for_save`` submits the step's dumps (every block
  that became full in the step and was neither loaded nor computed before)
  and returns. Native threads copy the blocks out of the KV cache into a
  bounded staging area and write them to files.
- Delayed free: ``request_finished`` answers True exactly for requests with
  dumps recorded (kvtier's ``SaveScheduler``): vLLM keeps their blocks
  until every worker reported them in ``finished_sending``, which a worker
  does once, after all the request's dumps ended, failed or not
  (``SaveTracker``). The scheduler side counts the workers' reports with
  ``ReportAggregator`` and checks it frees what vLLM's own aggregation frees.
- Preemption: ``handle_preemptions`` waits for the preempted requests'
  dumps only, before the forward pass can overwrite their blocks.
- Loads (workers): ``start_load_kv`` reads the step's hit blocks into the
  KV cache and waits for them (the forward pass reads them). A block that
  cannot be read is reported through ``get_block_ids_with_load_errors``,
  with every block after it in its request, and its lookups turn to
  misses. Set vLLM's ``kv_load_failure_policy="recompute"`` to have such
  requests recomputed (vLLM's default, ``"fail"``, fails them).
- Shutdown: bounded. Copies in flight finish, their writes get
  ``shutdown_grace`` seconds to start, queued dumps are dropped (a dropped
  dump is a later miss, never a partial file); then no buffer is held.

Files: vLLM's fs layout and raw format, one engine block per file, the
bytes vLLM's offloading worker places in its offload region for a block
(every KV tensor's page, in order). vLLM's fs tier reads them and writes
blocks this connector reads: with one rank, the directory is the one
vLLM's fs tier uses for the same model with offloaded blocks of the
engine's block size (``kvtier.vllm.cpu.CpuTieringSpec`` on CPUs,
vLLM's ``CPUOffloadingSpec`` on GPUs). With several ranks each rank has
its own directory (each dumps its part of a block), which vLLM's
parallelism-agnostic fs tier does not share. kvtier's checked format was
not chosen: sharing files with vLLM's tier is the point of the layout.

Settings (``kv_connector_extra_config``): ``root_dir`` (required),
``staging_bytes`` (64 MiB; an eighth is kept for loads), ``copy_threads``
(2), ``io_threads`` (4 readers and 4 writers), ``lookup_concurrency`` (4),
``lookup_timeout`` (2 s; ``None``: no limit), ``shutdown_grace`` (2 s),
``stale_temp_age`` (600 s: temporary files of dead writers older than this
are swept at start; ``None``: no sweep), ``blocking_save`` (False; True
makes ``wait_for_save`` wait for its dumps, vLLM's synchronous reference),
``capacity_bytes`` (``None``: unbounded; otherwise the byte budget of each
rank's directory, as ``kvtier.vllm.FsTier`` keeps it: a scan at start,
room made by eviction before each dump, a dump without room a failed dump,
nothing lost), ``eviction_policy`` (``"lru"`` or ``"s3fifo"``) and
``rescan_interval`` (``None``: never; otherwise seconds between reconciles
of each rank's budget with its directory, for engines sharing it, as
``kvtier.vllm.FsTier`` does). In an object store (``url`` or
``store_config``, as ``kvtier.vllm.ObjectTier`` takes them), ``index``
(``redis://host:6379``, with ``capacity_bytes``) bounds each rank's prefix
by the fleet's books in Valkey, shared by every engine writing into it,
and ``index_lease`` (30 s) is their lease: the workers' dumps reserve and
commit in the books, and the scheduler's lookups ask them, one round trip
per group, over a connection of their own.

Models with one KV-cache group, block hashes of one block each. Needs
vLLM (0.32).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Optional

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
    OffloadingConnectorWorker,
)

from .._native import ConfigError
from ._conn_common import ConnectorSettings, StorageConnectorMetadata, StorageWorkerMetadata
from ._conn_scheduler import SchedulerSide
from ._conn_worker import WorkerSide
from ._tensors import block_rows
from .metrics import KvtierPromMetrics
from .regions import remove_orphaned_regions_once

if TYPE_CHECKING:
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.kv_offload.base import CanonicalKVCaches
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = logging.getLogger("kvtier.vllm")

__all__ = ["StorageConnector", "StorageConnectorMetadata", "StorageWorkerMetadata"]


def _canonical_caches(
    vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig", kv_caches: dict[str, "torch.Tensor"]
) -> "CanonicalKVCaches":
    """The KV cache as vLLM's offloading worker sees it (its tensors of
    block rows and their pages per group), by vLLM's own derivation, so a
    block's bytes are those vLLM's offloading writes."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
        build_offloading_config,
    )

    captured: list[Any] = []
    spec = SimpleNamespace(
        replicated_layout=False,
        config=build_offloading_config(vllm_config, kv_cache_config),
        get_worker=captured.append,
    )
    OffloadingConnectorWorker(spec, vllm_config, kv_cache_config).register_kv_caches(kv_caches)  # type: ignore[arg-type]
    return captured[0]


#: What a GPU engine runs instead of this connector.
GPU_ALTERNATIVE = (
    "On GPUs use vLLM's OffloadingConnector with kvtier's tier underneath: "
    '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": '
    '{"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": ..., "secondary_tiers": '
    '[{"type": "FsTier", "module_path": "kvtier.vllm", "root_dir": ...}]}} '
    "(kvtier's README, \"kvtier in vLLM\")"
)


def _refuse_device_caches(kv_caches: dict[str, "torch.Tensor"]) -> None:
    """The connector copies blocks between host memory and files on CPU
    threads: a KV cache on a device (a GPU's) is refused at start, with
    what to run instead."""
    for name, tensor in kv_caches.items():
        # guard: K15-a-device-kv-cache-is-refused-with-the-alternative
        if tensor.device.type != "cpu":
            raise ConfigError(
                f"kvtier's StorageConnector runs on CPU engines: the KV cache {name!r} is on "
                f"{tensor.device}, not in host memory. {GPU_ALTERNATIVE}"
            )


def _register(cls: type) -> None:
    """Registers ``cls`` in vLLM's connector registry under its class name.

    vLLM's ``MultiConnector`` rebuilds each inner connector's stats by that
    name (``KVConnectorFactory.get_connector_class_by_name``), in the
    process that logs them; a connector loaded by ``module_path`` is not in
    the registry, and the lookup raised there at the first stats, ending
    the engine. Every process that builds the engine's metrics imports this
    module first (``MultiConnector.build_prom_metrics`` loads each inner
    connector's class), so registering at class creation is enough. A name
    vLLM already knows is left to vLLM."""
    try:
        # guard: K16-the-connector-is-registered-for-multiconnectors-stats
        KVConnectorFactory.register_connector(cls.__name__, cls.__module__, cls.__name__)
    except ValueError:
        pass  # registered already


class StorageConnector(KVConnectorBase_V1, SupportsHMA):
    """kvtier's storage connector for vLLM (see the module's docs)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _register(cls)

    def __init__(
        self,
        vllm_config: "VllmConfig",
        role: KVConnectorRole,
        kv_cache_config: Optional["KVCacheConfig"] = None,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        if kv_cache_config is None:
            raise ValueError("the kvtier connector needs vLLM's KV cache config")
        self._settings = ConnectorSettings.from_vllm(vllm_config, kv_cache_config)
        self._scheduler: Optional[SchedulerSide] = None
        self._worker: Optional[WorkerSide] = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerSide(self._settings, vllm_config.parallel_config.world_size)
            # What engines killed at SIGTERM left in /dev/shm (see regions.py).
            remove_orphaned_regions_once()
        else:
            self._worker = WorkerSide(self._settings, vllm_config.parallel_config.rank)

    # Worker side.

    def register_kv_caches(self, kv_caches: dict[str, "torch.Tensor"]) -> None:
        assert self._worker is not None
        _refuse_device_caches(kv_caches)
        caches = _canonical_caches(self._vllm_config, self._kv_cache_config, kv_caches)
        tensors = [(block_rows(c.tensor, c.page_size_bytes), c.page_size_bytes) for c in caches.tensors]
        groups = [[(ref.tensor_idx, ref.page_size_bytes) for ref in refs] for refs in caches.group_data_refs]
        self._worker.attach(tensors, groups)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        assert self._worker is not None and isinstance(kv_connector_metadata, StorageConnectorMetadata)
        self._worker.handle_preemptions(kv_connector_metadata)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None:
            assert isinstance(connector_metadata, StorageConnectorMetadata)
            self._worker.bind(connector_metadata)

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        if self._worker is not None:
            self._worker.clear()

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        assert self._worker is not None
        self._worker.start_load_kv()

    def wait_for_layer_load(self, layer_name: str) -> None:
        # start_load_kv waited for the step's loads: every layer is in.
        return

    def save_kv_layer(self, layer_name: str, kv_layer: "torch.Tensor", attn_metadata: Any, **kwargs: Any) -> None:
        # A block's file holds every layer: it is dumped in wait_for_save.
        return

    def wait_for_save(self) -> None:
        assert self._worker is not None
        self._worker.wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[Optional[set[str]], Optional[set[str]]]:
        assert self._worker is not None
        return self._worker.get_finished() or None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        assert self._worker is not None
        return self._worker.load_errors()

    def build_connector_worker_meta(self) -> Optional[StorageWorkerMetadata]:
        assert self._worker is not None
        return self._worker.worker_meta()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
        if self._scheduler is not None:
            self._scheduler.shutdown()

    # Scheduler side.

    def on_new_request(self, request: "Request") -> None:
        assert self._scheduler is not None
        self._scheduler.on_new_request(request)

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[Optional[int], bool]:
        assert self._scheduler is not None
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int) -> None:
        assert self._scheduler is not None
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        assert self._scheduler is not None
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        assert self._scheduler is not None
        self._scheduler.update_connector_output(connector_output)

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, Optional[dict[str, Any]]]:
        assert self._scheduler is not None
        return self._scheduler.request_finished(request)

    def request_finished_all_groups(
        self, request: "Request", block_ids: tuple[list[int], ...]
    ) -> tuple[bool, Optional[dict[str, Any]]]:
        assert self._scheduler is not None
        return self._scheduler.request_finished(request)

    def get_finished_count(self) -> Optional[int]:
        # Every worker reports every delayed request: vLLM's default count.
        return None

    @property
    def requires_kv_delivery(self) -> bool:
        # A cache: a dump lost to a preemption is a later miss.
        return False

    # Figures on vLLM's /metrics (see kvtier.vllm.metrics).

    def get_kv_connector_stats(self) -> Optional["KVConnectorStats"]:
        side = self._scheduler if self._scheduler is not None else self._worker
        assert side is not None
        return side.report_figures()

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[dict[str, Any]] = None) -> "KVConnectorStats":
        return OffloadingConnectorStats(data=data) if data else OffloadingConnectorStats()

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: "VllmConfig",
        metric_types: dict[Any, Any],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KvtierPromMetrics:
        return KvtierPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def stats(self) -> dict[str, int]:
        """kvtier's counters for this side (scheduler or worker)."""
        if self._scheduler is not None:
            return self._scheduler.stats()
        assert self._worker is not None
        return self._worker.stats()


_register(StorageConnector)

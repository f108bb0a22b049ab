"""``kvtier.vllm.CpuTieringSpec``: vLLM's tiered KV offloading on vLLM's CPU
backend.

vLLM 0.32 refuses KV offloading on its CPU platform: its offloading worker
copies blocks with device streams and events. Everything else of its
tiering (the tier manager, the secondary tiers, the shared offload region
in ``/dev/shm``) does not care where the KV cache lives. This spec is
vLLM's ``TieringOffloadingSpec`` with one part replaced: the worker, whose
block copies between the CPU KV cache and the offload region run on
kvtier's native threads (``kvtier._native.BlockCopier``), without the GIL,
and are reported through the worker's ``get_finished()`` once their bytes
are in place. vLLM loads it with no patch::

    from vllm.config import KVTransferConfig

    KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "spec_name": "CpuTieringSpec",
            "spec_module_path": "kvtier.vllm.cpu",
            "cpu_bytes_to_use": 1 << 30,
            "secondary_tiers": [
                {"type": "FsTier", "module_path": "kvtier.vllm", "root_dir": "/mnt/kv"},
            ],
        },
    )

Every setting of ``TieringOffloadingSpec`` applies; ``copy_threads``
(default 2) sets the copier's threads. Several KV-cache groups, several
layers per tensor, and offloaded blocks of several engine blocks
(``block_size`` a multiple of the engine's) are supported; vLLM's
``canonical_layout`` is not (the spec refuses it at start).

Needs vLLM (0.32); importing this module imports vLLM.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from .._native import BlockCopier, check_settings
from ._tensors import block_rows
from .regions import remove_orphaned_regions_once

if TYPE_CHECKING:
    from vllm.v1.kv_offload.config import OffloadingConfig

logger = logging.getLogger("kvtier.vllm")

__all__ = ["CpuTieringSpec", "CpuTieringWorker"]


class CpuTieringWorker(OffloadingWorker):
    """The offloading worker of ``CpuTieringSpec``: copies between the CPU
    KV cache and this rank's views of the offload region, natively.

    Stores and loads never wait; ``get_finished`` reports each job once, and
    ``wait(job_ids)`` (a preemption's fence) waits for those jobs alone.
    ``shutdown`` runs what was submitted, then releases the region."""

    def __init__(
        self,
        kv_caches: CanonicalKVCaches,
        blocks_per_chunk: int,
        region: SharedOffloadRegion,
        threads: int = 2,
    ) -> None:
        tensors = []
        for cache in kv_caches.tensors:
            page = cache.page_size_bytes
            engine = block_rows(cache.tensor, page)
            tensors.append((engine, region.create_next_worker_view(page * blocks_per_chunk), page))
        groups = [
            [(ref.tensor_idx, ref.page_size_bytes) for ref in refs]
            for refs in kv_caches.group_data_refs
        ]
        self._copier = BlockCopier(tensors, groups, blocks_per_chunk, threads=threads)
        self._region: Optional[SharedOffloadRegion] = region
        logger.info(
            "kvtier CPU offloading worker: %d KV tensors, %d groups, %d blocks per chunk",
            len(tensors),
            len(groups),
            blocks_per_chunk,
        )

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        """KV cache -> offload region; never waits."""
        self._copier.submit_store(
            job_id, src_spec.block_ids, dst_spec.block_ids, src_spec.group_sizes, src_spec.block_indices
        )
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        """Offload region -> KV cache; never waits."""
        self._copier.submit_load(
            job_id, dst_spec.block_ids, src_spec.block_ids, dst_spec.group_sizes, dst_spec.block_indices
        )
        return True

    def get_finished(self) -> list[TransferResult]:
        return [
            TransferResult(job_id=job_id, success=success, transfer_size=size, transfer_time=seconds)
            for job_id, _, success, size, seconds in self._copier.finished()
        ]

    def wait(self, job_ids: set[int]) -> None:
        self._copier.wait(job_ids)

    def shutdown(self) -> None:
        self._copier.shutdown()
        if self._region is not None:
            self._region.cleanup()
            self._region = None


class CpuTieringSpec(TieringOffloadingSpec):
    """vLLM's ``TieringOffloadingSpec`` with a worker that runs on CPU
    machines (see the module's docs)."""

    def __init__(self, config: "OffloadingConfig") -> None:
        super().__init__(config)
        if config.canonical_layout:
            raise ValueError(
                "CpuTieringSpec does not support canonical_layout: remove it from "
                "kv_connector_extra_config"
            )
        checked = check_settings(
            {"copy_threads": self.extra_config.get("copy_threads", 2)}, "kv_connector_extra_config"
        )
        self._copy_threads = checked["copy_threads"]
        # What engines killed at SIGTERM left in /dev/shm (see regions.py).
        remove_orphaned_regions_once()

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        # vLLM's own get_worker refuses any platform without device copies.
        if self._worker is None:
            self._worker = self.create_worker(kv_caches)
        return self._worker

    def create_worker(self, kv_caches: CanonicalKVCaches) -> CpuTieringWorker:  # type: ignore[override]
        rank = 0 if self.replicated_layout else self.config.parallel.rank
        region = SharedOffloadRegion(
            engine_id=self._engine_id,
            num_chunks=self.num_chunks,
            rank=rank,
            kv_bytes_per_chunk=self.kv_bytes_per_chunk,
            cpu_page_size=self.cpu_page_size_per_worker,
        )
        try:
            return CpuTieringWorker(kv_caches, self.blocks_per_chunk, region, threads=self._copy_threads)
        except Exception:
            region.cleanup()
            raise

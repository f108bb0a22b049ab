"""kvtier's CPU offloading worker and tier lifecycle, inside a real vLLM.

Run in vLLM's venv (python/integration/vllm.sh does):

- ``CpuTieringWorker`` against vLLM's own pointer rule: for random layouts
  (several KV-cache groups, several layers per tensor, padded pages, 1 to 4
  blocks per chunk) and random jobs, kvtier's native copies leave the
  shared offload region and the KV cache byte-for-byte as copies made at
  the addresses vLLM's ``compute_sub_block_ptrs`` gives;
- ``CpuTieringSpec`` loaded by vLLM's spec factory;
- ``FsTier.shutdown()`` lets go of the primary memory, so vLLM's primary
  tier can release its memoryview next (it raised ``BufferError``), and
  queued stores get their grace: alone, and inside vLLM's
  ``TieringOffloadingManager.shutdown()``.
"""

from __future__ import annotations

import ctypes
import json
import os
import pathlib
import random
import re
import time
import uuid

import numpy as np
import pytest
import torch

from kvtier.vllm import FsTier
from kvtier.vllm.cpu import CpuTieringSpec, CpuTieringWorker
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.gpu_worker import compute_sub_block_ptrs
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.base import TransferJob
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.manager import CPUPrimaryTierOffloadingManager, TieringOffloadingManager

from vllm_support import STEP_END, Region, context, key, offloading_spec, primary_memory

ENGINE_BLOCKS, CHUNKS = 24, 12


class Layout:
    """Random KV-cache tensors and groups, the engine's memory, a shared
    offload region, and an oracle copy of both."""

    def __init__(self, rng: random.Random, per_chunk: int) -> None:
        self.per_chunk = per_chunk
        pages = [rng.choice([64, 96, 128, 256]) for _ in range(rng.randint(1, 3))]
        self.groups = [
            [(rng.randrange(len(pages)), rng.choice([0, 8, 16])) for _ in range(rng.randint(1, 3))]
            for _ in range(rng.randint(1, 3))
        ]
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        self.engine = [
            torch.randint(-128, 127, (ENGINE_BLOCKS, page), dtype=torch.int8, generator=gen) for page in pages
        ]
        self.kv_caches = CanonicalKVCaches(
            tensors=[CanonicalKVCacheTensor(tensor=t, page_size_bytes=p) for t, p in zip(self.engine, pages)],
            group_data_refs=[
                [CanonicalKVCacheRef(tensor_idx=t, page_size_bytes=pages[t] - cut) for t, cut in layers]
                for layers in self.groups
            ],
        )
        self.pages = pages
        worker_bytes = sum(p * per_chunk for p in pages)
        row = -(-worker_bytes // 4096) * 4096
        self.region = SharedOffloadRegion(
            engine_id=f"kvtier-test-{uuid.uuid4().hex}",
            num_chunks=CHUNKS,
            rank=0,
            kv_bytes_per_chunk=row,
            cpu_page_size=worker_bytes,
        )
        # The oracle: the same memory shapes, copied by vLLM's addresses.
        self.oracle_engine = [t.clone() for t in self.engine]
        oracle_region = torch.zeros((CHUNKS, row), dtype=torch.int8)
        self.oracle_views, offset = [], 0
        for page in pages:
            self.oracle_views.append(oracle_region[:, offset : offset + page * per_chunk])
            offset += page * per_chunk

    def job(self, rng: random.Random):
        sizes, firsts = [], []
        for _ in self.groups:
            sizes.append(rng.randint(0, 4))
            firsts.append(rng.randrange(0, 9))
        chunks_needed = sum(
            (first + n - 1) // self.per_chunk - first // self.per_chunk + 1 for n, first in zip(sizes, firsts) if n
        )
        blocks = rng.sample(range(ENGINE_BLOCKS), sum(sizes))
        chunks = rng.sample(range(CHUNKS), chunks_needed)
        return GPULoadStoreSpec(blocks, sizes, firsts), CPULoadStoreSpec(chunks)

    def oracle(self, engine_spec: GPULoadStoreSpec, cpu_spec: CPULoadStoreSpec, store: bool) -> None:
        """The job's copies at the addresses vLLM's ``compute_sub_block_ptrs``
        gives, per group and layer, as vLLM's worker walks them."""
        block_at = chunk_at = 0
        for g, (count, first) in enumerate(zip(engine_spec.group_sizes, engine_spec.block_indices)):
            if count == 0:
                continue
            skip = first % self.per_chunk
            used = -(-(count + skip) // self.per_chunk)
            blocks = engine_spec.block_ids[block_at : block_at + count]
            chunks = cpu_spec.block_ids[chunk_at : chunk_at + used]
            for t, cut in self.groups[g]:
                engine_ptrs = np.empty(count, dtype=np.uint64)
                region_ptrs = np.empty(count, dtype=np.uint64)
                compute_sub_block_ptrs(blocks, 1, engine_ptrs, self.oracle_engine[t])
                compute_sub_block_ptrs(chunks, self.per_chunk, region_ptrs, self.oracle_views[t], skip_count=skip)
                for e, r in zip(engine_ptrs, region_ptrs):
                    src, dst = (e, r) if store else (r, e)
                    ctypes.memmove(int(dst), int(src), self.pages[t] - cut)
            block_at += count
            chunk_at += used


@pytest.mark.parametrize("seed", range(24))
def test_the_native_worker_copies_what_vllms_pointer_rule_names(seed):
    rng = random.Random(seed)
    layout = Layout(rng, per_chunk=1 + seed % 4)
    worker = CpuTieringWorker(layout.kv_caches, layout.per_chunk, layout.region)
    try:
        views = layout.region._views
        for job_id in range(6):
            engine_spec, cpu_spec = layout.job(rng)
            store = job_id % 2 == 0
            if store:
                assert worker.submit_store(job_id, engine_spec, cpu_spec)
            else:
                assert worker.submit_load(job_id, cpu_spec, engine_spec)
            worker.wait({job_id})
            [result] = worker.get_finished()
            assert (result.job_id, result.success) == (job_id, True)
            layout.oracle(engine_spec, cpu_spec, store)
            for t in range(len(layout.pages)):
                assert torch.equal(views[t], layout.oracle_views[t]), f"job {job_id}: offload view {t}"
                assert torch.equal(layout.engine[t], layout.oracle_engine[t]), f"job {job_id}: KV tensor {t}"
    finally:
        worker.shutdown()


def test_vllms_factory_loads_the_spec_from_its_module_path():
    assert OffloadingSpecFactory.get_spec_cls(
        {"spec_name": "CpuTieringSpec", "spec_module_path": "kvtier.vllm.cpu"}
    ) is CpuTieringSpec


def test_shutdown_lets_go_of_the_primary_memory_before_vllm_releases_it(tmp_path):
    def held():
        """Threads and file descriptors of this process."""
        return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))

    memory = primary_memory(16, 4096)
    view = memoryview(memory)
    before = held()
    tier = FsTier(offloading_spec(), view, "fs", str(tmp_path), n_read_threads=1, n_write_threads=1)
    for i in range(16):
        tier.submit_store(
            TransferJob(job_id=i, keys=[key(i)], chunk_ids=np.array([i]), is_promotion=False, req_context=context("r"))
        )
    tier.shutdown()
    # vLLM's CPUPrimaryTierOffloadingManager.shutdown() does this next.
    view.release()
    # A joined thread can stay listed for a moment: the kernel wakes the
    # joiner (clearing the thread's id word) before the thread has finished
    # exiting and left /proc. On a loaded machine that moment was seen to
    # last up to 11 ms (in 16 of 300 shutdowns beside three busy loops),
    # which failed CI once; a thread the shutdown left running would still
    # be listed after a second.
    deadline = time.monotonic() + 1.0
    while held() != before and time.monotonic() < deadline:
        time.sleep(0.001)
    if held() != before:
        names = []
        for tid in os.listdir("/proc/self/task"):
            try:
                names.append(pathlib.Path(f"/proc/self/task/{tid}/comm").read_text().strip())
            except OSError:
                pass  # it has gone meanwhile
        pytest.fail(f"threads or file descriptors outlive the tier's shutdown: {held()} against {before}: {names}")
    finished = list(tier.get_finished_jobs())
    assert len(finished) == 16 and all(r.success for r in finished), "the grace let the stores finish"


def test_the_readmes_cpu_recipe_names_this_spec_and_kvtiers_tier():
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("#### On a CPU machine", 1)[1].split("\n### ", 1)[0]
    config = json.loads(re.search(r"```json\n(.*?)```", section, re.S).group(1))
    extra = config["kv_connector_extra_config"]
    assert config["kv_connector"] == "OffloadingConnector"
    assert OffloadingSpecFactory.get_spec_cls(extra) is CpuTieringSpec
    assert CpuTieringSpec.build_metric_definitions(extra)
    (tier,) = extra["secondary_tiers"]
    assert SecondaryTierFactory.get_tier_class(tier) is FsTier
    # The offline script beside it builds vLLM's KVTransferConfig from that
    # JSON, as it is written.
    [script] = re.findall(r"```python\n(.*?)```", section, re.S)
    compile(script, "README.md", "exec")
    assert 'KVTransferConfig(**json.load(open("kv-transfer.json")))' in script
    from vllm.config import KVTransferConfig

    assert KVTransferConfig(**config).kv_connector_extra_config["spec_name"] == "CpuTieringSpec"


def test_vllms_tier_manager_shuts_down_over_kvtiers_tier_and_keeps_its_queued_stores(tmp_path):
    # vLLM's order at an engine's shutdown: every tier's shutdown() (no
    # drain), then the primary tier's, which releases its memoryview. With
    # kvtier's tier still holding an export, that raised BufferError.
    memory = primary_memory(16, 4096)
    primary = CPUPrimaryTierOffloadingManager(num_chunks=16, mmap_region=Region(memory))
    tier = FsTier(
        offloading_spec(), primary.get_kv_memoryview(), "fs", str(tmp_path), n_read_threads=1, n_write_threads=1
    )
    manager = TieringOffloadingManager(primary_tier=primary, secondary_tiers=[tier])
    ctx = context("writer")
    manager.on_new_request(ctx)
    keys = [key(i) for i in range(12)]
    assert manager.prepare_store(keys, ctx) is not None
    manager.complete_store(keys, ctx)
    manager.on_schedule_end(STEP_END)  # the cascades reach the tier
    assert manager.has_pending_work()
    manager.shutdown()
    stored = [os.path.exists(tier.file_mapper.get_file_name(k)) for k in keys]
    assert all(stored), f"stores queued at shutdown were dropped: {stored}"


def test_jobs_that_end_at_shutdown_are_still_reported_without_an_error(tmp_path):
    # A load that fails marks its keys a miss through the lookup; after
    # shutdown the lookup is closed, and that must not cut the report short.
    memory = primary_memory(8, 4096)
    tier = FsTier(offloading_spec(), memoryview(memory), "fs", str(tmp_path), n_read_threads=1, n_write_threads=1)
    job = TransferJob(job_id=1, keys=[key(1)], chunk_ids=np.array([0]), is_promotion=True, req_context=context("r"))
    tier.submit_load(job)
    tier.submit_store(
        TransferJob(job_id=2, keys=[key(2)], chunk_ids=np.array([1]), is_promotion=False, req_context=context("r"))
    )
    tier.shutdown()
    finished = {r.job_id: r.success for r in tier.get_finished_jobs()}
    assert finished == {1: False, 2: True}, "every job is reported once, after shutdown too"
    assert list(tier.get_finished_jobs()) == []

"""What kvtier's own checks inside vLLM share: vLLM's offloading settings
built from vLLM's public config classes, a primary tier's memory, keys and
contexts. Needs vLLM (and numpy, which vLLM brings)."""

from __future__ import annotations

import mmap
from types import SimpleNamespace

import numpy as np

from vllm.v1.kv_offload.base import (
    OffloadingKVEventsConfig,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)

#: The end of a scheduler step with nothing new scheduled.
STEP_END = ScheduleEndContext(new_req_ids=[], preempted_req_ids=())


def offloading_spec(
    *,
    model: str = "kvtier/test-model",
    dtype: str = "bfloat16",
    tokens_per_hash: int = 16,
    blocks_per_chunk: int = 1,
    tp_size: int = 1,
    pp_size: int = 1,
    rank: int = 0,
    parallelism_agnostic: bool = False,
    replicated_layout: bool = False,
    groups: tuple[tuple[int, tuple[str, ...]], ...] = (),
    kv_events: bool = False,
):
    """An object with what a secondary tier reads of vLLM's
    ``OffloadingSpec``: ``config``, ``blocks_per_chunk`` and
    ``kv_events_config``."""
    config = OffloadingConfig(
        groups=tuple(
            OffloadingGroupConfig(tokens_per_block=tokens, layer_names=layers, group_id=i)
            for i, (tokens, layers) in enumerate(groups)
        ),
        worker_kv_bytes_per_block=0,
        enable_kv_cache_events=kv_events,
        extra_config={},
        engine_id="kvtier-engine",
        model=OffloadingModelConfig(name=model, dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=tokens_per_hash, blocks_per_chunk=blocks_per_chunk),
        parallel=OffloadingParallelConfig(
            rank=rank,
            world_size=tp_size * pp_size,
            tp_size=tp_size,
            pp_size=pp_size,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=parallelism_agnostic,
        ),
        replicated_layout=replicated_layout,
    )
    events = OffloadingKVEventsConfig(enable_kv_cache_events=kv_events, self_describing_kv_events=False)
    return SimpleNamespace(config=config, blocks_per_chunk=blocks_per_chunk, kv_events_config=events)


def primary_memory(blocks: int, block_bytes: int = 64 * 1024) -> np.ndarray:
    """A primary tier's memory: page-aligned ``blocks`` × ``block_bytes``
    bytes (vLLM's fs tier may use O_DIRECT, which wants aligned memory)."""
    raw = np.zeros(blocks * block_bytes + mmap.PAGESIZE, dtype=np.uint8)
    shift = (-raw.ctypes.data) % mmap.PAGESIZE
    return raw[shift : shift + blocks * block_bytes].reshape(blocks, block_bytes)


class Region:
    """Stands in for vLLM's shared offload region: hands the primary tier
    its memory."""

    def __init__(self, memory: np.ndarray) -> None:
        self._memory = memory

    def create_kv_memoryview(self) -> memoryview:
        return memoryview(self._memory)

    def cleanup(self) -> None:
        pass


def key(n: int, group: int = 0) -> bytes:
    return make_offload_key(n.to_bytes(16, "big"), group)


def context(req_id: str) -> ReqContext:
    return ReqContext(req_id=req_id)


def store_through_manager(tier, memory: np.ndarray, keys: list, values: list, seconds: float = 20.0) -> None:
    """One engine: stores ``values`` under ``keys`` through vLLM's
    ``TieringOffloadingManager`` over ``tier`` (the primary tier on
    ``memory``) until its cascades are done, then shuts the tier down."""
    import time

    from vllm.v1.kv_offload.tiering.manager import (
        CPUPrimaryTierOffloadingManager,
        TieringOffloadingManager,
    )

    primary = CPUPrimaryTierOffloadingManager(num_chunks=len(memory), mmap_region=Region(memory))
    manager = TieringOffloadingManager(primary_tier=primary, secondary_tiers=[tier])
    ctx = context("writer")
    manager.on_new_request(ctx)
    stored = manager.prepare_store(keys, ctx)
    assert stored is not None
    for block, value in zip(stored.store_spec.chunk_ids, values):
        memory[block] = value
    manager.complete_store(keys, ctx)
    deadline = time.monotonic() + seconds
    while manager.has_pending_work() and time.monotonic() < deadline:
        manager.on_schedule_end(STEP_END)
        manager.lookup(key(99), ctx)  # polls the tiers' finished jobs
        time.sleep(0.001)
    manager.on_request_finished(ctx)
    tier.shutdown()


def promote_through_manager(tier, memory: np.ndarray, keys: list, seconds: float = 20.0) -> list:
    """Another engine, its primary tier empty: looks ``keys`` up through
    vLLM's ``TieringOffloadingManager`` over ``tier`` until they are hits
    and promotes them; returns the primary blocks they landed in. The
    caller shuts the tier down."""
    import time

    from vllm.v1.kv_offload.base import LookupResult
    from vllm.v1.kv_offload.tiering.manager import (
        CPUPrimaryTierOffloadingManager,
        TieringOffloadingManager,
    )

    primary = CPUPrimaryTierOffloadingManager(num_chunks=len(memory), mmap_region=Region(memory))
    manager = TieringOffloadingManager(primary_tier=primary, secondary_tiers=[tier])
    ctx = context("reader")
    manager.on_new_request(ctx)
    hits = [LookupResult.HIT] * len(keys)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        verdicts = [manager.lookup(k, ctx) for k in keys]
        if verdicts == hits:
            break
        manager.on_schedule_end(STEP_END)
        time.sleep(0.001)
    assert verdicts == hits
    return list(manager.prepare_load(keys, ctx).chunk_ids)

"""kvtier inside a real vLLM: what vLLM's own tier tests do not pin.

Run in vLLM's venv, without the substitution plugin (vLLM's own fs tier is
needed as it is): python/integration/vllm.sh does.

- kvtier's layout rule (``kvtier.vllm.base_dir``, ``rank_dir``,
  ``block_path``) against vLLM's ``FileMapper`` over many settings;
- ``FsTier`` loaded by vLLM's tier factory from ``module_path`` alone, and
  the README's KV transfer config read by vLLM's tiering spec;
- vLLM's fs tier and kvtier's reading each other's files in one directory;
- a promotion from kvtier's tier through vLLM's ``TieringOffloadingManager``;
- the layout check refusing a vLLM whose file names kvtier does not know;
- lookups, stores and loads that finish while the scheduler thread holds
  the GIL.
"""

from __future__ import annotations

import itertools
import json
import pathlib
import re
import sys
import time

import numpy as np
import pytest

import kvtier.vllm
from kvtier.vllm import FsTier, base_dir, block_path, rank_dir
from vllm.v1.kv_offload.base import LookupResult
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.base import TransferJob
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from vllm_support import (
    STEP_END,
    context,
    key,
    offloading_spec,
    primary_memory,
    promote_through_manager,
    store_through_manager,
)

BLOCKS, BLOCK_BYTES = 8, 64 * 1024


def job(job_id, keys, chunk_ids, promotion=False, req="r"):
    return TransferJob(
        job_id=job_id,
        keys=keys,
        chunk_ids=np.array(chunk_ids, dtype=np.int64),
        is_promotion=promotion,
        req_context=context(req),
    )


def finish(tier, timeout=10.0):
    tier.drain_jobs()
    return list(tier.get_finished_jobs())


def resolve(tier, keys, ctx, timeout=10.0):
    """Looks `keys` up until none is RETRY (the scheduler asks every step)."""
    deadline = time.monotonic() + timeout
    while True:
        verdicts = [tier.lookup(k, ctx) for k in keys]
        if LookupResult.RETRY not in verdicts or time.monotonic() > deadline:
            return verdicts
        tier.on_schedule_end(STEP_END)
        time.sleep(0.001)


@pytest.fixture
def memory():
    data = primary_memory(BLOCKS, BLOCK_BYTES)
    data[:] = np.random.default_rng(7).integers(0, 256, data.shape, dtype=np.uint8)
    return data


def kvtier_tier(root, memory, spec=None, **settings):
    return FsTier(
        offloading_spec=spec or offloading_spec(),
        primary_kv_view=memoryview(memory),
        tier_type="kvtier",
        root_dir=str(root),
        n_read_threads=2,
        n_write_threads=2,
        **settings,
    )


# The layout ----------------------------------------------------------------


GROUPS = ([], [{"tokens_per_block": 16, "layer_names": ["model.layers.0.attn", "l1"]}])


@pytest.mark.parametrize(
    "model, tp, pp, rank, agnostic, replicated, canonical, groups",
    list(itertools.product(
        ["meta-llama/Llama-3-8B", "m"],
        [1, 4],
        [1, 2],
        [0, 3],
        [False, True],
        [False, True],
        [None, "canonical-v1"],
        GROUPS,
    )),
)
def test_kvtiers_layout_rule_is_vllms_file_mapper(model, tp, pp, rank, agnostic, replicated, canonical, groups):
    settings = dict(
        model_name=model,
        tokens_per_hash=16,
        blocks_per_file=2,
        tp_size=tp,
        pp_size=pp,
        pcp_size=1,
        dcp_size=1,
        dtype="float16",
        kv_cache_groups=groups,
        parallel_agnostic=agnostic,
        replicated_layout=replicated,
        canonical_format=canonical,
    )
    mapper = FileMapper(root_dir="/kv/root", rank=rank, **settings)
    assert base_dir("/kv/root", **settings) == mapper.base_path
    ranks = rank_dir("/kv/root", rank=rank, **settings)
    assert ranks == f"{mapper.base_path}_r{mapper.rank}"
    for n, group in [(0, 0), (1, 3), (2**120, 2**32 - 1)]:
        assert block_path(ranks, key(n, group)) == mapper.get_file_name(key(n, group))


# Loading and sharing ---------------------------------------------------------


def test_vllms_factory_loads_the_tier_from_module_path_alone(tmp_path, memory):
    config = {"type": "FsTier", "module_path": "kvtier.vllm", "root_dir": str(tmp_path),
              "n_read_threads": 1, "n_write_threads": 1, "locality": "LOCAL"}
    tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(memory), offloading_spec())
    try:
        assert isinstance(tier, FsTier) and tier.tier_type == "FsTier"
        assert tier.locality.name == "LOCAL"
        assert resolve(tier, [key(1)], context("a")) == [LookupResult.MISS]
    finally:
        tier.shutdown()


def test_the_readmes_kv_transfer_config_builds_kvtiers_tier(tmp_path, memory):
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### kvtier in vLLM", 1)[1]
    config = json.loads(re.search(r"```json\n(.*?)```", section, re.S).group(1))
    assert config["kv_connector"] == "OffloadingConnector"
    extra = config["kv_connector_extra_config"]
    # The spec vLLM picks by this name, and the tier classes it resolves.
    assert OffloadingSpecFactory.get_spec_cls(extra) is TieringOffloadingSpec
    assert TieringOffloadingSpec.build_metric_definitions(extra)
    (tier_config,) = extra["secondary_tiers"]
    tier_config = dict(tier_config, root_dir=str(tmp_path))
    tier = SecondaryTierFactory.create_secondary_tier(tier_config, memoryview(memory), offloading_spec())
    try:
        assert isinstance(tier, FsTier)
        assert resolve(tier, [key(1)], context("a")) == [LookupResult.MISS]
    finally:
        tier.shutdown()


def test_capacity_bytes_in_the_tier_config_bounds_the_tiers_files(tmp_path, memory):
    config = {"type": "FsTier", "module_path": "kvtier.vllm", "root_dir": str(tmp_path),
              "n_read_threads": 1, "n_write_threads": 1, "capacity_bytes": 3 * BLOCK_BYTES}
    tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(memory), offloading_spec())
    try:
        for n in range(6):
            tier.submit_store(job(n, [key(n)], [n]))
            assert [r.success for r in finish(tier)] == [True]
        stats = tier.capacity_stats()
        assert (stats["resident_bytes"], stats["evictions"]) == (3 * BLOCK_BYTES, 3)
        on_disk = [p.stat().st_size for p in tmp_path.rglob("*.bin")]
        assert sum(on_disk) == 3 * BLOCK_BYTES
        # A fresh request's lookups see what is left.
        assert resolve(tier, [key(n) for n in range(6)], context("fresh")) == [LookupResult.MISS] * 3 + [
            LookupResult.HIT] * 3
        # A load of an evicted block fails there, keeping the blocks before it.
        tier.submit_load(job(10, [key(4), key(0)], [6, 7], promotion=True))
        [result] = finish(tier)
        assert not result.success and result.successful_keys == (key(4),)
    finally:
        tier.shutdown()
    with pytest.raises(kvtier.ConfigError, match="capacity_bytes"):
        kvtier_tier(tmp_path, memory, capacity_bytes=0)


def test_the_tiers_lookups_learn_of_its_stores_and_evictions(tmp_path, memory):
    # A budget of two blocks. Block 0 is looked up while absent, then
    # stored: the lookup hits without a new probe. Blocks 1 and 2 evict it:
    # its hit becomes a miss before any load, and the eviction is a
    # removed KV event.
    tier = kvtier_tier(tmp_path, memory, offloading_spec(kv_events=True), capacity_bytes=2 * BLOCK_BYTES,
                       enable_kv_events=True)
    try:
        ctx = context("waiting")
        assert resolve(tier, [key(0)], ctx) == [LookupResult.MISS]
        tier.submit_store(job(1, [key(0)], [0]))
        assert [r.success for r in finish(tier)] == [True]
        assert tier.lookup(key(0), ctx) == LookupResult.HIT, "the store settles the miss"
        for n in (1, 2):
            tier.submit_store(job(1 + n, [key(n)], [n]))
            assert [r.success for r in finish(tier)] == [True]
        assert tier.capacity_stats()["evictions"] == 1
        assert tier.lookup(key(0), ctx) == LookupResult.MISS, "the eviction settles the hit"
        events = list(tier.take_events())
        removed = [event.keys for event in events if event.removed]
        assert removed == [[key(0)]]
        assert [event.keys for event in events if not event.removed] == [[key(0)], [key(1)], [key(2)]]
        stats = tier._lookup_manager.native.stats()
        assert (stats["settled_hits"], stats["settled_misses"]) == (1, 1)
    finally:
        tier.shutdown()


def test_a_tier_shut_down_twice_raises_nothing(tmp_path, memory):
    # vLLM's own test_shutdown_discards_pending_tasks shuts its tier down and
    # its fixture does again; the report of what the lookups settled is made
    # once, while the lookup is open.
    tier = kvtier_tier(tmp_path, memory, capacity_bytes=2 * BLOCK_BYTES)
    tier.submit_store(job(1, [key(1)], [1]))
    tier.shutdown()
    tier.shutdown()
    assert [r.success for r in tier.get_finished_jobs()] in ([True], [False])


def test_engines_sharing_a_directory_learn_of_each_others_blocks_and_stay_within_one_budget(tmp_path, memory):
    # Two engines' tiers on one directory, each with a budget of two blocks
    # and a rescan every 20 ms. Engine a looks up a block engine b then
    # stores: a's rescan counts it and a's lookup turns to a hit. b's next
    # stores evict it: a's rescan forgets it and the hit turns back to a
    # miss. Once both are quiet the directory holds one budget.
    shared = dict(capacity_bytes=2 * BLOCK_BYTES, rescan_interval=0.02)
    a = kvtier_tier(tmp_path, memory, **shared)
    b = kvtier_tier(tmp_path, memory, **shared)
    try:
        ctx = context("waiting")

        def a_sees(verdict):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                finish(a)  # each step settles what the rescan found
                if resolve(a, [key(5)], ctx) == [verdict]:
                    return True
                time.sleep(0.01)
            return False

        assert resolve(a, [key(5)], ctx) == [LookupResult.MISS]
        b.submit_store(job(1, [key(5)], [0]))
        assert [r.success for r in finish(b)] == [True]
        assert a_sees(LookupResult.HIT), "a's rescan counts b's block"
        for n in (6, 7):
            b.submit_store(job(n, [key(n)], [n - 5]))
            assert [r.success for r in finish(b)] == [True]
        assert a_sees(LookupResult.MISS), "a's rescan forgets the block b evicted"
        a.submit_store(job(8, [key(8)], [3]))
        assert [r.success for r in finish(a)] == [True]
        files = lambda: sorted(tmp_path.rglob("*.bin"))  # noqa: E731
        deadline = time.monotonic() + 10
        while len(files()) > 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(files()) <= 2, files()
        stats = a.capacity_stats()
        assert stats["adopted"] >= 1 and stats["forgotten"] >= 1, stats
    finally:
        a.shutdown()
        b.shutdown()


def test_vllms_fs_tier_and_kvtiers_read_each_others_files(tmp_path, memory):
    spec = offloading_spec(groups=((16, ("l0",)),))
    vllms = FileSystemTierManager(spec, memoryview(memory), "fs", str(tmp_path), 2, 2)
    ours = kvtier_tier(tmp_path, memory, spec)
    try:
        assert ours.file_mapper.base_path == vllms.file_mapper.base_path
        # vLLM writes blocks 0 and 1; kvtier finds them and loads them into 4, 5.
        vllms.submit_store(job(1, [key(1), key(2)], [0, 1]))
        assert [r.success for r in finish(vllms)] == [True]
        assert resolve(ours, [key(1), key(2), key(3)], context("a")) == [
            LookupResult.HIT, LookupResult.HIT, LookupResult.MISS]
        ours.submit_load(job(2, [key(1), key(2)], [4, 5], promotion=True))
        assert [r.success for r in finish(ours)] == [True]
        assert (memory[4] == memory[0]).all() and (memory[5] == memory[1]).all()
        # kvtier writes block 2; vLLM finds it and loads it into 6.
        ours.submit_store(job(3, [key(3)], [2]))
        assert [r.success for r in finish(ours)] == [True]
        vllms.submit_load(job(4, [key(3)], [6], promotion=True))
        assert [r.success for r in finish(vllms)] == [True]
        assert (memory[6] == memory[2]).all()
    finally:
        ours.shutdown()
        vllms.shutdown()


def test_a_promotion_from_kvtier_goes_through_vllms_tiering_manager(tmp_path, memory):
    # A first engine stores blocks through its tier manager; a second one,
    # with an empty primary tier, finds them in kvtier's tier and promotes them.
    expected = [memory[0].copy(), memory[1].copy()]
    keys = [key(10), key(11)]
    store_through_manager(kvtier_tier(tmp_path, memory), memory, keys, expected)
    second_memory = primary_memory(BLOCKS, BLOCK_BYTES)
    tier = kvtier_tier(tmp_path, second_memory)
    try:
        for block, value in zip(promote_through_manager(tier, second_memory, keys), expected):
            assert (second_memory[block] == value).all(), "the promoted bytes are the stored ones"
    finally:
        tier.shutdown()


def test_a_vllm_whose_file_names_kvtier_does_not_know_is_refused(tmp_path, memory, monkeypatch):
    real = FileMapper.get_file_name
    monkeypatch.setattr(FileMapper, "get_file_name", lambda self, k: real(self, k) + ".v2")
    with pytest.raises(RuntimeError, match="not one kvtier knows"):
        kvtier_tier(tmp_path, memory)


# Off the GIL -----------------------------------------------------------------


@pytest.fixture
def gil_hog():
    """Makes the running thread keep the GIL: no other Python thread runs
    until it blocks, which the loops below never do."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    yield
    sys.setswitchinterval(interval)


def busy_until(done, seconds=5.0):
    """Spins in Python, never blocking, until `done()` or the deadline."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if done():
            return True
    return False


def test_lookups_stores_and_loads_finish_while_the_scheduler_thread_holds_the_gil(tmp_path, memory, gil_hog):
    tier = kvtier_tier(tmp_path, memory)
    try:
        ctx = context("busy")
        assert tier.lookup(key(1), ctx) is LookupResult.RETRY
        tier.on_schedule_end(STEP_END)
        assert busy_until(lambda: tier.lookup(key(1), ctx) is not LookupResult.RETRY)
        tier.submit_store(job(1, [key(1), key(2)], [0, 1]))
        finished = []
        assert busy_until(lambda: finished.extend(tier.get_finished_jobs()) or finished)
        assert finished[0].success
        tier.submit_load(job(2, [key(2)], [7], promotion=True))
        finished.clear()
        assert busy_until(lambda: finished.extend(tier.get_finished_jobs()) or finished)
        assert finished[0].success and (memory[7] == memory[1]).all()
    finally:
        tier.shutdown()


def test_vllms_own_lookup_manager_cannot_answer_while_the_gil_is_held(tmp_path, memory, gil_hog):
    # The same loop over vLLM's fs tier: its lookup worker is a Python thread,
    # which the loop starves. This is what the test above tells apart.
    tier = FileSystemTierManager(offloading_spec(), memoryview(memory), "fs", str(tmp_path), 1, 1)
    try:
        ctx = context("busy")
        assert tier.lookup(key(1), ctx) is LookupResult.RETRY
        tier.on_schedule_end(STEP_END)
        assert not busy_until(lambda: tier.lookup(key(1), ctx) is not LookupResult.RETRY, seconds=0.5)
    finally:
        sys.setswitchinterval(0.005)
        tier.shutdown()


@pytest.mark.parametrize("root_dir", ["", None, 7, "kv\0cache", b"/tmp/kv"])
def test_a_bad_root_dir_is_a_configuration_error(tmp_path, memory, monkeypatch, root_dir):
    """vLLM's FileMapper takes root_dir unchecked: "" made directories below
    /, None below ./None. The tier refuses them before any is made."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(kvtier.ConfigError, match="root_dir"):
        FsTier(
            offloading_spec=offloading_spec(),
            primary_kv_view=memoryview(memory),
            tier_type="kvtier",
            root_dir=root_dir,
        )
    assert list(tmp_path.iterdir()) == [], "nothing was made"


@pytest.mark.parametrize("grace", [-1.0, 1e20, float("nan")])
def test_a_shutdown_grace_out_of_range_is_a_configuration_error(tmp_path, memory, grace):
    with pytest.raises(kvtier.ConfigError, match="shutdown_grace"):
        kvtier_tier(tmp_path, memory, shutdown_grace=grace)


def test_the_package_keeps_working_without_the_tier(tmp_path):
    # kvtier.vllm's other names need no vLLM; FsTier is imported on demand.
    assert "FsTier" in kvtier.vllm.__all__
    assert kvtier.vllm.FsTier is FsTier

"""``kvtier.vllm.ObjectTier`` inside a real vLLM, on a real S3 server
(SeaweedFS, started by ``seaweed.py`` on loopback for this module).

- its object names are vLLM's obj tier's, from vLLM's own ``FileMapper``
  built as vLLM's obj tier builds it, with the empty segment left out;
- vLLM's tier factory loads it from ``module_path`` with vLLM's own
  ``store_config`` and ``prefix``, or with kvtier's ``url``;
- one host's stores are another host's hits and loads, through vLLM's
  ``TieringOffloadingManager``;
- a missing block fails the load through vLLM's failure path (the tail is
  marked a miss);
- wrong credentials, a missing bucket or an endpoint that does not answer
  are errors at start that name the setting;
- with the server stopped, lookups miss within ``lookup_timeout`` and jobs
  fail; once it is back, the tier is used again.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from kvtier import ConfigError
from kvtier.vllm import ObjectTier
from kvtier.vllm.object_tier import rank_prefix_of
from vllm.v1.kv_offload.base import LookupResult, make_offload_key
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.base import TransferJob
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

from seaweed import ACCESS_KEY, SECRET_KEY, Seaweed
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
BUCKET = "kvtier-vllm"


@pytest.fixture(scope="module")
def server():
    with Seaweed(buckets=[BUCKET], anonymous=True) as server:
        yield server


@pytest.fixture
def memory():
    data = primary_memory(BLOCKS, BLOCK_BYTES)
    data[:] = np.random.default_rng(11).integers(0, 256, data.shape, dtype=np.uint8)
    return data


def store_config(server, **overrides):
    return server.store_config(BUCKET, **overrides)


def object_tier(server, memory, prefix, spec=None, **settings):
    settings.setdefault("store_config", store_config(server))
    return ObjectTier(
        offloading_spec=spec or offloading_spec(),
        primary_kv_view=memoryview(memory),
        tier_type="kvtier-obj",
        prefix=prefix,
        n_read_threads=2,
        n_write_threads=2,
        request_timeout=2.0,
        connect_timeout=1.0,
        max_retries=1,
        **settings,
    )


def job(job_id, keys, chunk_ids, promotion=False):
    return TransferJob(
        job_id=job_id,
        keys=keys,
        chunk_ids=np.array(chunk_ids, dtype=np.int64),
        is_promotion=promotion,
        req_context=context("r"),
    )


def finish(tier, timeout=20.0):
    """The jobs' results, polled as vLLM's tier manager polls."""
    deadline = time.monotonic() + timeout
    results = []
    while time.monotonic() < deadline:
        results.extend(tier.get_finished_jobs())
        if not tier._transfers.in_flight():
            results.extend(tier.get_finished_jobs())
            return results
        time.sleep(0.005)
    raise AssertionError("jobs did not finish")


def resolve(tier, keys, ctx, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        verdicts = [tier.lookup(k, ctx) for k in keys]
        if LookupResult.RETRY not in verdicts or time.monotonic() > deadline:
            return verdicts
        tier.on_schedule_end(STEP_END)
        time.sleep(0.002)


@pytest.mark.parametrize("prefix", ["fleet", "a/b", ""])
def test_object_names_are_vllms_obj_tier_names_without_the_empty_segment(server, memory, prefix):
    spec = offloading_spec()
    tier = object_tier(server, memory, prefix, spec)
    try:
        # vLLM's obj tier builds its mapper this way (manager.py).
        root_dir = f"{prefix}/" if prefix else ""
        vllms = FileMapper.from_offloading_spec(root_dir, spec, parallel_agnostic=True)
        keys = [make_offload_key(b"\x01", 0), make_offload_key(b"\xab\xcd", 7), make_offload_key(bytes(range(32)), 2)]
        for n, k in enumerate(keys):
            memory[n] = n + 1
        tier.submit_store(job(1, keys, [0, 1, 2]))
        assert [r.success for r in finish(tier)] == [True]
        names = set(server.list_objects(BUCKET, tier.rank_prefix))
        theirs = {vllms.get_file_name(k) for k in keys}
        # vLLM's names have an empty segment after the prefix ("//"), or a
        # leading "/" without one: kvtier's are the same names without it.
        assert all(("//" in name) if prefix else name.startswith("/") for name in theirs)
        assert names == {"/".join(part for part in name.split("/") if part) for name in theirs}
        assert tier.rank_prefix == rank_prefix_of(vllms)
    finally:
        tier.shutdown()


def test_vllms_factory_loads_the_tier_with_vllms_settings_or_a_url(server, memory, monkeypatch):
    config = {"type": "ObjectTier", "module_path": "kvtier.vllm", "store_config": store_config(server),
              "prefix": "factory", "io_threads": 4}
    tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(memory), offloading_spec())
    try:
        assert isinstance(tier, ObjectTier) and tier.tier_type == "ObjectTier"
        assert resolve(tier, [key(1)], context("a")) == [LookupResult.MISS]
    finally:
        tier.shutdown()
    # kvtier's URL, the credentials from the environment.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    config = {"type": "ObjectTier", "module_path": "kvtier.vllm",
              "url": f"s3://{BUCKET}/factory?endpoint={server.endpoint}"}
    tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(memory), offloading_spec())
    try:
        assert tier.rank_prefix.startswith("factory/")
        assert resolve(tier, [key(1)], context("a")) == [LookupResult.MISS]
    finally:
        tier.shutdown()


def test_one_hosts_stores_are_another_hosts_hits_through_vllms_tier_manager(server, memory):
    expected = [memory[0].copy(), memory[1].copy()]
    keys = [key(10), key(11)]
    store_through_manager(object_tier(server, memory, "hosts"), memory, keys, expected)
    # Host B: its own memory, its own tier, the same bucket.
    other = primary_memory(BLOCKS, BLOCK_BYTES)
    tier = object_tier(server, other, "hosts")
    try:
        for block, value in zip(promote_through_manager(tier, other, keys), expected):
            assert (other[block] == value).all(), "the promoted bytes are the stored ones"
    finally:
        tier.shutdown()


def test_a_missing_block_fails_the_load_and_only_its_tail_becomes_a_miss(server, memory):
    tier = object_tier(server, memory, "failing")
    try:
        tier.submit_store(job(1, [key(1)], [0]))
        assert [r.success for r in finish(tier)] == [True]
        assert resolve(tier, [key(1), key(2)], context("a")) == [LookupResult.HIT, LookupResult.MISS]
        tier.submit_load(job(2, [key(1), key(2), key(3)], [4, 5, 6], promotion=True))
        (result,) = finish(tier)
        assert not result.success
        assert result.successful_keys == (key(1),)
        assert (memory[4] == memory[0]).all()
    finally:
        tier.shutdown()


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"secret_key": "s3cr3t-wrong-value"}, "store_config['access_key'] / store_config['secret_key']"),
        ({"bucket": "no-such-bucket"}, "store_config['bucket']"),
        ({"endpoint_override": "127.0.0.1:1"}, "store_config['endpoint_override']"),
        ({"scheme": "ftp"}, "store_config['scheme']"),
        ({"acess_key": "x"}, "store_config['acess_key']"),
    ],
)
def test_a_bad_store_is_an_error_at_start_that_names_the_setting(server, memory, overrides, named):
    with pytest.raises(ConfigError) as error:
        object_tier(server, memory, "bad", store_config=store_config(server, **overrides))
    assert str(error.value).startswith(named), str(error.value)
    assert "s3cr3t-wrong-value" not in str(error.value), "a secret is never shown"


def test_with_the_server_stopped_lookups_miss_jobs_fail_and_the_tier_comes_back(memory):
    with Seaweed(buckets=[BUCKET], anonymous=True) as server:
        tier = object_tier(server, memory, "outage", lookup_timeout=1.0)
        try:
            tier.submit_store(job(1, [key(1)], [0]))
            assert [r.success for r in finish(tier)] == [True]
            server.stop()
            started = time.monotonic()
            assert resolve(tier, [key(1)], context("during")) == [LookupResult.MISS]
            tier.submit_store(job(2, [key(2)], [1]))
            tier.submit_load(job(3, [key(1)], [5], promotion=True))
            results = {r.job_id: r.success for r in finish(tier)}
            assert results == {2: False, 3: False}
            print(f"outage: a lookup and two jobs failed in {time.monotonic() - started:.1f} s")
            server.start()
            server.wait_serving(BUCKET, next(iter(server.list_objects(BUCKET, tier.rank_prefix))))
            tier.on_request_finished(context("during"))
            assert resolve(tier, [key(1)], context("after")) == [LookupResult.HIT]
            tier.submit_load(job(4, [key(1)], [5], promotion=True))
            assert [r.success for r in finish(tier)] == [True]
            assert (memory[5] == memory[0]).all()
        finally:
            tier.shutdown()


def test_capacity_bytes_bounds_the_prefix_and_reconciles_count_the_other_hosts(server, memory):
    budget = 3 * BLOCK_BYTES
    a = object_tier(server, memory, "budget", capacity_bytes=budget, rescan_interval=0.05)
    other = primary_memory(BLOCKS, BLOCK_BYTES)
    b = object_tier(server, other, "budget", capacity_bytes=budget)
    try:
        listed = lambda: sum(server.list_objects(BUCKET, a.rank_prefix + "/").values())  # noqa: E731
        for n in range(5):
            a.submit_store(job(n, [key(n)], [n]))
            assert [r.success for r in finish(a)] == [True]
            assert listed() <= budget
        # The lookups heard of the two evictions: those keys miss at once.
        assert resolve(a, [key(0), key(1), key(4)], context("a")) == [
            LookupResult.MISS, LookupResult.MISS, LookupResult.HIT]
        # Host B writes two blocks into the same prefix: A's reconcile
        # counts them and brings the prefix back within the budget.
        b.submit_store(job(1, [key(10), key(11)], [0, 1]))
        assert [r.success for r in finish(b)] == [True]
        deadline = time.monotonic() + 20
        while listed() > budget and time.monotonic() < deadline:
            time.sleep(0.05)
        assert listed() <= budget
        stats = a.capacity_stats()
        assert stats["reconciles"] > 0 and stats["adopted"] >= 1, stats
    finally:
        a.shutdown()
        b.shutdown()


def test_a_stale_upload_of_a_block_is_aborted_at_start_and_others_stay(server, memory):
    spec = offloading_spec()
    first = object_tier(server, memory, "uploads", spec)
    rank_prefix = first.rank_prefix
    first.shutdown()
    block = f"{rank_prefix}/abc/de_g0/abcde{'0' * 27}.bin"
    other = f"{rank_prefix}/notes/upload.txt"
    server.start_upload(BUCKET, block)
    server.start_upload(BUCKET, other)
    assert sorted(server.list_uploads(BUCKET, rank_prefix)) == sorted([block, other])
    tier = object_tier(server, memory, "uploads", spec, stale_temp_age=0.0)
    try:
        deadline = time.monotonic() + 20
        while block in server.list_uploads(BUCKET, rank_prefix) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.list_uploads(BUCKET, rank_prefix) == [other]
    finally:
        tier.shutdown()


def test_a_block_at_vllms_own_name_is_served_where_the_server_collapses_empty_segments(server, memory):
    # vLLM's obj tier writes `{prefix}//{model}_{digest}_r0/...`. SeaweedFS
    # stores objects in a file tree and collapses the empty segment, so the
    # object is the one kvtier names: both tiers share it there. (AWS S3
    # keeps keys verbatim: there the two names are two objects; see
    # docs/design.md, "vLLM's object keys".)
    spec = offloading_spec()
    vllms = FileMapper.from_offloading_spec("shared/", spec, parallel_agnostic=True)
    block = make_offload_key(b"\x5a" * 16, 0)
    name = vllms.get_file_name(block)
    assert "//" in name
    expected = np.random.default_rng(3).integers(0, 256, BLOCK_BYTES, dtype=np.uint8)
    server.put_object(BUCKET, name, expected.tobytes())
    tier = object_tier(server, memory, "shared", spec)
    try:
        assert resolve(tier, [block], context("a")) == [LookupResult.HIT]
        tier.submit_load(job(1, [block], [7], promotion=True))
        assert [r.success for r in finish(tier)] == [True]
        assert (memory[7] == expected).all()
    finally:
        tier.shutdown()

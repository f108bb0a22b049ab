"""``kvtier.vllm.ObjectTier`` with the fleet's books (``index``) inside a
real vLLM, on a real S3 server (SeaweedFS) and a real Valkey, both started
for this module on loopback (``seaweed.py``, ``valkey.py``).

- hosts sharing a prefix stay within one ``capacity_bytes`` at every
  store, each host's stores and evictions are its KV events, and one
  host's stores are another's hits and loads through vLLM's
  ``TieringOffloadingManager``, the lookups answered by the books;
- a Valkey restarted (its books lost): lookups miss and stores fail; one
  host rebuilds the books from a listing and hits come back;
- SeaweedFS stopped: a block the books hold fails to load (vLLM
  recomputes it), its pin is let go, and it loads once the store is back;
- a bad ``index`` is an error at start that names it, without the
  password.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from kvtier import ConfigError, KvtierError
from kvtier.vllm import ObjectTier
from vllm.v1.kv_offload.base import LookupResult
from vllm.v1.kv_offload.tiering.base import TransferJob

from seaweed import Seaweed
from valkey import Valkey
from vllm_support import STEP_END, context, key, offloading_spec, primary_memory, promote_through_manager

BLOCKS, BLOCK_BYTES = 8, 64 * 1024
BUCKET = "kvtier-fleet-books"


@pytest.fixture(scope="module")
def server():
    with Seaweed(buckets=[BUCKET], anonymous=True) as server:
        yield server


@pytest.fixture
def valkey():
    with Valkey() as valkey:
        yield valkey


@pytest.fixture
def memory():
    data = primary_memory(BLOCKS, BLOCK_BYTES)
    data[:] = np.random.default_rng(43).integers(0, 256, data.shape, dtype=np.uint8)
    return data


def fleet_tier(server, valkey, memory, prefix, events=False, **settings):
    settings.setdefault("index", valkey.url)
    return ObjectTier(
        offloading_spec=offloading_spec(kv_events=events),
        enable_kv_events=events,
        primary_kv_view=memoryview(memory),
        tier_type="kvtier-fleet",
        store_config=server.store_config(BUCKET),
        prefix=prefix,
        n_read_threads=2,
        n_write_threads=2,
        request_timeout=2.0,
        connect_timeout=1.0,
        max_retries=1,
        lookup_timeout=1.0,
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


def test_hosts_share_one_budget_and_one_hosts_stores_are_anothers_hits(server, valkey, memory):
    budget = 3 * BLOCK_BYTES
    a = fleet_tier(server, valkey, memory, "shared", events=True, capacity_bytes=budget)
    other = primary_memory(BLOCKS, BLOCK_BYTES)
    b = fleet_tier(server, valkey, other, "shared", events=True, capacity_bytes=budget)
    try:
        listed = lambda: sum(server.list_objects(BUCKET, a.rank_prefix + "/").values())  # noqa: E731
        for n in range(6):
            tier = (a, b)[n % 2]
            tier.submit_store(job(n, [key(n)], [n]))
            assert [r.success for r in finish(tier)] == [True]
            assert listed() <= budget, f"after store {n}"
        # Each host's KV events: its stores, and the blocks it evicted to
        # make room (room for three: B's store of 3 evicted 0, A's of 4
        # evicted 1, B's of 5 evicted 2).
        for tier, stored, removed in ((a, [0, 2, 4], [[1]]), (b, [1, 3, 5], [[0], [2]])):
            events = list(tier.take_events())
            assert [e.keys for e in events if not e.removed] == [[key(n)] for n in stored]
            assert [e.keys for e in events if e.removed] == [[key(n) for n in keys] for keys in removed]
        # B sees what A stored (and what the fleet evicted) from the books.
        assert resolve(b, [key(0), key(3), key(4), key(5)], context("b")) == [
            LookupResult.MISS, LookupResult.HIT, LookupResult.HIT, LookupResult.HIT]
        a._transfers.reconcile()  # the figures are the last upkeep's: one now
        stats = a.capacity_stats()
        assert (stats["resident_bytes"], stats["capacity_bytes"]) == (budget, budget), stats
    finally:
        a.shutdown()
        b.shutdown()
    # Host C, empty, promotes A's block through vLLM's manager.
    third = primary_memory(BLOCKS, BLOCK_BYTES)
    c = fleet_tier(server, valkey, third, "shared", capacity_bytes=budget)
    try:
        (block,) = promote_through_manager(c, third, [key(4)])
        assert (third[block] == memory[4]).all(), "the promoted bytes are A's"
    finally:
        c.shutdown()


def test_a_restarted_valkey_misses_then_its_books_are_rebuilt(server, valkey, memory):
    tier = fleet_tier(server, valkey, memory, "restart", capacity_bytes=4 * BLOCK_BYTES, index_lease=0.9)
    try:
        expected = [memory[0].copy(), memory[1].copy()]
        tier.submit_store(job(1, [key(1), key(2)], [0, 1]))
        assert [r.success for r in finish(tier)] == [True]
        valkey.stop()
        valkey.start()
        # Until the books are rebuilt (the tier's upkeep, every 0.3 s):
        # lookups miss or wait, stores are refused, nothing hangs.
        started = time.monotonic()
        while time.monotonic() - started < 20:
            # A request per try: a finished request's verdicts are dropped,
            # as vLLM's requests end and new ones look the keys up again.
            ctx = context(f"t{time.monotonic()}")
            verdicts = resolve(tier, [key(1)], ctx)
            tier.on_request_finished(ctx)
            if verdicts == [LookupResult.HIT]:
                break
            time.sleep(0.1)
        assert verdicts == [LookupResult.HIT], "hits came back once the books were rebuilt"
        print(f"books rebuilt and hits back {time.monotonic() - started:.1f} s after the restart")
        tier.submit_load(job(2, [key(1), key(2)], [5, 6], promotion=True))
        assert [r.success for r in finish(tier)] == [True]
        assert (memory[5] == expected[0]).all() and (memory[6] == expected[1]).all()
    finally:
        tier.shutdown()


def test_with_the_store_stopped_a_hit_in_the_books_fails_to_load_and_holds_nothing(server, valkey, memory):
    # The books answer (Valkey is up) but the objects do not (SeaweedFS is
    # stopped): the load fails (vLLM recomputes the blocks), its pin is let
    # go, and once the store is back the block loads.
    tier = fleet_tier(server, valkey, memory, "outage", capacity_bytes=4 * BLOCK_BYTES)
    try:
        tier.submit_store(job(1, [key(1)], [0]))
        assert [r.success for r in finish(tier)] == [True]
        assert resolve(tier, [key(1)], context("before")) == [LookupResult.HIT]
        server.stop()
        try:
            tier.submit_load(job(2, [key(1)], [5], promotion=True))
            assert [r.success for r in finish(tier)] == [False], "a failed load, recomputed by vLLM"
            pins = [k for k in valkey.ask("KEYS", "kvtier:*:pins") if valkey.ask("HGETALL", k)]
            assert not pins, "the read's pin is let go"
        finally:
            server.start()
        server.wait_serving(BUCKET, next(iter(server.list_objects(BUCKET, tier.rank_prefix + "/"))))
        tier.submit_load(job(3, [key(1)], [6], promotion=True))
        assert [r.success for r in finish(tier)] == [True]
        assert (memory[6] == memory[0]).all()
    finally:
        tier.shutdown()


def test_a_bad_index_is_an_error_at_start_that_names_it(server, valkey, memory):
    with pytest.raises(ConfigError) as error:
        fleet_tier(server, valkey, memory, "bad", capacity_bytes=BLOCK_BYTES, index="http://u:hunter2@h:1")
    assert str(error.value).startswith("index "), str(error.value)
    assert "hunter2" not in str(error.value)
    with pytest.raises(ConfigError):
        fleet_tier(server, valkey, memory, "bad")  # an index without capacity_bytes
    with pytest.raises(KvtierError) as error:
        fleet_tier(server, valkey, memory, "bad", capacity_bytes=BLOCK_BYTES, index="redis://:hunter2@127.0.0.1:1")
    assert "hunter2" not in str(error.value), str(error.value)

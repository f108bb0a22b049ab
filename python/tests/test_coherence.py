"""Lookups stay coherent with a budgeted tier (``Lookup.settle`` fed by
``VllmTransfers.take_changes``, as ``kvtier.vllm.FsTier`` does each step):
a store that completes while a lookup's probe runs makes the lookup hit
whatever the probe answers afterwards, and an evicted hit becomes a miss
before any load is tried.
"""

from __future__ import annotations

import os
import threading

from kvtier import Lookup
from kvtier._native import VllmTransfers
from kvtier.vllm import make_key

BLOCK = 4096


def key(n: int) -> bytes:
    return make_key(n.to_bytes(8, "big"), 0)


def transfers_for(rank, capacity_blocks=None) -> VllmTransfers:
    view = memoryview(bytearray(4 * BLOCK)).cast("B", (4, BLOCK))
    capacity = None if capacity_blocks is None else capacity_blocks * BLOCK
    transfers = VllmTransfers(rank, view, load_threads=1, store_threads=1, capacity_bytes=capacity)
    transfers.record_changes(True)
    return transfers


def store(transfers: VllmTransfers, lookup: Lookup, job: int, keys: list[bytes]) -> int:
    transfers.submit_store(job, keys, list(range(len(keys))))
    transfers.drain()
    assert all(row[2] for row in transfers.finished())
    changed = 0
    for changed_key, present in transfers.take_changes():
        changed += lookup.settle([changed_key], present)
    return changed


def test_a_store_completing_during_a_probe_wins_over_its_late_absence(tmp_path):
    for capacity_blocks in (None, 8):
        rank = tmp_path / f"m{capacity_blocks}_r0"
        transfers = transfers_for(rank, capacity_blocks)
        looked, release = threading.Event(), threading.Event()

        def probe(keys, request):
            # The files as they are when the probe starts, answered later.
            answers = [os.path.exists(transfers.path_of(k)) for k in keys]
            looked.set()
            release.wait(10)
            return answers

        with Lookup.python(probe) as lookup:
            assert lookup.lookup(key(1), "r") is None
            lookup.flush()
            assert looked.wait(10)
            assert store(transfers, lookup, 1, [key(1)]) == 1
            assert lookup.lookup(key(1), "r") is True, "waiting lookups hit at once"
            release.set()
            lookup.wait_idle()
            assert lookup.lookup(key(1), "r") is True, "the late absence is stale"
            stats = lookup.stats()
            assert (stats["stale_results"], stats["settled_hits"]) == (1, 1)
        transfers.shutdown()


def test_an_evicted_hit_misses_before_any_load(tmp_path):
    rank = tmp_path / "m_r0"
    transfers = transfers_for(rank, capacity_blocks=2)
    with Lookup.vllm_fs(rank) as lookup:
        store(transfers, lookup, 1, [key(1), key(2)])
        for n in (1, 2):
            assert lookup.lookup(key(n), "r") is None
        lookup.flush()
        lookup.wait_idle()
        assert [lookup.lookup(key(n), "r") for n in (1, 2)] == [True, True]
        # Two more blocks under a budget of two: 1 and 2 are evicted.
        assert store(transfers, lookup, 2, [key(3), key(4)]) == 2
        assert not os.path.exists(transfers.path_of(key(1)))
        assert [lookup.lookup(key(n), "r") for n in (1, 2)] == [False, False]
        assert lookup.stats()["settled_misses"] == 2
    transfers.shutdown()


def test_changes_are_kept_only_while_recorded(tmp_path):
    transfers = transfers_for(tmp_path / "m_r0", capacity_blocks=1)
    transfers.submit_store(1, [key(1), key(2)], [0, 1])
    transfers.drain()
    transfers.finished()
    assert transfers.take_changes() == [(key(1), True), (key(1), False), (key(2), True)]
    assert transfers.take_changes() == []
    transfers.record_changes(False)
    transfers.submit_store(2, [key(3)], [2])
    transfers.drain()
    transfers.finished()
    assert transfers.take_changes() == []
    transfers.shutdown()

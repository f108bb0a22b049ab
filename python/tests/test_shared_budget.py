"""Engines sharing one directory with one byte budget
(``VllmTransfers(..., capacity_bytes=N, rescan_interval=S)``, what
``kvtier.vllm.FsTier``'s ``"rescan_interval"`` and the connector's setting
build): a reconcile counts the blocks the others wrote and forgets those
they deleted, tells the lookups of both, and evicts back to the budget; the
rescan thread does it on its own; bad settings are typed errors.
"""

from __future__ import annotations

import os
import time

import pytest

from kvtier import ConfigError
from kvtier._native import VllmTransfers
from kvtier.vllm import make_key

BLOCK = 4096


def primary(blocks: int) -> memoryview:
    return memoryview(bytearray(blocks * BLOCK)).cast("B", (blocks, BLOCK))


def key(n: int) -> bytes:
    return make_key(n.to_bytes(8, "big"), 0)


def bytes_on_disk(rank) -> int:
    return sum(
        os.path.getsize(os.path.join(top, name))
        for top, _, names in os.walk(rank)
        for name in names
        if name.endswith(".bin")
    )


def store(transfers: VllmTransfers, job: int, n: int) -> None:
    transfers.submit_store(job, [key(n)], [0])
    transfers.drain()
    [(_, _, success, _, _, _)] = transfers.finished()
    assert success


def test_a_reconcile_counts_the_neighbours_blocks_and_evicts_back_to_the_budget(tmp_path):
    rank = tmp_path / "m_r0"
    budget = dict(load_threads=1, store_threads=1, capacity_bytes=3 * BLOCK)
    a = VllmTransfers(rank, primary(1), **budget)
    b = VllmTransfers(rank, primary(1), **budget)
    a.record_changes(True)
    for n in range(3):
        store(a, n, n)
        store(b, n, 10 + n)
    assert bytes_on_disk(rank) == 6 * BLOCK, "each counts its own three"
    a.take_changes()
    report = a.reconcile()
    assert (report["adopted"], report["forgotten"], report["evicted"]) == (3, 0, 3)
    assert set(report) == {"adopted", "forgotten", "evicted", "swept", "seconds"}
    assert bytes_on_disk(rank) == 3 * BLOCK == a.capacity_stats()["resident_bytes"]
    # The lookups hear of the neighbour's blocks and of the evictions.
    changes = a.take_changes()
    assert sorted(k for k, present in changes if present) == sorted(key(10 + n) for n in range(3))
    assert sorted(k for k, present in changes if not present) == sorted(key(n) for n in range(3))
    # b learns that a deleted nothing of b's; a's own are gone from disk,
    # never counted by b.
    assert b.reconcile()["forgotten"] == 0
    stats = a.capacity_stats()
    assert (stats["reconciles"], stats["adopted"]) == (1, 3)
    a.shutdown()
    b.shutdown()


def test_rescanning_engines_settle_within_one_budget(tmp_path):
    rank = tmp_path / "m_r0"
    budget = dict(load_threads=1, store_threads=1, capacity_bytes=4 * BLOCK, rescan_interval=0.02)
    engines = [VllmTransfers(rank, primary(1), **budget) for _ in range(2)]
    for n in range(24):
        store(engines[n % 2], n, n)
    # Waited for (up to 10 s: a loaded machine may run a thread late): both
    # have reconciled and the directory holds one budget.
    def settled() -> bool:
        return bytes_on_disk(rank) <= 4 * BLOCK and all(e.capacity_stats()["reconciles"] > 0 for e in engines)

    deadline = time.monotonic() + 10
    while not settled() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert bytes_on_disk(rank) <= 4 * BLOCK
    assert all(engine.capacity_stats()["reconciles"] > 0 for engine in engines)
    for engine in engines:
        engine.shutdown()
    # Shut down, the threads are gone: nothing reconciles any more.
    counts = [engine.capacity_stats()["reconciles"] for engine in engines]
    time.sleep(0.1)
    assert [engine.capacity_stats()["reconciles"] for engine in engines] == counts


@pytest.mark.parametrize(
    "setting",
    [
        {"rescan_interval": 1.0},  # no budget to reconcile
        {"capacity_bytes": BLOCK, "rescan_interval": 0.0},
        {"capacity_bytes": BLOCK, "rescan_interval": -1.0},
        {"capacity_bytes": BLOCK, "rescan_interval": float("nan")},
        {"capacity_bytes": BLOCK, "rescan_interval": 1e12},
    ],
)
def test_bad_rescan_settings_are_config_errors(tmp_path, setting):
    with pytest.raises(ConfigError):
        VllmTransfers(tmp_path / "m_r0", primary(1), load_threads=1, store_threads=1, **setting)


def test_reconcile_needs_a_budget(tmp_path):
    transfers = VllmTransfers(tmp_path / "m_r0", primary(1), load_threads=1, store_threads=1)
    with pytest.raises(ConfigError, match="no byte budget"):
        transfers.reconcile()
    transfers.shutdown()

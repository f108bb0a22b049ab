"""A byte budget on vLLM's raw block files (``VllmTransfers(...,
capacity_bytes=N)``, what ``kvtier.vllm.FsTier``'s ``"capacity_bytes"`` and
the connector's setting build): the files stay within it, a store without
room fails as a job and loses nothing, an evicted block's load fails and
gives up only its tail, a restart keeps the newest blocks, and bad settings
are typed errors.
"""

from __future__ import annotations

import os

import pytest

from kvtier import ConfigError
from kvtier._native import VllmTransfers
from kvtier.vllm import make_key

BLOCK = 4096


def primary(blocks: int) -> memoryview:
    return memoryview(bytearray(blocks * BLOCK)).cast("B", (blocks, BLOCK))


def key(n: int) -> bytes:
    return make_key(n.to_bytes(8, "big"), 0)


def block_files(rank) -> dict[str, int]:
    found = {}
    for top, _, names in os.walk(rank):
        for name in names:
            if name.endswith(".bin"):
                found[os.path.join(top, name)] = os.path.getsize(os.path.join(top, name))
    return found


def run(transfers: VllmTransfers) -> list:
    transfers.drain()
    return transfers.finished()


def test_stores_evict_the_least_recently_used_and_stay_within_the_budget(tmp_path):
    rank = tmp_path / "m_r0"
    view = primary(4)
    transfers = VllmTransfers(rank, view, load_threads=1, store_threads=1, capacity_bytes=3 * BLOCK)
    for n in range(3):
        transfers.submit_store(n, [key(n)], [n % 4])
        assert run(transfers)[0][2], "stored"
    # A load of block 0 makes block 1 the least recently used.
    transfers.submit_load(10, [key(0)], [3])
    assert run(transfers)[0][2]
    for n in range(3, 12):
        transfers.submit_store(n, [key(n)], [n % 4])
        assert run(transfers)[0][2]
        assert sum(block_files(rank).values()) <= 3 * BLOCK
        if n == 3:
            assert os.path.exists(transfers.path_of(key(0))), "read, so kept"
            assert not os.path.exists(transfers.path_of(key(1))), "least recently used, so evicted"
    stats = transfers.capacity_stats()
    assert stats["resident_bytes"] == sum(block_files(rank).values()) == 3 * BLOCK
    assert stats["evictions"] == 9 and stats["pins"] == 1 and stats["reserved_bytes"] == 0
    transfers.shutdown()


def test_an_evicted_blocks_load_fails_and_keeps_the_blocks_before_it(tmp_path):
    rank = tmp_path / "m_r0"
    view = primary(4)
    transfers = VllmTransfers(rank, view, load_threads=1, store_threads=1, capacity_bytes=2 * BLOCK)
    transfers.submit_store(1, [key(1), key(2)], [0, 1])
    assert run(transfers)[0][2]
    transfers.submit_store(2, [key(3)], [2])  # evicts key(1)
    assert run(transfers)[0][2]
    transfers.submit_load(3, [key(2), key(1), key(3)], [0, 1, 3])
    [(job, is_load, success, keys, done, _)] = run(transfers)
    assert (job, is_load, success, done) == (3, True, False, 1), "the first block loaded, then a miss"
    stats = transfers.capacity_stats()
    # Evicted, so not held: its pin missed, and nothing held was lost.
    assert (stats["pins"], stats["pin_misses"], stats["lost"]) == (1, 1, 0)
    transfers.shutdown()


def test_a_block_larger_than_the_budget_fails_its_job_and_nothing_is_lost(tmp_path):
    rank = tmp_path / "m_r0"
    # A budget smaller than a block is refused where it is set (issue 41);
    # a trim can still lower one below a block.
    transfers = VllmTransfers(rank, primary(2), load_threads=1, store_threads=1, capacity_bytes=BLOCK)
    assert transfers.trim(BLOCK - 1) == 0
    transfers.submit_store(1, [key(1)], [0])
    [(_, _, success, _, done, _)] = run(transfers)
    assert not success and done == 0
    assert block_files(rank) == {}
    assert transfers.capacity_stats()["rejected_too_large"] == 1
    transfers.shutdown()


def test_a_restart_keeps_the_newest_blocks_and_a_trim_lowers_the_budget(tmp_path):
    rank = tmp_path / "m_r0"
    view = primary(2)
    transfers = VllmTransfers(rank, view, load_threads=1, store_threads=1)
    for n in range(6):
        transfers.submit_store(n, [key(n)], [0])
        run(transfers)
        os.utime(transfers.path_of(key(n)), (1_000_000 + n, 1_000_000 + n))
    transfers.shutdown()
    again = VllmTransfers(rank, view, load_threads=1, store_threads=1, capacity_bytes=4 * BLOCK)
    report = again.scan_report()
    assert (report["blocks"], report["trimmed"]) == (4, 2)
    assert [os.path.exists(again.path_of(key(n))) for n in range(6)] == [False] * 2 + [True] * 4
    assert again.capacity_stats()["startup_trims"] == 2
    assert again.trim(BLOCK) == 3
    assert [os.path.exists(again.path_of(key(n))) for n in range(6)] == [False] * 5 + [True]
    again.shutdown()


@pytest.mark.parametrize(
    "setting",
    [
        {"capacity_bytes": 0},
        {"capacity_bytes": -5},
        {"capacity_bytes": True},
        {"capacity_bytes": 1.5},
        {"capacity_bytes": "10G"},
        {"capacity_bytes": 2**64},
        {"capacity_bytes": 10, "eviction_policy": "mru"},
        {"capacity_bytes": 10, "stale_temp_age": -1.0},
    ],
)
def test_bad_budget_settings_are_config_errors(tmp_path, setting):
    with pytest.raises(ConfigError):
        VllmTransfers(tmp_path / "m_r0", primary(1), load_threads=1, store_threads=1, **setting)


def test_without_a_budget_there_are_no_capacity_stats(tmp_path):
    transfers = VllmTransfers(tmp_path / "m_r0", primary(1), load_threads=1, store_threads=1)
    assert transfers.capacity_stats() is None and transfers.scan_report() is None
    with pytest.raises(ConfigError, match="no byte budget"):
        transfers.trim(10)
    transfers.shutdown()

"""kvtier._native.VllmTransfers: vLLM's tier stores and loads between a
buffer of primary blocks and vLLM's raw block files, on native threads.

vLLM itself is not needed here: the primary memory is a bytearray seen as a
2-D memoryview (vLLM's is a numpy view of a tensor), and the files are
checked against vLLM's layout rule. python/integration runs vLLM's own
tier tests against kvtier.vllm.FsTier, which is built on this.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

import kvtier
from kvtier import ConfigError
from kvtier._native import VllmTransfers
from kvtier.vllm import block_path, make_key

from conftest import watchdog

BLOCK = 4096


def primary(blocks: int, block: int = BLOCK) -> memoryview:
    """A primary tier's memory: `blocks` rows of `block` bytes."""
    return memoryview(bytearray(blocks * block)).cast("B", (blocks, block))


def row(view: memoryview, i: int) -> memoryview:
    """Block `i` of a primary view, as bytes to read or write."""
    return view.obj[i * view.strides[0] : (i + 1) * view.strides[0]]


def key(n: int) -> bytes:
    return make_key(n.to_bytes(8, "big"), 0)


def run(transfers: VllmTransfers) -> list:
    transfers.drain()
    return transfers.finished()


def test_stores_write_vllms_raw_files_and_loads_read_them_back(tmp_path):
    view = primary(4)
    view.obj[0:BLOCK] = b"\x01" * BLOCK
    view.obj[BLOCK : 2 * BLOCK] = bytes(range(256)) * (BLOCK // 256)
    rank = tmp_path / "m_0123456789ab_r0"
    transfers = VllmTransfers(rank, view, load_threads=2, store_threads=2)
    assert transfers.shape == (4, BLOCK)
    transfers.submit_store(1, [key(1), key(2)], [0, 1])
    assert run(transfers) == [(1, False, True, [key(1), key(2)], 2, pytest.approx(0, abs=60))]
    assert open(block_path(rank, key(2)), "rb").read() == bytes(row(view, 1))
    assert os.fspath(transfers.path_of(key(2))) == block_path(rank, key(2))

    transfers.submit_load(2, [key(2), key(1)], [3, 2])
    [(job, is_load, success, keys, done, _)] = run(transfers)
    assert (job, is_load, success, done) == (2, True, True, 2)
    assert row(view, 3) == row(view, 1) and row(view, 2) == b"\x01" * BLOCK
    transfers.shutdown()
    assert transfers.threads_alive == 0


def test_a_failed_load_says_how_many_leading_blocks_it_loaded(tmp_path):
    view = primary(6)
    transfers = VllmTransfers(tmp_path, view, load_threads=1, store_threads=1)
    transfers.submit_store(1, [key(1), key(2), key(3)], [0, 1, 2])
    run(transfers)
    open(block_path(tmp_path, key(2)), "wb").write(b"short")
    transfers.submit_load(2, [key(1), key(2), key(3)], [3, 4, 5])
    [(_, _, success, keys, done, _)] = run(transfers)
    assert not success and done == 1 and keys == [key(1), key(2), key(3)]
    assert not os.path.exists(block_path(tmp_path, key(2))), "the damaged block is removed"


def test_the_primary_memory_must_be_a_writable_contiguous_buffer_of_blocks(tmp_path):
    with pytest.raises(kvtier.ConfigError, match="read-only"):
        VllmTransfers(tmp_path, memoryview(bytes(BLOCK * 2)).cast("B", (2, BLOCK)))
    with pytest.raises(kvtier.ConfigError, match="C-contiguous"):
        VllmTransfers(tmp_path, primary(4)[::2])
    with pytest.raises(TypeError):
        VllmTransfers(tmp_path, object())


def test_the_memory_stays_alive_while_the_transfers_hold_it(tmp_path):
    data = bytearray(BLOCK * 2)
    transfers = VllmTransfers(tmp_path, memoryview(data).cast("B", (2, BLOCK)))
    with pytest.raises(BufferError):
        data.extend(b"x")  # exported: it can be neither resized nor freed
    del data
    transfers.submit_store(1, [key(1)], [0])
    assert run(transfers)[0][2] is True
    del transfers


def test_bad_jobs_fail_where_the_engine_hears_of_them_and_bad_calls_raise(tmp_path):
    transfers = VllmTransfers(tmp_path, primary(2), load_threads=1, store_threads=1)
    transfers.submit_load(1, [key(1)], [-1])  # names no block
    transfers.submit_load(2, [key(1)], [2])  # past the last one
    transfers.submit_store(3, [key(1), key(2)], [0])  # keys and blocks disagree
    transfers.refuse(4, [key(1)], False, "dropped under backpressure")
    results = sorted(run(transfers))
    assert [(job, success, done) for job, _, success, _, done, _ in results] == [
        (1, False, 0),
        (2, False, 0),
        (3, False, 0),
        (4, False, 0),
    ]
    transfers.submit_store(5, [key(1)], [0])
    with pytest.raises(kvtier.ConfigError, match="in flight"):
        transfers.submit_store(5, [key(1)], [0])
    with pytest.raises(kvtier.ConfigError):
        transfers.submit_store(-1, [key(1)], [0])
    with pytest.raises(TypeError):
        transfers.submit_store(6, ["not bytes"], [0])
    assert [job for job, *_ in run(transfers)] == [5]


def test_drain_lets_other_python_threads_run(tmp_path):
    # Big blocks, so the drain waits for a while; a switch interval no
    # thread reaches, so the other thread runs only if drain lets go of the
    # GIL while it waits.
    blocks, size = 8, 4 << 20
    transfers = VllmTransfers(tmp_path, primary(blocks, size), load_threads=1, store_threads=1)
    go, ran_at = threading.Event(), []
    thread = threading.Thread(target=lambda: (go.wait(), ran_at.append(time.monotonic())))
    thread.start()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        transfers.submit_store(1, [key(n) for n in range(blocks)], list(range(blocks)))
        go.set()  # the thread can run once this one lets go of the GIL
        started = time.monotonic()
        with watchdog():
            transfers.drain()
        drained = time.monotonic()
    finally:
        sys.setswitchinterval(interval)
    thread.join()
    assert started < ran_at[0] < drained, "the other thread ran only after drain returned"
    assert transfers.finished()[0][2] is True


def test_shutdown_lets_go_of_the_primary_memory(tmp_path):
    # vLLM's primary tier releases its memoryview right after the tiers'
    # shutdown(); an export kvtier still held made that raise BufferError.
    memory = bytearray(8 * BLOCK)
    view = memoryview(memory).cast("B", (8, BLOCK))
    transfers = VllmTransfers(tmp_path, view, load_threads=1, store_threads=1)
    for i in range(8):
        transfers.submit_store(i, [key(i)], [i])
    assert transfers.shutdown(grace=60) == (0, 0)
    view.release()
    memory.extend(b"x")  # a bytearray with a live export cannot resize
    assert transfers.shape == (8, BLOCK)
    finished = transfers.finished()
    assert sorted(job for job, *_ in finished) == list(range(8))
    assert all(success for _, _, success, *_ in finished), "the grace let every store finish"
    assert all(os.path.exists(block_path(tmp_path, key(i))) for i in range(8))


def test_shutdown_without_grace_reports_what_it_dropped(tmp_path):
    view = primary(64)
    transfers = VllmTransfers(tmp_path, view, load_threads=0, store_threads=1)
    for i in range(64):
        transfers.submit_store(i, [key(i)], [i])
    for i in range(64, 80):
        transfers.submit_load(i, [key(i)], [i - 64])
    loads, stores = transfers.shutdown()
    assert loads <= 16
    finished = transfers.finished()
    assert len(finished) == 80, "every job is reported, dropped or not"
    failed_stores = sum(1 for _, is_load, success, *_ in finished if not is_load and not success)
    assert failed_stores == stores
    with pytest.raises(ConfigError, match="grace"):
        VllmTransfers(tmp_path, primary(1)).shutdown(grace=-1)

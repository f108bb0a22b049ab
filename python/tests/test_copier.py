"""kvtier._native.BlockCopier without vLLM or torch: tensors are stood in
for by objects with torch's shape methods over ctypes buffers, which is all
the copier reads of a tensor."""

from __future__ import annotations

import ctypes
import gc
import weakref

import pytest

from kvtier import ConfigError
from kvtier._native import BlockCopier


class Rows:
    """`count` rows of `length` bytes, `step` bytes apart, in host memory,
    with the methods of a 2-D int8 torch tensor the copier reads."""

    class device:
        type = "cpu"

    def __init__(self, count: int, length: int, step: int) -> None:
        self.count, self.length, self.step = count, length, step
        self.memory = (ctypes.c_uint8 * (count * step))()

    def dim(self) -> int:
        return 2

    def element_size(self) -> int:
        return 1

    def size(self, d: int) -> int:
        return (self.count, self.length)[d]

    def stride(self, d: int) -> int:
        return (self.step, 1)[d]

    def data_ptr(self) -> int:
        return ctypes.addressof(self.memory)

    def row(self, i: int, start: int = 0, end: int | None = None) -> bytes:
        end = self.length if end is None else end
        return bytes(self.memory[i * self.step + start : i * self.step + end])

    def fill_row(self, i: int, data: bytes) -> None:
        ctypes.memmove(ctypes.addressof(self.memory) + i * self.step, data, len(data))


rows = Rows


PAGE = 64


def copier(per_chunk: int = 2, threads: int = 2):
    engine = rows(8, PAGE, PAGE + 16)  # padded engine rows
    region = rows(4, PAGE * per_chunk, PAGE * per_chunk + 32)
    for i in range(8):
        engine.fill_row(i, bytes([i + 1]) * PAGE)
    return BlockCopier([(engine, region, PAGE)], [[(0, PAGE - 4)]], per_chunk, threads=threads), engine, region


def test_a_store_and_a_load_move_each_block_to_its_chunk_slot_and_back():
    c, engine, region = copier()
    # Request blocks 1..3 (the first starts in slot 1 of its chunk).
    assert c.submit_store(1, [2, 5, 6], [3, 0], [3], [1]) == 3 * (PAGE - 4)
    assert c.wait([1]) == 1
    assert c.finished() == [(1, True, True, 3 * (PAGE - 4), pytest.approx(0, abs=60))]
    assert region.row(3, PAGE, 2 * PAGE - 4) == bytes([3]) * (PAGE - 4)
    assert region.row(0, 0, PAGE - 4) == bytes([6]) * (PAGE - 4)
    assert region.row(0, PAGE, 2 * PAGE - 4) == bytes([7]) * (PAGE - 4)
    assert region.row(3, 0, PAGE) == bytes(PAGE), "slot 0 of chunk 3 is not the job's"
    assert region.row(3, 2 * PAGE - 4, 2 * PAGE) == bytes(4), "a layer's page ends at its bytes"

    c.submit_load(2, [0, 7, 4], [3, 0], [3], [1])
    c.wait([2])
    [(job, is_store, ok, _, _)] = c.finished()
    assert (job, is_store, ok) == (2, False, True)
    assert engine.row(0, 0, PAGE - 4) == bytes([3]) * (PAGE - 4)
    assert engine.row(7, 0, PAGE - 4) == bytes([6]) * (PAGE - 4)
    assert engine.row(4, 0, PAGE - 4) == bytes([7]) * (PAGE - 4)
    assert c.finished() == [], "each job is reported once"
    c.shutdown()


@pytest.mark.parametrize(
    "ids",
    [
        ([8], [0], [1], [0]),  # engine block past the end
        ([1], [4], [1], [0]),  # chunk past the end
        ([-1], [0], [1], [0]),  # a negative block
        ([1, 2], [0], [2], [1]),  # starts in slot 1: needs two chunks
        ([1], [0], [1, 0], [0, 0]),  # two groups for a one-group layout
    ],
)
def test_a_job_that_does_not_fit_is_refused_whole(ids):
    c, engine, region = copier()
    before = bytes(region.memory)
    with pytest.raises(ConfigError, match="does not fit"):
        c.submit_store(9, *ids)
    assert c.in_flight == 0 and c.finished() == []
    assert bytes(region.memory) == before
    c.shutdown()


def test_an_id_in_flight_is_refused_and_a_shut_down_copier_takes_nothing():
    c, _, _ = copier(threads=1)
    c.submit_store(1, [1], [0], [1], [0])
    with pytest.raises(ConfigError, match="in flight"):
        c.submit_store(1, [2], [1], [1], [0])
    assert c.shutdown() <= 1
    assert [job for job, *_ in c.finished()] == [1], "shutdown runs what was submitted"
    with pytest.raises(ConfigError, match="shut down"):
        c.submit_store(2, [1], [0], [1], [0])


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda e, r: ([(e, r, PAGE)], [[(0, PAGE)]], 2, 0), "threads"),
        (lambda e, r: ([(e, r, PAGE)], [[(1, PAGE)]], 2, 1), "tensor 1"),
        (lambda e, r: ([(e, r, PAGE)], [[(0, PAGE + 1)]], 2, 1), "bytes"),
        (lambda e, r: ([(e, r, PAGE)], [[(0, PAGE)]], 3, 1), "offload view"),
        (lambda e, r: ([(e, r, 2 * PAGE)], [[(0, PAGE)]], 1, 1), "engine tensor"),
    ],
)
def test_a_layout_that_does_not_fit_its_tensors_is_refused(make, message):
    engine, region = rows(8, PAGE, PAGE), rows(4, 2 * PAGE, 2 * PAGE)
    tensors, groups, per_chunk, threads = make(engine, region)
    with pytest.raises(ConfigError, match=message):
        BlockCopier(tensors, groups, per_chunk, threads=threads)


def test_a_tensor_off_the_host_is_refused():
    engine, region = rows(8, PAGE, PAGE), rows(4, 2 * PAGE, 2 * PAGE)

    class device:
        type = "cuda"

    engine.device = device
    with pytest.raises(ConfigError, match="host memory"):
        BlockCopier([(engine, region, PAGE)], [[(0, PAGE)]], 2)


def test_shutdown_lets_go_of_the_tensors():
    c, engine, region = copier()
    gone = weakref.ref(region)
    del region
    c.submit_store(1, [1], [0], [1], [0])
    c.shutdown()
    gc.collect()
    assert gone() is None, "the copier still holds the offload view"

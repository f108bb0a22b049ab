"""The connector's data path on a worker: dumps (KV cache -> files) and
loads (files -> KV cache), through a staging area of whole blocks.

A dump goes through three phases: it waits for staging slots (``queued``),
its blocks are copied out of the KV cache into the slots by
``BlockCopier``'s native threads (``copying``), and the slots are written
to vLLM's block files by ``VllmTransfers``' native threads (``writing``).
Only the copy reads the KV cache, but a dump counts as running until its
files are written: that is when the save core may report its request.
The staging area is bounded (``staging_bytes``), so a burst of dumps
queues instead of growing memory; a queued dump holds its engine blocks,
which is what the delayed free is for.

A load reads files into load slots and copies them into the KV cache; it
is waited for within the step (the forward pass needs the blocks). It
stops at the first block that fails; that block and the ones after it
are reported as failed.

Nothing here waits unless asked to (``wait`` of one dump, ``load``);
``pump`` moves dumps on from phase to phase without blocking.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Optional, Sequence

import torch

from .._native import BlockCopier, VllmTransfers
from ._transfers import open_transfers

logger = logging.getLogger("kvtier.vllm")

__all__ = ["Dump", "DumpEngine", "LoadResult"]

# How long a waiter sleeps between polls of the file writes (seconds): the
# writes have no blocking wait of their own. Waits happen only on a
# preemption fence, a blocking save and shutdown.
_POLL = 0.0005


class Dump:
    """One dump: engine blocks written to the files of ``keys``. The save
    core's store task: ``done()`` never waits, ``wait()`` returns once the
    dump no longer reads the KV cache and its files are written (raising
    ``RuntimeError`` if it failed)."""

    __slots__ = ("job", "keys", "blocks", "slots", "phase", "error", "_engine", "submitted")

    def __init__(self, engine: "DumpEngine", job: int, keys: list[bytes], blocks: list[int]) -> None:
        self._engine = engine
        self.job = job
        self.keys = keys
        self.blocks = blocks
        self.slots: list[int] = []
        self.phase = "queued"
        self.error: Optional[str] = None
        self.submitted = time.monotonic()

    def done(self) -> bool:
        return self.phase == "done"

    def wait(self) -> None:
        self._engine.wait(self)
        if self.error is not None:
            raise RuntimeError(self.error)

    def __repr__(self) -> str:
        return f"Dump(job={self.job}, blocks={len(self.blocks)}, phase={self.phase})"


class LoadResult:
    """What a load did: ``loaded`` leading blocks are in the KV cache; the
    rest (``failed_blocks``, ``failed_keys``) must be recomputed."""

    __slots__ = ("loaded", "failed_blocks", "failed_keys")

    def __init__(self, loaded: int, failed_blocks: list[int], failed_keys: list[bytes]) -> None:
        self.loaded = loaded
        self.failed_blocks = failed_blocks
        self.failed_keys = failed_keys


class DumpEngine:
    """Dumps and loads for one worker (see the module's docs).

    ``tensors`` and ``groups`` describe the KV cache as vLLM's offloading
    worker sees it (``CanonicalKVCaches``: per tensor its block rows and
    page bytes; per group, ``(tensor_index, bytes)`` per layer). A block's
    file holds the pages of every tensor, in order, as vLLM's offload region
    lays out one chunk of one block: the bytes vLLM's fs tier writes."""

    def __init__(
        self,
        rank_dir: str,
        tensors: Sequence[tuple[torch.Tensor, int]],
        groups: Sequence[Sequence[tuple[int, int]]],
        *,
        staging_bytes: int,
        copy_threads: int,
        io_threads: int,
        stale_temp_age: Optional[float] = None,
        capacity_bytes: Optional[int] = None,
        eviction_policy: Optional[str] = None,
        rescan_interval: Optional[float] = None,
        record_changes: bool = False,
        target: Any = None,
        index: Optional[str] = None,
        index_lease: Optional[float] = None,
    ) -> None:
        if len(groups) != 1:
            raise ValueError(f"the connector handles one KV-cache group, not {len(groups)}")
        self.cell_bytes = sum(page for _, page in tensors)
        if self.cell_bytes <= 0:
            raise ValueError("the KV cache has no bytes per block")
        total = max(2, staging_bytes // self.cell_bytes)
        self.load_slots_total = max(1, total // 8)
        self.dump_slots_total = total - self.load_slots_total
        # The staging area: one row (cell) per slot, vLLM's chunk layout.
        self._staging: Optional[torch.Tensor] = torch.empty((total, self.cell_bytes), dtype=torch.int8)
        copier_tensors = []
        offset = 0
        for engine, page in tensors:
            copier_tensors.append((engine, self._staging[:, offset : offset + page], page))
            offset += page
        self._copier: Optional[BlockCopier] = BlockCopier(copier_tensors, groups, 1, threads=copy_threads)
        # A byte budget's scan sweeps the stale temporary files at once;
        # without one they are swept in the background.
        self._transfers: Optional[VllmTransfers] = open_transfers(
            rank_dir,
            self._staging.numpy(),
            load_threads=io_threads,
            store_threads=io_threads,
            settings={
                "capacity_bytes": capacity_bytes,
                "eviction_policy": eviction_policy,
                "stale_temp_age": stale_temp_age,
                "rescan_interval": rescan_interval,
                "index": index,
                "index_lease": index_lease,
            },
            target=target,
        )
        # For take_changes: the blocks stored and deleted, in order.
        self._transfers.record_changes(record_changes)
        self.rank_dir = rank_dir
        self._free: list[int] = list(range(self.dump_slots_total))
        self._load_free: list[int] = list(range(self.dump_slots_total, total))
        self._queued: deque[Dump] = deque()
        self._active: dict[int, Dump] = {}
        self._next_job = 1
        # A test's hold on dumps: those it answers True for do not start.
        self._held = None
        self.stats = {
            "dumps": 0,
            "dumped_blocks": 0,
            "dumps_failed": 0,
            "dump_failed_blocks": 0,
            "loads": 0,
            "loaded_blocks": 0,
            "load_failed_blocks": 0,
            "dumps_dropped_at_shutdown": 0,
        }
        self._closed = False

    # Dumps.

    @property
    def max_dump_blocks(self) -> int:
        """The most blocks one dump may take (the staging area's dump slots)."""
        return self.dump_slots_total

    def dump(self, keys: list[bytes], blocks: list[int]) -> Dump:
        """Queues a dump of engine ``blocks`` to the files of ``keys``;
        never waits. At most ``max_dump_blocks`` blocks."""
        if len(keys) != len(blocks) or not keys or len(keys) > self.dump_slots_total:
            raise ValueError(f"a dump takes 1 to {self.dump_slots_total} blocks, one key each")
        dump = Dump(self, self._take_job(), list(keys), [int(b) for b in blocks])
        if self._closed:
            dump.phase, dump.error = "done", "the connector is shut down"
            return dump
        self._queued.append(dump)
        self.stats["dumps"] += 1
        self._start_queued()
        return dump

    def pump(self) -> None:
        """Moves dumps on: finished copies start their writes, finished
        writes end their dumps and free their slots, queued dumps take the
        freed slots. Never waits."""
        copier, transfers = self._copier, self._transfers
        if copier is None or transfers is None:
            return
        for job, is_store, success, _bytes, _seconds in copier.finished():
            dump = self._active.get(job)
            if dump is None or not is_store:
                continue
            if success:
                dump.phase = "writing"
                transfers.submit_store(job, dump.keys, dump.slots)
            else:
                self._end(dump, "copying the blocks out of the KV cache failed")
        for job, is_load, success, _keys, _done, _seconds in transfers.finished():
            dump = self._active.get(job)
            if dump is None or is_load:
                continue
            self._end(dump, None if success else "writing the block files failed")
        self._start_queued()

    def wait(self, dump: Dump) -> None:
        """Blocks until ``dump`` is done (its copy waited without the GIL)."""
        while True:
            self.pump()
            if dump.phase == "done":
                return
            copier = self._copier
            if dump.phase == "copying" and copier is not None:
                copier.wait([dump.job])
            elif self._copier is None:
                # Shut down under the waiter: nothing will move it on.
                self._end(dump, "the connector shut down before the dump ran")
                return
            else:
                time.sleep(_POLL)

    def capacity_stats(self) -> Optional[dict[str, int]]:
        """The byte budget's counters (``None`` without one, or shut down)."""
        return self._transfers.capacity_stats() if self._transfers is not None else None

    def take_changes(self) -> list[tuple[bytes, bool]]:
        """The blocks stored (``True``) and deleted (``False``) since the
        last call, in order; empty unless ``record_changes``, or once shut
        down."""
        return self._transfers.take_changes() if self._transfers is not None else []

    def in_flight(self) -> int:
        """Dumps queued, copying or writing."""
        return len(self._queued) + sum(1 for d in self._active.values() if d.phase != "done")

    def free_slots(self) -> int:
        return len(self._free)

    def _take_job(self) -> int:
        job = self._next_job
        self._next_job += 1
        return job

    def hold(self, predicate) -> None:  # type: ignore[no-untyped-def]
        """For tests: queued dumps ``predicate`` answers True for stay
        queued (``None``: none do), so a test can keep blocks under a dump."""
        self._held = predicate
        self.pump()

    def _start_queued(self) -> None:
        copier = self._copier
        held = self._held
        for dump in list(self._queued):
            if copier is None or len(dump.blocks) > len(self._free):
                break
            if held is not None and held(dump):
                continue
            self._queued.remove(dump)
            n = len(dump.blocks)
            dump.slots, self._free = self._free[:n], self._free[n:]
            dump.phase = "copying"
            self._active[dump.job] = dump
            try:
                copier.submit_store(dump.job, dump.blocks, dump.slots, [n], [0])
            except Exception as error:  # an engine block id out of range
                self._end(dump, f"the dump was refused: {error}")

    def _end(self, dump: Dump, error: Optional[str]) -> None:
        self._active.pop(dump.job, None)
        self._free.extend(dump.slots)
        dump.slots = []
        dump.phase = "done"
        dump.error = error
        if error is None:
            self.stats["dumped_blocks"] += len(dump.blocks)
        else:
            self.stats["dumps_failed"] += 1
            self.stats["dump_failed_blocks"] += len(dump.blocks)
            logger.warning("kvtier connector: a dump of %d blocks failed: %s", len(dump.blocks), error)

    # Loads.

    def load(self, keys: list[bytes], blocks: list[int]) -> LoadResult:
        """Reads the files of ``keys`` into engine ``blocks``, in order, and
        waits for it; stops at the first block that cannot be read."""
        if len(keys) != len(blocks):
            raise ValueError("a load takes one key per block")
        loaded = 0
        self.stats["loads"] += 1
        # The load runs within this call, and no dump starts meanwhile (only
        # pump() starts them): it borrows the dump slots that are free.
        borrowed, self._free = self._free, []
        slots = self._load_free + borrowed
        try:
            while loaded < len(keys) and self._copier is not None:
                batch = min(len(keys) - loaded, len(slots))
                ok = self._load_batch(keys[loaded : loaded + batch], blocks[loaded : loaded + batch], slots)
                loaded += ok
                if ok < batch:
                    break
        finally:
            self._free.extend(borrowed)
        self.stats["loaded_blocks"] += loaded
        self.stats["load_failed_blocks"] += len(keys) - loaded
        return LoadResult(loaded, [int(b) for b in blocks[loaded:]], list(keys[loaded:]))

    def _load_batch(self, keys: list[bytes], blocks: list[int], slots: list[int]) -> int:
        copier, transfers = self._copier, self._transfers
        assert copier is not None and transfers is not None
        slots = slots[: len(keys)]
        job = self._take_job()
        transfers.submit_load(job, keys, slots)
        done = None
        while done is None:
            for fjob, is_load, success, _keys, n, _seconds in transfers.finished():
                if fjob == job:
                    done = n if not success else len(keys)
                else:
                    # A dump's write ended meanwhile: keep it for pump().
                    self._finish_write(fjob, is_load, success)
            if done is None:
                time.sleep(_POLL)
        if done:
            copy = self._take_job()
            copier.submit_load(copy, [int(b) for b in blocks[:done]], slots[:done], [done], [0])
            copier.wait([copy])
            # The copy's report comes with the next finished(): pump() skips it.
        return done

    def _finish_write(self, job: int, is_load: bool, success: bool) -> None:
        dump = self._active.get(job)
        if dump is not None and not is_load:
            self._end(dump, None if success else "writing the block files failed")

    # Shutdown.

    def shutdown(self, grace: float) -> tuple[int, int]:
        """Stops: copies in flight finish and their writes get ``grace``
        seconds to start; queued dumps are dropped. Afterwards no thread runs
        and no buffer is held. Returns (dumps dropped, writes dropped)."""
        self._closed = True
        dropped = len(self._queued)
        while self._queued:
            self._end(self._queued.popleft(), "the connector shut down before the dump ran")
        self.stats["dumps_dropped_at_shutdown"] += dropped
        writes_dropped = 0
        if self._copier is not None:
            self._copier.shutdown()  # runs the copies submitted, then stops
            self.pump()  # their writes start
            self._copier = None
        if self._transfers is not None:
            _loads, writes_dropped = self._transfers.shutdown(grace)
            for job, is_load, success, _keys, _n, _s in self._transfers.finished():
                self._finish_write(job, is_load, success)
            self._transfers = None
        for dump in list(self._active.values()):
            self._end(dump, "the connector shut down before the dump was written")
        # guard: K10-shutdown-lets-go-of-the-staging-area
        self._staging = None
        return dropped, writes_dropped

    @property
    def closed(self) -> bool:
        return self._closed


"""The end-to-end harness's capacity scenario: kvtier's tier with a byte
budget smaller than the working set (``"capacity_bytes"`` in the tier
config, and in the connector's settings).

- tiering, process 1: every prompt block is stored to a tier that holds
  only part of them, so stores evict; the outputs equal the run without
  offloading, and the tier's files stay within the budget at every sample;
- tiering, process 2 (a restart): the tier's scan finds the files within
  the budget, prompts are served partly from the tier and partly
  recomputed (a block evicted after its lookup hit fails its load, and
  vLLM recomputes it), the outputs equal, the files stay within the budget;
- the connector, under pressure (preemptions, aborts, dumps trickling) with
  a budget: the survivors' outputs equal, the files stay within it.

A sample lists the tier's directory tree, then stats what it listed: a
file deleted meanwhile is not counted, one created meanwhile was not
listed, so every file a sample counts existed when its stats began, and
the sum is bytes that were on disk together. Block files and temporary
files both count (vLLM's run config, a few hundred bytes, does not: the
budget is of blocks).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from typing import TYPE_CHECKING

from e2e import BLOCK_BYTES, PREEMPT_BLOCKS, PREEMPT_TOKENS, PROMPT_TOKENS, PROMPTS, block_files, check

if TYPE_CHECKING:
    from e2e import Harness

#: The budget: 64 blocks of the 108 prompt blocks.
CAPACITY_BLOCKS = 64
CAPACITY = CAPACITY_BLOCKS * BLOCK_BYTES
#: Seconds between two samples.
PERIOD = 0.02


def usage(root: str) -> int:
    """Bytes of the block and temporary files under ``root`` that were on
    disk together (see the module's docs)."""
    listed = []
    stack = [root]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            elif entry.name.endswith((".bin", ".tmp")):
                listed.append(entry.path)
    total = 0
    for path in listed:
        try:
            total += os.stat(path).st_size
        except OSError:
            pass
    return total


class Sampler:
    """Samples ``usage(root)`` every ``PERIOD`` while an engine runs."""

    def __init__(self, root) -> None:
        self.root, self.samples, self.peak = str(root), 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, usage(self.root))
            self.samples += 1
            self._stop.wait(PERIOD)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, usage(self.root))
        self.samples += 1


def _within(name: str, sampler: Sampler) -> None:
    check(sampler.samples >= 10, f"{name}: only {sampler.samples} samples")
    check(
        sampler.peak <= CAPACITY,
        f"{name}: {sampler.peak} bytes of block files on disk, over the {CAPACITY}-byte budget",
    )


def settled(name: str, log: str) -> tuple[int, int, int]:
    """What the tier's shutdown line says: lookups settled as hits and as
    misses by its own stores and deletions, and blocks that failed to load."""
    found = re.search(r"settled (\d+) lookups as hits and (\d+) as misses; (\d+) blocks failed to load", log)
    check(found is not None, f"{name}: the tier's shutdown did not say what it settled")
    hits, misses, failures = (int(n) for n in found.groups())
    return hits, misses, failures


def tiering(h: "Harness") -> None:
    root = h.work / "capacity-kvtier"
    shutil.rmtree(root, ignore_errors=True)
    settings = h.settings("kvtier", root, tier_options={"capacity_bytes": CAPACITY})
    with Sampler(root) as first_usage:
        first = h.run("capacity-kvtier-1", settings)
    h.same_outputs("capacity (process 1)", first["outputs"])
    _within("capacity (process 1)", first_usage)
    stored = len(block_files(root))
    check(0 < stored <= CAPACITY_BLOCKS, f"capacity: {stored} blocks on disk after process 1")
    with Sampler(root) as second_usage:
        second = h.run("capacity-kvtier-2", settings)
    h.same_outputs("capacity (process 2)", second["outputs"])
    _within("capacity (process 2)", second_usage)
    m = second["metrics"]
    loaded = m.get("vllm:prompt_tokens_by_source{source=external_kv_transfer}", 0)
    computed = m.get("vllm:prompt_tokens_by_source{source=local_compute}", 0)
    check(loaded > 0, f"capacity (process 2): nothing served from the tier: {m}")
    check(computed > 0, f"capacity (process 2): a tier within its budget served every token: {m}")
    first_settled = settled("capacity (process 1)", first["log"])
    second_settled = settled("capacity (process 2)", second["log"])
    # Process 1 stores every prompt block while its requests hold their
    # lookups: the stores settle some of them as hits (L18) in the engine.
    check(first_settled[0] > 0, f"capacity (process 1): no lookup settled by a store: {first_settled}")
    h.notes.append(
        f"capacity: lookups settled (hits, misses) and blocks that failed to load: process 1 "
        f"{first_settled}, process 2 {second_settled}"
    )
    h.notes.append(
        f"capacity: a {CAPACITY_BLOCKS}-block budget for {PROMPTS * PROMPT_TOKENS // 32} prompt blocks; "
        f"{stored} blocks on disk after process 1; process 2 loaded {loaded} and computed {computed} prompt "
        f"tokens; peak bytes {first_usage.peak} and {second_usage.peak} of {CAPACITY} "
        f"({first_usage.samples + second_usage.samples} samples)"
    )


def connector(h: "Harness") -> None:
    root = h.work / "capacity-connector"
    shutil.rmtree(root, ignore_errors=True)
    aborted = {1, 4}
    connector = {"mode": "alone", "dump_delay": 0.05, "options": {"capacity_bytes": CAPACITY}}
    settings = h.settings(None, root, connector=connector, num_gpu_blocks=PREEMPT_BLOCKS, abort=sorted(aborted))
    settings["max_tokens"] = PREEMPT_TOKENS
    with Sampler(root) as sampled:
        result = h.run("capacity-connector-pressure", settings)
    survivors = set(range(PROMPTS)) - aborted
    h.same_outputs("capacity connector (pressure)", result["outputs"], only=survivors)
    _within("capacity connector (pressure)", sampled)
    stored = len(block_files(root))
    check(0 < stored <= CAPACITY_BLOCKS, f"capacity connector: {stored} blocks on disk")
    h.notes.append(
        f"capacity connector: {stored} blocks on disk under a {CAPACITY_BLOCKS}-block budget, "
        f"peak {sampled.peak} bytes ({sampled.samples} samples)"
    )

"""The end-to-end harness's capacity scenario: kvtier's tier with a byte
budget smaller than the working set (``"capacity_bytes"`` in the tier
config, and in the connector's settings).

- tiering, process 1: two engines at once share the tier's directory,
  each with the budget and a rescan every ``RESCAN`` seconds, each with
  half the prompts; together they store every prompt block, more than the
  budget holds, so their reconciles count each other's blocks and evict;
  the outputs equal the run without offloading, and the files stay within
  the budget plus what the engines wrote in about one interval
  (``SHARED_SLACK_BLOCKS``) at every sample, far below what they stored;
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

Each sample also runs ``du -sb`` on the tier's root, what a disk quota or
a Kubernetes ``emptyDir`` ``sizeLimit`` counts: the files and the
directories. It stays within the budget plus ``directory_slack``: a block
lives two directories down (a fan-out and a shard), so at most two
directories per resident block, plus the root's own few (the root, vLLM's
base directory with its run config, the rank directory), each the size the
file system gives a directory (4 KiB on ext4). Deletions take the
directories they empty with them: without that, the directories of every
block ever stored stay, and ``du`` grows past any budget.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from typing import TYPE_CHECKING

from e2e_common import BLOCK_BYTES, PREEMPT_BLOCKS, PREEMPT_TOKENS, PROMPT_TOKENS, PROMPTS, block_files, check

if TYPE_CHECKING:
    from harness import Harness

#: The budget: 64 blocks of the 108 prompt blocks.
CAPACITY_BLOCKS = 64
CAPACITY = CAPACITY_BLOCKS * BLOCK_BYTES
#: Seconds between two samples.
PERIOD = 0.02
#: Seconds between two reconciles of each engine sharing the directory.
RESCAN = 0.05
#: What engines sharing a directory may hold beyond the budget: what the
#: other engine stored since this one's last listing began (about one
#: interval of stores), here a generous 8 blocks.
SHARED_SLACK_BLOCKS = 8


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


def du(root: str) -> int:
    """``du -sb`` of ``root``: apparent bytes of its files and directories
    (a file deleted while du runs is skipped; its complaint is ignored)."""
    done = subprocess.run(["du", "-sb", root], capture_output=True, text=True)
    return int(done.stdout.split()[0]) if done.stdout else 0


#: Directories a sample may catch between a victim's deletion and the
#: removal of the directories it emptied (microseconds each): eight
#: evictions under way at once.
DELETING_DIRECTORIES = 16


def directory_slack(root: str, blocks: int) -> int:
    """What ``du -sb`` may count beyond the blocks' bytes (see the module's
    docs): two directories per resident block, the root's own few (the
    root, vLLM's base directory, the rank directory, and one to spare),
    those of evictions under way, and vLLM's run config."""
    directory = os.stat(root).st_size
    return (2 * blocks + 4 + DELETING_DIRECTORIES) * directory + 4096


class Sampler:
    """Samples ``usage(root)`` and ``du -sb`` every ``PERIOD`` while an
    engine runs."""

    def __init__(self, root) -> None:
        self.root, self.samples, self.peak, self.du_peak = str(root), 0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.peak = max(self.peak, usage(self.root))
        if os.path.isdir(self.root):
            self.du_peak = max(self.du_peak, du(self.root))
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(PERIOD)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def _within(name: str, sampler: Sampler, slack: int = 0) -> None:
    check(sampler.samples >= 10, f"{name}: only {sampler.samples} samples")
    check(
        sampler.peak <= CAPACITY + slack,
        f"{name}: {sampler.peak} bytes of block files on disk, over the {CAPACITY}-byte budget "
        f"(+{slack} tolerated)",
    )
    blocks = CAPACITY_BLOCKS + slack // BLOCK_BYTES
    allowed = CAPACITY + slack + directory_slack(sampler.root, blocks)
    check(
        sampler.du_peak <= allowed,
        f"{name}: du -sb read {sampler.du_peak} bytes, over the {CAPACITY}-byte budget plus "
        f"{allowed - CAPACITY} for directories",
    )


def reconciled(name: str, log: str) -> tuple[int, int, int]:
    """What the tier's shutdown line says of its reconciles: how many, the
    blocks it adopted and the blocks it forgot."""
    found = re.search(r"(\d+) reconciles with the directory adopted (\d+) blocks .* forgot (\d+)", log)
    check(found is not None, f"{name}: the tier's shutdown did not say what it reconciled")
    return tuple(int(n) for n in found.groups())


def shifted(outputs: dict, by: int) -> dict:
    """An engine's outputs for prompts ``by``, ``by + 1``, ..., keyed by
    their index among all prompts."""
    return {str(int(i) + by): output for i, output in outputs.items()}


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
    half = PROMPTS // 2
    parts = {"a": range(0, half), "b": range(half, PROMPTS)}
    runs = []
    for engine, part in parts.items():
        shared = h.settings("kvtier", root, tier_options={"capacity_bytes": CAPACITY, "rescan_interval": RESCAN})
        shared["prompts"] = [h.prompts[i] for i in part]
        # A few more reconciles once its prompts are done, so that each
        # engine also sees the other's last stores.
        shared["linger"] = 0.5
        runs.append((f"capacity-kvtier-1{engine}", shared))
    with Sampler(root) as first_usage:
        both = h.run_together(runs)
    slack = SHARED_SLACK_BLOCKS * BLOCK_BYTES
    for (engine, part), result in zip(parts.items(), both):
        h.same_outputs(f"capacity (engine 1{engine})", shifted(result["outputs"], part.start), only=part)
    _within("capacity (engines 1a and 1b)", first_usage, slack)
    adopted = [reconciled(f"capacity (engine 1{e})", r["log"]) for e, r in zip(parts, both)]
    check(
        all(count > 0 and took > 0 for count, took, _ in adopted),
        f"capacity: an engine sharing the directory never counted the other's blocks: {adopted}",
    )
    first = both[0]
    stored = len(block_files(root))
    check(0 < stored, f"capacity: {stored} blocks on disk after engines 1a and 1b")
    with Sampler(root) as second_usage:
        second = h.run("capacity-kvtier-2", settings)
    h.same_outputs("capacity (process 2)", second["outputs"])
    _within("capacity (process 2)", second_usage)
    m = second["metrics"]
    loaded = m.get("vllm:prompt_tokens_by_source{source=external_kv_transfer}", 0)
    computed = m.get("vllm:prompt_tokens_by_source{source=local_compute}", 0)
    check(loaded > 0, f"capacity (process 2): nothing served from the tier: {m}")
    check(computed > 0, f"capacity (process 2): a tier within its budget served every token: {m}")
    first_settled = settled("capacity (engine 1a)", first["log"])
    second_settled = settled("capacity (process 2)", second["log"])
    # Engine 1a stores its prompt blocks while its requests hold their
    # lookups: the stores settle some of them as hits (L18) in the engine.
    check(first_settled[0] > 0, f"capacity (engine 1a): no lookup settled by a store: {first_settled}")
    h.notes.append(
        f"capacity: lookups settled (hits, misses) and blocks that failed to load: engine 1a "
        f"{first_settled}, process 2 {second_settled}; engines 1a and 1b reconciled (times, adopted, "
        f"forgotten) {adopted[0]} and {adopted[1]}"
    )
    h.notes.append(
        f"capacity: a {CAPACITY_BLOCKS}-block budget for {PROMPTS * PROMPT_TOKENS // 32} prompt blocks; "
        f"{stored} blocks on disk after engines 1a and 1b; process 2 loaded {loaded} and computed {computed} "
        f"prompt tokens; peak bytes {first_usage.peak} (two engines sharing, {CAPACITY} + {slack} tolerated) "
        f"and {second_usage.peak} of {CAPACITY} ({first_usage.samples + second_usage.samples} samples); "
        f"du -sb peaks {first_usage.du_peak} and {second_usage.du_peak}"
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
        f"peak {sampled.peak} bytes, du -sb peak {sampled.du_peak} ({sampled.samples} samples)"
    )

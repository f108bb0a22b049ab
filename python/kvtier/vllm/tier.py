"""``kvtier.vllm.FsTier``: a secondary tier for vLLM's tier manager, on
vLLM's own file-system layout, with lookups, stores and loads run natively.

vLLM loads it with no patch, from its tier config::

    "secondary_tiers": [{"type": "FsTier", "module_path": "kvtier.vllm",
                         "root_dir": "/mnt/kv-cache"}]

It takes the settings of vLLM's own fs tier (``root_dir``,
``n_read_threads``, ``n_write_threads``, ``enable_kv_events``,
``locality``), and writes and reads the same files, so vLLM's fs tier and
this one share a directory. The directory is vLLM's: the tier builds the
``FileMapper`` of the vLLM that runs it and checks, at construction, that
kvtier's layout names every block as that ``FileMapper`` does.

- Lookups: kvtier's native prober (``Lookup.vllm_fs``).
- Stores and loads: ``kvtier._native.VllmTransfers`` on vLLM's raw block
  files; loads are served first by the read threads; a short (damaged)
  file is removed.
- Everything else (completion, events, figures, shutdown) is
  ``NativeTier``'s (``_native_tier.py``), shared with ``ObjectTier``.

Needs vLLM (0.32 or later); the rest of ``kvtier.vllm`` does not.
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Optional

from vllm.v1.kv_offload.base import make_offload_key
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

from .._native import Lookup, check_settings, vllm_block_path
from ._layout import check_root_dir, rank_dir_of
from ._native_tier import NativeTier
from ._transfers import open_transfers

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec

logger = logging.getLogger("kvtier.vllm")

__all__ = ["FsTier"]

# Keys whose paths the construction-time layout check compares: one-, two-
# and many-byte hashes (the fan-out slices differently) in several groups.
_LAYOUT_PROBES = (
    (b"\x01", 0),
    (b"\xab\xcd", 7),
    (bytes(range(32)), 2**32 - 1),
    (b"\xff" * 16, 1),
)


class FsTier(NativeTier):
    """vLLM's file-system secondary tier, natively (see the module's docs).

    Arguments after ``tier_type`` are those of vLLM's
    ``FileSystemTierManager``, plus ``lookup_concurrency`` (lookup groups
    probed at once, default 4), ``lookup_timeout`` (seconds a group's
    probe may take before its keys are misses, default 2; ``None``: no
    limit), ``shutdown_grace`` (seconds that stores still queued at
    ``shutdown()`` get to start, default 2; see ``shutdown``) and
    ``stale_temp_age`` (at start, temporary block files left by writers
    that died mid-store and older than this many seconds are swept in the
    background, default 600: younger ones may be another live engine's;
    ``None``: no sweep).

    ``capacity_bytes`` bounds the bytes of the tier's block files (default
    ``None``: unbounded, as vLLM's fs tier). With a budget the tier scans
    its directory at start (the newest blocks that fit are kept, older ones
    deleted, stale temporary files swept), every store first makes room by
    evicting blocks (``eviction_policy``: ``"lru"``, the default, or
    ``"s3fifo"``), a store that cannot get room fails as a job (nothing is
    lost; the block is computed again when needed), and loads pin their
    blocks. Each step the lookups learn which blocks were stored and which
    evicted (a hit whose block was evicted becomes a miss before any load
    is tried; a store that completes while a lookup's probe is running
    makes it a hit, whatever the probe answers later), and evictions are
    ``removed`` KV events. A block deleted by another process is still
    found by its failed load, and only the failed tail is marked a miss.

    Engines sharing one directory (or an engine and ``kvtier trim``) each
    keep their own books; ``rescan_interval`` (seconds, default ``None``:
    never) reconciles them with the directory on a thread: blocks the others
    wrote are counted, blocks they deleted forgotten (the lookups learn of
    both), and blocks over the budget deleted, so the directory stays within
    ``capacity_bytes`` plus what the engines write in about one interval.
    ``capacity_stats()``
    gives the counters (resident and reserved bytes, evictions, refusals,
    ENOSPC, startup trims)::

        {"type": "FsTier", "module_path": "kvtier.vllm", "root_dir": "/mnt/kv",
         "capacity_bytes": 50 * 2**30}
    """

    def __init__(
        self,
        offloading_spec: "OffloadingSpec",
        primary_kv_view: memoryview,
        tier_type: str,
        root_dir: str,
        n_read_threads: int = 16,
        n_write_threads: int = 16,
        enable_kv_events: bool = False,
        locality: Optional[str] = None,
        backpressure_detector: Optional[BackpressureDetector] = None,
        lookup_concurrency: int = 4,
        lookup_timeout: Optional[float] = 2.0,
        shutdown_grace: float = 2.0,
        stale_temp_age: Optional[float] = 600.0,
        capacity_bytes: Optional[int] = None,
        eviction_policy: Optional[str] = None,
        rescan_interval: Optional[float] = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        # Every setting is checked first, by kvtier's one set of rules, and
        # before anything on disk changes: a bad one leaves the directory as
        # it was and starts no thread.
        settings = {
            "n_read_threads": n_read_threads,
            "n_write_threads": n_write_threads,
            "lookup_concurrency": lookup_concurrency,
            "lookup_timeout": lookup_timeout,
            "shutdown_grace": shutdown_grace,
            "stale_temp_age": stale_temp_age,
            # guard: N8-capacity-bytes-reaches-the-tier
            "capacity_bytes": capacity_bytes,
            "eviction_policy": eviction_policy,
            # guard: N13-rescan-interval-reaches-the-tier
            "rescan_interval": rescan_interval,
        }
        # guard: N14-settings-are-checked-before-the-scan
        settings = check_settings(settings)
        self._shutdown_grace = settings["shutdown_grace"]
        root_dir = check_root_dir(root_dir)
        self._init_events(offloading_spec, tier_type, enable_kv_events, locality)
        # vLLM's own mapper, with the arguments vLLM's fs tier gives it, so
        # the directory is the one vLLM's fs tier uses for this run.
        self.file_mapper = FileMapper.from_offloading_spec(
            root_dir=root_dir,
            offloading_spec=offloading_spec,
            blocks_per_file=offloading_spec.blocks_per_chunk,
            parallel_agnostic=True,
        )
        rank_dir = rank_dir_of(self.file_mapper.base_path, self.file_mapper.rank)
        # The layout is checked before anything on disk changes too.
        _check_layout(self.file_mapper, rank_dir)
        # guard: N14-settings-are-checked-before-the-scan
        lookup = Lookup.vllm_fs(
            rank_dir, concurrency=settings["lookup_concurrency"], group_timeout=settings["lookup_timeout"]
        )
        try:
            # With a budget, the scan at construction sweeps the stale
            # temporary files; without one they are swept in the background
            # (all of them are kept when stale_temp_age is None).
            transfers = open_transfers(
                rank_dir,
                primary_kv_view,
                load_threads=settings["n_read_threads"],
                store_threads=settings["n_write_threads"],
                settings=settings,
            )
        # guard: N14-settings-are-checked-before-the-scan
        except BaseException:
            lookup.shutdown()
            raise
        _write_run_config(self.file_mapper)
        self._adopt(tier_type, lookup, transfers, settings["n_read_threads"] + settings["n_write_threads"])
        if settings["capacity_bytes"] is not None:
            report = transfers.scan_report()
            logger.info(
                "tier %r: %d bytes budget, %d blocks (%d bytes) found, %d trimmed, %d stale temporary "
                "files swept, in %.2f s",
                tier_type,
                settings["capacity_bytes"],
                report["blocks"],
                report["bytes"],
                report["trimmed"],
                report["swept"],
                report["seconds"],
            )
            if report["failed"]:
                logger.warning(
                    "tier %r: %d files the startup scan meant to delete could not be deleted: they stay on disk",
                    tier_type,
                    report["failed"],
                )

    def __repr__(self) -> str:
        return f"FsTier({self.tier_type!r}, {self._transfers!r})"


def _write_run_config(file_mapper: FileMapper) -> None:
    """Writes the run's settings next to its blocks, as vLLM's fs tier does
    (the same file, so either tier can create it)."""
    config_path = file_mapper.get_config_file_path()
    os.makedirs(os.path.dirname(config_path), exist_ok=True)
    if not os.path.exists(config_path):
        with open(config_path, "w") as f:
            json.dump(file_mapper.get_run_config(), f, indent=2, sort_keys=True)


def _check_layout(file_mapper: FileMapper, rank_dir: str) -> None:
    """Refuses to run when kvtier's layout and the running vLLM's disagree:
    the tier would look for, and write, blocks where vLLM does not."""
    for block_hash, group in _LAYOUT_PROBES:
        key = make_offload_key(block_hash, group)
        ours, theirs = os.fspath(vllm_block_path(rank_dir, key)), file_mapper.get_file_name(key)
        # guard: N4-a-layout-vllm-does-not-share-is-refused
        if os.path.normpath(ours) != os.path.normpath(theirs):
            raise RuntimeError(
                f"kvtier's vLLM layout names block {key.hex()} {ours!r} where this vLLM "
                f"names it {theirs!r}: this vLLM's fs layout is not one kvtier knows"
            )


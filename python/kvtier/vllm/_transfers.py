"""vLLM's transfers of a rank directory (or of a rank prefix in an object
store), as the tier and the connector both open them: checked settings in,
a byte budget when one is set, and the stale temporary files swept in the
background when none is (a budget's own scan sweeps them at once); in an
object store, the stale multipart uploads of its blocks aborted in the
background."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from .._native import VllmTransfers


def open_transfers(
    rank_dir: str,
    primary: Any,
    *,
    load_threads: int,
    store_threads: int,
    settings: Mapping[str, Any],
    target: Any = None,
) -> VllmTransfers:
    """``settings``: the budget's settings as ``check_settings`` returned
    them (``capacity_bytes``, ``eviction_policy``, ``stale_temp_age``,
    ``rescan_interval``, and on a bucket ``index`` and ``index_lease``);
    passed through unchanged.
    ``target``: an ``ObjectTarget`` (``rank_dir`` is then the rank's
    prefix in its bucket), or ``None`` for a directory."""
    capacity: Optional[int] = settings.get("capacity_bytes")
    stale: Optional[float] = settings.get("stale_temp_age")
    if target is not None:
        transfers = VllmTransfers.objects(
            target,
            rank_dir,
            primary,
            load_threads=load_threads,
            store_threads=store_threads,
            capacity_bytes=capacity,
            eviction_policy=settings.get("eviction_policy"),
            rescan_interval=settings.get("rescan_interval"),
            index=settings.get("index"),
            index_lease=settings.get("index_lease"),
        )
        if stale is not None:
            transfers.sweep_stale_temps(stale)
        return transfers
    transfers = VllmTransfers(
        rank_dir,
        primary,
        load_threads=load_threads,
        store_threads=store_threads,
        capacity_bytes=capacity,
        eviction_policy=settings.get("eviction_policy"),
        stale_temp_age=stale,
        rescan_interval=settings.get("rescan_interval"),
    )
    if capacity is None and stale is not None:
        transfers.sweep_stale_temps(stale)
    return transfers

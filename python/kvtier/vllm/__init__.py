"""kvtier for vLLM: a secondary tier, its lookup manager and vLLM's block layout.

``FsTier`` is a whole secondary tier for vLLM's ``TieringOffloadingManager``,
loaded by vLLM from its config alone (no patch)::

    {"type": "FsTier", "module_path": "kvtier.vllm", "root_dir": "/mnt/kv-cache"}

It takes its directory from vLLM's own ``FileMapper``, answers lookups
with kvtier's native prober and runs stores and loads on native threads
that read and write the primary tier's memory without the GIL, in vLLM's
raw block format: vLLM's fs tier and kvtier's read each other's files.
``StorageConnector`` is a KV connector with deferred dumps (saving never
blocks the model step; a finished request keeps its blocks until its dumps
are done), loaded by vLLM from its config alone::

    {"kv_connector": "StorageConnector",
     "kv_connector_module_path": "kvtier.vllm.connector",
     "kv_role": "kv_both", "kv_connector_extra_config": {"root_dir": "/mnt/kv"}}

(``kvtier.vllm.connector``'s docs tell how it runs.) ``ObjectTier`` is
``FsTier`` on an S3-compatible object store, for engines on several hosts
(``kvtier.vllm.object_tier``'s docs)::

    {"type": "ObjectTier", "module_path": "kvtier.vllm",
     "url": "s3://kv-cache/fleet?endpoint=http://10.0.0.5:8333"}

Importing ``FsTier``, ``ObjectTier`` or ``StorageConnector`` imports vLLM;
nothing else here does.

``AsyncLookupManager`` has the contract of the per-tier lookup manager
vLLM's tier manager composes: ``lookup(key, req_context)`` answers ``True``
(HIT), ``False`` (MISS) or ``None`` (RETRY next step) without blocking;
``flush()`` ends the step (``on_schedule_end``); ``cleanup(req_id)`` forgets a
finished request (``on_request_finished``); ``mark_miss(keys)`` after a failed
load; ``shutdown()``. Behind it is kvtier's lookup: generations, per-group
publication, stale answers ignored, ``mark_miss`` that never touches a newer
lookup, faults turned into misses, bounded shutdown.

Two ways to give it a tier:

- a native prober, which never takes the GIL::

      manager = AsyncLookupManager("fs", lookup=Lookup.vllm_fs(rank_dir(...)))

- a subclass that implements ``batch_lookup(keys, req_context)``, as
  vLLM's own tiers do; it runs on kvtier's worker thread::

      class MyTier(AsyncLookupManager):
          def batch_lookup(self, keys, req_context):
              return [my_store.exists(key) for key in keys]

vLLM names a block by its ``OffloadKey``: the block hash followed by the
KV-cache group index as 4 big-endian bytes (``make_key``). Its file-system
tier stores the block at
``<root>/<model>_<cfghash>_r<rank>/<hex[:3]>/<hex[3:5]>_g<group>/<hex>.bin``
(``rank_dir``, ``block_path``).
"""

from __future__ import annotations

from typing import Any

from .. import HIT, MISS, RETRY
from ._compat import LookupPhase
from ._layout import LAYOUT_VERSIONS, base_dir, block_path, make_key, rank_dir, split_key
from ._lookup import AsyncLookupManager

__all__ = [
    "HIT",
    "MISS",
    "RETRY",
    "LAYOUT_VERSIONS",
    "AsyncLookupManager",
    "FsTier",
    "LookupPhase",
    "ObjectTier",
    "StorageConnector",
    "base_dir",
    "block_path",
    "make_key",
    "rank_dir",
    "split_key",
]


def __getattr__(name: str) -> Any:
    # vLLM's tier classes need vLLM: imported when first asked for, so the
    # rest of this module works without vLLM installed (a tier config's
    # {"type": "FsTier", "module_path": "kvtier.vllm"} asks for it).
    if name == "FsTier":
        from .tier import FsTier

        return FsTier
    if name == "ObjectTier":
        from .object_tier import ObjectTier

        return ObjectTier
    if name == "StorageConnector":
        from .connector import StorageConnector

        return StorageConnector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

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

(``kvtier.vllm.connector``'s docs tell how it runs.) Importing ``FsTier``
or ``StorageConnector`` imports vLLM; nothing else here does.

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

import hashlib
import json
import logging
import os
import weakref
from typing import Any, Iterable, Optional, Sequence

from .. import HIT, MISS, RETRY
from .._native import Lookup, WorkerLostError
from ._compat import LookupPhase, PrivateLookupState

__all__ = [
    "HIT",
    "MISS",
    "RETRY",
    "LAYOUT_VERSIONS",
    "AsyncLookupManager",
    "FsTier",
    "LookupPhase",
    "StorageConnector",
    "base_dir",
    "block_path",
    "make_key",
    "rank_dir",
    "split_key",
]

logger = logging.getLogger("kvtier.vllm")

#: Bytes of the group index at the end of a key.
GROUP_BYTES = 4
#: Hex digits of the run-settings hash in a base directory's name.
CONFIG_HASH_DIGITS = 12


def make_key(block_hash: bytes, group: int = 0) -> bytes:
    """vLLM's ``OffloadKey`` of ``block_hash`` in KV-cache group ``group``."""
    if not block_hash:
        raise ValueError("a block hash is at least one byte")
    return bytes(block_hash) + int(group).to_bytes(GROUP_BYTES, "big")


def split_key(key: bytes) -> tuple[bytes, int]:
    """The block hash and the group index of an ``OffloadKey``."""
    if len(key) <= GROUP_BYTES:
        raise ValueError(
            f"a {len(key)}-byte key holds no hash: a key is a block hash and a "
            f"{GROUP_BYTES}-byte group index"
        )
    return key[:-GROUP_BYTES], int.from_bytes(key[-GROUP_BYTES:], "big")


#: The vLLM versions whose fs layout ``base_dir`` knows, newest first. The
#: settings hashed into a base directory's name change between vLLM
#: versions (0.32 hashes ``tokens_per_hash`` and ``blocks_per_file``, where
#: older versions hashed ``hash_block_size`` and ``gpu_blocks_per_file``), so
#: a computed directory is only right for the version it was computed for.
#: Inside vLLM, ``kvtier.vllm.FsTier`` takes the directory from vLLM's own
#: ``FileMapper`` instead, whatever the version.
LAYOUT_VERSIONS = ("0.32",)


def base_dir(
    root: str | os.PathLike[str],
    *,
    model_name: str,
    tokens_per_hash: int,
    blocks_per_file: int,
    dtype: str,
    tp_size: int = 1,
    pp_size: int = 1,
    pcp_size: int = 1,
    dcp_size: int = 1,
    kv_cache_groups: Optional[Sequence[dict[str, Any]]] = None,
    inference_engine: str = "vllm",
    parallel_agnostic: bool = False,
    replicated_layout: bool = False,
    canonical_format: Optional[str] = None,
    vllm: str = "0.32",
) -> str:
    """vLLM's base directory for a run, ``<root>/<model>_<cfghash>``, as the
    fs tier of vLLM ``vllm`` names it (see ``LAYOUT_VERSIONS``).

    ``cfghash`` is the first 12 hex digits of the SHA-256 of the run's
    settings as canonical JSON (keys sorted, no spaces); ``/`` in the model
    name becomes ``_``. ``kv_cache_groups`` lists each group's
    ``{"tokens_per_block": ..., "layer_names": [...]}``. With
    ``parallel_agnostic`` every parallel size is 1 (and the rank 0), and
    otherwise ``"parallel_agnostic": false`` is hashed too;
    ``replicated_layout`` and ``canonical_format`` are hashed only when set.
    vLLM's fs tier asks for a parallel-agnostic layout, which vLLM grants
    only when the run's blocks do not depend on the parallelism.
    """
    if vllm not in LAYOUT_VERSIONS:
        raise ValueError(
            f"kvtier knows the fs layout of vLLM {', '.join(LAYOUT_VERSIONS)}, not {vllm!r}; "
            "inside vLLM use kvtier.vllm.FsTier, which takes it from vLLM's FileMapper"
        )
    if parallel_agnostic:
        tp_size = pp_size = pcp_size = dcp_size = 1
    fields: dict[str, Any] = {
        "model_name": model_name,
        "tokens_per_hash": tokens_per_hash,
        "blocks_per_file": blocks_per_file,
        "tp_size": tp_size,
        "pp_size": pp_size,
        "pcp_size": pcp_size,
        "dcp_size": dcp_size,
        "dtype": str(dtype),
        "kv_cache_groups": [dict(group) for group in (kv_cache_groups or [])],
        "inference_engine": inference_engine,
    }
    if not parallel_agnostic:
        fields["parallel_agnostic"] = False
    if replicated_layout:
        fields["replicated_layout"] = True
    if canonical_format is not None:
        fields["canonical_format"] = canonical_format
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:CONFIG_HASH_DIGITS]
    return f"{os.fspath(root)}/{model_name.replace('/', '_')}_{digest}"


def rank_dir(root: str | os.PathLike[str], *, rank: int = 0, **settings: Any) -> str:
    """The directory of one rank's blocks, ``<base_dir>_r<rank>``: what
    ``Lookup.vllm_fs`` takes. ``settings`` are ``base_dir``'s; with
    ``parallel_agnostic`` the rank is 0."""
    if settings.get("parallel_agnostic"):
        rank = 0
    if rank < 0:
        raise ValueError(f"rank {rank} is negative")
    return f"{base_dir(root, **settings)}_r{rank}"


def block_path(rank_directory: str | os.PathLike[str], key: bytes) -> str:
    """Where vLLM stores the block of ``key`` below a rank's directory."""
    block_hash, group = split_key(key)
    digits = block_hash.hex()
    return os.path.join(
        os.fspath(rank_directory), digits[:3], f"{digits[3:5]}_g{group}", f"{digits}.bin"
    )


class AsyncLookupManager(PrivateLookupState):
    """vLLM's per-tier async lookup manager, over kvtier.

    ``lookup`` takes a key (``bytes``) and the request's context (an object
    with ``req_id``, or the id itself as a ``str``). Give ``lookup=`` a
    native ``kvtier.Lookup``, or subclass and implement ``batch_lookup``.
    """

    def __init__(self, tier_type: str = "kvtier", *, lookup: Optional[Lookup] = None) -> None:
        self._tier_type = tier_type
        #: Worker losses seen by ``flush`` (their keys were answered as misses).
        self.flush_errors = 0
        self._contexts: Optional[dict[str, Any]] = None
        self._last_context: Any = None
        if lookup is None:
            if type(self).batch_lookup is AsyncLookupManager.batch_lookup:
                raise TypeError(
                    "give AsyncLookupManager a native prober (lookup=kvtier.Lookup.vllm_fs(...)) "
                    "or subclass it and implement batch_lookup(keys, req_context)"
                )
            # The worker hands batch_lookup the request's context, as vLLM's
            # does. It holds the manager weakly: a manager nobody uses is
            # freed (and its worker stopped) at once, not by the cycle GC.
            self._contexts = {}
            manager = weakref.ref(self)

            def probe(keys: list[bytes], req_id: str) -> Iterable[bool]:
                owner = manager()
                if owner is None:
                    raise RuntimeError("the lookup manager was freed")
                return owner._probe(keys, req_id)

            lookup = Lookup.python(probe, name=f"kvtier_lookup_{tier_type}")
        self._lookup = lookup
        if self._contexts is None and type(self).lookup is AsyncLookupManager.lookup:
            # No Python frame between the scheduler and the native call.
            self.lookup = lookup.lookup  # type: ignore[method-assign]

    @property
    def tier_type(self) -> str:
        """The tier's name, as given."""
        return self._tier_type

    @property
    def native(self) -> Lookup:
        """The ``kvtier.Lookup`` underneath (for ``set_limits``, ``stats``)."""
        return self._lookup

    # The backend side: override in a subclass for a Python backend.

    def batch_lookup(self, keys: list[bytes], req_context: Any) -> Iterable[bool]:
        """Whether the tier holds each of ``keys``, in order. Runs on kvtier's
        worker thread; an exception makes the group's keys misses."""
        raise NotImplementedError

    def _probe(self, keys: list[bytes], req_id: str) -> Iterable[bool]:
        contexts = self._contexts or {}
        return self.batch_lookup(keys, contexts.get(req_id, req_id))

    # The scheduler side.

    def lookup(self, key: bytes, req_context: Any) -> Optional[bool]:
        """``True`` (HIT), ``False`` (MISS) or ``None`` (RETRY next step)."""
        if req_context is not self._last_context and self._contexts is not None:
            self._remember(req_context)
        return self._lookup.lookup(key, req_context)

    def lookup_many(self, keys: Sequence[bytes], req_context: Any) -> tuple[list[Optional[bool]], int]:
        """One request's keys in one native call: their verdicts and how many
        leading keys are hits."""
        if req_context is not self._last_context and self._contexts is not None:
            self._remember(req_context)
        return self._lookup.lookup_many(keys, req_context)

    def _remember(self, req_context: Any) -> None:
        """Keeps the context batch_lookup gets for the request's groups. A
        scheduler asks for one request's keys in a row, so this runs once
        per request per step, not once per key."""
        self._last_context = req_context
        req_id = req_context if isinstance(req_context, str) else req_context.req_id
        self._contexts[req_id] = req_context

    def flush(self) -> None:
        """Ends the step: the step's new keys go to the prober. Never waits.
        A lost worker is logged, not raised: its keys are misses."""
        self._apply_forged_answers()
        try:
            self._lookup.flush()
        except WorkerLostError as error:
            self.flush_errors += 1
            logger.warning("kvtier lookup worker of tier %s is lost: %s", self._tier_type, error)

    def drain_results(self) -> None:
        """Applies the answers published so far (every call does this first)."""
        self._lookup.drain()
        self._apply_forged_answers()

    def mark_miss(self, keys: Iterable[bytes]) -> None:
        """The loads of ``keys`` failed: their cached hits become misses,
        without a re-probe. A key looked up again since (pending or in
        flight) is not touched."""
        self._lookup.mark_miss(keys)

    def settle(self, keys: Iterable[bytes], present: bool) -> int:
        """The tier stored (``present``) or deleted the blocks of ``keys``:
        their lookups say so from now on, and a probe still in flight for
        one of them can no longer override it. Returns how many changed."""
        return self._lookup.settle(keys, present)

    def cleanup(self, req_id: str) -> None:
        """Forgets a finished request; an unknown id is a no-op."""
        self._lookup.cleanup(req_id)
        if self._contexts is not None:
            self._contexts.pop(req_id, None)
            self._last_context = None

    def on_schedule_end(self) -> None:
        """The tier manager's end-of-step hook: ``flush()``."""
        self.flush()

    def on_request_finished(self, req_id: str) -> None:
        """The tier manager's request-finished hook: ``cleanup(req_id)``."""
        self.cleanup(req_id)

    def wait_idle(self) -> int:
        """Blocks (without the GIL) until every submitted group is answered.
        For tests and orderly pauses. From inside ``batch_lookup`` it would
        wait for the call making it, so there it raises ``KvtierError``."""
        return self._lookup.wait_idle()

    def stats(self) -> dict[str, int]:
        """The lookup counters."""
        return self._lookup.stats()

    def shutdown(self) -> None:
        """Stops the worker (without holding the GIL, so a Python
        ``batch_lookup`` in progress can finish) and applies its last answers."""
        self._lookup.shutdown()

    def __repr__(self) -> str:
        return f"AsyncLookupManager({self._tier_type!r}, {self._lookup!r})"


def __getattr__(name: str) -> Any:
    # vLLM's tier classes need vLLM: imported when first asked for, so the
    # rest of this module works without vLLM installed (a tier config's
    # {"type": "FsTier", "module_path": "kvtier.vllm"} asks for it).
    if name == "FsTier":
        from .tier import FsTier

        return FsTier
    if name == "StorageConnector":
        from .connector import StorageConnector

        return StorageConnector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

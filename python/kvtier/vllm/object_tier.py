"""``kvtier.vllm.ObjectTier``: a secondary tier for vLLM's tier manager on
any S3-compatible object store, with lookups, stores and loads run
natively (no NIXL, no GIL on the I/O path).

vLLM loads it with no patch, from its tier config, with either kvtier's
URL::

    "secondary_tiers": [{"type": "ObjectTier", "module_path": "kvtier.vllm",
                         "url": "s3://kv-cache/fleet?endpoint=http://10.0.0.5:8333"}]

or vLLM's own obj tier's settings, so switching a config from vLLM's tier
to this one is a change of ``type`` and ``module_path``::

    {"type": "ObjectTier", "module_path": "kvtier.vllm",
     "store_config": {"bucket": "kv-cache", "endpoint_override": "10.0.0.5:8333",
                      "access_key": "...", "secret_key": "..."},
     "prefix": "fleet"}

Credentials: ``store_config``'s ``access_key`` / ``secret_key`` (and
``session_token``), or, when it has none (and always with ``url``), the
AWS environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, web identity or container credentials). They are
never logged, and the cloud instance-metadata service is never asked.

Objects are named as vLLM's obj tier names them, from the ``FileMapper``
of the vLLM that runs it (``prefix/{model}_{cfghash}_r0/{hhh}/{hh}_g{group}/{hash}.bin``),
except for the empty segment vLLM's key has after the prefix, which the
client kvtier uses cannot address (see docs/design.md, "vLLM's object
keys"). The format is vLLM's raw block, as with ``FsTier``.

- At start one listing checks that the server answers, takes the
  credentials and has the bucket; if not, the error names the setting.
- Lookups: one HEAD per key, a group's keys concurrently, each group within
  ``lookup_timeout``; a server that fails or does not answer makes the
  group's keys misses.
- Stores and loads: native I/O threads (``n_read_threads`` +
  ``n_write_threads``, default 16 each; vLLM's ``io_threads`` sets both
  halves) with one request in flight each; every request has
  ``request_timeout`` (default 5 s) and ``max_retries`` retries with backoff
  (default 2). A block already in the bucket is not written again; a
  failed load goes through vLLM's failure path (the blocks are
  recomputed).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional

from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

from .._native import ConfigError, Lookup, check_settings
from ._layout import rank_dir_of
from ._native_tier import NativeTier
from ._transfers import open_transfers

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec

logger = logging.getLogger("kvtier.vllm")

__all__ = ["ObjectTier", "rank_prefix_of"]


def rank_prefix_of(file_mapper: FileMapper) -> str:
    """The rank's prefix below the bucket, from vLLM's obj tier's
    ``FileMapper``: its rank directory with empty segments dropped."""
    rank_dir = rank_dir_of(file_mapper.base_path, file_mapper.rank)
    return "/".join(part for part in rank_dir.split("/") if part)


class ObjectTier(NativeTier):
    """vLLM's object-store secondary tier, natively (see the module's docs).

    Arguments after ``tier_type``: ``url`` or vLLM's ``store_config`` and
    ``prefix``; vLLM's ``io_threads``, ``enable_kv_events`` and
    ``locality``; and kvtier's ``n_read_threads``, ``n_write_threads``,
    ``lookup_concurrency`` (groups probed at once, default 4),
    ``lookup_timeout`` (seconds, default 2), ``shutdown_grace`` (seconds
    queued stores get at ``shutdown()``, default 2), ``request_timeout``,
    ``connect_timeout`` (default 2 s) and ``max_retries``.

    ``capacity_bytes`` bounds the bytes of the rank prefix's blocks
    (default ``None``: unbounded, as vLLM's obj tier), as ``FsTier``'s does
    a directory's: listed at start (the newest that fit kept, older ones
    deleted), every store makes room first (``eviction_policy``), loads
    pin. Hosts sharing the prefix each keep their own books;
    ``rescan_interval`` (seconds) reconciles them with a listing that often,
    so the prefix stays within ``capacity_bytes`` plus what the other hosts
    write in about one interval. Listings count and delete only the
    layout's block objects.

    ``index`` (``redis://host:6379`` or ``valkey://…``; needs
    ``capacity_bytes``) puts the budget in the fleet's books in Valkey or
    Redis instead: every host writing into the prefix shares one budget and
    one recency, enforced at every store (committed plus reserved bytes
    never exceed ``capacity_bytes``), and lookups are one round trip per
    group. ``index_lease`` (seconds, default 30) is how long a store's
    reservation or a read's pin holds without renewal: a host that dies
    gets its space back after it. While the index does not answer, or after
    it lost its books until one host rebuilt them from a listing, lookups
    miss and stores are refused.

    ``stale_temp_age`` (seconds, default 600; ``None``: never): at start,
    unfinished multipart uploads of the layout's blocks older than this
    (writers that died mid-upload left them; kvtier writes each block with
    one PUT and leaves none) are aborted in the background.
    """

    def __init__(
        self,
        offloading_spec: "OffloadingSpec",
        primary_kv_view: memoryview,
        tier_type: str,
        url: Optional[str] = None,
        store_config: Optional[dict[str, Any]] = None,
        prefix: Optional[str] = None,
        io_threads: Optional[int] = None,
        n_read_threads: Optional[int] = None,
        n_write_threads: Optional[int] = None,
        enable_kv_events: bool = False,
        locality: Optional[str] = None,
        backpressure_detector: Optional[BackpressureDetector] = None,
        lookup_concurrency: int = 4,
        lookup_timeout: Optional[float] = 2.0,
        shutdown_grace: float = 2.0,
        request_timeout: Optional[float] = None,
        connect_timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
        capacity_bytes: Optional[int] = None,
        eviction_policy: Optional[str] = None,
        rescan_interval: Optional[float] = None,
        stale_temp_age: Optional[float] = 600.0,
        index: Optional[str] = None,
        index_lease: Optional[float] = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        given = {
            "url": url,
            "store_config": store_config,
            "prefix": prefix,
            "lookup_concurrency": lookup_concurrency,
            "lookup_timeout": lookup_timeout,
            "shutdown_grace": shutdown_grace,
            "request_timeout": request_timeout,
            "connect_timeout": connect_timeout,
            "max_retries": max_retries,
            "capacity_bytes": capacity_bytes,
            "eviction_policy": eviction_policy,
            "rescan_interval": rescan_interval,
            "stale_temp_age": stale_temp_age,
            "index": index,
            "index_lease": index_lease,
        }
        if io_threads is not None:
            given["io_threads"] = io_threads
        for name, value in (("n_read_threads", n_read_threads), ("n_write_threads", n_write_threads)):
            if value is not None:
                given[name] = value
        # One door: every setting is checked before anything is started.
        settings = check_settings(given)
        target = settings.get("object_target")
        if target is None:
            raise ConfigError("ObjectTier needs url, or vLLM's store_config (with prefix): where the blocks go")
        reads, writes = _threads(settings)
        self._shutdown_grace = settings["shutdown_grace"]
        self._init_events(offloading_spec, tier_type, enable_kv_events, locality)
        # vLLM's obj tier's mapper, as it builds it: the rank directory (and
        # its digest of the run's settings) is the one vLLM's tier names.
        root_dir = f"{target.prefix}/" if target.prefix else ""
        self.file_mapper = FileMapper.from_offloading_spec(root_dir, offloading_spec, parallel_agnostic=True)
        self.rank_prefix = rank_prefix_of(self.file_mapper)
        # guard: O6-a-bad-store-is-refused-at-start
        target.check_reachable(self.rank_prefix)
        # guard: O12-the-object-tiers-budget-reaches-the-transfers
        transfers = open_transfers(
            self.rank_prefix,
            primary_kv_view,
            load_threads=reads,
            store_threads=writes,
            settings=settings,
            target=target,
        )
        try:
            # With the fleet's books (index), they answer the lookups too.
            lookup = Lookup.vllm_objects(
                target,
                self.rank_prefix,
                transfers=transfers,
                concurrency=settings["lookup_concurrency"],
                group_timeout=settings["lookup_timeout"],
            )
        except BaseException:
            transfers.shutdown(0.0)
            raise
        self._target = target
        self._adopt(tier_type, lookup, transfers, reads + writes)
        logger.info(
            "tier %r: bucket %r at %s, prefix %r, %d read and %d write threads",
            tier_type,
            target.bucket,
            target.endpoint or "AWS",
            self.rank_prefix,
            reads,
            writes,
        )
        if settings.get("index") is not None:
            report = transfers.scan_report()
            logger.info(
                "tier %r: %d bytes budget on the fleet's books at %s (leases of %.1f s): %d blocks "
                "(%d bytes) committed fleet-wide",
                tier_type,
                settings["capacity_bytes"],
                _shown(settings["index"]),
                settings["index_lease"],
                report["blocks"],
                report["bytes"],
            )
        elif settings.get("capacity_bytes") is not None:
            report = transfers.scan_report()
            logger.info(
                "tier %r: %d bytes budget, %d blocks (%d bytes) listed, %d trimmed, in %.2f s; "
                "reconciled with a listing every %s",
                tier_type,
                settings["capacity_bytes"],
                report["blocks"],
                report["bytes"],
                report["trimmed"],
                report["seconds"],
                f"{settings['rescan_interval']} s" if settings.get("rescan_interval") else "never (rescan_interval)",
            )

    def __repr__(self) -> str:
        return f"ObjectTier({self.tier_type!r}, {self._target!r}, {self.rank_prefix!r})"


def _shown(url: str) -> str:
    """``url`` without a password."""
    scheme, _, rest = url.partition("://")
    authority, slash, tail = rest.partition("/")
    if "@" in authority:
        user, _, host = authority.rpartition("@")
        authority = f"{user.partition(':')[0]}:***@{host}"
    return f"{scheme}://{authority}{slash}{tail}"


def _threads(settings: dict[str, Any]) -> tuple[int, int]:
    """Read and write threads: each given, or half of vLLM's ``io_threads``
    each (at least one), or 16 each."""
    io_threads = settings.get("io_threads")
    default = 16 if io_threads is None else max(1, io_threads // 2)
    reads = settings.get("n_read_threads", default)
    writes = settings.get("n_write_threads", default)
    if reads + writes == 0:
        raise ConfigError("n_read_threads + n_write_threads is 0: the tier needs an I/O thread")
    return reads, writes

"""What both sides of the connector share: its settings (from
``kv_connector_extra_config``), where its blocks live, and the metadata
that crosses from the scheduler to the workers and back."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Mapping, Optional

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)
from vllm.v1.kv_offload.file_mapper import FileMapper

from .._native import ConfigError, check_settings
from ._layout import check_root_dir, rank_dir_of

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

#: The settings kvtier's one set of rules checks (``check_settings``), with
#: the connector's defaults.
_DEFAULTS: dict[str, Any] = {
    "staging_bytes": 64 << 20,
    "copy_threads": 2,
    "io_threads": 4,
    "lookup_concurrency": 4,
    "lookup_timeout": 2.0,
    "shutdown_grace": 2.0,
    "stale_temp_age": 600.0,
    "capacity_bytes": None,
    "eviction_policy": None,
    "rescan_interval": None,
    "index": None,
    "index_lease": None,
}


#: An object store's settings, instead of ``root_dir`` (see ``ObjectTier``).
_STORE = ("url", "store_config", "prefix", "request_timeout", "connect_timeout", "max_retries")

_KNOWN = {
    "root_dir",
    *_STORE,
    "staging_bytes",
    "copy_threads",
    "io_threads",
    "lookup_concurrency",
    "lookup_timeout",
    "shutdown_grace",
    "stale_temp_age",
    "blocking_save",
    "capacity_bytes",
    "eviction_policy",
    "rescan_interval",
    "index",
    "index_lease",
}


@dataclass(frozen=True)
class ConnectorSettings:
    """The connector's settings (see ``StorageConnector``'s docs)."""

    base_path: str
    agnostic: bool
    block_size: int
    staging_bytes: int
    copy_threads: int
    io_threads: int
    lookup_concurrency: int
    lookup_timeout: Optional[float]
    shutdown_grace: float
    stale_temp_age: Optional[float]
    blocking_save: bool
    world_size: int
    capacity_bytes: Optional[int] = None
    eviction_policy: Optional[str] = None
    rescan_interval: Optional[float] = None
    run_config: dict[str, Any] = field(default_factory=dict)
    #: The bucket and prefix (a native ``ObjectTarget``) when the blocks
    #: live in an object store; ``None`` for ``root_dir``.
    target: Any = None
    #: The fleet's books (``redis://…``) and their lease, on a bucket.
    index: Optional[str] = None
    index_lease: Optional[float] = None

    @staticmethod
    def from_vllm(vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig") -> "ConnectorSettings":
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
            build_offloading_config,
        )

        transfer = vllm_config.kv_transfer_config
        extra: Mapping[str, Any] = dict(transfer.kv_connector_extra_config or {}) if transfer else {}
        unknown = sorted(set(extra) - _KNOWN)
        if unknown:
            raise ConfigError(
                f"kv_connector_extra_config has settings the kvtier connector does not know: {unknown}; "
                f"it knows {sorted(_KNOWN)}"
            )
        in_store = "url" in extra or "store_config" in extra
        if ("root_dir" in extra) == in_store:
            raise ConfigError(
                "kv_connector_extra_config needs 'root_dir' (a directory) or 'url' / 'store_config' "
                "(an S3-compatible bucket) for the blocks, and not both"
            )
        values = {name: extra.get(name, default) for name, default in _DEFAULTS.items()}
        values.update({name: extra[name] for name in _STORE if name in extra})
        # guard: K7-settings-are-checked
        checked = check_settings(values, "kv_connector_extra_config")
        target = checked.get("object_target")
        if target is not None:
            # As vLLM's obj tier roots its mapper (see ObjectTier).
            root_dir = f"{target.prefix}/" if target.prefix else ""
        else:
            root_dir = check_root_dir(extra["root_dir"])
        blocking = extra.get("blocking_save", False)
        if not isinstance(blocking, bool):
            raise ConfigError(f"kv_connector_extra_config['blocking_save'] is a bool, not {blocking!r}")
        groups = kv_cache_config.kv_cache_groups
        if len(groups) != 1:
            raise ConfigError(
                f"the kvtier connector handles models with one KV-cache group; this one has {len(groups)}"
            )
        block_size = vllm_config.cache_config.block_size
        # vLLM's own run config, so the directory is the one vLLM's fs tier
        # uses for this model (offloaded blocks of one engine block).
        offloading = build_offloading_config(vllm_config, kv_cache_config)
        if offloading.cache.tokens_per_hash != block_size:
            raise ConfigError(
                f"the kvtier connector needs one block hash per block: the hash covers "
                f"{offloading.cache.tokens_per_hash} tokens, a block {block_size}"
            )
        world = vllm_config.parallel_config.world_size
        # One rank: vLLM's fs tier's directory (a parallelism-agnostic run
        # collapses to rank 0). Several: each rank its own directory, since
        # each rank dumps its own part of a block.
        agnostic = world == 1
        mapper = FileMapper.from_offloading_spec(
            root_dir=root_dir,
            offloading_spec=SimpleNamespace(config=offloading),  # type: ignore[arg-type]
            blocks_per_file=1,
            parallel_agnostic=agnostic,
        )
        return ConnectorSettings(
            base_path=mapper.base_path,
            agnostic=mapper.rank == 0 and agnostic,
            block_size=block_size,
            staging_bytes=checked["staging_bytes"],
            copy_threads=checked["copy_threads"],
            io_threads=checked["io_threads"],
            lookup_concurrency=checked["lookup_concurrency"],
            lookup_timeout=checked["lookup_timeout"],
            shutdown_grace=checked["shutdown_grace"],
            stale_temp_age=checked["stale_temp_age"],
            blocking_save=blocking,
            world_size=world,
            capacity_bytes=checked["capacity_bytes"],
            eviction_policy=checked["eviction_policy"],
            rescan_interval=checked["rescan_interval"],
            run_config=mapper.get_run_config(),
            target=target,
            index=checked.get("index"),
            index_lease=checked.get("index_lease"),
        )

    def rank_dir(self, rank: int) -> str:
        """The rank's directory, or in an object store its prefix (vLLM's
        rank directory with empty segments dropped)."""
        rank_dir = rank_dir_of(self.base_path, 0 if self.agnostic else rank)
        if self.target is None:
            return rank_dir
        return "/".join(part for part in rank_dir.split("/") if part)

    def write_run_config(self) -> None:
        """The run's settings next to its blocks, as vLLM's fs tier writes
        them (either may create the file); nothing in an object store."""
        if self.target is not None:
            return
        path = os.path.join(self.base_path, "config.json")
        os.makedirs(self.base_path, exist_ok=True)
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(self.run_config, f, indent=2, sort_keys=True)
            os.replace(tmp, path)


@dataclass
class StorageConnectorMetadata(KVConnectorMetadata):
    """One step, from the scheduler to every worker: the step in kvtier's
    wire form (sequence number, requests dumping, preempted, finished), the
    dumps and the loads as ``(req_id, keys, engine_blocks)``, and the
    requests whose finish vLLM did not announce (fenced like a preemption,
    never reported)."""

    step: bytes
    saves: list[tuple[str, list[bytes], list[int]]] = field(default_factory=list)
    loads: list[tuple[str, list[bytes], list[int]]] = field(default_factory=list)
    forget: list[str] = field(default_factory=list)


@dataclass
class StorageWorkerMetadata(KVConnectorWorkerMetadata):
    """From the workers to the scheduler, each step: every worker's
    ``WorkerReport`` (wire form), the keys of blocks that failed to load,
    and the blocks rank 0 stored or deleted since the last step, in order
    (``changed_keys[i]`` is present when ``changed_present[i]``), which the
    scheduler's lookups settle. vLLM folds the workers' metadata together
    with ``aggregate``."""

    reports: list[bytes] = field(default_factory=list)
    failed_keys: list[bytes] = field(default_factory=list)
    changed_keys: list[bytes] = field(default_factory=list)
    changed_present: list[bool] = field(default_factory=list)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, StorageWorkerMetadata)
        return StorageWorkerMetadata(
            reports=self.reports + other.reports,
            failed_keys=self.failed_keys + other.failed_keys,
            changed_keys=self.changed_keys + other.changed_keys,
            changed_present=self.changed_present + other.changed_present,
        )

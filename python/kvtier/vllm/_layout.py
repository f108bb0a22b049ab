"""vLLM 0.32's block layout: keys (``make_key``), run directories
(``base_dir``, ``rank_dir``) and block paths (``block_path``), and the
check of a ``root_dir`` before vLLM's ``FileMapper`` sees it."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Optional, Sequence

from .._native import ConfigError

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
    return rank_dir_of(base_dir(root, **settings), rank)


def block_path(rank_directory: str | os.PathLike[str], key: bytes) -> str:
    """Where vLLM stores the block of ``key`` below a rank's directory."""
    block_hash, group = split_key(key)
    digits = block_hash.hex()
    return os.path.join(
        os.fspath(rank_directory), digits[:3], f"{digits[3:5]}_g{group}", f"{digits}.bin"
    )


def check_root_dir(root_dir: object) -> str:
    """``root_dir`` as vLLM's ``FileMapper`` takes it: a non-empty path
    without NUL. vLLM hands it on unchecked (``""`` makes directories below
    ``/``, ``None`` below ``./None``), so it is checked here."""
    # guard: N7-root-dir-checked
    if not isinstance(root_dir, (str, os.PathLike)):
        raise ConfigError(f"root_dir is a path (str or os.PathLike), not {type(root_dir).__name__}")
    path = os.fspath(root_dir)
    if isinstance(path, bytes):
        raise ConfigError("root_dir is a str path, not bytes")
    if not path:
        raise ConfigError("root_dir is empty; name the directory the tier stores blocks in")
    if "\0" in path:
        raise ConfigError(f"root_dir {path!r} contains a NUL character")
    return path


def rank_dir_of(base_path: str, rank: int) -> str:
    """The directory of rank ``rank`` below a run's base directory, as
    vLLM's fs tier names it."""
    return f"{base_path}_r{rank}"

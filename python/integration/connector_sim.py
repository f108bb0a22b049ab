"""A vLLM engine in one process for connector tests: vLLM's real
``Scheduler`` (built by the scheduler-level helpers of vLLM's sdist,
``tests/v1/kv_connector/unit/utils.py``, imported from the sdist, never
copied), worker-side connectors on real CPU tensors, and vLLM's own
``KVOutputAggregator`` folding the workers' outputs, in the order a model
runner calls a connector in one step.

The "model" writes, per step, every block it computes: a block that is full
gets bytes derived from its block hash, a block still filling gets bytes
derived from its request and position. So a block file holds its key's
bytes exactly when nothing overwrote the block while it was being dumped
(``check_files``), and the harness also checks, at every step, that no
block under a dump was handed to another request (``reused_under_dump``).

Needs vLLM (0.32) and its sdist's tests on ``sys.path`` (``KVTIER_VLLM_SDIST``).
"""

from __future__ import annotations

import hashlib
import os
import sys
from types import SimpleNamespace
from typing import Any, Iterable, Optional

import torch

_SDIST = os.environ.get("KVTIER_VLLM_SDIST")
if _SDIST and _SDIST not in sys.path:
    sys.path.insert(0, _SDIST)

from tests.v1.kv_connector.unit.utils import (  # noqa: E402  (vLLM's sdist)
    EOS_TOKEN_ID,
    create_request,
    create_scheduler,
    create_vllm_config,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.kv_offload.base import make_offload_key  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

from kvtier.vllm.connector import StorageConnector  # noqa: E402

__all__ = [
    "Cluster",
    "EOS_TOKEN_ID",
    "connector_config",
    "create_request",
    "create_scheduler",
    "create_vllm_config",
    "storage_of",
]

BLOCK = 16
MODULE = "kvtier.vllm.connector"


def connector_config(
    root: Optional[str], *, multi: Optional[str] = None, workers: int = 1, failure_policy: str = "recompute", **extra: Any
):
    """vLLM's config for kvtier's connector alone, or under MultiConnector
    next to OffloadingConnector (``multi="offloading"``: vLLM's HMA path) or
    next to OffloadingConnector and ExampleConnector, which has no HMA
    support (``multi="offloading+example"``: the non-HMA path);
    failed loads are recomputed unless ``failure_policy="fail"``; ``root``
    ``None`` leaves ``root_dir`` out (an object store's settings in
    ``extra`` instead)."""
    ours = ({} if root is None else {"root_dir": root}) | extra
    if multi is None:
        config = create_vllm_config(
            kv_connector="StorageConnector",
            kv_connector_module_path=MODULE,
            kv_role="kv_both",
            block_size=BLOCK,
            dtype="float32",
            kv_connector_extra_config=ours,
            max_num_batched_tokens=256,
            kv_load_failure_policy=failure_policy,
        )
    else:
        others: list[dict[str, Any]] = [
            {
                "kv_connector": "OffloadingConnector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {
                    "spec_name": "CpuTieringSpec",
                    "spec_module_path": "kvtier.vllm.cpu",
                    "cpu_bytes_to_use": 1 << 20,
                },
            }
        ]
        if multi == "offloading+example":
            # A connector without HMA support beside them: MultiConnector
            # then takes vLLM's non-HMA path (request_finished).
            others.append(
                {
                    "kv_connector": "ExampleConnector",
                    "kv_role": "kv_both",
                    "kv_connector_extra_config": {"shared_storage_path": os.path.join(root, "example")},
                }
            )
        config = create_vllm_config(
            kv_connector="MultiConnector",
            kv_role="kv_both",
            block_size=BLOCK,
            dtype="float32",
            max_num_batched_tokens=256,
            kv_load_failure_policy=failure_policy,
            kv_connector_extra_config={
                "connectors": [
                    {
                        "kv_connector": "StorageConnector",
                        "kv_connector_module_path": MODULE,
                        "kv_role": "kv_both",
                        "kv_connector_extra_config": ours,
                    },
                    *others,
                ]
            },
        )
    if workers > 1:
        # vLLM's config counts its workers from the parallel sizes; the
        # harness runs its workers itself, so only the count matters.
        config.parallel_config.world_size = workers
    return config


def storage_of(connector: Any) -> StorageConnector:
    """kvtier's connector, alone or inside a MultiConnector."""
    if isinstance(connector, StorageConnector):
        return connector
    for sub in getattr(connector, "_connectors", ()):
        if isinstance(sub, StorageConnector):
            return sub
    raise LookupError(f"no kvtier connector in {connector!r}")


def _fill(seed: bytes, size: int) -> torch.Tensor:
    digest = hashlib.sha256(seed).digest()
    data = (digest * (size // len(digest) + 1))[:size]
    return torch.frombuffer(bytearray(data), dtype=torch.int8)


# What ExampleConnector reads of a forward context when there is no model.
_NO_FORWARD = SimpleNamespace(attn_metadata=None, no_compile_layers={})


class Cluster:
    """vLLM's scheduler and ``workers`` worker-side connectors."""

    def __init__(self, config: Any, *, num_blocks: int = 64, workers: int = 1) -> None:
        self.config = config
        self.scheduler = create_scheduler(config, num_blocks=num_blocks)
        self.kv_cache_config = self.scheduler.kv_cache_config
        self.num_blocks = num_blocks
        self.caches: list[torch.Tensor] = []
        self.workers = []
        for rank in range(workers):
            config.parallel_config.rank = rank
            worker = KVConnectorFactory.create_connector(config, KVConnectorRole.WORKER, self.kv_cache_config)
            cache = torch.zeros((num_blocks, 2, BLOCK, 1, 1), dtype=torch.float32)
            worker.register_kv_caches({"layer": cache})
            self.caches.append(cache)
            self.workers.append(worker)
        config.parallel_config.rank = 0
        self.aggregator = KVOutputAggregator.from_connector(self.scheduler.connector, workers)
        self.page = self.caches[0][0].numel() * 4
        self.steps = 0
        # Per worker: the requests it reported in finished_sending, in order.
        self.reported: list[list[str]] = [[] for _ in range(workers)]
        self.freed: list[str] = []
        self.reuse_violations: list[str] = []
        self.skip_report: dict[int, set[str]] = {}

    # Views.

    @property
    def connector(self) -> StorageConnector:
        return storage_of(self.scheduler.connector)

    def worker(self, rank: int = 0) -> StorageConnector:
        return storage_of(self.workers[rank])

    def engine(self, rank: int = 0):  # type: ignore[no-untyped-def]
        dumps = self.worker(rank)._worker.engine
        assert dumps is not None
        return dumps

    def blocks_of(self, req_id: str) -> list[int]:
        return list(self.scheduler.kv_cache_manager.get_block_ids(req_id)[0])

    def add(self, request: Any) -> Any:
        self.scheduler.add_request(request)
        return request

    def abort(self, req_id: str) -> None:
        self.scheduler.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)

    # One step.

    def step(self, *, finish: Iterable[str] = ()) -> Any:
        """Schedules, runs the workers' connector calls around a "forward"
        that writes the computed blocks, folds their outputs with vLLM's
        aggregator and hands the result to the scheduler. Requests in
        ``finish`` sample EOS."""
        so = self.scheduler.schedule()
        self._finish_step(so, finish)
        return so

    def _finish_step(self, so: Any, finish: Iterable[str] = ()) -> None:
        """The rest of a step whose ``schedule()`` the caller ran."""
        finish = set(finish)
        meta = so.kv_connector_metadata
        self._check_reuse(so)
        outputs = []
        for rank, worker in enumerate(self.workers):
            worker.handle_preemptions(meta)
            worker.bind_connector_metadata(meta)
            worker.start_load_kv(_NO_FORWARD)
            self._forward(so, self.caches[rank])
            worker.wait_for_save()
            results = worker.get_transfer_results(so.finished_req_ids)
            self.reported[rank].extend(sorted(results.finished_sending))
            output = KVConnectorOutput(
                finished_sending=results.finished_sending or None,
                finished_recving=results.finished_recving or None,
                invalid_block_ids=worker.get_block_ids_with_load_errors(),
                kv_connector_worker_meta=worker.build_connector_worker_meta(),
            )
            worker.clear_connector_metadata()
            outputs.append(self._runner_output(so, finish, output))
        merged = self.aggregator.aggregate(outputs)
        if merged.kv_connector_output and merged.kv_connector_output.finished_sending:
            self.freed.extend(sorted(merged.kv_connector_output.finished_sending))
        self.scheduler.update_from_output(so, merged)
        self.steps += 1

    def run(self, steps: int, **kwargs: Any) -> None:
        for _ in range(steps):
            self.step(**kwargs)

    def _runner_output(self, so: Any, finish: set[str], kv: KVConnectorOutput) -> ModelRunnerOutput:
        req_ids = list(so.num_scheduled_tokens)
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[[EOS_TOKEN_ID if r in finish else 7] for r in req_ids],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=None,
            kv_connector_output=kv,
        )

    def _forward(self, so: Any, cache: torch.Tensor) -> None:
        """Writes every block computed this step (see the module's docs)."""
        flat = cache.view(self.num_blocks, -1).view(torch.int8)
        for req_id, count in so.num_scheduled_tokens.items():
            request = self.scheduler.requests[req_id]
            # schedule() has counted the step's tokens as computed already.
            end = request.num_computed_tokens
            start = end - count
            blocks = self.blocks_of(req_id)
            for index in range(start // BLOCK, (end + BLOCK - 1) // BLOCK):
                if index >= len(blocks):
                    break
                full = (index + 1) * BLOCK <= end and index < len(request.block_hashes)
                seed = (
                    make_offload_key(bytes(request.block_hashes[index]), 0)
                    if full
                    else f"{req_id}/{index}/{end}".encode()
                )
                flat[blocks[index]] = _fill(seed, self.page)

    def _check_reuse(self, so: Any) -> None:
        """No block a dump has not copied yet belongs to a request other
        than the dump's own (a free before the dump ended)."""
        held = {}
        for rank in range(len(self.workers)):
            engine = self.engine(rank)
            for dump in list(engine._queued) + [d for d in engine._active.values() if d.phase == "copying"]:
                for block in dump.blocks:
                    held[block] = dump
        if not held:
            return
        for req_id in so.num_scheduled_tokens:
            for block in self.blocks_of(req_id):
                dump = held.get(block)
                if dump is not None and not any(
                    make_offload_key(bytes(h), 0) in dump.keys
                    for h in self.scheduler.requests[req_id].block_hashes
                ):
                    self.reuse_violations.append(f"block {block} of {req_id} is under {dump!r}")

    # Checks.

    def key_file(self, key: bytes, rank: int = 0) -> str:
        return os.fspath(self.worker(rank)._worker.engine._transfers.path_of(key))  # type: ignore[union-attr]

    def check_files(self, keys: Iterable[bytes], rank: int = 0) -> dict[str, int]:
        """Each existing file of ``keys`` holds its key's bytes; counts
        files present, absent and wrong."""
        counts = {"present": 0, "absent": 0, "wrong": 0}
        for key in keys:
            path = self.key_file(key, rank)
            if not os.path.exists(path):
                counts["absent"] += 1
                continue
            with open(path, "rb") as f:
                data = f.read()
            expected = bytes(_fill(key, self.page).numpy().tobytes())
            counts["present" if data == expected else "wrong"] += 1
        return counts

    def keys_of(self, request: Any, count: Optional[int] = None) -> list[bytes]:
        hashes = request.block_hashes if count is None else request.block_hashes[:count]
        return [make_offload_key(bytes(h), 0) for h in hashes]

    def shutdown(self) -> None:
        for worker in self.workers:
            worker.shutdown()
        self.scheduler.connector.shutdown()

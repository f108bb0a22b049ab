"""The connector's scheduler side: lookups through kvtier's async lookup,
the step's dumps and loads, and the delayed free of requests whose dumps
are recorded, through kvtier's save core (``SaveScheduler`` records who
dumps, ``ReportAggregator`` frees a request once every worker reported
it)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional

from vllm.v1.kv_offload.base import make_offload_key

from .._native import Lookup, ReportAggregator, SaveScheduler, WorkerReport
from ._conn_common import ConnectorSettings, StorageConnectorMetadata, StorageWorkerMetadata
from .metrics import Figures, lookup_figures

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = logging.getLogger("kvtier.vllm")


class _Req:
    """What the scheduler side knows of a live request."""

    __slots__ = ("request", "saved", "blocks", "pending_load", "loaded")

    def __init__(self, request: "Request") -> None:
        self.request = request
        # Leading blocks dumped, loaded or found computed: never dumped again.
        self.saved: Optional[int] = None
        # The request's engine blocks (KV-cache group 0), as scheduled.
        self.blocks: list[int] = []
        # (first block, keys of the leading hits) from the last lookup.
        self.pending_load: Optional[tuple[int, list[bytes]]] = None
        # The keys of the blocks loaded for it, and their block indices.
        self.loaded: dict[bytes, int] = {}


class SchedulerSide:
    """The scheduler side of ``StorageConnector`` (see the module's docs)."""

    def __init__(self, settings: ConnectorSettings, workers: int) -> None:
        self.settings = settings
        self.block_size = settings.block_size
        settings.write_run_config()
        if settings.target is not None:
            # One listing: the store answers, takes the credentials and has
            # the bucket, or the error names the setting to fix.
            settings.target.check_reachable(settings.rank_dir(0))
            # With the fleet's books (index), they answer: the transfers
            # are the workers', so the lookups connect on their own.
            books = {} if settings.index is None else {
                "index": settings.index,
                "index_lease": settings.index_lease,
                "capacity_bytes": settings.capacity_bytes,
            }
            self.lookup = Lookup.vllm_objects(
                settings.target,
                settings.rank_dir(0),
                concurrency=settings.lookup_concurrency,
                group_timeout=settings.lookup_timeout,
                **books,
            )
        else:
            self.lookup = Lookup.vllm_fs(
                settings.rank_dir(0),
                concurrency=settings.lookup_concurrency,
                group_timeout=settings.lookup_timeout,
            )
        # The groups' times to verdict, for /metrics (see report_figures).
        self.lookup.time_verdicts(True)
        self.figures = Figures("connector")
        self.saves = SaveScheduler()
        self.aggregator = ReportAggregator(workers)
        self._reqs: dict[str, _Req] = {}
        self._loads: list[tuple[str, list[bytes], list[int]]] = []
        # Loaded keys -> the request they were loaded for (while it lives).
        self._loaded_by: dict[bytes, str] = {}
        # Requests whose free waits for the workers' reports.
        self._delayed: set[str] = set()
        # Requests vLLM finished without telling the connector.
        self._forgotten: set[str] = set()
        self.counters = {
            "lookups_retried": 0,
            "blocks_hit": 0,
            "blocks_loaded": 0,
            "blocks_dumped": 0,
            "load_failed_keys": 0,
            "unannounced_finishes": 0,
            "report_disagreements": 0,
            "blocks_settled": 0,
        }

    def _req(self, request: "Request") -> _Req:
        req = self._reqs.get(request.request_id)
        if req is None:
            req = self._reqs[request.request_id] = _Req(request)
        return req

    def _key(self, block_hash: Any) -> bytes:
        return make_offload_key(bytes(block_hash), 0)

    # vLLM's calls.

    def on_new_request(self, request: "Request") -> None:
        self._req(request)

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[Optional[int], bool]:
        """The tokens of the leading blocks the tier holds past the computed
        ones; ``None`` while the tier is being probed (vLLM asks again next
        step). The prompt's last token is always computed: a hit of the
        prompt's last full block is loaded whole and counts one token less."""
        req = self._req(request)
        req.pending_load = None
        bs = self.block_size
        prompt = request.num_prompt_tokens
        first = num_computed_tokens // bs
        last = min(prompt // bs, len(request.block_hashes))
        if last <= first:
            return 0, False
        keys = [self._key(h) for h in request.block_hashes[first:last]]
        verdicts, leading = self.lookup.lookup_many(keys, request.request_id)
        # guard: K2-an-unanswered-lookup-retries
        if leading < len(keys) and verdicts[leading] is None:
            self.counters["lookups_retried"] += 1
            return None, False
        tokens = min((first + leading) * bs, prompt - 1) - num_computed_tokens
        if tokens <= 0:
            return 0, False
        req.pending_load = (first, keys[:leading])
        self.counters["blocks_hit"] += leading
        return tokens, False

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int) -> None:
        req = self._reqs.get(request.request_id)
        if req is None:
            return
        pending, req.pending_load = req.pending_load, None
        if num_external_tokens <= 0 or pending is None:
            return
        first, keys = pending
        bs = self.block_size
        # The external tokens start at block `first` (vLLM asked with a
        # block-aligned count). Every block holding one of them is loaded
        # whole: the last may count a token short (vLLM computes that one).
        count = min(-(-num_external_tokens // bs), len(keys))
        block_ids = blocks.get_block_ids()[0]
        engine = [int(b) for b in block_ids[first : first + count]]
        if count and len(engine) == count:
            self._loads.append((request.request_id, keys[:count], engine))
            self.counters["blocks_loaded"] += count
            if req.saved is None:
                # Loaded blocks are on disk already: never dumped again.
                req.saved = first + count
            for i, key in enumerate(keys[:count]):
                req.loaded[key] = first + i
                self._loaded_by[key] = request.request_id

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> StorageConnectorMetadata:
        forget = self._unannounced(scheduler_output.finished_req_ids)
        preempted = list(scheduler_output.preempted_req_ids or ())
        if preempted:
            # guard: K3-preempted-requests-are-fenced
            self.saves.preempt(preempted)
            for req_id in preempted:
                req = self._reqs.get(req_id)
                if req is not None:
                    req.blocks = []
        saves = self._saves(scheduler_output)
        step = self.saves.record_step([(req_id, len(keys)) for req_id, keys, _ in saves])
        loads, self._loads = self._loads, []
        # The step's lookups go to the prober now.
        self.lookup.flush()
        return StorageConnectorMetadata(step=step.encode(), saves=saves, loads=loads, forget=forget)

    def _unannounced(self, finished: Any) -> list[str]:
        """Requests vLLM finished without calling ``request_finished`` (a
        wrapper that does not forward it): vLLM may have handed their blocks
        to another request already. Their dumps are fenced in this step,
        before the forward pass writes those blocks, and they are never
        reported (vLLM knows no such request any more)."""
        forget = []
        for req_id in finished or ():
            req = self._reqs.pop(req_id, None)
            if req is None:
                continue
            self._forget(req)
            self.lookup.cleanup(req_id)
            if self.saves.is_delayed(req_id):
                self.counters["unannounced_finishes"] += 1
                logger.error(
                    "kvtier connector: request %s finished without request_finished reaching the "
                    "connector (a wrapper that does not forward it?); its dumps are fenced now",
                    req_id,
                )
                # guard: K8-unannounced-finishes-are-fenced
                self.saves.preempt([req_id])
                self.saves.request_finished(req_id)
                # The workers report it (and drop it from finished_sending):
                # counted here so the reports stay in step.
                self.aggregator.expect(req_id)
                self._forgotten.add(req_id)
                forget.append(req_id)
        return forget

    def _saves(self, so: "SchedulerOutput") -> list[tuple[str, list[bytes], list[int]]]:
        """Per scheduled request, the blocks that are full once this step
        ran and were not dumped, loaded or computed before."""
        computed: dict[str, int] = {}
        for new in so.scheduled_new_reqs:
            req = self._reqs.get(new.req_id)
            if req is None:
                continue
            req.blocks = [int(b) for b in new.block_ids[0]]
            computed[new.req_id] = new.num_computed_tokens
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            req = self._reqs.get(req_id)
            if req is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                req.blocks = [int(b) for b in new_ids[0]] if new_ids is not None else []
            elif new_ids is not None:
                req.blocks.extend(int(b) for b in new_ids[0])
            computed[req_id] = cached.num_computed_tokens[i]
        saves = []
        bs = self.block_size
        for req_id, done in computed.items():
            req = self._reqs[req_id]
            if req.saved is None:
                req.saved = done // bs
            end = done + so.num_scheduled_tokens.get(req_id, 0)
            full = min(end // bs, len(req.request.block_hashes), len(req.blocks))
            if full > req.saved:
                hashes = req.request.block_hashes[req.saved : full]
                saves.append((req_id, [self._key(h) for h in hashes], req.blocks[req.saved : full]))
                self.counters["blocks_dumped"] += full - req.saved
                req.saved = full
        return saves

    def _forget(self, req: Optional[_Req]) -> None:
        if req is not None:
            for key in req.loaded:
                self._loaded_by.pop(key, None)

    def _failed_loads(self, keys: list[bytes]) -> None:
        """Blocks that failed to load are recomputed by vLLM: their lookups
        miss from now on, and they are dumped again once recomputed."""
        self.counters["load_failed_keys"] += len(keys)
        self.lookup.mark_miss(keys)
        for key in keys:
            req = self._reqs.get(self._loaded_by.pop(key, ""))
            if req is None:
                continue
            index = req.loaded.pop(key, None)
            # guard: K9-recomputed-blocks-are-dumped-again
            if index is not None and req.saved is not None:
                req.saved = min(req.saved, index)

    def request_finished(self, request: "Request") -> tuple[bool, Optional[dict[str, Any]]]:
        """True when dumps of the request were recorded: its blocks stay
        until every worker reported it in ``finished_sending``."""
        req_id = request.request_id
        self._forget(self._reqs.pop(req_id, None))
        self.lookup.cleanup(req_id)
        # guard: K1-a-request-with-recorded-dumps-delays-its-free
        delay = self.saves.request_finished(req_id)
        if delay:
            self.aggregator.expect(req_id)
            self._delayed.add(req_id)
        return delay, None

    def update_connector_output(self, output: "KVConnectorOutput") -> None:
        """The workers' reports of the step: failed loads become misses,
        rank 0's stored and deleted blocks settle the lookups, and the
        requests every worker reported are freed — the same ones vLLM's own
        aggregation frees (counted when they differ)."""
        meta = output.kv_connector_worker_meta
        freed: set[str] = set()
        if isinstance(meta, StorageWorkerMetadata):
            if meta.failed_keys:
                self._failed_loads(meta.failed_keys)
            # What rank 0 stored and deleted, in order: a deleted block's
            # hit misses before any load, a stored one's wait ends in a hit.
            # guard: K13-the-scheduler-settles-the-workers-changes
            for key, present in zip(meta.changed_keys, meta.changed_present):
                self.counters["blocks_settled"] += self.lookup.settle([key], present)
            for data in meta.reports:
                free, refused = self.aggregator.accept(WorkerReport.decode(data))
                freed.update(free)
                for message in refused:
                    logger.warning("kvtier connector: a worker report was refused: %s", message)
        gone = freed & self._forgotten
        self._forgotten -= gone
        freed -= gone
        vllm_freed = set(output.finished_sending or ()) & (self._delayed | freed)
        if freed != vllm_freed:
            self.counters["report_disagreements"] += 1
            logger.error(
                "kvtier connector: vLLM freed %s and kvtier's aggregation %s",
                sorted(vllm_freed),
                sorted(freed),
            )
        self._delayed -= freed | vllm_freed

    def has_delayed(self) -> bool:
        return bool(self._delayed)

    def stats(self) -> dict[str, int]:
        stats = dict(self.counters)
        stats.update({f"saves_{k}": v for k, v in self.saves.stats().items()})
        stats["waiting_reports"] = self.aggregator.waiting
        stats["live_requests"] = len(self._reqs)
        return stats

    def report_figures(self) -> Any:
        """kvtier's lookup figures for vLLM's /metrics (see
        ``kvtier.vllm.metrics``)."""
        lookups, seconds = lookup_figures(self.lookup)
        return self.figures.report(lookups=lookups, verdict_seconds=seconds)

    def shutdown(self) -> None:
        self.lookup.shutdown()

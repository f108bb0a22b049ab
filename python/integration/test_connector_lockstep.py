"""The connector's scheduler/worker protocol in lockstep with kvtier's save
reference model.

Random schedules (seeded) drive the connector's two sides as vLLM would,
with one to three workers: requests arrive, are scheduled in chunks and
decode, are preempted and resumed, finish (announced through
``request_finished``, or not: the seed's wrapper bug), and each worker's
dumps end at random moments (scripted tasks: a dump ends when the schedule
says so, or when a fence waits for it). vLLM's side of the aggregation is
modelled as vLLM does it (a request leaves ``finished_sending`` once every
worker reported it).

Two kinds of checks:

- call by call: every save-core call the connector makes
  (``SaveScheduler``, each worker's ``SaveTracker``, ``ReportAggregator``)
  is recorded with its result, and ``models/examples/connector_replay.rs``
  replays the trace against ``kvtier_models::save_reference``: each result
  must be the reference's;
- the protocol's promises, at the vLLM level: a request is freed only once
  no dump of it runs on any worker, exactly once, and only if its free was
  delayed; a fence leaves no dump of a preempted request running; a finish
  vLLM did not announce is never reported; at the end everything delayed
  was freed.
"""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest

from kvtier import ReportAggregator, SaveScheduler, SaveTracker, WorkerReport
from kvtier.vllm._conn_common import ConnectorSettings, StorageWorkerMetadata
from kvtier.vllm._conn_scheduler import SchedulerSide
from kvtier.vllm._conn_worker import WorkerSide

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 16


def _names(ids: Any) -> str:
    ids = list(ids)
    return ",".join(ids) if ids else "-"


class _Trace:
    def __init__(self, workers: int) -> None:
        self.lines = [f"workers {workers}"]

    def add(self, line: str) -> None:
        self.lines.append(line)


class _Scheduler:
    """``SaveScheduler``, each call recorded."""

    def __init__(self, inner: SaveScheduler, trace: _Trace) -> None:
        self.inner, self.trace = inner, trace

    def record_step(self, saves: Any) -> Any:
        saves = list(saves)
        step = self.inner.record_step(saves)
        listed = ",".join(f"{r}:{n}" for r, n in saves) or "-"
        self.trace.add(
            f"sched_record {listed} => {step.step} {_names(step.requests)} {_names(step.preempted)} "
            f"{_names(step.finished)}"
        )
        return step

    def preempt(self, requests: Any) -> None:
        requests = list(requests)
        self.inner.preempt(requests)
        self.trace.add(f"sched_preempt {_names(requests)}")

    def request_finished(self, request: str) -> bool:
        delay = self.inner.request_finished(request)
        self.trace.add(f"sched_finished {request} => {int(delay)}")
        return delay

    def is_delayed(self, request: str) -> bool:
        delayed = self.inner.is_delayed(request)
        self.trace.add(f"sched_delayed {request} => {int(delayed)}")
        return delayed

    def stats(self) -> dict:
        return self.inner.stats()


class _Aggregator:
    """``ReportAggregator``, each call recorded."""

    def __init__(self, inner: ReportAggregator, trace: _Trace) -> None:
        self.inner, self.trace = inner, trace

    def expect(self, request: str) -> bool:
        fresh = self.inner.expect(request)
        self.trace.add(f"agg_expect {request} => {int(fresh)}")
        return fresh

    def accept(self, report: WorkerReport) -> Any:
        free, refused = self.inner.accept(report)
        self.trace.add(
            f"agg_accept {report.worker} {report.step} {_names(report.finished)} => {_names(free)} {len(refused)}"
        )
        return free, refused

    @property
    def waiting(self) -> int:
        return self.inner.waiting


class _Dump:
    """A scripted dump: done when the schedule ends its I/O, or when a
    fence waits for it (the wait is recorded)."""

    def __init__(self, world: "_World", worker: int, request: str) -> None:
        self.world, self.worker, self.request = world, worker, request
        self.task: Optional[int] = None
        self.io_done = False

    def done(self) -> bool:
        return self.io_done

    def wait(self) -> None:
        if not self.io_done:
            self.world.waited[self.worker].append(self.task)
            self.io_done = True


class _Engine:
    """The worker's data path, scripted."""

    closed = False
    max_dump_blocks = 1 << 20
    stats: dict = {}

    def __init__(self, world: "_World", worker: int) -> None:
        self.world, self.worker = world, worker

    def dump(self, keys: list, blocks: list) -> _Dump:
        dump = _Dump(self.world, self.worker, self.world.submitting)
        self.world.dumps[self.worker].append(dump)
        return dump

    def pump(self) -> None:
        pass

    def in_flight(self) -> int:
        return sum(not d.io_done for d in self.world.dumps[self.worker])

    def take_changes(self) -> list:
        return []  # no files in the scripted data path


class _Tracker:
    """A worker's ``SaveTracker``, each call recorded."""

    def __init__(self, inner: SaveTracker, world: "_World", worker: int) -> None:
        self.inner, self.world, self.worker = inner, world, worker

    def begin_step(self, step: Any) -> None:
        self.world.waited[self.worker] = []
        self.inner.begin_step(step)
        waited = sorted(self.world.waited[self.worker])
        self.world.trace.add(f"w_begin {self.worker} {step.step} => {_names(map(str, waited))}")

    def submit(self, task: _Dump, requests: list) -> int:
        task.task = self.inner.submit(task, requests)
        self.world.trace.add(f"w_submit {self.worker} {_names(requests)} => {task.task}")
        return task.task

    def submit_failed(self, requests: list, error: str) -> None:
        self.inner.submit_failed(requests, error)
        self.world.trace.add(f"w_submit_failed {self.worker} {_names(requests)}")

    def poll(self) -> int:
        reaped = self.inner.poll()
        self.world.trace.add(f"w_poll {self.worker} => {reaped}")
        return reaped

    def finish_step(self, rank: int, step: Any) -> WorkerReport:
        report = self.inner.finish_step(rank, step)
        self.world.trace.add(f"w_finish {self.worker} {step.step} => {_names(report.finished)}")
        return report

    def stats(self) -> dict:
        return self.inner.stats()


class _Request:
    """What the connector reads of vLLM's ``Request``."""

    def __init__(self, rid: str, prompt: int, rng: random.Random) -> None:
        self.request_id = rid
        self.num_prompt_tokens = prompt
        self.generated = 0
        self._hashes = [rng.randbytes(32) for _ in range(prompt // BLOCK + 8)]
        self.computed = 0
        self.blocks: list[int] = []
        self.resumed = False

    @property
    def block_hashes(self) -> list[bytes]:
        return self._hashes[: (self.num_prompt_tokens + self.generated) // BLOCK]


class _World:
    def __init__(self, seed: int, workers: int, root: Path) -> None:
        self.rng = random.Random(seed)
        self.trace = _Trace(workers)
        settings = ConnectorSettings(
            base_path=str(root / "base"),
            agnostic=True,
            block_size=BLOCK,
            staging_bytes=1 << 20,
            copy_threads=1,
            io_threads=1,
            lookup_concurrency=1,
            lookup_timeout=1.0,
            shutdown_grace=0.0,
            stale_temp_age=None,
            blocking_save=False,
            world_size=workers,
        )
        self.scheduler = SchedulerSide(settings, workers)
        self.scheduler.saves = _Scheduler(self.scheduler.saves, self.trace)  # type: ignore[assignment]
        self.scheduler.aggregator = _Aggregator(self.scheduler.aggregator, self.trace)  # type: ignore[assignment]
        self.dumps: list[list[_Dump]] = [[] for _ in range(workers)]
        self.waited: list[list[int]] = [[] for _ in range(workers)]
        self.submitting = ""
        self.workers = []
        for w in range(workers):
            side = WorkerSide(settings, w)
            side.tracker = _Tracker(side.tracker, self, w)  # type: ignore[assignment]
            side.engine = _Engine(self, w)  # type: ignore[assignment]
            self.workers.append(side)
        self.running: dict[str, _Request] = {}
        self.waiting: list[_Request] = []
        self.preempted: list[_Request] = []
        self.resuming: list[_Request] = []
        self.finished_now: set[str] = set()
        self.preempted_now: set[str] = set()
        self.delayed: set[str] = set()
        self.unannounced: set[str] = set()
        self.freed: list[str] = []
        self.vllm_counts: dict[str, int] = {}
        self.next_id = 0
        self.next_block = 0

    def end_io(self) -> None:
        for w, dumps in enumerate(self.dumps):
            for dump in dumps:
                if not dump.io_done and self.rng.random() < 0.35:
                    dump.io_done = True
                    self.trace.add(f"w_io_end {w} {dump.task}")

    def events(self) -> None:
        rng = self.rng
        if rng.random() < 0.5 and len(self.running) + len(self.waiting) < 8:
            self.next_id += 1
            request = _Request(f"r{self.next_id}", rng.randrange(BLOCK, 8 * BLOCK), rng)
            self.scheduler.on_new_request(request)  # type: ignore[arg-type]
            self.waiting.append(request)
        for rid, request in list(self.running.items()):
            roll = rng.random()
            if request.computed >= request.num_prompt_tokens and roll < 0.15:
                del self.running[rid]
                self.finished_now.add(rid)
                if rng.random() < 0.1:
                    # The seed's bug: vLLM frees it without asking.
                    self.unannounced.add(rid)
                elif self.scheduler.request_finished(request)[0]:  # type: ignore[arg-type]
                    self.delayed.add(rid)
            elif roll < 0.22:
                del self.running[rid]
                self.preempted_now.add(rid)
                request.computed, request.blocks, request.resumed = 0, [], True
                # Resumed from the next step on, never in the step that preempts it.
                self.resuming.append(request)

    def schedule(self) -> Any:
        new, cached, tokens = [], SimpleNamespace(
            req_ids=[], resumed_req_ids=set(), new_block_ids=[], num_computed_tokens=[]
        ), {}
        for request in self.waiting + self.preempted:
            self.running[request.request_id] = request
        admitted, self.waiting = self.waiting, []
        resumed, self.preempted = self.preempted, []
        for request in self.running.values():
            remaining = request.num_prompt_tokens - request.computed
            count = min(remaining, self.rng.choice((BLOCK, 2 * BLOCK, 3 * BLOCK + 5))) if remaining > 0 else 1
            blocks_needed = (request.computed + count + BLOCK - 1) // BLOCK - len(request.blocks)
            fresh = list(range(self.next_block, self.next_block + max(0, blocks_needed)))
            self.next_block += len(fresh)
            request.blocks += fresh
            tokens[request.request_id] = count
            if request in admitted:
                new.append(SimpleNamespace(req_id=request.request_id, block_ids=(list(request.blocks),),
                                           num_computed_tokens=request.computed))
            else:
                cached.req_ids.append(request.request_id)
                if request in resumed:
                    cached.resumed_req_ids.add(request.request_id)
                    cached.new_block_ids.append((list(request.blocks),))
                else:
                    cached.new_block_ids.append((fresh,) if fresh else None)
                cached.num_computed_tokens.append(request.computed)
        output = SimpleNamespace(
            scheduled_new_reqs=new,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=tokens,
            finished_req_ids=set(self.finished_now),
            preempted_req_ids=set(self.preempted_now) or None,
        )
        self.finished_now, self.preempted_now = set(), set()
        self.preempted, self.resuming = self.resuming, []
        for rid, count in tokens.items():
            request = self.running[rid]
            request.computed += count
            if request.computed > request.num_prompt_tokens:
                request.generated += 1
        return output

    def step(self) -> None:
        self.events()
        self.end_io()
        so = self.schedule()
        meta = self.scheduler.build_connector_meta(so)  # type: ignore[arg-type]
        preempted = set(so.preempted_req_ids or ()) | set(meta.forget)
        metas = []
        for w, side in enumerate(self.workers):
            side.handle_preemptions(meta)
            # The fence: no dump of a preempted request runs on this worker.
            running = [d for d in self.dumps[w] if d.request in preempted and not d.io_done]
            assert not running, f"dumps of preempted requests still run after the fence: {running}"
            side.bind(meta)
            self._wait_for_save(side, meta)
            if self.rng.random() < 0.5:
                self.end_io()
            finished = side.get_finished()
            for rid in finished:
                assert rid not in self.unannounced, f"{rid}, never announced, was reported"
                self.vllm_counts[rid] = self.vllm_counts.get(rid, 0) + 1
            metas.append(side.worker_meta())
            side.clear()
        freed = {rid for rid, n in self.vllm_counts.items() if n == len(self.workers)}
        for rid in freed:
            del self.vllm_counts[rid]
            assert rid in self.delayed, f"{rid} freed without a delayed free"
            assert rid not in self.freed, f"{rid} freed twice"
            running = [d for dumps in self.dumps for d in dumps if d.request == rid and not d.io_done]
            assert not running, f"{rid} freed while its dumps run: {running}"
            self.freed.append(rid)
        merged = StorageWorkerMetadata()
        for m in metas:
            if m is not None:
                merged = merged.aggregate(m)  # type: ignore[assignment]
        self.scheduler.update_connector_output(
            SimpleNamespace(kv_connector_worker_meta=merged, finished_sending=freed)  # type: ignore[arg-type]
        )

    def _wait_for_save(self, side: WorkerSide, meta: Any) -> None:
        # Each save's dump is made for its request: the scripted engine
        # learns the request from the submission order.
        saves = list(meta.saves)
        engine = side.engine

        original = engine.dump  # type: ignore[union-attr]
        order = iter(rid for rid, _keys, _blocks in saves)

        def dump(keys: list, blocks: list) -> _Dump:
            self.submitting = next(order)
            return original(keys, blocks)

        engine.dump = dump  # type: ignore[union-attr,method-assign]
        try:
            side.wait_for_save()
        finally:
            engine.dump = original  # type: ignore[union-attr,method-assign]

    def drain(self) -> None:
        for request in list(self.running.values()):
            request.computed = max(request.computed, request.num_prompt_tokens)
        for _ in range(200):
            for w, dumps in enumerate(self.dumps):
                for dump in dumps:
                    if not dump.io_done:
                        dump.io_done = True
                        self.trace.add(f"w_io_end {w} {dump.task}")
            for rid, request in list(self.running.items()):
                del self.running[rid]
                self.finished_now.add(rid)
                if self.scheduler.request_finished(request)[0]:  # type: ignore[arg-type]
                    self.delayed.add(rid)
            self.waiting, self.preempted, self.resuming = [], [], []
            self.step()
            if set(self.freed) == self.delayed and not self.vllm_counts:
                break
        assert set(self.freed) == self.delayed, f"never freed: {sorted(self.delayed - set(self.freed))}"
        for w, side in enumerate(self.workers):
            stats = side.tracker.stats()
            counters = ",".join(f"{k}={v}" for k, v in sorted(stats.items()))
            self.trace.add(f"w_stats {w} {counters}")


def _replayer() -> str:
    binary = os.environ.get("KVTIER_CONNECTOR_REPLAY") or str(ROOT / "target" / "debug" / "examples" / "connector_replay")
    if not os.path.exists(binary):
        subprocess.run(
            ["cargo", "build", "-q", "-p", "kvtier-models", "--example", "connector_replay"], cwd=ROOT, check=True
        )
    return binary


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_the_connector_agrees_with_the_save_reference_model(tmp_path: Path, workers: int) -> None:
    replay = _replayer()
    calls = 0
    for seed in range(40):
        world = _World(seed * 10 + workers, workers, tmp_path / f"s{seed}")
        for _ in range(30):
            world.step()
        world.drain()
        assert world.freed, "a schedule that freed nothing checks nothing"
        path = tmp_path / f"trace-{workers}-{seed}.txt"
        path.write_text("\n".join(world.trace.lines) + "\n")
        done = subprocess.run([replay, str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr + done.stdout
        calls += len(world.trace.lines)
        world.scheduler.shutdown()
    assert calls > 1000

"""kvtier's fs tier against vLLM's, inside vLLM's TieringOffloadingManager.

Both tiers serve the same directory of stored blocks (vLLM's layout, raw
files) to the same workload, alternately, in one process:

- **time to verdict**: from a key's first ``manager.lookup`` (the secondary
  tier answers RETRY) to the one that starts its promotion (the tier
  answered HIT), p50/p99 over every key;
- **load completion**: from that promotion to the first lookup answering
  HIT (the block is in the primary tier), p50/p99;

each with the scheduler thread idle between steps (it sleeps) and busy
(it runs Python between steps, as a scheduler that builds batches does),
and

- **scheduler-thread cost per ``tier.lookup`` call** (vLLM calls it once
  per key) on resolved keys, beside two baselines measured in the same run:
  a Python method that returns at once and a bound ``dict.get``.

Figures are medians over ``--runs`` alternating runs; the ratios
(kvtier ÷ vLLM) are taken within each run, then their median. Nothing is
asserted: the figures go to docs/performance.md.

    python python/integration/bench_vllm.py [--runs 5] [--requests 64] [--keys 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from vllm.v1.kv_offload.base import LookupResult  # noqa: E402
from vllm.v1.kv_offload.file_mapper import FileMapper  # noqa: E402
from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager  # noqa: E402
from vllm.v1.kv_offload.tiering.manager import (  # noqa: E402
    CPUPrimaryTierOffloadingManager,
    TieringOffloadingManager,
)

from kvtier.vllm import FsTier  # noqa: E402
from vllm_support import STEP_END, Region, context, key, offloading_spec, primary_memory  # noqa: E402

TIERS = {"vllm": FileSystemTierManager, "kvtier": FsTier}


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def store_blocks(root, spec, keys, block_bytes):
    """The directory both tiers serve: one raw block file per key, where
    vLLM's fs tier stores it."""
    mapper = FileMapper.from_offloading_spec(root, spec, blocks_per_file=1, parallel_agnostic=True)
    rng = np.random.default_rng(1)
    for k in keys:
        path = mapper.get_file_name(k)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(rng.integers(0, 256, block_bytes, dtype=np.uint8).tobytes())


def spin(seconds):
    """Python work on the scheduler thread, never blocking."""
    until = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < until:
        n += 1
    return n


def workload(name, root, spec, args, busy):
    """One tier under a tier manager: requests arrive, each step looks up
    every waiting request's keys; per key, when the tier answered and when
    its block was loaded."""
    total = args.requests * args.keys
    memory = primary_memory(total, args.block_kib * 1024)
    primary = CPUPrimaryTierOffloadingManager(num_chunks=total, mmap_region=Region(memory))
    tier = TIERS[name](spec, memoryview(memory), name, root, args.threads, args.threads)
    manager = TieringOffloadingManager(primary_tier=primary, secondary_tiers=[tier])
    requests = [
        (context(f"{name}-{r}"), [key(r * args.keys + i) for i in range(args.keys)])
        for r in range(args.requests)
    ]
    asked, answered, loaded = {}, {}, {}
    waiting, arrived, step = [], 0, 0
    deadline = time.monotonic() + args.timeout
    while (arrived < len(requests) or waiting) and time.monotonic() < deadline:
        for _ in range(args.arrivals):
            if arrived < len(requests):
                ctx, keys = requests[arrived]
                manager.on_new_request(ctx)
                waiting.append((ctx, keys))
                arrived += 1
        still = []
        for ctx, keys in waiting:
            done = True
            for k in keys:
                result = manager.lookup(k, ctx)
                now = time.perf_counter()
                asked.setdefault(k, now)
                if result is LookupResult.HIT_PENDING:
                    answered.setdefault(k, now)
                    done = False
                elif result is LookupResult.HIT:
                    answered.setdefault(k, now)
                    loaded.setdefault(k, now)
                else:
                    done = False
            if done:
                manager.on_request_finished(ctx)
            else:
                still.append((ctx, keys))
        waiting = still
        manager.on_schedule_end(STEP_END)
        step += 1
        if busy:
            spin(args.step_ms / 1000)
        else:
            time.sleep(args.step_ms / 1000)
    tier.shutdown()
    missing = total - len(loaded)
    if missing:
        raise RuntimeError(f"{name}: {missing} of {total} keys were never loaded")
    verdict = [answered[k] - asked[k] for k in asked]
    load = [loaded[k] - answered[k] for k in asked]
    return {
        "verdict_p50_ms": 1e3 * percentile(verdict, 0.5),
        "verdict_p99_ms": 1e3 * percentile(verdict, 0.99),
        "load_p50_ms": 1e3 * percentile(load, 0.5),
        "load_p99_ms": 1e3 * percentile(load, 0.99),
        "steps": step,
    }


class _NoOp:
    def lookup(self, key, req_context):
        return None


class _DictGet:
    def __init__(self, keys):
        self.lookup = dict.fromkeys(keys, LookupResult.HIT).get


def per_call_ns(lookup, keys, ctx, reps):
    """Scheduler-thread time per ``lookup(key, ctx)`` call, loop included:
    the median of seven passes."""
    passes = []
    for _ in range(7):
        started = time.perf_counter_ns()
        for _ in range(reps):
            for k in keys:
                lookup(k, ctx)
        passes.append((time.perf_counter_ns() - started) / (reps * len(keys)))
    return statistics.median(passes)


def call_cost(name, root, spec, args):
    """``tier.lookup`` on resolved keys (hits), as vLLM calls it."""
    memory = primary_memory(4, args.block_kib * 1024)
    tier = TIERS[name](spec, memoryview(memory), name, root, 1, 1)
    keys = [key(i) for i in range(256)]
    ctx = context(f"{name}-calls")
    deadline = time.monotonic() + args.timeout
    while LookupResult.RETRY in [tier.lookup(k, ctx) for k in keys] and time.monotonic() < deadline:
        tier.on_schedule_end(STEP_END)
        time.sleep(0.002)
    cost = per_call_ns(tier.lookup, keys, ctx, args.call_reps)
    tier.shutdown()
    return cost


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--keys", type=int, default=4, help="keys per request")
    parser.add_argument("--arrivals", type=int, default=4, help="requests arriving per step")
    parser.add_argument("--step-ms", type=float, default=2.0, help="time between steps (slept, or spun when busy)")
    parser.add_argument("--block-kib", type=int, default=256)
    parser.add_argument("--threads", type=int, default=4, help="each tier's read and write threads")
    parser.add_argument("--call-reps", type=int, default=400)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    spec = offloading_spec()
    root = tempfile.mkdtemp(prefix="kvtier-bench-vllm-")
    try:
        runs = measure(root, spec, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report(runs, args)


def measure(root, spec, args):
    store_blocks(root, spec, [key(i) for i in range(max(args.requests * args.keys, 256))], args.block_kib * 1024)

    runs = []
    for run in range(args.runs):
        figures = {}
        order = ["vllm", "kvtier"] if run % 2 == 0 else ["kvtier", "vllm"]
        for mode in ("idle", "busy"):
            for name in order:
                figures[(name, mode)] = workload(name, root, spec, args, busy=mode == "busy")
        for name in order:
            figures[(name, "call_ns")] = call_cost(name, root, spec, args)
        keys = [key(i) for i in range(256)]
        figures[("noop", "call_ns")] = per_call_ns(_NoOp().lookup, keys, None, args.call_reps)
        figures[("dict.get", "call_ns")] = per_call_ns(_DictGet(keys).lookup, keys, None, args.call_reps)
        runs.append(figures)
        print(f"run {run + 1}/{args.runs} done", file=sys.stderr)
    return runs


def report(runs, args):
    def value(run, name, mode, field):
        figure = run[(name, mode)]
        return figure if field is None else figure[field]

    def median(name, mode, field=None):
        return statistics.median(value(r, name, mode, field) for r in runs)

    def ratio(mode, field=None):
        return statistics.median(value(r, "kvtier", mode, field) / value(r, "vllm", mode, field) for r in runs)

    rows = []
    for mode in ("idle", "busy"):
        for field, label in [
            ("verdict_p50_ms", "time to verdict p50 (ms)"),
            ("verdict_p99_ms", "time to verdict p99 (ms)"),
            ("load_p50_ms", "load completion p50 (ms)"),
            ("load_p99_ms", "load completion p99 (ms)"),
        ]:
            rows.append((f"{label}, scheduler {mode}", median("vllm", mode, field), median("kvtier", mode, field),
                         ratio(mode, field)))
    rows.append(("tier.lookup per call (ns)", median("vllm", "call_ns"), median("kvtier", "call_ns"),
                 ratio("call_ns")))
    baselines = {name: median(name, "call_ns") for name in ("noop", "dict.get")}
    if args.json:
        print(json.dumps({"rows": rows, "baselines": baselines, "args": vars(args)}, indent=2))
        return
    print(f"{args.runs} runs; {args.requests} requests x {args.keys} keys, {args.arrivals} arriving per step, "
          f"{args.step_ms} ms steps, {args.block_kib} KiB blocks, {args.threads} threads per lane")
    print(f"{'figure':48} {'vLLM fs':>10} {'kvtier':>10} {'kvtier/vLLM':>12}")
    for label, theirs, ours, r in rows:
        print(f"{label:48} {theirs:10.2f} {ours:10.2f} {r:11.2f}x")
    print("baselines in the same runs (ns a call, loop included): "
          + ", ".join(f"{name} {value:.1f}" for name, value in baselines.items()))
    kv = median("kvtier", "call_ns")
    print(f"kvtier's tier.lookup: {kv / baselines['noop']:.2f}x a Python method returning at once, "
          f"{kv / baselines['dict.get']:.2f}x a bound dict.get")


if __name__ == "__main__":
    main()

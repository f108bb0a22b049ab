"""Python-side benchmarks of kvtier's lookup, each a ratio measured in one run.

    python python/bench/bench_lookup.py step   # scheduler-thread cost per key
    python python/bench/bench_lookup.py gil    # time to verdict under Python load
    python python/bench/bench_lookup.py all --json results.json

step: the scheduler step trace of benches/workload (32 live requests of 128
keys, 64 of them a prefix every request shares, each request living 4 steps;
half the keys stored), as a scheduler thread runs it: every request's keys
looked up every step, then flush, then cleanup of the finished requests.
Timed: the scheduler's calls only; between steps the worker is let finish
(untimed), so it never competes for the CPU. Compared: a pure-Python manager
after the reference design (bench/reference_manager.py), kvtier's per-key
`Lookup.lookup`, kvtier's `Lookup.lookup_many` (one call per request), and
the vLLM adapter subclassed with a Python `batch_lookup`.

gil: groups of keys of vLLM's fs layout on a real directory, probed while
the scheduler thread runs Python work. Per group: look its keys up, flush,
then run steps until every key has a verdict: each step works (busy Python
bytecode for the given share of the time, sleeping for the rest), asks for
the keys again and flushes. The time from the first flush to the step that
saw every verdict is the group's time to verdict (so it includes up to one
chunk of work, about 0.1 ms).
Compared: the pure-Python manager whose worker stats each file
(os.path.exists) and kvtier's native prober (`Lookup.vllm_fs`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from reference_manager import ReferenceManager  # noqa: E402

import kvtier  # noqa: E402
from kvtier.vllm import AsyncLookupManager, block_path, make_key  # noqa: E402

MASK = (1 << 64) - 1

# The step trace (benches/workload/mod.rs) ---------------------------------

LIVE, KEYS_PER_REQUEST, SHARED_PREFIX, LIFETIME = 32, 128, 64, 4


def mix(x: int) -> int:
    """SplitMix64's finaliser, as in benches/workload."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def key_number(request: int, index: int) -> int:
    if index < SHARED_PREFIX:
        return mix(index)
    return mix(((request + 1) << 16) | index)


def key_bytes(number: int) -> bytes:
    """A 36-byte vLLM key: a 32-byte hash and group 0."""
    return make_key(number.to_bytes(8, "big") * 4, 0)


def present(number: int) -> bool:
    return mix(number ^ 0x5EED) & 1 == 0


def trace(steps: int):
    """[(requests: [(req_id, keys)], finished: [req_id])] for `steps` steps,
    and the set of stored keys."""
    live = [(r, r % LIFETIME) for r in range(LIVE)]
    next_request = LIVE
    stored = set()
    out = []
    for _ in range(steps):
        requests = []
        for request, _age in live:
            numbers = [key_number(request, i) for i in range(KEYS_PER_REQUEST)]
            keys = [key_bytes(n) for n in numbers]
            stored.update(k for k, n in zip(keys, numbers) if present(n))
            requests.append((f"req-{request}", keys))
        finished = []
        kept = []
        for request, age in live:
            if age + 1 >= LIFETIME:
                finished.append(f"req-{request}")
                kept.append((next_request, 0))
                next_request += 1
            else:
                kept.append((request, age + 1))
        live = kept
        out.append((requests, finished))
    return out, stored


def run_step_trace(name: str, steps, stored) -> float:
    """ns of scheduler-thread time per lookup of one implementation."""

    def backend(keys, req_id):
        return [key in stored for key in keys]

    if name == "reference":
        manager = ReferenceManager(backend)
        lookup, flush, cleanup, idle = manager.lookup, manager.flush, manager.cleanup, manager.wait_idle
    elif name == "adapter":

        class Tier(AsyncLookupManager):
            def batch_lookup(self, keys, req_context):
                return backend(keys, req_context)

        manager = Tier("bench")
        lookup, flush, cleanup, idle = manager.lookup, manager.flush, manager.cleanup, manager.wait_idle
    else:
        manager = kvtier.Lookup.python(backend)
        lookup, flush, cleanup, idle = manager.lookup, manager.flush, manager.cleanup, manager.wait_idle
    batched = name == "lookup_many"
    lookup_many = getattr(manager, "lookup_many", None)
    elapsed = 0
    count = 0
    clock = time.perf_counter_ns
    for requests, finished in steps:
        start = clock()
        if batched:
            for req_id, keys in requests:
                lookup_many(keys, req_id)
        else:
            for req_id, keys in requests:
                for key in keys:
                    lookup(key, req_id)
        flush()
        for req_id in finished:
            cleanup(req_id)
        elapsed += clock() - start
        count += sum(len(keys) for _, keys in requests)
        idle()  # untimed: the worker answers between steps
    manager.shutdown()
    return elapsed / count


STEP_IMPLS = ["reference", "kvtier lookup", "lookup_many", "adapter"]


def bench_step(steps: int, runs: int) -> dict:
    trace_steps, stored = trace(steps)
    samples = {name: [] for name in STEP_IMPLS}
    for _ in range(runs):
        for name in STEP_IMPLS:  # alternated, so drift hits all alike
            samples[name].append(run_step_trace(name, trace_steps, stored))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    # Ratios within each run (the runs alternate the implementations, so a
    # slow moment of the machine hits a run's figures alike), then their
    # median and range over the runs.
    ratios = {
        name: [ref / own for ref, own in zip(samples["reference"], samples[name])]
        for name in STEP_IMPLS
    }
    print(f"\nstep trace: {steps} steps x {LIVE} requests x {KEYS_PER_REQUEST} keys, median of {runs} runs")
    print(f"{'implementation':<16} {'ns/key':>9} {'range':>17} {'reference / this':>17} {'range':>13}")
    for name in STEP_IMPLS:
        lo, hi = min(samples[name]), max(samples[name])
        r = ratios[name]
        print(
            f"{name:<16} {medians[name]:9.1f} {lo:8.1f}-{hi:<8.1f} {statistics.median(r):16.2f}x"
            f" {min(r):5.2f}-{max(r):<5.2f}"
        )
    return {"ns_per_key": medians, "runs": samples, "ratio_to_reference": ratios}


# GIL contention ---------------------------------------------------------------


def busy(units: int) -> int:
    """Python bytecode, holding the GIL (but for the switch interval)."""
    total = 0
    for i in range(units):
        total += i * i
    return total


def time_to_verdict(manager, keys, req_id, load: float, chunk: int, chunk_s: float, limit: float) -> float:
    for key in keys:
        manager.lookup(key, req_id)
    manager.flush()
    start = time.perf_counter()
    while True:
        if load > 0:
            busy(chunk)
        if load < 1:
            time.sleep(chunk_s * (1 - load) / max(load, 1e-9) if load > 0 else chunk_s)
        # A scheduler step: ask again, then flush (which is also where the
        # reference design drains answers published after the step's first
        # lookup).
        resolved = all(manager.lookup(key, req_id) is not None for key in keys)
        manager.flush()
        if resolved:
            return time.perf_counter() - start
        if time.perf_counter() - start > limit:
            return limit


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_gil(groups: int, keys_per_group: int, loads: list[float]) -> dict:
    with tempfile.TemporaryDirectory() as root:
        rank = os.path.join(root, "bench_0123456789ab_r0")
        all_keys = []
        for g in range(groups):
            keys = [key_bytes(mix((g << 20) | i)) for i in range(keys_per_group)]
            for key in keys[::2]:
                path = block_path(rank, key)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                open(path, "wb").close()
            all_keys.append(keys)
        # A chunk of busy work of about 50 us.
        chunk = 2000
        t = time.perf_counter()
        busy(chunk * 20)
        chunk_s = (time.perf_counter() - t) / 20
        results = {}
        print(f"\ntime to verdict: {groups} groups of {keys_per_group} fs keys, "
              f"work in chunks of {chunk_s * 1e6:.0f} us, switch interval {sys.getswitchinterval() * 1e3:.0f} ms")
        print(f"{'prober':<22} {'load':>5} {'p50 ms':>9} {'p99 ms':>9}")
        for load in loads:
            for name in ("python worker (stat)", "kvtier native"):
                if name == "kvtier native":
                    manager = kvtier.Lookup.vllm_fs(rank, concurrency=4)
                else:
                    manager = ReferenceManager(
                        lambda keys, req_id: [os.path.exists(block_path(rank, k)) for k in keys]
                    )
                times = []
                for g, keys in enumerate(all_keys):
                    req_id = f"g{g}-{load}"
                    times.append(time_to_verdict(manager, keys, req_id, load, chunk, chunk_s, 5.0))
                    manager.cleanup(req_id)
                manager.shutdown()
                p50, p99 = percentile(times, 0.5) * 1e3, percentile(times, 0.99) * 1e3
                results.setdefault(name, {})[str(load)] = {"p50_ms": p50, "p99_ms": p99}
                print(f"{name:<22} {load:5.2f} {p50:9.3f} {p99:9.3f}")
        print("\np50 under load / p50 idle (1.00 = unaffected by the scheduler's Python work):")
        for name, by_load in results.items():
            idle = by_load[str(loads[0])]["p50_ms"]
            ratios = ", ".join(f"load {l}: {by_load[str(l)]['p50_ms'] / idle:.2f}x" for l in loads[1:])
            print(f"  {name}: {ratios}")
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["step", "gil", "all"])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--keys", type=int, default=16)
    parser.add_argument("--loads", default="0,0.5,0.9,1")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    out = {"python": sys.version.split()[0], "kvtier": kvtier.__version__}
    if args.which in ("step", "all"):
        out["step"] = bench_step(args.steps, args.runs)
    if args.which in ("gil", "all"):
        out["gil"] = bench_gil(args.groups, args.keys, [float(l) for l in args.loads.split(",")])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()

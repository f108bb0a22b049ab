"""The scheduler thread's cost of a lookup per key, inside vLLM: kvtier's
``ObjectTier`` (on SeaweedFS, ``seaweed.py``) against kvtier's ``FsTier``
and vLLM's own fs tier, in one run, alternated, medians of the series
(docs/performance.md §15), as the scheduler thread's own CPU time
(``time.thread_time_ns``: the store answering on the same machine does not
count). The call timed is what vLLM's tier manager
makes per key and step: ``tier.lookup(key, req_context)`` on keys whose
verdicts are in (a prompt of 18 blocks), then the first call on fresh keys
(which submits their group) with its ``on_schedule_end``.

    python bench_objects.py [--series 5] [--calls 20000]

Run with vLLM's venv's Python (``vllm.sh`` makes it)."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from kvtier.vllm import FsTier, ObjectTier
from vllm.v1.kv_offload.base import LookupResult
from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

from seaweed import ACCESS_KEY, SECRET_KEY, Seaweed
from vllm_support import STEP_END, context, key, offloading_spec, primary_memory

BUCKET = "kvtier-bench"


def resolve(tier, keys, ctx) -> None:
    deadline = time.monotonic() + 30
    while LookupResult.RETRY in [tier.lookup(k, ctx) for k in keys]:
        tier.on_schedule_end(STEP_END)
        if time.monotonic() > deadline:
            raise RuntimeError("lookups did not resolve")
        time.sleep(0.001)


def resolved_ns(tier, calls: int) -> float:
    keys, ctx = [key(n) for n in range(18)], context("bench")
    resolve(tier, keys, ctx)
    lookup = tier.lookup
    rounds = max(1, calls // len(keys))
    started = time.thread_time_ns()
    for _ in range(rounds):
        for k in keys:
            lookup(k, ctx)
    return (time.thread_time_ns() - started) / (rounds * len(keys))


def fresh_ns(tier, groups: int, base: int) -> float:
    """The first call on each key of a fresh 18-key group, and the step's
    end that submits the group: what a new request costs the scheduler."""
    total = 0
    for g in range(groups):
        keys, ctx = [key(base + g * 18 + n) for n in range(18)], context(f"fresh-{base}-{g}")
        started = time.thread_time_ns()
        for k in keys:
            tier.lookup(k, ctx)
        tier.on_schedule_end(STEP_END)
        total += time.thread_time_ns() - started
        tier.on_request_finished(ctx)
    return total / (groups * 18)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--series", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    spec = offloading_spec()
    memory = primary_memory(8, 64 * 1024)
    with Seaweed(buckets=[BUCKET]) as server, tempfile.TemporaryDirectory() as root:
        store = {
            "bucket": BUCKET,
            "endpoint_override": server.endpoint.removeprefix("http://"),
            "access_key": ACCESS_KEY,
            "secret_key": SECRET_KEY,
        }
        tiers = {
            "ObjectTier": ObjectTier(spec, memoryview(memory), "obj", store_config=store, prefix="bench",
                                     n_read_threads=1, n_write_threads=1),
            "FsTier": FsTier(spec, memoryview(memory), "fs", root_dir=root, n_read_threads=1, n_write_threads=1),
            "vLLM fs": FileSystemTierManager(spec, memoryview(memory), "vllm", root + "/vllm", 1, 1),
        }
        resolved: dict[str, list[float]] = {name: [] for name in tiers}
        fresh: dict[str, list[float]] = {name: [] for name in tiers}
        try:
            for series in range(args.series):
                for name, tier in tiers.items():
                    resolved[name].append(resolved_ns(tier, args.calls))
                    fresh[name].append(fresh_ns(tier, 20, 100_000 * (series + 1)))
        finally:
            for tier in tiers.values():
                tier.shutdown()
    base = statistics.median(resolved["FsTier"])
    for name in tiers:
        r, f = statistics.median(resolved[name]), statistics.median(fresh[name])
        print(
            f"{name:10s} resolved key {r:7.0f} ns/call ({r / base:.2f}x FsTier's), "
            f"a fresh group's first calls and step end {f:7.0f} ns/key "
            f"(series: {', '.join(f'{x:.0f}' for x in resolved[name])})"
        )


if __name__ == "__main__":
    main()

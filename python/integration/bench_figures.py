"""What kvtier's /metrics figures cost an engine step, against what vLLM's
own tiering figures cost it, measured in the same run.

vLLM's tier manager calls every secondary tier's ``get_stats()`` once per
engine step, beside its own ``TieringMetricsTracker.take_stats()``. This
times both, with kvtier's tier idle between calls (the gauges are still
read and sent) and with a budget (two native snapshots a report):

    python python/integration/bench_figures.py [--calls 20000] [--runs 5]

Run in vLLM's venv. Prints the median of the runs for each, and the ratio
of kvtier's to vLLM's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from vllm.v1.kv_offload.tiering.metrics import TieringMetricsTracker

from kvtier.vllm import FsTier
from vllm_support import offloading_spec, primary_memory


def per_call(fn, calls: int, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - start) / calls * 1e6)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    memory = primary_memory(8, 64 * 1024)
    tracker = TieringMetricsTracker(["FsTier"], num_primary_chunks=1024, primary_chunk_size=64 * 1024)
    vllm_us = per_call(tracker.take_stats, args.calls, args.runs)
    print(f"vLLM's TieringMetricsTracker.take_stats: median {statistics.median(vllm_us):.2f} us a step")
    for budget in (None, 1 << 30):
        tier = FsTier(
            offloading_spec=offloading_spec(),
            primary_kv_view=memoryview(memory),
            tier_type="FsTier",
            root_dir=tempfile.mkdtemp(),
            n_read_threads=1,
            n_write_threads=1,
            capacity_bytes=budget,
        )
        try:
            ours = per_call(tier.get_stats, args.calls, args.runs)
        finally:
            tier.shutdown()
        median = statistics.median(ours)
        label = "with a budget" if budget else "without a budget"
        print(
            f"kvtier's FsTier.get_stats, {label}: median {median:.2f} us a step "
            f"({statistics.median(vllm_us) and median / statistics.median(vllm_us):.1f}x vLLM's)"
        )


if __name__ == "__main__":
    main()

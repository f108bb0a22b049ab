"""Figures for docs/performance.md §11: kvtier's KV connector in real vLLM
engine processes, as ratios against baselines measured in the same run
(medians of ``--runs``, the configurations alternating):

1. Model steps with dumps in flight: the engine loop's step times and its
   ``generate()`` time with the connector's deferred dumps, against the
   same connector with ``blocking_save`` (``wait_for_save`` waits for the
   step's dumps: vLLM's synchronous reference), on a model whose blocks are
   2 MiB (8 layers, hidden 1024, float32), so a prefill step dumps hundreds
   of MiB. Twice: onto the page cache (this machine's file system), and onto
   a storage that takes ``--dump-delay`` seconds a dump, one dump at a time
   (``slow_tier.SlowStorageConnector``: each dump waits its turn before it
   starts, as on a slow network file system or object store). Every process
   starts on an empty directory.
2. Prefix hits: ``generate()`` of a restarted engine (one output token
   per prompt, so the time to the first tokens) with every prompt block on
   disk, served through the connector, against recomputing them, and
   against vLLM's tiering (``OffloadingConnector``, ``CpuTieringSpec``)
   with kvtier's ``FsTier``.

    python bench_connector.py --work DIR [--runs 3] [--dump-delay 0.25] [--only steps|hits]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
from pathlib import Path

from bench_e2e import engine, make_model  # noqa: E402


def _median_step(out: dict) -> float:
    return statistics.median(out["step_seconds"])


def _p90_step(out: dict) -> float:
    steps = sorted(out["step_seconds"])
    return steps[int(0.9 * (len(steps) - 1))]


def step_figures(work: Path, model: Path, runs: int, delay: float) -> dict:
    rng = random.Random(11)
    prompts = [[rng.randrange(1, 8000) for _ in range(512)] for _ in range(16)]
    base = {
        "model": str(model),
        "prompts": prompts,
        "max_tokens": 32,
        "tier": None,
        "load_format": "dummy",
        "model_len": 2048,
        "max_num_seqs": 16,
        "kv_space_gib": 2,
        "warmup": [rng.randrange(1, 8000) for _ in range(40)],
    }
    figures: dict = {"deferred": [], "blocking": [], "deferred-slow": [], "blocking-slow": []}
    for run in range(runs):
        for mode in figures:
            root = work / f"steps-{mode}"
            shutil.rmtree(root, ignore_errors=True)
            connector = {"mode": "alone", "blocking": mode.startswith("blocking")}
            if mode.endswith("-slow"):
                connector["dump_delay"] = delay
            out = engine(work, f"steps-{mode}-{run}", dict(base, root=str(root), connector=connector))
            figures[mode].append(
                {"seconds": out["seconds"], "median_step": _median_step(out), "p90_step": _p90_step(out),
                 "max_step": max(out["step_seconds"]), "steps": len(out["step_seconds"])}
            )
    summary = {}
    for mode, values in figures.items():
        summary[mode] = {k: statistics.median(v[k] for v in values) for k in values[0]}
    return summary | {"all": figures}


def hit_figures(work: Path, model: Path, runs: int) -> dict:
    rng = random.Random(7)
    prompts = [[rng.randrange(1, 8000) for _ in range(1024)] for _ in range(4)]
    base = {
        "model": str(model),
        "prompts": prompts,
        "max_tokens": 1,
        "load_format": "dummy",
        "model_len": 2048,
        "cpu_bytes": 2 << 30,
        "max_num_seqs": 64,
        "warmup": [rng.randrange(1, 8000) for _ in range(40)],
    }
    configs = {
        "connector": dict(base, tier=None, connector={"mode": "alone"}),
        "tiering": dict(base, tier="kvtier"),
    }
    seconds: dict = {"recompute": [], "connector": [], "tiering": []}
    for run in range(runs):
        for name, settings in configs.items():
            root = work / f"hits-{name}"
            if run == 0:
                shutil.rmtree(root, ignore_errors=True)
                engine(work, f"hits-{name}-fill", dict(settings, root=str(root)))
            out = engine(work, f"hits-{name}-{run}", dict(settings, root=str(root)))
            loaded = out["metrics"].get("vllm:prompt_tokens_by_source{source=external_kv_transfer}", 0)
            assert loaded > 0, f"hits {name}: nothing loaded: {out['metrics']}"
            seconds[name].append(out["seconds"])
        out = engine(work, f"hits-recompute-{run}", dict(base, tier=None, root=""))
        seconds["recompute"].append(out["seconds"])
    return {name: statistics.median(values) for name, values in seconds.items()} | {"all": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dump-delay", type=float, default=0.25)
    parser.add_argument("--only", choices=("steps", "hits"))
    args = parser.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    make_model(model)
    report = {}
    if args.only in (None, "steps"):
        report["steps"] = step_figures(work, model, args.runs, args.dump_delay)
    if args.only in (None, "hits"):
        report["hits"] = hit_figures(work, model, args.runs)
    (work / f"report-connector-{args.only or 'all'}.json").write_text(json.dumps(report, indent=1))
    for suffix in ("", "-slow"):
        if "steps" not in report:
            break
        d, b = report["steps"][f"deferred{suffix}"], report["steps"][f"blocking{suffix}"]
        print(
            f"steps{suffix or ' (page cache)'}: generate() deferred {d['seconds']:.2f} s, blocking "
            f"{b['seconds']:.2f} s (deferred/blocking {d['seconds'] / b['seconds']:.2f}); median step "
            f"{d['median_step'] * 1e3:.1f} ms vs {b['median_step'] * 1e3:.1f} ms, p90 {d['p90_step'] * 1e3:.1f} "
            f"vs {b['p90_step'] * 1e3:.1f} ms, max {d['max_step'] * 1e3:.0f} vs {b['max_step'] * 1e3:.0f} ms"
        )
    if "hits" in report:
        h = report["hits"]
        print(
            f"hits: generate() recompute {h['recompute']:.2f} s, connector {h['connector']:.2f} s "
            f"({h['recompute'] / h['connector']:.1f}x faster), tiering with kvtier's FsTier {h['tiering']:.2f} s "
            f"(connector/tiering {h['connector'] / h['tiering']:.2f})"
        )


if __name__ == "__main__":
    main()

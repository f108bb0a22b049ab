"""Figures for docs/performance.md §10: kvtier in real vLLM engine processes.

All in one run, on one machine, as ratios against baselines measured in the
same run (medians of ``--runs``):

1. Process 2's ``generate()`` with every prompt block on the tier, against
   recomputing them (no offloading) and against vLLM's fs tier, on a model
   where recomputing costs something (8 layers, hidden 1024, float32,
   dummy weights: the numbers do not depend on the weights), with a few
   long prompts and with many concurrent requests. Each figure is a fresh
   engine process on a directory the first process filled; each process
   first runs a short warmup prompt of its own.
2. Load bandwidth of kvtier's native loads (``VllmTransfers``, 16 threads,
   as the tier runs them) from the stored block files into memory, against a
   raw read loop over the same files with the same threads (the limit),
   page cache warm for both.

    python bench_e2e.py --work DIR [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
LAYERS, HIDDEN, HEADS = 8, 1024, 16


def make_model(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 8192,
        "hidden_size": HIDDEN,
        "intermediate_size": 4 * HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": HIDDEN // HEADS,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "float32",
    }
    (directory / "config.json").write_text(json.dumps(config))


def engine(work: Path, name: str, settings: dict) -> dict:
    run_dir = work / "runs" / name
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "settings.json").write_text(json.dumps(settings))
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(HERE))
    with open(run_dir / "engine.log", "w") as log:
        subprocess.run(
            [sys.executable, str(HERE / "engine.py"), str(run_dir / "settings.json"), str(run_dir / "out.json")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            check=True,
            timeout=1800,
        )
    return json.loads((run_dir / "out.json").read_text())


def generate_figures(work: Path, model: Path, label: str, prompts: list, runs: int) -> dict:
    """Median generate() seconds of process 2 for each tier, and recompute."""
    rng = random.Random(99)
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
    seconds: dict = {"recompute": [], "kvtier": [], "vllm": []}
    for run in range(runs):
        for tier in ("kvtier", "vllm"):
            root = work / f"{label}-{tier}"
            if run == 0:
                shutil.rmtree(root, ignore_errors=True)
                engine(work, f"{label}-{tier}-fill", dict(base, tier=tier, root=str(root)))
            out = engine(work, f"{label}-{tier}-{run}", dict(base, tier=tier, root=str(root)))
            # The warmup prompt's last, partial block is all a process 2
            # computes: every prompt block comes from the tier.
            computed = out["metrics"].get("vllm:prompt_tokens_by_source{source=local_compute}")
            assert computed == len(base["warmup"]) % 32, f"{label} {tier}: {computed} prompt tokens computed"
            seconds[tier].append(out["seconds"])
        out = engine(work, f"{label}-recompute-{run}", dict(base, tier=None, root=""))
        seconds["recompute"].append(out["seconds"])
    return {name: statistics.median(values) for name, values in seconds.items()} | {"all": seconds}


def bandwidth(root: Path, runs: int) -> dict:
    """kvtier's native loads against a raw read loop, same files, same
    threads, warm page cache."""
    import numpy as np

    from kvtier._native import VllmTransfers
    from kvtier.vllm import make_key

    [rank] = [p for p in root.iterdir() if p.name.endswith("_r0")]
    files = sorted(rank.rglob("*.bin"))
    size = files[0].stat().st_size
    keys = [make_key(bytes.fromhex(p.stem), int(p.parent.name.split("_g")[1])) for p in files]
    memory = np.zeros((len(files), size), dtype=np.uint8)
    threads = 16

    def kvtier_load() -> float:
        transfers = VllmTransfers(rank, memoryview(memory), load_threads=threads, store_threads=0)
        started = time.perf_counter()
        # One job a block, as a promotion's chunks arrive one a job.
        for i, key in enumerate(keys):
            transfers.submit_load(i, [key], [i])
        transfers.drain()
        took = time.perf_counter() - started
        assert all(ok for _, _, ok, *_ in transfers.finished())
        transfers.shutdown()
        return took

    def raw_read() -> float:
        def read(i: int) -> None:
            with open(files[i], "rb", buffering=0) as f:
                assert f.readinto(memoryview(memory[i])) == size

        started = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(read, range(len(files))))
        return time.perf_counter() - started

    raw_read()  # warm the page cache
    times: dict = {"kvtier": [], "raw": []}
    for _ in range(max(runs, 5)):
        times["raw"].append(raw_read())
        times["kvtier"].append(kvtier_load())
    total = len(files) * size
    return {
        "files": len(files),
        "bytes": total,
        "raw_gib_s": total / statistics.median(times["raw"]) / 2**30,
        "kvtier_gib_s": total / statistics.median(times["kvtier"]) / 2**30,
        "all": times,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    make_model(model)
    rng = random.Random(7)
    long_prompts = [[rng.randrange(1, 8000) for _ in range(1024)] for _ in range(4)]
    many_prompts = [[rng.randrange(1, 8000) for _ in range(256)] for _ in range(48)]
    report = {
        "long": generate_figures(work, model, "long", long_prompts, args.runs),
        "many": generate_figures(work, model, "many", many_prompts, args.runs),
        "bandwidth": bandwidth(work / "long-kvtier", args.runs),
    }
    (work / "report.json").write_text(json.dumps(report, indent=1))
    for label in ("long", "many"):
        r = report[label]
        print(
            f"{label}: generate() recompute {r['recompute']:.2f} s, kvtier {r['kvtier']:.2f} s "
            f"({r['recompute'] / r['kvtier']:.2f}x faster), vLLM fs tier {r['vllm']:.2f} s "
            f"(kvtier/vLLM {r['kvtier'] / r['vllm']:.2f})"
        )
    b = report["bandwidth"]
    print(
        f"load bandwidth: {b['files']} blocks of {b['bytes'] // b['files']} bytes, raw {b['raw_gib_s']:.2f} GiB/s, "
        f"kvtier {b['kvtier_gib_s']:.2f} GiB/s ({b['kvtier_gib_s'] / b['raw_gib_s']:.0%} of raw)"
    )


if __name__ == "__main__":
    main()

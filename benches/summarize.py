#!/usr/bin/env python3
"""Summarise criterion results as the tables in docs/performance.md.

Reads target/criterion/<group>/<bench>/new/{estimates,benchmark}.json and
prints, per group, each bench's median time per element (the group's
throughput: one lookup, one key, one task...) with its median absolute
deviation, and its ratio to every `baseline_*` bench of the same group --
all measured in the same `cargo bench` run.

Given several criterion directories (one per repeated run, as
`benches/repeat.sh` leaves them) it prints, per bench, the median over the
runs of each run's median, the range of those medians (the run-to-run
noise), and the ratios computed within each run, as median and range.

    python3 benches/summarize.py [GROUP...]          # target/criterion
    python3 benches/summarize.py target/bench-runs/*/criterion [GROUP...]

An argument that is a directory is a run; any other is a group to show.
"""
import argparse
import json
import os
import sys


def load(root):
    groups = {}
    for group in sorted(os.listdir(root)):
        gdir = os.path.join(root, group)
        if not os.path.isdir(gdir) or group == "report":
            continue
        for dirpath, _dirs, files in os.walk(gdir):
            if os.path.basename(dirpath) != "new" or "estimates.json" not in files:
                continue
            with open(os.path.join(dirpath, "estimates.json")) as f:
                est = json.load(f)
            with open(os.path.join(dirpath, "benchmark.json")) as f:
                meta = json.load(f)
            per = 1
            throughput = meta.get("throughput") or {}
            for kind in ("Elements", "Bytes", "ElementsAndBytes"):
                if kind in throughput:
                    value = throughput[kind]
                    per = value["elements"] if isinstance(value, dict) else value
            function = meta.get("function_id") or os.path.basename(os.path.dirname(dirpath))
            bench = (function, meta.get("value_str") or "")
            groups.setdefault(meta.get("group_id", group), {})[bench] = (
                est["median"]["point_estimate"] / per,
                est["median_abs_dev"]["point_estimate"] / per,
                per,
            )
    return groups


def fmt(ns):
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns:.1f} ns"


def order(benches):
    def key(bench):
        function, value = bench
        return (function, float(value) if value.replace(".", "").isdigit() else value)

    return sorted(benches, key=key)


def single(groups, wanted):
    for group, benches in groups.items():
        if wanted and group not in wanted:
            continue
        # Baselines are compared at the same parameter (table size...).
        baselines = sorted({f for f, _ in benches if f.startswith("baseline")})
        header = ["bench", "median / element", "MAD", "elements"] + [f"÷ {b}" for b in baselines]
        print(f"\n### {group}\n")
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for function, value in order(benches):
            median, mad, per = benches[(function, value)]
            name = f"{function}/{value}" if value else function
            row = [name, fmt(median), f"{100 * mad / median:.1f} %", str(per)]
            for base in baselines:
                reference = benches.get((base, value))
                row.append(f"{median / reference[0]:.2f}×" if reference else "")
            print("| " + " | ".join(row) + " |")


def middle(values):
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def repeated(runs, wanted):
    names = sorted({group for run in runs for group in run})
    for group in names:
        if wanted and group not in wanted:
            continue
        per_run = [run.get(group, {}) for run in runs]
        benches = set().union(*per_run)
        baselines = sorted({f for f, _ in benches if f.startswith("baseline")})
        header = ["bench", f"median of {len(runs)} runs", "range of run medians", "MAD in run"]
        header += [f"÷ {b}" for b in baselines]
        print(f"\n### {group}\n")
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for bench in order(benches):
            function, value = bench
            medians = [run[bench][0] for run in per_run if bench in run]
            mads = [run[bench][1] / run[bench][0] for run in per_run if bench in run]
            name = f"{function}/{value}" if value else function
            row = [
                name,
                fmt(middle(medians)),
                f"{fmt(min(medians))} – {fmt(max(medians))}",
                f"{100 * middle(mads):.1f} %",
            ]
            for base in baselines:
                ratios = [
                    run[bench][0] / run[(base, value)][0]
                    for run in per_run
                    if bench in run and (base, value) in run
                ]
                row.append(
                    f"{middle(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f})" if ratios else ""
                )
            print("| " + " | ".join(row) + " |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("args", nargs="*", metavar="RUN_DIR|GROUP")
    args = parser.parse_args()
    runs = [a for a in args.args if os.path.isdir(a)]
    groups = [a for a in args.args if not os.path.isdir(a)]
    if len(runs) > 1:
        repeated([load(d) for d in runs], groups)
        return
    root = runs[0] if runs else "target/criterion"
    if not os.path.isdir(root):
        sys.exit(f"no criterion results under {root}: run cargo bench first")
    single(load(root), groups)


if __name__ == "__main__":
    main()

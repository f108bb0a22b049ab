#!/usr/bin/env python3
"""Summarise criterion results as the tables in docs/performance.md.

Reads target/criterion/<group>/<bench>/new/{estimates,benchmark}.json and
prints, per group, each bench's median time per element (the group's
throughput: one lookup, one key, one task...) with its median absolute
deviation, and its ratio to every `baseline_*` bench of the same group --
all measured in the same `cargo bench` run.

    python3 benches/summarize.py [--criterion-dir target/criterion] [GROUP...]
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--criterion-dir", default="target/criterion")
    parser.add_argument("groups", nargs="*")
    args = parser.parse_args()
    if not os.path.isdir(args.criterion_dir):
        sys.exit(f"no criterion results under {args.criterion_dir}: run cargo bench first")
    for group, benches in load(args.criterion_dir).items():
        if args.groups and group not in args.groups:
            continue
        # Baselines are compared at the same parameter (table size...).
        baselines = sorted({f for f, _ in benches if f.startswith("baseline")})
        header = ["bench", "median / element", "MAD", "elements"] + [f"÷ {b}" for b in baselines]
        print(f"\n### {group}\n")
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        order = sorted(benches, key=lambda b: (b[0], float(b[1]) if b[1].replace(".", "").isdigit() else b[1]))
        for function, value in order:
            median, mad, per = benches[(function, value)]
            name = f"{function}/{value}" if value else function
            row = [name, fmt(median), f"{100 * mad / median:.1f} %", str(per)]
            for base in baselines:
                reference = benches.get((base, value))
                row.append(f"{median / reference[0]:.2f}×" if reference else "")
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()

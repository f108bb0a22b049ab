#!/usr/bin/env python3
"""Instructions per operation of the scheduler's and the save tracker's
calls, counted by callgrind: repeatable whatever else the machine is doing.

Builds `benches/instructions.rs` (the bench profile, as `cargo bench`
does), runs it once under `valgrind --tool=callgrind` collecting only inside
its `measured_*` functions, and prints each one's inclusive instruction
count divided by the operations the binary says it performed, with the
ratio to the baseline of the same table (`baseline_*`).

    python3 benches/instructions.py               # the table
    python3 benches/instructions.py --json FILE   # also write the figures as JSON

Needs valgrind (Debian's package).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (table title, baseline, ops) in the order printed.
TABLES = [
    ("lookup table, per key (1,024 keys over 8 requests)", "baseline_foldhash_probe",
     ["lookup_known", "lookup_known_32_requesters", "lookup_join_31_requesters", "lookup_new", "lookup_all",
      "flush", "apply", "cleanup", "baseline_foldhash_probe", "baseline_std_probe"]),
    ("step workload on the table, per lookup (24 steps of 4,096 lookups)",
     "step_baseline_foldhash_probe",
     ["step_lookup", "step_lookup_all", "step_flush", "step_apply", "step_cleanup", "step_scheduler",
      "step_reference_foldhash_lookup", "step_reference_foldhash_scheduler",
      "step_floor_lookup", "step_floor_scheduler", "step_baseline_foldhash_probe"]),
    ("save tracker with 10^4 outstanding tasks, per task", "save_baseline_check_loop",
     ["save_submit", "save_poll_none_done", "save_poll_reaping", "save_baseline_check_loop"]),
]


def build():
    out = subprocess.run(
        ["cargo", "bench", "--bench", "instructions", "--no-run", "--message-format=json"],
        cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout
    for line in out.splitlines():
        message = json.loads(line)
        if message.get("reason") == "compiler-artifact" and message["target"]["name"] == "instructions" \
                and message.get("executable"):
            return message["executable"]
    sys.exit("cargo built no `instructions` bench executable")


def measure(binary):
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "callgrind.out")
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", "--toggle-collect=*measured_*",
             f"--callgrind-out-file={out_file}", binary],
            cwd=ROOT, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ops = {}
        for line in run.stdout.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "ops":
                ops[parts[1]] = int(parts[2])
        annotate = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", "--threshold=100", out_file],
            check=True, stdout=subprocess.PIPE, text=True).stdout
    counts = {}
    pattern = re.compile(r"^\s*([\d,]+)\s.*[:\s][\w:<>]*::measured_(\w+)\b")
    for line in annotate.splitlines():
        match = pattern.match(line)
        if match:
            name = match.group(2)
            counts[name] = max(counts.get(name, 0), int(match.group(1).replace(",", "")))
    missing = sorted(set(ops) - set(counts))
    if missing:
        sys.exit(f"callgrind saw no instructions for {missing}")
    per_op = {name: counts[name] / ops[name] for name in ops}
    sums = {
        "step_scheduler": ["step_lookup", "step_flush", "step_apply", "step_cleanup"],
        "step_reference_foldhash_scheduler": [
            "step_reference_foldhash_lookup", "step_reference_foldhash_flush",
            "step_reference_foldhash_rest"],
        "step_floor_scheduler": ["step_floor_lookup", "step_floor_flush", "step_floor_rest"],
    }
    for total, parts in sums.items():
        if all(name in per_op for name in parts):
            per_op[total] = sum(per_op[name] for name in parts)
    return per_op


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write {op: instructions per op} here")
    args = parser.parse_args()
    per_op = measure(build())
    for title, baseline, names in TABLES:
        print(f"\n### {title}\n")
        print(f"| operation | instructions per op | ÷ {baseline} |")
        print("|---|---|---|")
        for name in names:
            if name not in per_op:
                continue
            ratio = per_op[name] / per_op[baseline] if per_op.get(baseline) else float("nan")
            print(f"| {name} | {per_op[name]:.1f} | {ratio:.2f}× |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(per_op, out, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()

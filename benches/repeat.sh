#!/usr/bin/env bash
# Runs every bench N times (default 3) and keeps each run's criterion
# results and printed tables under target/bench-runs/<i>/, then prints the
# per-run medians' median and range across the runs:
#
#     bash benches/repeat.sh [N]
#     python3 benches/summarize.py target/bench-runs/*/criterion
#
# Run it on a quiet machine: nothing else building or benchmarking.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
cargo bench --benches --no-run
rm -rf target/bench-runs
for i in $(seq 1 "$runs"); do
    out="target/bench-runs/$i"
    mkdir -p "$out"
    rm -rf target/criterion
    echo "run $i of $runs"
    cargo bench --benches >"$out/stdout.txt" 2>"$out/stderr.txt"
    cp -r target/criterion "$out/criterion"
done
python3 benches/summarize.py target/bench-runs/*/criterion

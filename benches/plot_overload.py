#!/usr/bin/env python3
"""Renders the overload example's JSON lines as a markdown table and an SVG
chart (no dependencies beyond python3):

    cargo run --release --example overload -- --json > target/overload.jsonl
    python3 benches/plot_overload.py target/overload.jsonl docs/overload.svg

The chart has two panels against the offered load (1x to 10x the tier's
capacity, log scale): the 99th percentile of the time to verdict, and the
largest table. One line per driver and bounds.
"""

import json
import math
import sys

COLUMNS = [
    ("driver", "driver"), ("mode", "bounds"), ("load", "load"),
    ("groups_per_second", "groups probed/s"), ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"),
    ("pending_at_end", "pending at end"), ("oldest_pending_ms", "oldest pending ms"),
    ("deadline_misses", "deadline misses"), ("shed", "shed keys"), ("abandoned", "given up"),
    ("peak_table", "peak table"), ("peak_outstanding", "peak outstanding"),
    ("peak_rss_mib", "peak RSS MiB"),
]
STYLE = {
    ("thread", "unbounded"): "#c0392b",
    ("tokio", "unbounded"): "#e67e22",
    ("thread", "bounded"): "#2471a3",
    ("tokio", "bounded"): "#17a589",
    ("thread", "sized"): "#7d3c98",
    ("tokio", "sized"): "#b7950b",
}


def table(runs):
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    for run in runs:
        cells = [f"{run['load']}x" if key == "load" else str(run[key]) for key, _ in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def panel(runs, key, title, x0, width, height):
    loads = sorted({run["load"] for run in runs})
    top = max(run[key] for run in runs) * 1.1 or 1
    left, bottom = x0 + 60, height - 40
    plot_w, plot_h = width - 80, height - 80
    xs = {load: left + plot_w * math.log(load) / math.log(loads[-1]) for load in loads}
    y = lambda v: bottom - plot_h * v / top
    out = [f'<text x="{left + plot_w / 2}" y="20" text-anchor="middle">{title}</text>',
           f'<line x1="{left}" y1="{bottom}" x2="{left + plot_w}" y2="{bottom}" stroke="black"/>',
           f'<line x1="{left}" y1="{bottom}" x2="{left}" y2="{bottom - plot_h}" stroke="black"/>']
    for load in loads:
        out.append(f'<text x="{xs[load]}" y="{bottom + 18}" text-anchor="middle">{load}x</text>')
    for tick in range(5):
        value = top * tick / 4
        out.append(f'<text x="{left - 6}" y="{y(value) + 4}" text-anchor="end">{value:.0f}</text>')
    for (driver, mode), colour in STYLE.items():
        points = sorted((run["load"], run[key]) for run in runs
                        if run["driver"] == driver and run["mode"] == mode)
        path = " ".join(f"{xs[load]:.1f},{y(value):.1f}" for load, value in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
    return out


def main():
    runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    print(table(runs))
    if len(sys.argv) < 3:
        return
    width, height = 900, 360
    body = panel(runs, "p99_ms", "p99 time to verdict (ms)", 0, width / 2, height)
    body += panel(runs, "peak_table", "peak table size (keys)", width / 2, width / 2, height)
    for i, ((driver, mode), colour) in enumerate(STYLE.items()):
        body.append(f'<rect x="{20 + i * 145}" y="{height - 14}" width="14" height="4" fill="{colour}"/>')
        body.append(f'<text x="{38 + i * 145}" y="{height - 8}">{driver}, {mode}</text>')
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">\n'
           f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n")
    with open(sys.argv[2], "w") as f:
        f.write(svg)


if __name__ == "__main__":
    main()

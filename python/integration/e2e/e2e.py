"""kvtier serving inside real vLLM engine processes: the end-to-end harness.

Every scenario runs fresh engine processes (``engine.py``) on a tiny Llama
whose float32 weights this harness generates itself (seeded, written
locally by transformers), with vLLM's tiering on the CPU backend through
``kvtier.vllm.cpu.CpuTieringSpec``, and runs once with kvtier's ``FsTier``
and once with vLLM's own fs tier (the control). What it checks:

- restart: a second process loads every prompt block from the tier,
  computes no prompt token (vLLM's own counters), and gives the tokens and
  logprobs of a run without offloading;
- cross-read: one engine with both tiers side by side, offloading blocks
  of two engine blocks, makes them write byte-identical files at the same
  paths, and each tier serves a fresh process from the other's directory;
- crash: process 1 is killed (SIGKILL) while stores are in flight; no
  partial block is left under a block's name, process 2's outputs match,
  and kvtier sweeps the temporary files a crash leaves;
- damage: block files truncated, emptied, replaced by a directory or
  removed between runs are recomputed through vLLM's load-failure path,
  the outputs match, and nothing crashes;
- preemption and aborts: a KV cache too small for the batch preempts
  requests and some are aborted mid-flight; the survivors' outputs match;
- kvtier's KV connector, alone and under MultiConnector: deferred dumps
  under preemption and aborts, restart hits, SIGKILL mid-dump, the bytes
  of a blocking save, vLLM's fs tier reading its files (``e2e_connector.py``);
- a byte budget below the working set (``"capacity_bytes"``), through
  tiering and through the connector: the outputs equal, and the tier's
  files stay within the budget at every sample (``e2e_capacity.py``);
- the README's server recipes behind a real OpenAI client, stopped by
  SIGTERM with the recipe's timeout and in vLLM's default mode, restarted:
  texts equal, prompt tokens from the tier, kvtier's figures on /metrics,
  no kvtier frame in any traceback, /dev/shm clean (``e2e_server.py``);
- a fleet of hosts on one bucket of a real S3 server through kvtier's
  ``ObjectTier``: cross-host hits with 0 prompt tokens computed, and a
  server outage mid-run (``e2e_fleet.py``);
- the fleet's books in a real Valkey: one budget below the working set,
  cross-host hits answered by the books, a Valkey restart, a killed host's
  space back after its leases (``e2e_books.py``);
- every clean run: no ``Traceback`` or ``BufferError`` in any engine
  process's output (vLLM's own chat-template warmup warning, which every
  engine started with ``skip_tokenizer_init`` prints, is the one record
  let through), exit status 0, and no /dev/shm offload region left.

    python e2e.py --work DIR [--tiers kvtier,vllm] [--scenarios ...] [--control ...]
                  [--connector-multi full|pressure]

(``--control``: the scenarios that also run on vLLM's fs tier, or ``none``;
the cross-read always has vLLM's tier serve an engine from kvtier's files.
``--connector-multi pressure``: under MultiConnector only the run under
pressure, not its restart and the SIGKILL scenario. CI runs no control and
``--connector-multi pressure``: the cross-read's fresh engine on vLLM's tier
already shows the checks pass on vLLM's own code, and the restart and the
kill are the connector's, whatever wraps it.)

Run it with the vLLM venv's Python (``vllm.sh --e2e`` does). Exits non-zero
and names what failed when a check fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from e2e_common import SCENARIOS, CheckFailed, make_model
from harness import Harness


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--tiers", default="kvtier,vllm")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument(
        "--control",
        default="restart,crash,damage,preempt",
        help="the scenarios that also run on vLLM's fs tier, the control, or 'none' (cross always does)",
    )
    parser.add_argument(
        "--connector-multi",
        default="full",
        choices=("full", "pressure"),
        help="under MultiConnector: every connector scenario (full), or the run under pressure only",
    )
    args = parser.parse_args()
    tiers = args.tiers.split(",")
    scenarios = args.scenarios.split(",")
    control = set() if args.control == "none" else set(args.control.split(","))
    if "damage" in control:
        control.add("restart")  # the damage scenario damages the restart's files
    unknown = set(scenarios) - set(SCENARIOS) or set(tiers) - {"kvtier", "vllm"} or control - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown: {sorted(unknown)}")
    args.work.mkdir(parents=True, exist_ok=True)
    harness = Harness(args.work.resolve())
    started = time.monotonic()
    try:
        make_model(harness.model)
        harness.run_baseline()
        roots = {}
        if {"restart", "damage"} & set(scenarios):
            for tier in tiers:
                if tier == "vllm" and "restart" not in control:
                    continue
                print(f"restart: {tier}", flush=True)
                roots[tier] = harness.restart(tier)
        if "cross" in scenarios:
            print("cross-read, offloaded blocks of 2 engine blocks", flush=True)
            harness.cross()
        for scenario in ("crash", "damage", "preempt"):
            if scenario not in scenarios:
                continue
            for tier in tiers:
                if tier == "vllm" and scenario not in control:
                    continue
                print(f"{scenario}: {tier}", flush=True)
                if scenario == "damage":
                    harness.damage(tier, roots[tier])
                else:
                    getattr(harness, scenario)(tier)
        if "connector" in scenarios:
            import e2e_connector

            deferred = {}
            for mode in ("alone", "multi"):
                full = mode == "alone" or args.connector_multi == "full"
                print(f"connector: {mode}, under pressure{', then a restart' if full else ''}", flush=True)
                deferred[mode] = e2e_connector.pressure(harness, mode, restart=full)
                if full:
                    print(f"connector: {mode}, SIGKILL mid-dump, then a restart", flush=True)
                    e2e_connector.killed(harness, mode)
            print("connector: a blocking save's bytes; vLLM's fs tier reads the files", flush=True)
            e2e_connector.blocking_and_cross(harness, deferred["alone"])
        if "capacity" in scenarios:
            import e2e_capacity

            print("capacity: tiering with a budget below the working set, then a restart", flush=True)
            e2e_capacity.tiering(harness)
            print("capacity: the connector under pressure with a budget", flush=True)
            e2e_capacity.connector(harness)
        if "server" in scenarios:
            import e2e_server

            print("server: the README's recipes behind an OpenAI client, SIGTERM both ways", flush=True)
            e2e_server.run(harness)
        if "fleet" in scenarios:
            import e2e_fleet

            print("fleet: hosts sharing one bucket of a real S3 server (SeaweedFS), an outage", flush=True)
            e2e_fleet.run(harness)
        if "books" in scenarios:
            import e2e_books

            print("books: the fleet's budget and recency in a real Valkey, a restart, a kill", flush=True)
            e2e_books.run(harness)
    except CheckFailed as failure:
        print(f"FAILED: {failure}", flush=True)
        return 1
    for note in harness.notes:
        print(f"  {note}")
    print(f"end-to-end: every check passed, {harness.runs} engine processes, {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

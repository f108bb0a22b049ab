#!/usr/bin/env python3
"""Remove or invert each guarding line of kvtier's code on a scratch copy,
and show which check then fails.

    python3 models/mutants.py            # every mutation, its named check
    python3 models/mutants.py L4-ticket  # mutations whose id starts with L4-ticket
    python3 models/mutants.py --matrix   # every mutation against every suite
    python3 models/mutants.py --anchors  # only check that every mutation applies
    python3 models/mutants.py P          # the Python package's (not in the default run)
    python3 models/mutants.py N          # vLLM's tier (needs python/integration/vllm.sh's venv)
    python3 models/mutants.py K          # kvtier's vLLM connector (the same venv)
    python3 models/mutants.py --record   # as the default run, then record it (below)
    python3 models/mutants.py --ci       # what CI runs: changed since the record, and a sample
    python3 models/mutants.py --check-selection  # the CI rule runs what changed, and only that

The mutations live in models/mutation/catalogue/, one file per subsystem.
Each names the invariant (docs/design.md) whose guard it breaks, the text it
replaces, and the check expected to catch it. The code marks each guard
with a `// guard: <id>` comment; a mutation edits only the few lines after
its tags, so it follows its guard when code moves, and a tag or a text that
is gone makes it STALE (a failure). A mutation whose check still passes is
reported as SURVIVED and makes the script exit non-zero: that check cannot
see the guard, so either the check or the guard is wrong. The working tree
is never modified; the scratch copy lives in $KVTIER_MUTANTS_DIR (default:
target/mutants/).

--matrix runs each mutation against every suite of its protocol
(mutation/suites.py) and prints a markdown table per protocol of which
suites catch it: the evidence tables of docs/verification.md.

--record adds, for each mutation just run (all of them caught), a key of
what its verdict depends on (mutation/keys.py: its guard's lines and its
check's own functions, not whole files) to models/mutants-record.json.
--ci runs every mutation whose key is not the recorded one, and every
SAMPLE_EVERY-th of the rest (mutation/record.py).
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mutation import record as records  # noqa: E402
from mutation.catalogue import MUTATIONS  # noqa: E402
from mutation.defs import PY_VENV, ROOT, ensure_py_venv  # noqa: E402
from mutation.guards import mutated_text  # noqa: E402
from mutation.runner import baseline, matrix, run, sync_scratch  # noqa: E402
from mutation.selection_check import check_selection  # noqa: E402


def check_anchors():
    """--anchors: every mutation's tags and texts are found (exactly once)
    in the working tree, without building anything. Exits non-zero naming
    the stale ones."""
    stale = [(m.id, r) for m in MUTATIONS if isinstance(r := mutated_text(m, ROOT), str)]
    for id, reason in stale:
        print(f"STALE    {id}: {reason}")
    print(f"{len(MUTATIONS) - len(stale)} of {len(MUTATIONS)} mutations anchored")
    sys.exit(1 if stale else 0)


def main():
    args = sys.argv[1:]
    if args == ["--anchors"]:
        check_anchors()
    if args == ["--check-selection"]:
        check_selection(MUTATIONS)
        sys.exit(0)
    record = "--record" in args
    args = [a for a in args if a != "--record"]
    ci = "--ci" in args
    if ci:
        if not os.path.exists(records.RECORD):
            print(f"no {os.path.relpath(records.RECORD, ROOT)}: every mutation is changed")
        chosen = records.ci_selection(MUTATIONS, records.read_record(), ROOT)
        for mutation, why in chosen:
            print(f"selected {mutation.id}: {why}")
        print(f"CI runs {len(chosen)} of {len(MUTATIONS)} mutations")
        if not chosen:
            sys.exit(0)
        exact = {m.id for m, _ in chosen}
        selected = [m for m in MUTATIONS if m.id in exact]
        as_matrix = False
    else:
        as_matrix = "--matrix" in args
        prefixes = [a for a in args if a != "--matrix"]
        selected = [m for m in MUTATIONS if not prefixes or any(m.id.startswith(p) for p in prefixes)]
        if not prefixes:
            # Each P mutant rebuilds the extension module, and each N and K
            # mutant needs vLLM's venv (python/integration/vllm.sh): asked
            # for by name only.
            selected = [m for m in selected if not m.id.startswith(("P", "N", "K"))]
        if not selected:
            sys.exit(f"no mutation id starts with {prefixes}")
    # The P mutations' checks, and any other whose check builds the module
    # into the scratch venv (C4's), need that venv.
    if any(m.id.startswith("P") or PY_VENV in " ".join(m.check) for m in selected):
        ensure_py_venv()
    tree = sync_scratch()
    keys = {m.id: records.key(m, tree) for m in selected} if record else {}
    if as_matrix:
        matrix(selected, tree)
    baseline({(tuple(m.check), tuple(sorted((m.env or {}).items()))) for m in selected}, tree)
    bad = 0
    caught = set()
    for mutation in selected:
        started = time.time()
        verdict, detail = run(mutation, tree)
        bad += verdict != "CAUGHT"
        if verdict == "CAUGHT":
            caught.add(mutation.id)
        print(f"{verdict:8} {mutation.id:34} {time.time() - started:5.1f}s  {mutation.what}")
        print(f"         check: {' '.join(mutation.check)}")
        print(f"         -> {detail}", flush=True)
    print(f"\n{len(selected) - bad} of {len(selected)} mutations caught")
    if record:
        # Only what was caught: a mutation that survived (or broke) is run
        # again by the next selection.
        records.write_record({id: key for id, key in keys.items() if id in caught})
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

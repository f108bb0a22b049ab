"""The record of caught mutations and what CI runs from it: every mutation
whose key (keys.py) is not the recorded one, and a fixed sample
(docs/verification.md, "Mutations in CI")."""

import json
import os
import subprocess
import time

from . import keys
from .defs import ROOT, portable

#: The keys of the mutations of the last recorded runs, by id.
RECORD = os.path.join(ROOT, "models", "mutants-record.json")
#: The fixed sample: every SAMPLE_EVERY-th mutation, in registry order, of
#: those whose check is a debug `cargo test` (the checks that rebuild the
#: Python extension, run in vLLM's venv or build in release run when their
#: guard or check changed, and in the recorded full runs).
SAMPLE_EVERY = 14
CHANGED = "changed since the recorded run"


def key(mutation, tree, read=None):
    return keys.key(mutation, tree, portable(mutation.check), read)


def in_debug_build(mutation):
    """Whether the mutation's check is a `cargo test` of the debug build
    (what the README's test step has built)."""
    return mutation.check[0] == "cargo" and "--release" not in mutation.check


def fixed_sample(every):
    """The ids of the fixed sample of the registry `every`: every
    SAMPLE_EVERY-th of its mutations checked in the debug build."""
    light = [m.id for m in every if in_debug_build(m)]
    return {id for i, id in enumerate(light) if i % SAMPLE_EVERY == 0}


def ci_selection(mutations, record, tree, read=None, every=None):
    """[(mutation, why)] CI runs: every mutation whose key is not the
    recorded one (its guard, its check or the mutation changed, or it is
    new), and the fixed sample of `every` (the registry)."""
    sample = fixed_sample(every if every is not None else mutations)
    read = read or keys._reader(tree)
    chosen = []
    for mutation in mutations:
        if record.get(mutation.id) != key(mutation, tree, read):
            chosen.append((mutation, CHANGED))
        elif mutation.id in sample:
            chosen.append((mutation, "fixed sample"))
    return chosen


def read_record(path=RECORD):
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)["keys"]


def write_record(new_keys, path=RECORD):
    """Adds `new_keys` (of mutations caught just now, taken of the tree
    they were run in before the run) to the record."""
    record = read_record(path)
    record.update(new_keys)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    data = {"recorded_at_commit": commit, "recorded": time.strftime("%Y-%m-%d"),
            "keyed_by": "models/mutation/keys.py", "keys": dict(sorted(record.items()))}
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print(f"recorded {len(new_keys)} keys in {os.path.relpath(path, ROOT)}")

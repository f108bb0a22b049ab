"""Running mutations: a scratch copy of the tree, one mutated file at a
time, each check in a process group of its own with a time bound."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile

from .defs import ROOT, SCRATCH
from .guards import mutated_text
from .suites import SUITES


def sync_scratch():
    """Copies the working tree (without build output) into the scratch dir."""
    src = os.path.join(SCRATCH, "tree")
    shutil.rmtree(src, ignore_errors=True)
    # shutil.copy, not copy2: fresh mtimes, so cargo never mistakes a copied
    # file for one it already built from a mutated version.
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns("target", ".git"), copy_function=shutil.copy)
    return src


def mutate(mutation, tree):
    """Writes the mutated file into the scratch tree; returns (file,
    original text), or a string saying why the mutation is stale."""
    mutated = mutated_text(mutation, tree)
    if isinstance(mutated, str):
        return mutated
    file, text = mutated
    path = os.path.join(tree, file)
    # From the scratch copy, not the working tree: the tree may be edited
    # while a long run goes on.
    original = open(path).read()
    open(path, "w").write(text)
    return file, original


def target_dir(env):
    """Where a check builds: the scratch dir's target for its RUSTFLAGS, or
    for checks without any, `KVTIER_MUTANTS_TARGET` when set (CI points it
    at the checkout's own target, whose debug dependencies the test steps
    built: the scratch tree's crates sit at other paths, so cargo keeps
    their artifacts apart from the checkout's, and only the dependencies
    are shared)."""
    flags = env.get("RUSTFLAGS")
    shared = os.environ.get("KVTIER_MUTANTS_TARGET")
    if shared and not flags:
        return shared
    return os.path.join(SCRATCH, "target-" + (flags or "std").split()[-1])


def check(command, env_extra, tree, shown=None):
    """Runs one check in the scratch tree: (verdict, detail). With `shown`
    (a list), the check's output is appended to it."""
    env = dict(os.environ)
    env.update(env_extra or {})
    env["CARGO_TARGET_DIR"] = target_dir(env_extra or {})
    output, failed = run_bounded(command, tree, env, timeout=900)
    if shown is not None:
        shown.append(output)
    if "error[E" in output and "could not compile" in output:
        return "BROKEN", "the mutant does not compile; fix the mutation"
    if not failed:
        return "SURVIVED", "the check passed with the guard removed"
    failing = [l.split(" --- ")[0].strip() for l in output.splitlines() if l.endswith(" --- FAILED")]
    # pytest names its failures, and faulthandler a hang it ended.
    failing += [l.strip() for l in output.splitlines() if l.startswith("FAILED ")]
    failing += ["hung: " + l.strip() for l in output.splitlines() if "Timeout (" in l]
    return "CAUGHT", ("failing test: " + failing[0] if failing else "the check failed")[:160]


def run_bounded(command, tree, env, timeout):
    """Runs a check in a process group of its own: (output, failed). Its
    output goes to a file, not a pipe, so a process it left behind (a forked
    child that hangs under a mutation) cannot keep the wait going once the
    check itself has ended; whatever is left of the group is then killed."""
    with tempfile.TemporaryFile(mode="w+", errors="replace") as out:
        process = subprocess.Popen(command, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            failed = process.wait(timeout=timeout) != 0
            note = ""
        except subprocess.TimeoutExpired:
            failed, note = True, "\ntimed out (counts as caught: the check did not pass)"
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        out.seek(0)
        return out.read() + note, failed


def run(mutation, tree):
    mutated = mutate(mutation, tree)
    if isinstance(mutated, str):
        return "STALE", mutated + "; update the tag or the catalogue"
    file, original = mutated
    try:
        return check(mutation.check, mutation.env, tree)
    finally:
        open(os.path.join(tree, file), "w").write(original)


def baseline(checks, tree):
    """Every check must pass on the unmutated tree, or a "caught" mutant
    would prove nothing."""
    for command, env in checks:
        output = []
        verdict, _ = check(list(command), dict(env), tree, output)
        if verdict != "SURVIVED":
            # What failed, so that a flaky or broken check can be told apart.
            print("\n".join(output[0].splitlines()[-60:]))
            sys.exit(f"baseline check fails without any mutation: {' '.join(command)}")


def matrix(selected, tree):
    """--matrix: each mutation against every suite of its protocol; a
    markdown table per protocol."""
    uncaught = 0
    for protocol, suites in SUITES.items():
        mutations = [m for m in selected if m.id.startswith(protocol)]
        if not mutations:
            continue
        baseline([(tuple(c), tuple(sorted(e.items()))) for c, e in suites.values()], tree)
        print("| mutation | " + " | ".join(suites) + " |")
        print("|---|" + "---|" * len(suites))
        for mutation in mutations:
            mutated = mutate(mutation, tree)
            if isinstance(mutated, str):
                print(f"| {mutation.id} | STALE: {mutated} |")
                uncaught += 1
                continue
            file, original = mutated
            cells = []
            try:
                for command, env in suites.values():
                    verdict, _ = check(command, env, tree)
                    cells.append({"CAUGHT": "caught", "SURVIVED": "-", "BROKEN": "BROKEN"}[verdict])
            finally:
                open(os.path.join(tree, file), "w").write(original)
            uncaught += "caught" not in cells
            print(f"| {mutation.id} | " + " | ".join(cells) + " |", flush=True)
        print()
    print(f"{len(selected) - uncaught} of {len(selected)} mutations caught by at least one suite")
    sys.exit(1 if uncaught else 0)

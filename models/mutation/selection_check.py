"""`mutants.py --check-selection`: the CI rule runs what changed, and
only that. Two parts:

- on the real tree: every mutation's key can be computed (its guard is
  tagged, its check selects at least one test), no key hashes this
  machine's paths, an unchanged tree runs exactly the fixed sample, an
  edit to any mutation's guard lines or definition gets it run, and the
  record names no mutation that is gone;
- on a small tree made here, the selection each kind of change must
  produce: a moved guard (and moved tests) runs nothing, an edited guard
  runs its mutations, an edited check runs its mutation, an unrelated edit
  runs nothing, and an edit to the Rust a Python check calls runs that
  check's mutation.
"""

import os
import shutil
import tempfile

from . import keys
from .defs import ROOT, TEST, VLLM_TESTS, VLLM_VENV, Mutation, portable, pytest
from .guards import GUARD_TAG, guard_tags
from .record import CHANGED, ci_selection, fixed_sample, key, read_record, RECORD


def check_selection(mutations):
    _real_tree(mutations)
    cases = _small_tree_cases()
    print(f"CI rule: an unchanged tree runs the sample of {len(mutations)} mutations; an edit to any "
          f"mutation's guard lines or definition runs it; {cases} kinds of change on a small tree "
          "select what they must")


def _real_tree(mutations):
    spelled = [m.id for m in mutations
               if any(path in arg for arg in portable(m.check) for path in (ROOT, VLLM_VENV, VLLM_TESTS))]
    assert not spelled, f"keys of {spelled} would hash this machine's paths"
    read = keys._reader(ROOT)
    broken = []
    record = {}
    for m in mutations:
        try:
            record[m.id] = key(m, ROOT, read)
        except keys.CheckNotFound as e:
            broken.append(f"{m.id}: {e}")
    assert not broken, "checks whose own code cannot be found:\n" + "\n".join(broken)
    picked = {m.id for m, _ in ci_selection(mutations, record, ROOT, read)}
    sample = fixed_sample(mutations)
    assert picked == sample, f"an unchanged tree picks {sorted(picked - sample)} beyond the sample"
    tags = guard_tags(ROOT)
    missed = []
    for m in mutations:
        assert tags.get(m.id), f"{m.id} has no guard tag"
        file, at = tags[m.id][0]
        # The first line of the window a key counts (not blank, not a comment).
        untagged = [l for l in read(file).split("\n") if not GUARD_TAG.match(l)]
        while at < len(untagged) and (not untagged[at].strip() or untagged[at].strip().startswith(("//", "#"))):
            at += 1

        def edited(path, file=file, at=at):
            text = read(path)
            if path != file:
                return text
            lines, kept, out = text.split("\n"), 0, []
            for line in lines:
                if GUARD_TAG.match(line):
                    out.append(line)
                    continue
                out.append(line + " EDITED" if kept == at else line)
                kept += 1
            return "\n".join(out)
        if ci_selection([m], record, ROOT, edited, every=mutations) != [(m, CHANGED)]:
            missed.append((m.id, "its guard's first line"))
        changed = Mutation(m.id, m.what, m.edits + [("x", "y")], m.check, m.env)
        if ci_selection([changed], record, ROOT, read, every=mutations) != [(changed, CHANGED)]:
            missed.append((m.id, "its own definition"))
    assert not missed, f"changes the CI rule would skip: {missed[:10]}"
    stale = sorted(set(read_record()) - {m.id for m in mutations})
    assert not stale, f"{os.path.relpath(RECORD, ROOT)} records mutations that no longer exist: {stale}"


# ---- the small tree ----------------------------------------------------------

_BASE = {
    "src/lib.rs": "pub mod a;\npub mod b;\n",
    "src/a.rs": """
/// Doubles a positive number.
pub fn guarded(x: i32) -> i32 {
    // guard: R1-positive
    if x > 0 {
        return x * 2;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_doubles() {
        assert_eq!(guarded(2), 4);
    }
}
""",
    "src/b.rs": "pub fn unrelated() -> u32 {\n    7\n}\n",
    "tests/t.rs": """
use kvtier::a::guarded;

fn helper() -> i32 {
    guarded(3)
}

#[test]
fn catches_the_guard() {
    assert_eq!(helper(), 6);
}

#[test]
fn another_test() {
    assert_eq!(kvtier::b::unrelated(), 7);
}
""",
    "python/src/lib.rs": """
#[pyfunction]
fn probe(x: i64) -> i64 {
    x + 1
}

#[pyfunction]
fn unrelated_binding() -> i64 {
    0
}
""",
    "python/kvtier/__init__.py": """
from . import _native


def probe_all(values):
    # guard: P1-probes-every-value
    return [_native.probe(v) for v in values]


def other():
    return _native.unrelated_binding()
""",
    "python/tests/test_p.py": """
import kvtier


def test_probe():
    assert kvtier.probe_all([1, 2]) == [2, 3]
""",
}

_MUTATIONS = [
    Mutation("R1-positive", "integration", [("if x > 0 {", "if true {")],
             TEST + ["-p", "kvtier", "--test", "t", "catches_the"]),
    Mutation("R1-positive-unit", "unit", [("if x > 0 {", "if true {")],
             TEST + ["-p", "kvtier", "--lib", "a::tests::unit"]),
    Mutation("P1-probes-every-value", "pytest", [("for v in values", "for v in values[:1]")],
             pytest("tests/test_p.py::test_probe")),
]


def _write(tree, files):
    for path, text in files.items():
        full = os.path.join(tree, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)


def _changed(base_record, files, remove=()):
    with tempfile.TemporaryDirectory() as tree:
        _write(tree, dict(_BASE, **files))
        for path in remove:
            os.remove(os.path.join(tree, path))
        mutations = [Mutation(m.id.replace("-unit", ""), m.what, m.edits, m.check) for m in _MUTATIONS]
        # Two mutations share a guard here; keyed apart by their own ids.
        chosen = []
        for m, name in zip(mutations, (m.id for m in _MUTATIONS)):
            if base_record[name] != key(m, tree):
                chosen.append(name)
        return sorted(chosen)


def _small_tree_cases():
    with tempfile.TemporaryDirectory() as tree:
        _write(tree, _BASE)
        base = {name: key(Mutation(m.id.replace("-unit", ""), m.what, m.edits, m.check), tree)
                for m, name in zip(_MUTATIONS, (m.id for m in _MUTATIONS))}
    a = _BASE["src/a.rs"]
    guard_fn = a[:a.index("#[cfg(test)]")]
    unit_tests = a[a.index("mod tests {") + len("mod tests {"):a.rindex("}")]
    cases = {
        # The guarded function moves to a file of its own, the unit tests
        # to a sibling tests.rs, the integration test's helper to a module.
        "a moved guard": ({
            "src/lib.rs": "pub mod a;\npub mod b;\npub mod c;\n",
            "src/c.rs": "\n\n" + guard_fn,
            "src/a.rs": "pub use crate::c::guarded;\n\n#[cfg(test)]\nmod tests;\n",
            "src/a/tests.rs": unit_tests,
            "tests/t.rs": _BASE["tests/t.rs"].replace(
                "fn helper() -> i32 {\n    guarded(3)\n}\n", "mod common;\nuse common::helper;\n"),
            "tests/common/mod.rs": "use kvtier::a::guarded;\n\npub fn helper() -> i32 {\n    guarded(3)\n}\n",
        }, []),
        "an edited guard": ({"src/a.rs": a.replace("if x > 0 {", "if x >= 0 {")},
                            ["R1-positive", "R1-positive-unit"]),
        "an edited check (a helper)": ({"tests/t.rs": _BASE["tests/t.rs"].replace("guarded(3)", "guarded(4)")},
                                       ["R1-positive"]),
        "an edited check (a unit test)": ({"src/a.rs": a.replace("guarded(2), 4", "guarded(1), 2")},
                                          ["R1-positive-unit"]),
        "an edited check (a pytest test)": ({"python/tests/test_p.py": _BASE["python/tests/test_p.py"].replace(
            "[1, 2]) == [2, 3]", "[1]) == [2]")}, ["P1-probes-every-value"]),
        "an unrelated edit": ({
            "src/b.rs": "pub fn unrelated() -> u32 {\n    8\n}\n",
            "src/a.rs": a.replace("/// Doubles a positive number.", "/// Doubles x when it is positive."),
            "tests/t.rs": _BASE["tests/t.rs"].replace("unrelated(), 7", "unrelated(), 8"),
            "python/src/lib.rs": _BASE["python/src/lib.rs"].replace("    0\n", "    1\n"),
        }, []),
        "a Rust edit under a pytest check": ({"python/src/lib.rs": _BASE["python/src/lib.rs"].replace(
            "x + 1", "x + 2")}, ["P1-probes-every-value"]),
    }
    wrong = []
    for name, (files, expected) in cases.items():
        got = _changed(base, files)
        if got != sorted(expected):
            wrong.append(f"{name}: runs {got}, must run {sorted(expected)}")
    assert not wrong, "the CI rule selects wrongly:\n" + "\n".join(wrong)
    return len(cases)

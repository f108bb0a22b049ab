"""What a mutation's recorded verdict depends on, and its key: the record
(record.py) holds one key per mutation, and CI runs a mutation again when
its key changes.

A key hashes
- the mutation itself: its id, edits, check command and environment;
- its guard: the lines a mutation may edit (GUARD_WINDOW lines after each
  `guard:` tag), each stripped, without blank or comment-only lines, and
  without the file's name or the lines' numbers;
- its check's own code: the test functions the check selects and the
  helpers they name, followed by name through the check's own files (its
  test targets, the lib's test modules, the reference models for a models
  test; the test folder and its conftest for a pytest check), each item
  as its tokens (comments and layout do not count), never its file;
- for a pytest check, the code it exercises through the Python package:
  the package's functions and classes its code names, and the native
  module's Rust items (python/src) those name, followed by name too. The
  library under src/ is the code under test, as for a cargo check: only
  its guard lines count.

So moving or splitting code without changing a guard's lines or a check's
functions changes no key; an edit to a guard, to a check's function or
helper, or to a binding a Python check calls changes the keys that depend
on it. Items are matched by name, so an edit to an item that shares a name
with one a check uses also changes that check's key: the rule errs towards
running a mutation again, never towards skipping it.
"""

import hashlib
import json
import os
import re
import shlex

from . import python_items, rust_items
from .guards import GUARD_TAG, GUARD_WINDOW, guard_tags

#: Where each package's library code and integration tests live.
PACKAGES = {
    "kvtier": ("src", "tests"),
    "kvtier-models": (os.path.join("models", "src"), os.path.join("models", "tests")),
    "kvtier-cli": (os.path.join("cli", "src"), os.path.join("cli", "tests")),
}


class CheckNotFound(Exception):
    """A check whose own code cannot be found (a filter that selects no
    test, a test file that does not exist): the mutation must be fixed."""


def key(mutation, tree, portable_check, read=None):
    """The hex key of `mutation` in `tree`. `read(path)` returns a file's
    text (tests substitute edited texts)."""
    read = read or _reader(tree)
    parts = {
        "mutation": [mutation.id, mutation.edits, portable_check, mutation.env],
        "guard": guard_lines(mutation, tree, read),
        "check": sorted(set(check_code(mutation.check, tree, read))),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _reader(tree):
    cache = {}

    def read(path):
        if path not in cache:
            with open(os.path.join(tree, path), errors="replace") as f:
                cache[path] = f.read()
        return cache[path]
    return read


def guard_lines(mutation, tree, read):
    """The stripped, non-blank, non-comment lines of each guard window, in
    order; no file name, no line numbers. A window ends where the block
    holding its tag ends (so what follows a guarded function does not
    count), unless an edit of the mutation reaches further."""
    out = []
    for file, at in guard_tags(tree, read).get(mutation.id, []):
        lines = [l for l in read(file).split("\n") if not GUARD_TAG.match(l)]
        window = lines[at:at + GUARD_WINDOW]
        block = window[:_block_end(window, file.endswith(".py"))]
        text = "\n".join(block)
        if all(old in text for old, _ in mutation.edits if old in "\n".join(window)):
            window = block
        out.append([l.strip() for l in window if l.strip() and not l.strip().startswith(("//", "#", "--"))])
    return out


def _block_end(window, python):
    """How many lines of `window` lie in the block its first line is in."""
    if python:
        indents = [len(l) - len(l.lstrip()) for l in window if l.strip()]
        base = indents[0] if indents else 0
        for n, line in enumerate(window):
            if line.strip() and len(line) - len(line.lstrip()) < base:
                return n
        return len(window)
    depth = 0
    for n, line in enumerate(window):
        for kind, t in rust_items.tokens(line):
            if kind == "punct" and t in "{}":
                depth += 1 if t == "{" else -1
                if depth < 0:
                    return n + 1
    return len(window)


# ---- cargo checks ----------------------------------------------------------

def check_code(command, tree, read):
    """The texts of the check's own items (see the module's doc)."""
    if command[:2] == ["cargo", "test"]:
        return _cargo_code(command, tree, read)
    return _pytest_code(command, tree, read)


def _cargo_code(command, tree, read):
    args, package, names, filters, lib = command[2:], "kvtier", [], [], False
    every = "--tests" in args
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-p", "--package"):
            package, i = args[i + 1], i + 2
            continue
        if a in ("--test",):
            names.append(args[i + 1])
            i += 2
            continue
        if a in ("--features", "-F"):
            i += 2
            continue
        if a == "--lib":
            lib = True
        elif not a.startswith("-"):
            filters.append(a)
        i += 1
    lib_dir, tests_dir = PACKAGES[package]
    if every or not (names or lib):
        names += sorted(n[:-3] for n in _listdir(tree, tests_dir) if n.endswith(".rs"))
        lib = True
    pool, candidates = [], []
    for name in names:
        target = os.path.join(tests_dir, name + ".rs")
        if not _exists(tree, target, read):
            raise CheckNotFound(f"`--test {name}`: {target} does not exist")
        for file, path in _crate_files(tree, target, [], read):
            found, _ = rust_items.items(read(file))
            pool += found
            candidates += [(path + i.path + [i.name], i) for i in found if i.test]
        if package == "kvtier-models":
            # A models test checks through the reference models.
            for file in _all(tree, lib_dir, ".rs"):
                pool += rust_items.items(read(file))[0]
    if lib:
        for file, path, is_test_file in _lib_files(tree, lib_dir, read):
            found, _ = rust_items.items(read(file))
            tested = [i for i in found if is_test_file or i.test_module]
            pool += tested
            candidates += [(path + i.path + [i.name], i) for i in tested if i.test]
    chosen = [item for path, item in candidates if not filters or any(f in "::".join(path) for f in filters)]
    if not chosen:
        raise CheckNotFound(f"`{' '.join(command)}` selects no test")
    return _closure(chosen, pool)


def _crate_files(tree, root_file, path, read):
    """(file, module path) of a test crate's root and the files its
    `mod name;` lines declare (with `#[path = ".."]` honoured)."""
    out = [(root_file, path)]
    _, declared = rust_items.items(read(root_file))
    here = os.path.dirname(root_file)
    for name, attrs in declared:
        at = [a for a in attrs if a.startswith("path =")]
        if at:
            child = os.path.normpath(os.path.join(here, at[0].split("=", 1)[1].strip().strip('"')))
        else:
            child = next((c for c in (os.path.join(here, name + ".rs"), os.path.join(here, name, "mod.rs"))
                          if _exists(tree, c, read)), None)
        if child:
            out += [(f, p) for f, p in _crate_files(tree, child, path + [name], read)]
    return out


def _lib_files(tree, lib_dir, read):
    """(file, module path, whether the whole file is a test module) for a
    library's files."""
    files = _all(tree, lib_dir, ".rs")
    test_files = set()
    for file in files:
        base = os.path.dirname(file) if os.path.basename(file) in ("mod.rs", "lib.rs", "main.rs") else file[:-3]
        for name, attrs in rust_items.items(read(file))[1]:
            if name == "tests" or rust_items.is_cfg_test(attrs) or file in test_files:
                test_files |= {os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")}
    out = []
    for file in files:
        rel = os.path.relpath(file, lib_dir)[:-3].split(os.sep)
        if rel[-1] in ("mod", "lib", "main"):
            rel = rel[:-1]
        out.append((file, rel, file in test_files))
    return out


def _closure(chosen, pool):
    """The texts of `chosen` and of every pool item a chosen one names,
    followed until nothing new is named."""
    return [item.text for item in _closure_items(chosen, pool)]


def _names_of(item):
    return item.names if isinstance(item, python_items.PyItem) else item.idents


# ---- pytest checks ---------------------------------------------------------

def _pytest_code(command, tree, read):
    script = command[-1]
    words = shlex.split(script.split("pytest", 1)[1].split("&&")[0]) if "pytest" in script else []
    where = _pytest_folder(script, tree)
    selected, expression, plugins = [], None, []
    i = 0
    while i < len(words):
        w = words[i]
        if w == "-k":
            expression, i = words[i + 1], i + 2
            continue
        if w == "-p":
            if not words[i + 1].startswith("no:"):
                plugins.append(words[i + 1])
            i += 2
            continue
        if not w.startswith("-"):
            selected.append(w)
        i += 1
    folders = {where}
    if "PYTHONPATH=" in script and "python/integration" in script:
        folders.add(os.path.join("python", "integration"))
    pool, candidates, always = [], [], []
    for folder in sorted(f for f in folders if f and not os.path.isabs(f)):
        for name in sorted(n for n in _listdir(tree, folder) if n.endswith(".py")):
            file = os.path.join(folder, name)
            found = python_items.items(read(file))
            pool += found
            if name == "conftest.py" or name[:-3] in plugins:
                always += found
    for spec in selected:
        file, _, node = spec.partition("::")
        base = where if not os.path.isabs(where) else None
        path = os.path.normpath(os.path.join(base, file)) if base is not None else None
        if path is None:
            # vLLM's own test files, outside the repository: pinned with
            # vLLM's version; the check's own code here is the plugin.
            continue
        if _isdir(tree, path, read):
            files = [os.path.join(path, n) for n in sorted(_listdir(tree, path)) if n.startswith("test") and n.endswith(".py")]
        elif _exists(tree, path, read):
            files = [path]
        else:
            raise CheckNotFound(f"pytest names {path}, which does not exist")
        for f in files:
            found = python_items.items(read(f))
            always += [item for item in found if item.always]
            for item in found:
                for test in item.tests:
                    if node and test != node and test.split("::")[-1] != node:
                        continue
                    if expression and not _k_matches(expression, test):
                        continue
                    candidates.append(item)
    if not candidates and not (os.path.isabs(where) and plugins):
        raise CheckNotFound(f"`{script[-120:]}` selects no test")
    check = _closure(candidates + always, pool)
    return check + _exercised(candidates, always, pool, tree, read)


def _pytest_folder(script, tree):
    """The folder the check's pytest runs in, relative to the tree (or an
    absolute path outside it)."""
    dirs = re.findall(r"\bcd ([^ &;]+)", script)
    where = dirs[-1] if dirs else "."
    return where


def _k_matches(expression, test):
    """pytest's -k, for the plain forms the checks use: names joined by
    `and`, `or`, `not` (and parentheses), each a case-insensitive
    substring of the test's name."""
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*|[()]", expression)
    python = " ".join(w if w in ("and", "or", "not", "(", ")") else repr(w.lower() in test.lower())
                      for w in words)
    try:
        return bool(eval(python, {"__builtins__": {}}))
    except SyntaxError:
        return True


def _exercised(candidates, always, pool, tree, read):
    """The package's Python items and the native module's Rust items that
    the check's code names, followed by name through both."""
    names = set()
    for item in _closure_items(candidates + always, pool):
        names |= _names_of(item)
    package = [item for file in _all(tree, os.path.join("python", "kvtier"), ".py")
               for item in python_items.items(read(file))]
    binding = []
    for file in _all(tree, os.path.join("python", "src"), ".rs"):
        text = read(file)
        found, _ = rust_items.items(text)
        aliases = dict(re.findall(r'#\[pyclass\([^)]*name = "(\w+)"[^)]*\)\]\s*(?:#\[[^\]]*\]\s*)*pub\s+struct\s+(\w+)', text))
        for item in found:
            binding.append(item)
            for alias, struct in aliases.items():
                if item.name == struct:
                    binding.append(rust_items.Item(item.kind, alias, item.text, item.path, False, False, item.idents | {struct}))
    both = package + binding
    start = [i for i in both if i.name in names]
    return _closure(start, both)


def _closure_items(chosen, pool):
    by_name = {}
    for item in pool:
        by_name.setdefault(item.name, []).append(item)
    seen, todo, out = set(), list(chosen), []
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        out.append(item)
        for name in _names_of(item):
            todo += [i for i in by_name.get(name, []) if id(i) not in seen]
    return out


# ---- files -------------------------------------------------------------------

def _listdir(tree, folder):
    try:
        return os.listdir(os.path.join(tree, folder))
    except FileNotFoundError:
        return []


def _isdir(tree, path, read):
    return os.path.isdir(os.path.join(tree, path))


def _exists(tree, path, read):
    return os.path.exists(os.path.join(tree, path))


def _all(tree, folder, suffix):
    found = []
    for here, dirs, names in os.walk(os.path.join(tree, folder)):
        dirs.sort()
        found += [os.path.relpath(os.path.join(here, n), tree) for n in sorted(names) if n.endswith(suffix)]
    return found

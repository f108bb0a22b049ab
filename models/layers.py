#!/usr/bin/env python3
"""The module layers of kvtier's code: no import circle, and no import from
a layer above.

    python3 models/layers.py              # prints every violation; exits 1 if any
    python3 models/layers.py --self-test  # small trees, one planted fault each

Rust (the crates under src/, cli/src, python/src, models/src): a node is a
module file; an edge goes from a file to the module where an item it names
through `crate::`, `super::`, `self::` or a child module's path is
*defined*, following `pub use` re-exports to the definition. Then

- a circle is two or more files that reach each other;
- an upward import is one whose path goes through an ancestor module of the
  importer (its parent `mod.rs` or the crate root): an item defined there,
  or re-exported there. Import from the module that defines the item.

Exempt: `pub use` lines themselves (a re-export is not an import), and the
code of test modules (`mod tests`, `#[cfg(test)]`, their files).

Python (the package under python/kvtier, and the end-to-end harness's
scripts): a node is a module; edges are `import` and `from ... import`
statements anywhere in it (lazy ones included), names followed through a
package `__init__`'s re-exports to their module. Circles and upward imports
as for Rust (an `__init__.py` is the layer above its package's modules, and
its own imports are re-exports); and a private name (`_x`) may only be
imported from a private module (`_x.py`), never from a sibling's public one.

models/tests/layers.rs runs this on every `cargo test --workspace`.
"""

import ast
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mutation.rust_items import is_cfg_test, tokens  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CRATES = {"kvtier": "src/lib.rs", "kvtier-cli": "cli/src/main.rs",
          "kvtier-python": "python/src/lib.rs", "kvtier-models": "models/src/lib.rs"}
PACKAGES = {"kvtier": "python/kvtier"}
SCRIPT_FOLDERS = ["python/integration/e2e", "python/integration"]


# ---- Rust ------------------------------------------------------------------

class Module:
    def __init__(self, path, file, test):
        self.path = path          # ("lookup", "table")
        self.file = file
        self.test = test
        self.children = {}        # name -> Module
        self.defined = set()      # item names defined here
        self.reexports = {}       # name -> [segments] (relative to this module)
        self.globs = []           # [segments] of `pub use x::*`
        self.uses = []            # ([segments], line) imports and paths in code


def _parse_file(module, text, modules, crate_dir):
    toks = tokens(text)
    _scan(toks, 0, len(toks), module, modules, crate_dir, module.test)


def _scan(toks, i, end, module, modules, crate_dir, in_test):
    depth = 0
    while i < end:
        kind, t = toks[i]
        if t == "{" and kind == "punct":
            depth += 1
        elif t == "}" and kind == "punct":
            depth -= 1
        if kind == "ident" and t == "mod" and i + 2 < end and toks[i + 1][0] == "ident":
            name = toks[i + 1][1]
            attrs = _attrs(toks, i)
            test = in_test or name == "tests" or is_cfg_test(attrs)
            if toks[i + 2][1] == ";":
                path = [a for a in attrs if a.startswith("path =")]
                child = _child_file(module, name, path, crate_dir)
                if child and os.path.exists(os.path.join(ROOT, child)):
                    sub = Module(module.path + (name,), child, test)
                    module.children[name] = sub
                    modules.append(sub)
                    _parse_file(sub, open(os.path.join(ROOT, child)).read(), modules, crate_dir)
                i += 3
                continue
            if toks[i + 2][1] == "{":
                close = _matching(toks, i + 2)
                sub = Module(module.path + (name,), module.file, test)
                module.children[name] = sub
                modules.append(sub)
                _scan(toks, i + 3, close - 1, sub, modules, crate_dir, test)
                i = close
                continue
        if kind == "ident" and t in ("fn", "struct", "enum", "trait", "type", "const", "static", "union") \
                and i + 1 < end and toks[i + 1][0] == "ident" and depth == 0:
            module.defined.add(toks[i + 1][1])
        if kind == "ident" and t == "macro_rules" and i + 2 < end:
            module.defined.add(toks[i + 2][1])
        if kind == "ident" and t == "use" and (i == 0 or toks[i - 1][1] != "."):
            stop = i
            while stop < end and toks[stop][1] != ";":
                stop += 1
            public = _is_pub(toks, i)
            for segs, alias in _use_tree(toks[i + 1:stop]):
                if public and depth == 0:
                    if segs[-1] == "*":
                        module.globs.append(segs[:-1])
                    else:
                        module.reexports[alias] = segs
                elif not in_test:
                    module.uses.append(segs)
                if not public and depth == 0 and segs[-1] != "*":
                    module.defined.discard(alias)
            i = stop + 1
            continue
        if kind == "ident" and t in ("crate", "super", "self") and not in_test and i + 1 < end \
                and toks[i + 1][1] == ":" and (i == 0 or toks[i - 1][1] not in (":", "(")):
            segs, j = [t], i + 1
            while j + 2 < end and toks[j][1] == ":" and toks[j + 1][1] == ":" and toks[j + 2][0] == "ident":
                segs.append(toks[j + 2][1])
                j += 3
            if len(segs) > 1:
                module.uses.append(segs)
            i = j
            continue
        i += 1


def _is_pub(toks, i):
    j = i - 1
    if j >= 0 and toks[j][1] == ")":
        while j >= 0 and toks[j][1] != "(":
            j -= 1
        j -= 1
    return j >= 0 and toks[j][1] == "pub"


def _attrs(toks, i):
    out, j = [], i - 1
    if j >= 0 and toks[j][1] == "pub":
        j -= 1
    while j >= 0 and toks[j][1] == "]":
        k, depth = j, 0
        while k >= 0:
            if toks[k][1] == "]":
                depth += 1
            elif toks[k][1] == "[":
                depth -= 1
                if depth == 0:
                    break
            k -= 1
        out.append(" ".join(t for _, t in toks[k + 1:j]))
        j = k - 2
    return out


def _matching(toks, at):
    depth = 0
    for j in range(at, len(toks)):
        if toks[j] == ("punct", "{"):
            depth += 1
        elif toks[j] == ("punct", "}"):
            depth -= 1
            if depth == 0:
                return j + 1
    return len(toks)


def _child_file(module, name, path_attr, crate_dir):
    here = os.path.dirname(module.file)
    base = os.path.basename(module.file)
    if path_attr:
        return os.path.normpath(os.path.join(here, path_attr[0].split("=", 1)[1].strip().strip('"')))
    folder = here if base in ("lib.rs", "main.rs", "mod.rs") else module.file[:-3]
    for candidate in (os.path.join(folder, name + ".rs"), os.path.join(folder, name, "mod.rs")):
        if os.path.exists(os.path.join(ROOT, candidate)):
            return candidate
    return None


def _use_tree(toks):
    """[(segments, alias)] of a use tree's token list."""
    out = []

    def walk(i, prefix):
        segs = list(prefix)
        while i < len(toks):
            k, t = toks[i]
            if t == "{":
                i += 1
                while i < len(toks) and toks[i][1] != "}":
                    i = walk(i, segs)
                    if i < len(toks) and toks[i][1] == ",":
                        i += 1
                return i + 1
            if t in (",", "}"):
                break
            if t == ":":
                i += 1
                continue
            if t == "as":
                out.append((segs, toks[i + 1][1]))
                return i + 2
            if t == "*" or k == "ident":
                segs = segs + [t]
            i += 1
        if segs and segs != list(prefix):
            alias = segs[-1] if segs[-1] != "self" else (segs[-2] if len(segs) > 1 else "self")
            out.append((segs if segs[-1] != "self" else segs[:-1], alias))
        return i

    walk(0, [])
    return out


def _resolve(module, segs, root, seen=None):
    """(defining module, [modules that supplied the name: re-exporters and
    the definer]) for a path used in `module`, or None when it leaves the
    crate. Modules a path only walks through (`crate::a::b::X` walks the
    root and `a`) do not supply anything."""
    seen = seen or set()
    if not segs:
        return None
    first, rest = segs[0], segs[1:]
    if first == "crate":
        at = root
    elif first == "self":
        at = module
    elif first == "super":
        at = _ancestor(root, module.path[:-1])
        while rest and rest[0] == "super":
            at, rest = _ancestor(root, at.path[:-1]), rest[1:]
    elif first in module.children:
        at = module.children[first]
    elif first in module.reexports and (module.path, first) not in seen:
        seen.add((module.path, first))
        return _resolve(module, module.reexports[first] + rest, root, seen)
    else:
        return None
    while rest:
        name = rest[0]
        if name in at.children:
            at = at.children[name]
            rest = rest[1:]
            continue
        if name == "*" or name in at.defined:
            return at, [at]
        if name in at.reexports and (at.path, name) not in seen:
            seen.add((at.path, name))
            found = _resolve(at, at.reexports[name] + rest[1:], root, seen)
            return (found[0], [at] + found[1]) if found else None
        for glob in at.globs:
            if (at.path, "*") in seen:
                break
            found = _resolve(at, glob + rest, root, seen | {(at.path, "*")})
            if found:
                return found[0], [at] + found[1]
        return at, [at]
    return at, [at]


def _ancestor(root, path):
    at = root
    for name in path:
        at = at.children.get(name, at)
    return at


def rust_violations():
    problems = []
    for crate, root_file in CRATES.items():
        root = Module((), root_file, False)
        modules = [root]
        _parse_file(root, open(os.path.join(ROOT, root_file)).read(), modules, os.path.dirname(root_file))
        file_of = {m.path: m.file for m in modules}
        edges = {}
        for m in modules:
            if m.test:
                continue
            for segs in m.uses:
                found = _resolve(m, segs, root)
                if not found:
                    continue
                target, through = found
                if target.test or target.file == m.file:
                    continue
                edges.setdefault(m.file, set()).add(target.file)
                above = [t for t in through if t.path != m.path and m.path[:len(t.path)] == t.path
                         and t.file != m.file]
                if above:
                    problems.append(f"{crate}: {m.file} imports `{'::'.join(segs)}` through "
                                    f"{above[-1].file}, a layer above it (import from {target.file})")
        problems += [f"{crate}: import circle: {' -> '.join(c)}" for c in _circles(edges)]
        del file_of
    return sorted(set(problems))


def _circles(edges):
    """The strongly connected components of two or more nodes (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


# ---- Python ----------------------------------------------------------------

def _py_modules(folder, package):
    """{dotted name: file} of a package's modules."""
    out = {}
    for here, dirs, names in os.walk(os.path.join(ROOT, folder)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in names:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(here, name), os.path.join(ROOT, folder))[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join([package] + rel)] = os.path.relpath(os.path.join(here, name), ROOT)
    return out


def python_violations():
    problems = []
    for package, folder in PACKAGES.items():
        modules = _py_modules(folder, package)
        trees = {name: ast.parse(open(os.path.join(ROOT, f)).read()) for name, f in modules.items()}
        is_pkg = {name: modules[name].endswith("__init__.py") for name in modules}
        defined, reexports = {}, {}
        for name, tree in trees.items():
            defined[name] = {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                             for t in ast.walk(n) if isinstance(t, ast.Name)}
            defined[name] |= {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef,
                                                                          ast.AsyncFunctionDef))}
            reexports[name] = {}
            if is_pkg[name]:
                for node in ast.walk(tree):
                    if isinstance(node, ast.ImportFrom):
                        source = _absolute(name, True, node)
                        for alias in node.names:
                            reexports[name][alias.asname or alias.name] = (source, alias.name)
        edges = {}
        for name, tree in trees.items():
            if is_pkg[name]:
                continue  # a package's __init__ re-exports
            for node in ast.walk(tree):
                for target, imported in _imports(name, False, node, modules):
                    final, through = _py_resolve(target, imported, modules, defined, reexports)
                    if final is None or final == name:
                        continue
                    edges.setdefault(name, set()).add(final)
                    above = [t for t in through if name.startswith(t + ".") and is_pkg.get(t)]
                    if above:
                        problems.append(f"{modules[name]} imports `{imported or target}` from {modules[above[0]]}, "
                                        f"a layer above it (import from {modules[final]})")
                    if imported and imported.startswith("_") and not imported.startswith("__") \
                            and not final.split(".")[-1].startswith("_"):
                        problems.append(f"{modules[name]} imports the private `{imported}` of {modules[final]}")
        problems += [f"import circle: {' -> '.join(modules[m] for m in c)}" for c in _circles(edges)]
    for folder in SCRIPT_FOLDERS:
        names = {n[:-3] for n in os.listdir(os.path.join(ROOT, folder)) if n.endswith(".py")}
        edges = {}
        for name in names:
            tree = ast.parse(open(os.path.join(ROOT, folder, name + ".py")).read())
            for node in ast.walk(tree):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
                for mod in mods:
                    if mod.split(".")[0] in names and mod.split(".")[0] != name:
                        edges.setdefault(name, set()).add(mod.split(".")[0])
        problems += [f"import circle: {' -> '.join(os.path.join(folder, m + '.py') for m in c)}"
                     for c in _circles(edges)]
    return sorted(set(problems))


def _absolute(module, is_pkg, node):
    if not node.level:
        return node.module
    parts = module.split(".")
    base = parts if is_pkg else parts[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module, is_pkg, node, modules):
    """[(module imported from, name or None)] of one import node, within the package."""
    out = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name in modules:
                out.append((alias.name, None))
    elif isinstance(node, ast.ImportFrom):
        source = _absolute(module, is_pkg, node)
        if source in modules:
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.append((sub, None) if sub in modules else (source, alias.name))
    return out


def _py_resolve(module, name, modules, defined, reexports, seen=None):
    """(module defining `name`, [modules passed through])."""
    seen = seen or set()
    if name is None or name in defined.get(module, ()) or (module, name) in seen:
        return module, [module]
    seen.add((module, name))
    if name in reexports.get(module, {}):
        source, original = reexports[module][name]
        if f"{source}.{original}" in modules:
            return f"{source}.{original}", [module]
        if source in modules:
            final, through = _py_resolve(source, original, modules, defined, reexports, seen)
            return final, [module] + through
        return None, []
    return module, [module]


def self_test():
    """Small trees with one known fault each: the check names each, and
    says nothing of a clean tree."""
    import tempfile

    global ROOT, CRATES, PACKAGES, SCRIPT_FOLDERS
    saved = ROOT, CRATES, PACKAGES, SCRIPT_FOLDERS
    cases = [
        ("clean", {"src/lib.rs": "mod error;\nmod a;\n", "src/error.rs": "pub struct E;\n",
                   "src/a.rs": "use crate::error::E;\nfn f(_: E) {}\n",
                   "py/p/__init__.py": "from .a import f\n", "py/p/a.py": "from ._b import _g\ndef f(): _g()\n",
                   "py/p/_b.py": "def _g(): pass\n"}, None),
        ("rust circle", {"src/lib.rs": "mod a;\nmod b;\n", "src/a.rs": "use crate::b::B;\npub struct A;\n",
                         "src/b.rs": "use crate::a::A;\npub struct B;\n"}, "import circle"),
        ("rust upward", {"src/lib.rs": "mod s;\n", "src/s/mod.rs": "mod c;\npub struct E;\n",
                         "src/s/c.rs": "use super::E;\nfn f(_: E) {}\n"}, "a layer above it"),
        ("rust upward through a re-export", {"src/lib.rs": "mod e;\nmod a;\npub use e::E;\n",
                                             "src/e.rs": "pub struct E;\n", "src/a.rs": "use crate::E;\n"},
         "a layer above it"),
        ("python circle", {"py/p/__init__.py": "", "py/p/a.py": "from .b import g\ndef f(): pass\n",
                           "py/p/b.py": "def g():\n    from .a import f\n"}, "import circle"),
        ("python private", {"py/p/__init__.py": "", "py/p/a.py": "from .b import _g\n",
                            "py/p/b.py": "def _g(): pass\n"}, "imports the private `_g`"),
        ("python upward", {"py/p/__init__.py": "def f(): pass\n", "py/p/a.py": "from . import f\n"},
         "a layer above it"),
    ]
    failed = []
    for name, files, expected in cases:
        with tempfile.TemporaryDirectory() as tree:
            for path, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(tree, path)), exist_ok=True)
                with open(os.path.join(tree, path), "w") as f:
                    f.write(text)
            ROOT = tree
            CRATES = {"c": "src/lib.rs"} if "src/lib.rs" in files else {}
            PACKAGES = {"p": "py/p"} if "py/p/__init__.py" in files else {}
            SCRIPT_FOLDERS = []
            try:
                problems = rust_violations() + python_violations()
            finally:
                ROOT, CRATES, PACKAGES, SCRIPT_FOLDERS = saved
        ok = not problems if expected is None else any(expected in p for p in problems)
        print(f"{'ok' if ok else 'WRONG':5} {name}: {problems or 'no problem'}")
        if not ok:
            failed.append(name)
    print("the layering check finds each planted fault" if not failed else f"missed: {failed}")
    sys.exit(1 if failed else 0)


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
    problems = rust_violations() + python_violations()
    for p in problems:
        print(p)
    print(f"{len(problems)} layering problems")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()

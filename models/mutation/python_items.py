"""The items of a Python file (its top-level functions, classes and
assignments), each with its text as `ast.unparse` gives it (comments and
layout do not change it) and the names it uses: what the mutation record
keys a pytest check on (keys.py).
"""

import ast
from dataclasses import dataclass, field


@dataclass
class PyItem:
    name: str
    text: str
    tests: list                 # the test functions it is or holds: ["test_x"] or ["TestA::test_x"]
    names: set = field(default_factory=set)
    always: bool = False        # an autouse fixture: part of every test of its file


_PARSED = {}


def items(source):
    """[PyItem] of a module's top level, a class's methods as items of
    their own (a class's item is the class without its named methods:
    its bases, decorators, attributes and dunder methods). A file that
    does not parse is one item, its text. Memoized by text."""
    if source not in _PARSED:
        _PARSED[source] = _items(source)
    return _PARSED[source]


def _items(source):
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return [PyItem("<unparsed>", source, [], set())]
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            tests = [node.name] if node.name.startswith("test") else []
            autouse = any("autouse" in ast.unparse(d) for d in node.decorator_list)
            out.append(PyItem(node.name, ast.unparse(node), tests, _names(node), autouse))
        elif isinstance(node, ast.ClassDef):
            methods = [f for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and not (f.name.startswith("__") and f.name.endswith("__"))]
            test_class = node.name.startswith("Test")
            for f in methods:
                tests = [f"{node.name}::{f.name}"] if test_class and f.name.startswith("test") else []
                out.append(PyItem(f.name, ast.unparse(f), tests, _names(f) | {node.name}))
            shell = ast.ClassDef(name=node.name, bases=node.bases, keywords=node.keywords,
                                 body=[b for b in node.body if b not in methods] or [ast.Pass()],
                                 decorator_list=node.decorator_list, type_params=getattr(node, "type_params", []))
            out.append(PyItem(node.name, ast.unparse(shell), [], _names(shell)))
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in (n.id for n in ast.walk(target) if isinstance(n, ast.Name)):
                    out.append(PyItem(name, ast.unparse(node), [], _names(node.value) if node.value else set()))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        else:
            # Module-level statements (an `if`, a `try` around imports): they
            # run whenever the module does, so every check of it depends on them.
            out.append(PyItem("<module>", ast.unparse(node), [], _names(node)))
    return out


def _names(node):
    """Every name a node reads: variables, attributes, parameters (pytest
    fixtures are parameters) and the strings of `getfixturevalue`-style
    lookups and `parametrize` argument lists are not followed."""
    found = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            found.add(n.id)
        elif isinstance(n, ast.Attribute):
            found.add(n.attr)
        elif isinstance(n, ast.arg):
            found.add(n.arg)
        elif isinstance(n, ast.alias):
            found.add((n.asname or n.name).split(".")[-1])
            found.add(n.name.split(".")[-1])
    return found

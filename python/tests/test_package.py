"""The package's surface: stubs that match the native module, docstrings
everywhere, the quick start in the README, the doctest of the package."""

from __future__ import annotations

import ast
import doctest
import pathlib
import re

import kvtier
import kvtier.vllm
from kvtier import _native

PACKAGE = pathlib.Path(kvtier.__file__).parent
#: The repository: the tests run against the installed package, wherever it is.
ROOT = pathlib.Path(__file__).resolve().parents[2]


def stub_names() -> dict[str, set[str]]:
    """Top-level names of _native.pyi, and the members of each class."""
    tree = ast.parse((PACKAGE / "_native.pyi").read_text())
    names: dict[str, set[str]] = {"": set()}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names[""].add(node.name)
            names[node.name] = {
                item.name for item in node.body if isinstance(item, ast.FunctionDef)
            }
        elif isinstance(node, ast.FunctionDef):
            names[""].add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[""].add(node.target.id)
    return names


DUNDERS = {"__len__", "__enter__", "__exit__"}


def test_the_stubs_name_exactly_what_the_native_module_has():
    stubs = stub_names()
    stub_top = {n for n in stubs[""] if not n.startswith("_")}
    runtime_top = {n for n in dir(_native) if not n.startswith("_")}
    assert stub_top == runtime_top
    for cls in stub_top:
        runtime = getattr(_native, cls)
        if not isinstance(runtime, type) or issubclass(runtime, BaseException):
            continue
        members = {n for n in vars(runtime) if not n.startswith("_") or n in DUNDERS}
        stubbed = {n for n in stubs[cls] if not n.startswith("_") or n in DUNDERS}
        assert stubbed == members, cls


def test_every_public_native_name_has_a_docstring():
    missing = []
    for name in dir(_native):
        if name.startswith("_"):
            continue
        item = getattr(_native, name)
        if not getattr(item, "__doc__", None):
            missing.append(name)
        if isinstance(item, type):
            for member, value in vars(item).items():
                if not member.startswith("_") and not getattr(value, "__doc__", None):
                    missing.append(f"{name}.{member}")
    assert missing == []


def test_the_package_docstrings_run():
    for module in (kvtier, kvtier.vllm):
        failures, _ = doctest.testmod(module)
        assert failures == 0


def test_the_readmes_python_quick_start_runs(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    # A recipe that starts a vLLM engine needs vLLM and a model: it is
    # checked in vLLM's venv (python/integration/test_cpu_tiering_in_vllm.py).
    blocks = [block for block in blocks if "from vllm" not in block]
    assert blocks, "the README has a Python quick start"
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})


def _stub_params(node: ast.FunctionDef) -> list[tuple[str, str]]:
    """(name, kind) of a stub's parameters, `self` left out."""
    args = node.args
    params = [(a.arg, "positional") for a in args.posonlyargs + args.args]
    if args.vararg:
        params.append((args.vararg.arg, "*args"))
    params += [(a.arg, "keyword") for a in args.kwonlyargs]
    if args.kwarg:
        params.append((args.kwarg.arg, "**kwargs"))
    return [p for p in params if p[0] not in ("self", "cls")]


def _runtime_params(item) -> list[tuple[str, str]] | None:
    import inspect

    try:
        signature = inspect.signature(item)
    except (TypeError, ValueError):
        return None
    kinds = {
        inspect.Parameter.POSITIONAL_ONLY: "positional",
        inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
        inspect.Parameter.VAR_POSITIONAL: "*args",
        inspect.Parameter.KEYWORD_ONLY: "keyword",
        inspect.Parameter.VAR_KEYWORD: "**kwargs",
    }
    return [(p.name, kinds[p.kind]) for p in signature.parameters.values() if p.name not in ("self", "cls")]


def test_the_stubs_signatures_are_the_native_modules():
    """Each stubbed function and method takes the parameters, by name and
    kind, that the native module's own signature gives (issue 41: a stub
    that drifts from the binding is a test failure, not a surprise)."""
    tree = ast.parse((PACKAGE / "_native.pyi").read_text())
    checked, wrong = 0, []
    for node in tree.body:
        pairs = []
        if isinstance(node, ast.FunctionDef) and hasattr(_native, node.name):
            pairs.append((node.name, node, getattr(_native, node.name)))
        elif isinstance(node, ast.ClassDef) and hasattr(_native, node.name):
            runtime = getattr(_native, node.name)
            for item in node.body:
                if not isinstance(item, ast.FunctionDef):
                    continue
                member = runtime if item.name == "__init__" else vars(runtime).get(item.name)
                if member is None or isinstance(member, property):
                    continue
                if item.name == "__init__" and not getattr(runtime, "__text_signature__", None):
                    continue
                pairs.append((f"{node.name}.{item.name}", item, member))
        for name, stub, runtime in pairs:
            found = _runtime_params(runtime)
            if found is None:
                continue
            checked += 1
            stubbed = _stub_params(stub)
            # A native `**settings` takes the keywords its docs list, which
            # the stub spells out; a native `*args` takes the positionals.
            if found and found[-1][1] == "**kwargs":
                found = found[:-1]
                stubbed = [p for p in stubbed if p[1] != "keyword" or p in found]
            if found and found[-1][1] == "*args":
                found = found[:-1]
                stubbed = [p for p in stubbed if p[1] != "positional" or p in found]
            if stubbed != found:
                wrong.append(f"{name}: stub {_stub_params(stub)} != native {found}")
    assert checked > 50, checked
    assert wrong == [], "\n".join(wrong)

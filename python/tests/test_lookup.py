"""kvtier.Lookup from Python: the native probers on real directories and a
real S3-compatible server, vLLM's layout, the GIL, faults and bad input."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time

import pytest

import kvtier
from conftest import PATIENCE, ScriptedBackend, native_threads, watchdog
from kvtier import ConfigError, HIT, MISS, RETRY, Lookup, ShutdownError, TierError
from kvtier.vllm import base_dir, block_path, make_key, rank_dir, split_key


def resolve(lookup: Lookup, key: bytes, req: str = "r") -> bool | None:
    lookup.lookup(key, req)
    lookup.flush()
    lookup.wait_idle()
    return lookup.lookup(key, req)


# vLLM's layout -------------------------------------------------------------


def vllm_file(rank_directory, block_hash: bytes, group: int):
    """The path vLLM's fs tier writes, spelled out from its documented rule
    (not through kvtier's helper)."""
    h = block_hash.hex()
    return os.path.join(rank_directory, h[0:3], f"{h[3:5]}_g{group}", f"{h}.bin")


def test_files_at_vllms_paths_are_found_and_absent_ones_are_not(tmp_path):
    rank = str(tmp_path / "meta-llama_Llama-3-8B_0123456789ab_r0")
    stored = [(hashlib.sha256(b"%d" % i).digest(), i % 3) for i in range(40)]
    for block_hash, group in stored:
        path = vllm_file(rank, block_hash, group)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as block:
            block.write(b"vllm block bytes")
    absent = [
        (hashlib.sha256(b"absent").digest(), 0),
        (stored[0][0], 7),  # the same hash in another group
        (b"\x01\x02", 1),  # a short hash: a shorter fan-out, as Python slices
    ]
    keys = [make_key(h, g) for h, g in stored + absent]
    with Lookup.vllm_fs(rank) as lookup:
        verdicts, _ = lookup.lookup_many(keys, "req")
        assert set(verdicts) == {RETRY}
        lookup.flush()
        lookup.wait_idle()
        verdicts, leading = lookup.lookup_many(keys, "req")
    assert verdicts == [HIT] * len(stored) + [MISS] * len(absent)
    assert leading == len(stored)


def test_a_directory_or_a_short_key_is_not_a_block(tmp_path):
    block_hash = bytes(range(32))
    os.makedirs(vllm_file(str(tmp_path), block_hash, 0))  # a directory there
    with Lookup.vllm_fs(tmp_path) as lookup:
        assert resolve(lookup, make_key(block_hash, 0)) is MISS
        assert resolve(lookup, b"\x00\x00\x00\x01") is MISS  # no hash at all
        assert lookup.stats()["backend_errors"] == 0


def test_a_missing_rank_directory_means_misses_not_errors(tmp_path):
    with Lookup.vllm_fs(tmp_path / "not-yet") as lookup:
        assert resolve(lookup, make_key(b"\xab" * 32)) is MISS


def test_the_layout_helpers_follow_vllms_rule(tmp_path):
    settings = dict(
        model_name="meta-llama/Llama-3-8B",
        tokens_per_hash=16,
        blocks_per_file=1,
        dtype="bfloat16",
        tp_size=2,
        kv_cache_groups=[{"tokens_per_block": 16, "layer_names": ["l0", "l1"]}],
    )
    # The run's settings as canonical JSON, written out by hand.
    canonical = (
        '{"blocks_per_file":1,"dcp_size":1,"dtype":"bfloat16","inference_engine":"vllm",'
        '"kv_cache_groups":[{"layer_names":["l0","l1"],"tokens_per_block":16}],'
        '"model_name":"meta-llama/Llama-3-8B","parallel_agnostic":false,"pcp_size":1,'
        '"pp_size":1,"tokens_per_hash":16,"tp_size":2}'
    )
    assert json.loads(canonical)["tp_size"] == 2
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:12]
    base = base_dir(tmp_path, **settings)
    assert base == f"{tmp_path}/meta-llama_Llama-3-8B_{digest}"
    assert rank_dir(tmp_path, rank=1, **settings) == base + "_r1"
    agnostic = rank_dir(tmp_path, rank=1, parallel_agnostic=True, **settings)
    assert agnostic.endswith("_r0") and agnostic != base + "_r0"
    key = make_key(b"\xde\xad\xbe\xef", 3)
    assert split_key(key) == (b"\xde\xad\xbe\xef", 3)
    assert block_path("/r", key) == vllm_file("/r", b"\xde\xad\xbe\xef", 3)
    with pytest.raises(ValueError):
        split_key(b"\x00\x00\x00\x03")
    with pytest.raises(ValueError):
        make_key(b"", 0)


# The base directories vLLM 0.32's own FileMapper gives for these settings
# (rank 1, root /kv), read off vLLM: what base_dir must reproduce without
# vLLM installed. python/integration checks the rule against the FileMapper
# itself, over many more settings.
VLLM_0_32_BASES = [
    (dict(tp_size=2), "/kv/meta-llama_Llama-3-8B_46937cc53ccc", 1),
    (dict(tp_size=2, parallel_agnostic=True), "/kv/meta-llama_Llama-3-8B_cd942e8f7a18", 0),
    (dict(replicated_layout=True, canonical_format="c1"), "/kv/meta-llama_Llama-3-8B_e27d92c2e414", 1),
]


@pytest.mark.parametrize(("extra", "base", "rank"), VLLM_0_32_BASES)
def test_base_dir_matches_vllm_0_32s_file_mapper(extra, base, rank):
    settings = dict(
        model_name="meta-llama/Llama-3-8B",
        tokens_per_hash=16,
        blocks_per_file=1,
        dtype="bfloat16",
        kv_cache_groups=[{"tokens_per_block": 16, "layer_names": ["l0", "l1"]}],
        **extra,
    )
    assert base_dir("/kv", **settings) == base
    assert rank_dir("/kv", rank=1, **settings) == f"{base}_r{rank}"


def test_the_settings_of_older_vllms_are_refused():
    # hash_block_size and gpu_blocks_per_file are what vLLM hashed before
    # 0.32: a directory computed from them holds none of 0.32's blocks.
    with pytest.raises(TypeError):
        base_dir("/kv", model_name="m", hash_block_size=16, gpu_blocks_per_file=1, dtype="f")
    with pytest.raises(ValueError, match="0.32"):
        base_dir("/kv", model_name="m", tokens_per_hash=16, blocks_per_file=1, dtype="f", vllm="0.31")


# kvtier's own tiers --------------------------------------------------------


def test_kvtiers_fs_tier_is_probed_natively(tmp_path):
    key = b"\x12\x34\x56\x78"
    shard = tmp_path / "ns" / "123" / "45"
    shard.mkdir(parents=True)
    (shard / "12345678.bin").write_bytes(b"a block file")
    with Lookup.fs(tmp_path, "ns", concurrency=2) as lookup:
        assert resolve(lookup, key) is HIT
        assert resolve(lookup, b"\x99\x99") is MISS


def test_an_object_store_on_loopback_is_probed_natively(s3_endpoint, s3_client):
    s3_client.create_bucket(Bucket="kvtier-py")
    key = bytes(range(16))
    digits = key.hex()
    s3_client.put_object(
        Bucket="kvtier-py", Key=f"llama/{digits[:3]}/{digits[3:5]}/{digits}.bin", Body=b"x"
    )
    url = f"s3://kvtier-py/llama?endpoint={s3_endpoint}"
    with Lookup.s3(url, access_key_id="testing", secret_access_key="testing") as lookup:
        assert resolve(lookup, key) is HIT
        assert resolve(lookup, b"\x00" * 16) is MISS
        assert lookup.stats()["backend_errors"] == 0


def test_the_object_layout_in_a_directory(tmp_path):
    key = b"\xab\xcd\xef"
    shard = tmp_path / "ns" / "abc" / "de"
    shard.mkdir(parents=True)
    (shard / "abcdef.bin").write_bytes(b"x")
    with Lookup.object_dir(tmp_path, "ns") as lookup:
        assert resolve(lookup, key) is HIT


# The GIL ---------------------------------------------------------------------


def busy_until_resolved(lookup: Lookup, key: bytes, seconds: float) -> bool:
    """Runs Python on this thread without letting go of the GIL (the switch
    interval is raised around it), asking about `key` through a native call
    that does not release the GIL either. True if an answer came."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        if lookup.lookup(key, "r") is not None:
            return True
        sum(range(200))
    return False


def test_a_native_prober_answers_while_python_holds_the_gil(tmp_path):
    block_hash = b"\x42" * 32
    path = vllm_file(str(tmp_path), block_hash, 0)
    os.makedirs(os.path.dirname(path))
    open(path, "wb").close()
    key = make_key(block_hash)
    python = Lookup.python(lambda keys, req: [os.path.exists(block_path(tmp_path, k)) for k in keys])
    native = Lookup.vllm_fs(tmp_path)
    interval = sys.getswitchinterval()
    try:
        for lookup in (native, python):
            assert lookup.lookup(key, "r") is RETRY
        sys.setswitchinterval(100.0)  # this thread keeps the GIL while it runs
        native.flush()
        native_answered = busy_until_resolved(native, key, 2.0)
        python.flush()
        python_answered = busy_until_resolved(python, key, 0.5)
    finally:
        sys.setswitchinterval(interval)
    assert native_answered, "the native prober never needed the GIL"
    # The same test with a prober that needs the GIL: it cannot answer until
    # the busy thread lets go, which shows the test can tell them apart.
    assert not python_answered
    python.wait_idle()
    assert python.lookup(key, "r") is HIT
    for lookup in (native, python):
        lookup.shutdown()


def test_shutdown_never_deadlocks_with_a_python_backend_that_needs_the_gil():
    started = threading.Event()

    def slow(keys, req_id):
        started.set()
        time.sleep(0.2)  # the GIL is let go and must be taken back
        return [sum(range(10_000)) > 0 for _ in keys]

    lookup = Lookup.python(slow)
    lookup.lookup(b"k", "r")
    lookup.flush()
    assert started.wait(PATIENCE)
    with watchdog():
        stats = lookup.shutdown()
    assert stats["groups_applied"] == 1, "the call in progress finished and was applied"


def test_wait_idle_releases_the_gil_for_other_python_threads():
    release = threading.Event()
    lookup = Lookup.python(lambda keys, req: (release.wait(PATIENCE), [True] * len(keys))[1])
    lookup.lookup(b"k", "r")
    lookup.flush()
    # Another Python thread lets the backend finish; it can only run while
    # wait_idle has let go of the GIL.
    threading.Timer(0.05, release.set).start()
    with watchdog():
        assert lookup.wait_idle() == 1
    assert lookup.lookup(b"k", "r") is HIT
    lookup.shutdown()


def test_a_lookup_caught_in_a_cycle_is_collected_and_stops_its_worker():
    class Owner:
        def __init__(self):
            self.lookup = Lookup.python(self.batch_lookup, name="kvtier-cycle")

        def batch_lookup(self, keys, req_id):
            return [False] * len(keys)

    owner = Owner()
    assert native_threads("kvtier-cycle", expect=1) == 1
    del owner
    import gc

    gc.collect()
    assert native_threads("kvtier-cycle", expect=0) == 0


# Faults of a Python backend ------------------------------------------------


@pytest.mark.parametrize(
    "backend, counter",
    [
        (lambda keys, req: 1 / 0, "backend_errors"),
        (lambda keys, req: None, "backend_errors"),  # not iterable
        (lambda keys, req: [True] * (len(keys) - 1), "short_results"),
        (lambda keys, req: [True] * (len(keys) + 5), "surplus_results"),
        (lambda keys, req: (True if i < 1 else 1 / 0 for i in range(len(keys))), "backend_errors"),
    ],
    ids=["raises", "not-iterable", "short", "surplus", "raises-midway"],
)
def test_a_faulty_python_backend_gives_misses_never_a_stuck_key(backend, counter):
    with Lookup.python(backend) as lookup:
        keys = [b"k1", b"k2", b"k3"]
        lookup.lookup_many(keys, "r")
        lookup.flush()
        lookup.wait_idle()
        verdicts, _ = lookup.lookup_many(keys, "r")
        assert RETRY not in verdicts, "no key left in flight"
        assert lookup.stats()[counter] == 1
        if counter != "surplus_results":
            assert verdicts[-1] is MISS


def test_an_endless_answer_iterator_is_cut_at_one_past_the_keys():
    import itertools

    with Lookup.python(lambda keys, req: itertools.repeat(True)) as lookup:
        lookup.lookup_many([b"k1", b"k2"], "r")
        lookup.flush()
        with watchdog():
            lookup.wait_idle()
        assert lookup.lookup_many([b"k1", b"k2"], "r") == ([HIT, HIT], 2)
        assert lookup.stats()["surplus_results"] == 1


def test_a_backend_object_with_batch_lookup_is_called_by_method():
    backend = ScriptedBackend(stored=[b"x"])
    with Lookup.python(backend) as lookup:
        assert resolve(lookup, b"x") is HIT
    assert backend.calls == [("r", [b"x"])]


# Bad input -------------------------------------------------------------------


def test_bad_input_raises_typed_errors(tmp_path):
    with pytest.raises(TypeError):
        Lookup.python(42)
    with pytest.raises(ConfigError):
        Lookup.vllm_fs(tmp_path, concurrency=0)
    with pytest.raises(ConfigError):
        Lookup.vllm_fs(tmp_path, group_timeout=-1.0)
    with pytest.raises(ConfigError):
        Lookup.vllm_fs(tmp_path, group_timeout=float("nan"))
    with pytest.raises(ConfigError):
        Lookup.vllm_fs("")
    with pytest.raises(TypeError, match="concurency"):
        Lookup.vllm_fs(tmp_path, concurency=2)  # a misspelt setting is not ignored
    with pytest.raises(ConfigError, match="threads is a whole number, not str"):
        Lookup.fs(tmp_path, "ns", threads="two")
    with pytest.raises(TierError):
        Lookup.fs(tmp_path / "missing", "ns")
    with pytest.raises(ConfigError):
        Lookup.fs(tmp_path, "../escape")
    with pytest.raises(ConfigError):
        Lookup.s3("http://not-s3/bucket")
    with pytest.raises(ConfigError):
        Lookup.s3("s3://bucket/ns?endpoint=http://127.0.0.1:1", access_key_id="only-half")
    with Lookup.python(lambda keys, req: [True] * len(keys)) as lookup:
        with pytest.raises(TypeError):
            lookup.lookup("not bytes", "r")
        with pytest.raises(TypeError):
            lookup.lookup(b"k", 42)
        with pytest.raises(TypeError):
            lookup.lookup_many([b"k", "str"], "r")
        with pytest.raises(ConfigError):
            lookup.set_limits(max_outstanding_keys=0)
        with pytest.raises(ConfigError):
            lookup.set_limits(pending_time=-5.0)
        assert isinstance(ConfigError("x"), kvtier.KvtierError)
    with pytest.raises(ShutdownError):
        lookup.flush()
    with pytest.raises(ShutdownError):
        lookup.stats()
    assert lookup.shutdown() is None


def test_a_rust_panic_surfaces_as_a_kvtier_exception():
    with pytest.raises(kvtier.InternalError, match="kvtier panicked: on purpose"):
        kvtier._native._panic_for_test("on purpose")


def test_limits_bound_what_waits(tmp_path):
    release = threading.Event()
    with Lookup.python(lambda keys, req: (release.wait(PATIENCE), [True] * len(keys))[1]) as lookup:
        lookup.set_limits(max_outstanding_keys=2)
        verdicts, _ = lookup.lookup_many([b"a", b"b", b"c"], "r")
        assert verdicts == [RETRY, RETRY, MISS], "the third key is shed"
        assert lookup.stats()["shed"] == 1
        release.set()


def test_shutdown_all_stops_every_live_lookup():
    lookups = [Lookup.python(lambda keys, req: [True] * len(keys), name=f"kvtier-all{i}") for i in range(3)]
    lookups[0].shutdown()
    assert kvtier._native.shutdown_all() == 2
    assert all(lookup.closed for lookup in lookups)
    assert native_threads("kvtier-all", expect=0) == 0

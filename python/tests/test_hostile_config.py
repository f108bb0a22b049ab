"""The package under hostile input (issue 31): numbers that used to abort
the process, settings that used to be misreported, answers judged by
truthiness, and wire messages that cost far more memory than their size.
Each test fails on the build before its fix."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import kvtier
from kvtier import ConfigError, Lookup, ReportAggregator, SaveStep, WireError
from kvtier._native import VllmTransfers
from kvtier.vllm import AsyncLookupManager

from conftest import PATIENCE


def isolated(code: str) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter: a case that used to abort the
    process fails its test instead of killing the test run."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def primary(blocks: int = 2, block: int = 64) -> memoryview:
    return memoryview(bytearray(blocks * block)).cast("B", (blocks, block))


# D2: a worker count sized two vectors unchecked (SIGABRT from 10**8 up).
@pytest.mark.parametrize("workers", [10**8, 2**31, 2**32, 2**40, 2**61, 2**63])
def test_a_huge_worker_count_is_a_configuration_error(workers):
    result = isolated(
        f"""
        import kvtier
        try:
            kvtier.ReportAggregator({workers})
        except kvtier.ConfigError as error:
            print("refused:", error)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "refused: an aggregator counts at most 4096 workers" in result.stdout


def test_the_largest_worker_count_is_taken():
    assert ReportAggregator(4096).waiting == 0
    with pytest.raises(ConfigError):
        ReportAggregator(0)


# D3 and D13: thread counts aborted the process (2**40) or wrapped (2**63 +
# 2**63 = 0 reported "need at least one I/O thread").
@pytest.mark.parametrize(
    "load, store", [(2**40, 0), (0, 2**40), (2**62, 0), (2**63, 2**63), (1024, 1)]
)
def test_huge_thread_counts_are_configuration_errors(tmp_path, load, store):
    result = isolated(
        f"""
        import kvtier
        from kvtier._native import VllmTransfers
        view = memoryview(bytearray(128)).cast("B", (2, 64))
        try:
            VllmTransfers({str(tmp_path / "m_r0")!r}, view, load_threads={load}, store_threads={store})
        except kvtier.ConfigError as error:
            print("refused:", error)
        """
    )
    assert result.returncode == 0, result.stderr
    # Each side past the cap names itself; two sides within it whose sum
    # is past it are refused by the pool.
    assert "refused:" in result.stdout, result.stdout
    assert "0 to 1024 threads" in result.stdout or "at most 1024 I/O threads" in result.stdout, result.stdout


def test_the_largest_thread_count_is_taken(tmp_path):
    transfers = VllmTransfers(str(tmp_path / "m_r0"), primary(), load_threads=512, store_threads=512)
    assert transfers.threads_alive == 1024
    transfers.shutdown()


# D13: durations too large for a Duration were called "not a finite number >= 0".
@pytest.mark.parametrize(
    "make",
    [
        lambda d: Lookup.vllm_fs(d, shutdown_grace=1e20),
        lambda d: Lookup.vllm_fs(d, group_timeout=1e308),
        lambda d: Lookup.python(lambda keys, req: [False] * len(keys), shutdown_grace=1e20),
    ],
)
def test_a_duration_too_long_says_so(tmp_path, make):
    with pytest.raises(ConfigError, match="too long"):
        make(str(tmp_path))


def test_pending_time_too_long_says_so_and_negative_says_so(tmp_path):
    with Lookup.vllm_fs(str(tmp_path)) as lookup:
        with pytest.raises(ConfigError, match="too long"):
            lookup.set_limits(pending_time=1e20)
        with pytest.raises(ConfigError, match=">= 0"):
            lookup.set_limits(pending_time=-1.0)
        with pytest.raises(ConfigError, match=">= 0"):
            lookup.set_limits(pending_time=float("nan"))


@pytest.mark.parametrize("concurrency", [0, 2**17, 2**62])
def test_a_concurrency_out_of_range_is_a_configuration_error(tmp_path, concurrency):
    with pytest.raises(ConfigError, match="concurrency is .*; it must be 1 to 65536 groups"):
        Lookup.vllm_fs(str(tmp_path), concurrency=concurrency)


# D13: a NUL in the rank directory was accepted, and every key then missed.
def test_a_rank_directory_with_a_nul_is_refused():
    with pytest.raises(ConfigError, match="NUL"):
        Lookup.vllm_fs("a\0b")
    with pytest.raises(ConfigError, match="NUL"):
        VllmTransfers("a\0b", primary())


# D10: a NUL in a name was reported as a kvtier bug (InternalError).
def test_a_nul_in_a_lookup_name_or_tier_type_is_a_configuration_error():
    with pytest.raises(ConfigError, match="NUL"):
        Lookup.python(lambda keys, req: [False] * len(keys), name="kv\0tier")
    class Manager(AsyncLookupManager):
        def batch_lookup(self, keys, req_context):
            return [False] * len(keys)

    with pytest.raises(ConfigError, match="NUL"):
        Manager("tier\0type")


# D9: CR/LF in an S3 credential was accepted; every probe then panicked in
# the S3 client and every key missed.
@pytest.mark.parametrize(
    "key_id, secret",
    [("AKID\r\nX-Evil: 1", "secret"), ("AKID", "sec\nret"), ("AKID EX", "secret"), ("", "s")],
)
def test_an_s3_credential_with_a_control_byte_is_refused(key_id, secret):
    with pytest.raises(ConfigError, match="access_key_id|secret_access_key"):
        Lookup.s3(
            "s3://bucket?endpoint=http://127.0.0.1:9",
            access_key_id=key_id,
            secret_access_key=secret,
        )


# D14: answers were judged by truthiness: "False", b"\0", a dict's keys hit.
@pytest.mark.parametrize(
    "answers",
    [
        lambda keys: ["False"] * len(keys),
        lambda keys: [b"\x00"] * len(keys),
        lambda keys: {key: False for key in keys},
        lambda keys: [1] * len(keys),
        lambda keys: [None] * len(keys),
    ],
)
def test_an_answer_that_is_not_a_bool_makes_the_group_miss(answers):
    with Lookup.python(lambda keys, req: answers(keys)) as lookup:
        assert lookup.lookup(b"k1", "r") is None
        assert lookup.lookup(b"k2", "r") is None
        lookup.flush()
        lookup.wait_idle()
        assert lookup.lookup(b"k1", "r") is False
        assert lookup.lookup(b"k2", "r") is False
        assert lookup.stats()["backend_errors"] == 1


def test_bools_and_numpys_bools_are_answers():
    numpy = pytest.importorskip("numpy")
    for answer in (True, numpy.bool_(True)):
        with Lookup.python(lambda keys, req, a=answer: [a] * len(keys)) as lookup:
            lookup.lookup(b"k", "r")
            lookup.flush()
            lookup.wait_idle()
            assert lookup.lookup(b"k", "r") is True


# D7: a 64 MiB step of empty ids took the process from 140 MB to 1.7 GB.
def test_the_largest_message_of_empty_ids_is_refused_without_its_cost():
    result = isolated(
        """
        import kvtier

        def high_water():
            with open("/proc/self/status") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024

        count = (64 << 20) - 8
        body = bytes([0, 2]) + bytes([count & 0x7f | 0x80, count >> 7 & 0x7f | 0x80,
                                      count >> 14 & 0x7f | 0x80, count >> 21])
        body += bytes(count) + bytes([0, 0])
        message = b"KVTW\\x01\\x01" + len(body).to_bytes(4, "little") + body
        before = high_water()
        try:
            kvtier.SaveStep.decode(message)
        except kvtier.WireError as error:
            print("refused:", error)
        print("grew", high_water() - before)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "refused:" in result.stdout and "memory budget" in result.stdout, result.stdout
    grew = int(result.stdout.split("grew")[1])
    assert grew < 64 << 20, f"decoding grew the process by {grew} bytes"


def test_a_message_of_realistic_ids_decodes_and_its_lists_read():
    scheduler = kvtier.SaveScheduler()
    saves = [(f"cmpl-{i:032x}-0", 1) for i in range(20_000)]
    step = scheduler.record_step(saves)
    decoded = SaveStep.decode(step.encode())
    assert decoded.requests == [req for req, _ in saves]
    assert decoded == step


def test_a_message_past_its_budget_is_refused_by_the_encoder_too():
    scheduler = kvtier.SaveScheduler()
    # Ids of one or two characters (3 to 4 bytes of UTF-8): 56 bytes each
    # once decoded, over 8 per byte of the message.
    ids = [chr(i) for i in range(0x800, 0xD800)] + ["a" + chr(i) for i in range(0x800, 0xD800)]
    step = scheduler.record_step([(i, 1) for i in ids])
    with pytest.raises(WireError, match="memory budget"):
        step.encode()

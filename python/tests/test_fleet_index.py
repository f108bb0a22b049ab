"""The fleet's books (issue 43) from Python: ``index`` and ``index_lease``
pass the one door (``check_settings``) with their rules, and
``VllmTransfers.objects(..., index=...)`` with ``Lookup.vllm_objects(...,
transfers=...)`` share one budget and answer lookups from the books, on a
real Valkey (python/integration/valkey.py's binary; skipped without one)
and the S3 test server."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest

from kvtier import HIT, MISS, ConfigError
from kvtier._native import Lookup, VllmTransfers, check_settings
from kvtier.vllm import make_key

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
import valkey as valkey_fixture  # noqa: E402

BLOCK = 4096
URL = "s3://kv-cache/fleet?endpoint=http://127.0.0.1:9"


def refused(values) -> str:
    with pytest.raises(ConfigError) as error:
        check_settings(values)
    return str(error.value)


def test_the_index_passes_the_door_with_its_rules():
    checked = check_settings({"url": URL, "capacity_bytes": 1 << 20, "index": "redis://127.0.0.1:6379/0"})
    assert checked["index"] == "redis://127.0.0.1:6379/0"
    assert checked["index_lease"] == 30.0
    checked = check_settings(
        {"url": URL, "capacity_bytes": 1 << 20, "index": "valkey://10.0.0.5", "index_lease": 5}
    )
    assert checked["index_lease"] == 5.0
    assert "without capacity_bytes" in refused({"url": URL, "index": "redis://h"})
    assert "without url or store_config" in refused({"capacity_bytes": 1, "index": "redis://h"})
    assert "index_lease is set without index" in refused({"url": URL, "index_lease": 5})
    message = refused({"url": URL, "capacity_bytes": 1, "index": "http://u:hunter2@h"})
    assert message.startswith("index ") and "hunter2" not in message
    assert "index_lease" in refused({"url": URL, "capacity_bytes": 1, "index": "redis://h", "index_lease": 0.1})
    assert "index" in refused({"url": URL, "capacity_bytes": 1, "index": 6379})


def _binary():
    named = os.environ.get("KVTIER_VALKEY")
    if named:
        return named
    installed = valkey_fixture._installed()
    return str(installed) if installed else shutil.which("redis-server")


@pytest.fixture()
def valkey_url(tmp_path):
    binary = _binary()
    if binary is None:
        pytest.skip("no Valkey: python3 python/integration/valkey.py install, or KVTIER_VALKEY")
    os.environ.setdefault("KVTIER_VALKEY", binary)
    server = valkey_fixture.Valkey(tmp_path / "valkey").start()
    try:
        yield server.url
    finally:
        server.close()


def key(n: int) -> bytes:
    return make_key(n.to_bytes(8, "big"), 0)


def test_hosts_share_the_books_and_lookups_ask_them(valkey_url, s3_endpoint, s3_client):
    bucket = f"fleet-{uuid.uuid4().hex[:8]}"
    s3_client.create_bucket(Bucket=bucket)
    settings = check_settings(
        {
            "url": f"s3://{bucket}/fleet?endpoint={s3_endpoint}",
            "capacity_bytes": 3 * BLOCK,
            "index": valkey_url,
            "index_lease": 5,
        }
    )
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    target, prefix = settings["object_target"], "fleet/m_0123456789ab_r0"
    hosts = []
    for _ in range(2):
        view = memoryview(bytearray(4 * BLOCK)).cast("B", (4, BLOCK))
        transfers = VllmTransfers.objects(
            target,
            prefix,
            view,
            load_threads=1,
            store_threads=1,
            capacity_bytes=settings["capacity_bytes"],
            index=settings["index"],
            index_lease=settings["index_lease"],
        )
        hosts.append((view, transfers))
    try:
        for n in range(5):
            view, transfers = hosts[n % 2]
            view.obj[0:BLOCK] = bytes([n]) * BLOCK
            transfers.submit_store(n, [key(n)], [0])
            transfers.drain()
            assert [done[2] for done in transfers.finished()] == [True]
            listed = s3_client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("KeyCount", 0)
            assert listed <= 3, f"after store {n}"
        hosts[0][1].reconcile()  # the figures are the last upkeep's: one now
        stats = hosts[0][1].capacity_stats()
        assert (stats["resident_bytes"], stats["capacity_bytes"]) == (3 * BLOCK, 3 * BLOCK)
        lookup = Lookup.vllm_objects(target, prefix, transfers=hosts[1][1], concurrency=1, group_timeout=5.0)
        try:
            keys = [key(n) for n in range(5)]
            lookup.lookup_many(keys, "r")
            lookup.flush()
            lookup.wait_idle()
            verdicts, _ = lookup.lookup_many(keys, "r")
            # Blocks 0 and 1 were evicted (the least recent across both
            # hosts); the books answer, no HEAD is sent.
            assert verdicts == [MISS, MISS, HIT, HIT, HIT]
        finally:
            lookup.shutdown()
        # A process without transfers (the KV connector's scheduler): the
        # lookup's own connection to the same books.
        lookup = Lookup.vllm_objects(
            target, prefix, index=settings["index"], index_lease=5, capacity_bytes=3 * BLOCK,
            concurrency=1, group_timeout=5.0,
        )
        try:
            keys = [key(n) for n in range(5)]
            lookup.lookup_many(keys, "r")
            lookup.flush()
            lookup.wait_idle()
            assert lookup.lookup_many(keys, "r")[0] == [MISS, MISS, HIT, HIT, HIT]
        finally:
            lookup.shutdown()
        with pytest.raises(ConfigError, match="capacity_bytes"):
            Lookup.vllm_objects(target, prefix, index=settings["index"])
        with pytest.raises(ConfigError, match="exclusive"):
            Lookup.vllm_objects(target, prefix, index=settings["index"], capacity_bytes=BLOCK,
                                transfers=hosts[0][1])
        with pytest.raises(ConfigError, match="without index"):
            Lookup.vllm_objects(target, prefix, capacity_bytes=BLOCK)
    finally:
        for _, transfers in hosts:
            transfers.shutdown(0.0)

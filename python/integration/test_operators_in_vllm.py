"""What operators of kvtier inside vLLM rely on, checked against vLLM's own
machinery (run in vLLM's venv, as vllm.sh does):

- a refused configuration has changed nothing on disk (the startup scan
  runs only once every setting is checked);
- kvtier's figures reach vLLM's Prometheus metrics: the tier's
  definitions through vLLM's own ``OffloadPromMetrics`` (as the tiering
  spec collects them), its ``get_stats()`` as increases, the connector's
  through its ``build_prom_metrics``;
- the connector refuses a KV cache on a device, naming the alternative.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

import kvtier
from kvtier.vllm import FsTier
from kvtier.vllm.connector import StorageConnector, _refuse_device_caches
from kvtier.vllm.metrics import PREFIX, KvtierPromMetrics, metric_definitions
from vllm.v1.kv_offload.base import LookupResult
from vllm.v1.kv_offload.tiering.base import TransferJob

from vllm_support import STEP_END, context, key, offloading_spec, primary_memory

BLOCKS, BLOCK_BYTES = 8, 64 * 1024


def job(job_id, keys, chunk_ids, promotion=False):
    return TransferJob(
        job_id=job_id,
        keys=keys,
        chunk_ids=np.array(chunk_ids, dtype=np.int64),
        is_promotion=promotion,
        req_context=context("r"),
    )


def finish(tier):
    tier.drain_jobs()
    return list(tier.get_finished_jobs())


@pytest.fixture
def memory():
    return primary_memory(BLOCKS, BLOCK_BYTES)


def tier(root, memory, **settings):
    return FsTier(
        offloading_spec=offloading_spec(),
        primary_kv_view=memoryview(memory),
        tier_type="FsTier",
        root_dir=str(root),
        **{"n_read_threads": 1, "n_write_threads": 1, **settings},
    )


def block_files(root):
    return sorted(p for p in root.rglob("*.bin"))


@pytest.mark.parametrize(
    "bad",
    [{"lookup_concurrency": 0}, {"lookup_timeout": 0}, {"lookup_concurrency": 10**6}, {"lookup_timeout": -1.0}],
)
def test_a_refused_configuration_deletes_nothing(tmp_path, memory, bad):
    # Six blocks a first engine stored.
    first = tier(tmp_path, memory)
    try:
        first.submit_store(job(1, [key(n) for n in range(6)], list(range(6))))
        assert [r.success for r in finish(first)] == [True]
    finally:
        first.shutdown()
    stored = block_files(tmp_path)
    assert len(stored) == 6
    # A budget of one block, and a lookup setting out of range: refused,
    # and the scan that would have trimmed five blocks never ran.
    with pytest.raises(kvtier.ConfigError):
        tier(tmp_path, memory, capacity_bytes=BLOCK_BYTES, **bad)
    assert block_files(tmp_path) == stored


@pytest.mark.parametrize(
    "bad, message",
    [
        # The hostile pass of issue 41: each was accepted (True as 1 s, 1
        # group or 1 thread; 'LRU'; a policy with no budget; a budget
        # smaller than a block, after which every store failed), or refused
        # with a message that did not name the setting.
        ({"stale_temp_age": True}, "stale_temp_age is a number of seconds, not bool"),
        ({"shutdown_grace": True}, "shutdown_grace is a number of seconds, not bool"),
        ({"lookup_timeout": True}, "lookup_timeout is a number of seconds, not bool"),
        ({"lookup_concurrency": True}, "lookup_concurrency is a whole number, not bool"),
        ({"n_read_threads": True}, "n_read_threads is a whole number, not bool"),
        ({"capacity_bytes": 10 * BLOCK_BYTES, "rescan_interval": True}, "rescan_interval is a number of seconds"),
        ({"capacity_bytes": 10 * BLOCK_BYTES, "eviction_policy": "LRU"}, 'eviction_policy is "LRU"'),
        ({"capacity_bytes": 10 * BLOCK_BYTES, "eviction_policy": "S3-FIFO"}, 'must be "lru" or "s3fifo"'),
        ({"eviction_policy": "s3fifo"}, "eviction_policy is set without capacity_bytes"),
        ({"capacity_bytes": BLOCK_BYTES - 1}, "capacity_bytes is 65535; it must hold at least one block"),
        ({"lookup_concurrency": "4"}, "lookup_concurrency is a whole number, not str"),
        ({"stale_temp_age": 86_401}, r"stale_temp_age is 86401 seconds, too long: at most 86400 \(a day\)"),
    ],
)
def test_fs_tier_settings_pass_one_door_and_errors_name_them(tmp_path, memory, bad, message):
    with pytest.raises(kvtier.ConfigError, match=message):
        tier(tmp_path, memory, **bad)
    assert block_files(tmp_path) == []


def test_the_tiers_figures_are_vllms_metric_definitions_and_report_increases(tmp_path, memory):
    definitions = FsTier.build_metric_definitions({})
    assert definitions == metric_definitions()
    for name, meta in definitions.items():
        assert name.startswith("vllm:kvtier_"), name
        assert name.endswith(("_bytes", "_seconds", "_total", "entries")), name
        assert meta.labelnames == ("tier",)
    t = tier(tmp_path, memory, capacity_bytes=3 * BLOCK_BYTES)
    try:
        t.get_stats()  # whatever the start reported
        ctx = context("req")
        assert t.lookup(key(0), ctx) == LookupResult.RETRY
        t.on_schedule_end(STEP_END)
        t._lookup_manager.wait_idle()
        assert t.lookup(key(0), ctx) == LookupResult.MISS
        t.submit_store(job(1, [key(n) for n in range(4)], [0, 1, 2, 3]))
        assert [r.success for r in finish(t)] == [True]
        t.submit_load(job(2, [key(3), key(0)], [4, 5], promotion=True))
        assert [r.success for r in finish(t)] == [False]  # key 0 was evicted
        values = t.get_stats().data["data"]
        label = ("FsTier",)

        def value(name):
            return values[PREFIX + name][label]

        assert value("store_bytes_total") == 4 * BLOCK_BYTES
        assert (value("load_bytes_total"), value("load_failures_total")) == (BLOCK_BYTES, 1)
        assert (value("evictions_total"), value("resident_bytes"), value("entries")) == (1, 3 * BLOCK_BYTES, 3)
        assert value("capacity_bytes") == 3 * BLOCK_BYTES
        assert value("lookup_misses_total") == 1
        assert len(values[PREFIX + "lookup_verdict_seconds"][label]) == 1
        # Counters report their increase: nothing new, no counter.
        again = t.get_stats().data["data"]
        assert PREFIX + "store_bytes_total" not in again and PREFIX + "evictions_total" not in again
        t.submit_store(job(3, [key(5)], [0]))
        assert [r.success for r in finish(t)] == [True]
        later = t.get_stats().data["data"]
        assert later[PREFIX + "store_bytes_total"][label] == BLOCK_BYTES
        assert later[PREFIX + "evictions_total"][label] == 1
    finally:
        t.shutdown()


def exposition(prom: KvtierPromMetrics, registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def registered_metric_types(registry: CollectorRegistry):
    """prometheus_client's metric classes, registering in ``registry``."""

    def bind(cls):
        class Bound(cls):  # type: ignore[misc, valid-type]
            def __init__(self, *args, **kwargs):
                super().__init__(*args, registry=registry, **kwargs)

        return Bound

    return {Gauge: bind(Gauge), Counter: bind(Counter), Histogram: bind(Histogram)}


def test_vllms_offload_prom_metrics_export_the_tiers_figures(tmp_path, memory, monkeypatch):
    """The tiering path as vLLM runs it: its OffloadPromMetrics collects the
    spec's definitions (kvtier's tier's among them) and observes the
    payload the tier's get_stats() gave."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadPromMetrics

    registry = CollectorRegistry()
    config = type("Config", (), {})()
    config.kv_transfer_config = type("Transfer", (), {})()
    config.kv_transfer_config.kv_connector_extra_config = {
        "spec_name": "CpuTieringSpec",
        "spec_module_path": "kvtier.vllm.cpu",
        "secondary_tiers": [{"type": "FsTier", "module_path": "kvtier.vllm", "root_dir": str(tmp_path)}],
    }
    prom = OffloadPromMetrics(config, registered_metric_types(registry), ["engine"], {0: ["0"]})
    t = tier(tmp_path, memory)
    try:
        t.submit_store(job(1, [key(0), key(1)], [0, 1]))
        assert [r.success for r in finish(t)] == [True]
        prom.observe(t.get_stats().data, engine_idx=0)
    finally:
        t.shutdown()
    text = exposition(prom, registry)
    assert f'vllm:kvtier_store_bytes_total{{engine="0",tier="FsTier"}} {float(2 * BLOCK_BYTES)}' in text, text


def test_the_connectors_prom_metrics_export_its_figures():
    registry = CollectorRegistry()
    config = type("Config", (), {"kv_transfer_config": None})()
    prom = StorageConnector.build_prom_metrics(config, registered_metric_types(registry), ["engine"], {0: ["0"]})
    assert isinstance(prom, KvtierPromMetrics)
    payload = {
        "types": {PREFIX + "store_bytes_total": "counter", PREFIX + "resident_bytes": "gauge",
                  PREFIX + "lookup_verdict_seconds": "histogram", "vllm:other": "counter"},
        "data": {
            PREFIX + "store_bytes_total": {("connector_r0",): 4096},
            PREFIX + "resident_bytes": {("connector_r0",): 8192},
            PREFIX + "lookup_verdict_seconds": {("connector",): [0.003, 0.2]},
            "vllm:other": {(): 1},
        },
    }
    stats = StorageConnector.build_kv_connector_stats(payload)
    assert stats.data == payload and not stats.is_empty()
    assert StorageConnector.build_kv_connector_stats(None).is_empty()
    prom.observe(stats.data, engine_idx=0)
    prom.observe(stats.data, engine_idx=0)
    text = exposition(prom, registry)
    assert 'vllm:kvtier_store_bytes_total{engine="0",tier="connector_r0"} 8192.0' in text
    assert 'vllm:kvtier_resident_bytes{engine="0",tier="connector_r0"} 8192.0' in text
    assert 'vllm:kvtier_lookup_verdict_seconds_count{engine="0",tier="connector"} 4.0' in text
    assert "vllm:other" not in text


class ShadowStorageConnector(StorageConnector):
    """A subclass, as a wrapper of kvtier's connector would be."""


def test_multiconnector_rebuilds_the_connectors_stats_by_its_name():
    """MultiConnector looks each inner connector's stats class up by the
    class's name; kvtier's connector, loaded by module path, and its
    subclasses are in vLLM's registry once their module is imported."""
    from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector

    payload = {"types": {PREFIX + "store_bytes_total": "counter"},
               "data": {PREFIX + "store_bytes_total": {("connector_r0",): 4096}}}
    for name in ("StorageConnector", "ShadowStorageConnector"):
        stats = MultiConnector.build_kv_connector_stats({name: payload})
        assert stats is not None and stats.data[name].data == payload, name


def test_the_connector_refuses_a_kv_cache_on_a_device_and_names_the_alternative():
    _refuse_device_caches({"model.layers.0.attn": torch.zeros(4)})
    with pytest.raises(kvtier.ConfigError, match="OffloadingConnector") as refused:
        _refuse_device_caches({"model.layers.0.attn": torch.empty(4, device="meta")})
    assert "FsTier" in str(refused.value) and "meta" in str(refused.value)

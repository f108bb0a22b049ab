"""kvtier's KV connector on a bucket bounded by the fleet's books
(``index``): SeaweedFS and Valkey on loopback (``seaweed.py``,
``valkey.py``), vLLM's real ``Scheduler`` (``connector_sim.Cluster``).
Two engines share a prefix and one ``capacity_bytes``: the workers' dumps
reserve and commit in the books (the bucket never holds more than the
budget), and the scheduler's lookups ask the books over a connection of
their own: the second engine loads what the first dumped. An ``index``
without a bucket is an error at start that names it.

Run by ``vllm.sh`` with the connector tests' environment (``KVTIER_VLLM_SDIST``
and an offline ``HF_HOME``)."""

from __future__ import annotations

import pytest
import torch

from connector_sim import Cluster, _fill, connector_config
from kvtier import ConfigError
from seaweed import Seaweed
from test_connector_in_vllm import _prefill, _request, _settle, _step_until
from valkey import Valkey

BUCKET = "kvtier-connector-books"


@pytest.fixture(scope="module")
def server():
    with Seaweed(buckets=[BUCKET], anonymous=True) as server:
        yield server


@pytest.fixture
def valkey():
    with Valkey() as valkey:
        yield valkey


def books(server: Seaweed, valkey: Valkey, prefix: str, capacity: int) -> dict:
    return {
        "store_config": server.store_config(BUCKET),
        "prefix": prefix,
        "request_timeout": 2.0,
        "max_retries": 1,
        "capacity_bytes": capacity,
        "index": valkey.url,
        "index_lease": 5.0,
    }


def books_committed(valkey: Valkey) -> int:
    (meta,) = valkey.ask("KEYS", "kvtier:*:meta")
    fields = valkey.ask("HGETALL", meta)
    return int(dict(zip(fields[0::2], fields[1::2]))["committed"])


def test_two_engines_share_one_budget_and_the_books_answer_the_lookups(server, valkey, tmp_path) -> None:
    sizing = Cluster(connector_config(str(tmp_path)))
    page = sizing.page
    sizing.shutdown()
    # Room for eight blocks: the first request's six, then two of the
    # second's six after four evictions.
    capacity = 8 * page
    a = Cluster(connector_config(None, **books(server, valkey, "shared", capacity)))
    request = a.add(_request())
    _prefill(a, request)
    _settle(a)
    keys = a.keys_of(request, 6)
    assert sum(server.list_objects(BUCKET, "shared/").values()) == 6 * page
    assert books_committed(valkey) == 6 * page
    a.shutdown()

    # Engine B: the twin's blocks are hits in the books, and loaded.
    b = Cluster(connector_config(None, **books(server, valkey, "shared", capacity)))
    assert ", books)" in repr(b.connector._scheduler.lookup), "the books answer the scheduler's lookups"
    twin = b.add(_request(request_id=int(request.request_id.split("-")[1])))
    so = _step_until(b, lambda so: twin.request_id in so.num_scheduled_tokens)
    assert so.num_scheduled_tokens[twin.request_id] == 100 - 96, "96 tokens loaded"
    rows = b.caches[0].view(b.num_blocks, -1).view(torch.int8)
    for key, block in zip(keys, b.blocks_of(twin.request_id)[:6]):
        assert bytes(rows[block].numpy().tobytes()) == bytes(_fill(key, b.page).numpy().tobytes())
    b.run(4)
    _settle(b)
    # A new prompt of six blocks: the books evict to stay within eight.
    other = b.add(_request(request_id=4343))
    _prefill(b, other)
    _settle(b)
    held = sum(server.list_objects(BUCKET, "shared/").values())
    assert held <= capacity and books_committed(valkey) <= capacity, (held, capacity)
    assert books_committed(valkey) == held, "every object in the bucket is counted, and only those"
    b.shutdown()


def test_an_index_without_a_bucket_is_refused_at_start(valkey, tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"kv_connector_extra_config\['index'\]"):
        Cluster(connector_config(str(tmp_path), capacity_bytes=1 << 20, index=valkey.url))

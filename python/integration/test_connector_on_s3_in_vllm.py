"""kvtier's KV connector with its blocks in an S3 bucket (SeaweedFS on
loopback, ``seaweed.py``) instead of a directory, through vLLM's real
``Scheduler`` (``connector_sim.Cluster``): ``kv_connector_extra_config``
takes kvtier's ``url`` or vLLM's obj tier's ``store_config`` and
``prefix`` instead of ``root_dir``, with the same deferred dumps: a
finished request is freed only once its dumps are in the bucket, and a
second engine loads the dumped bytes. A bad store is an error at start
that names the setting.

Run by ``vllm.sh`` with the connector tests' environment (``KVTIER_VLLM_SDIST``
and an offline ``HF_HOME``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from connector_sim import Cluster, _fill, connector_config
from kvtier import ConfigError
from seaweed import ACCESS_KEY, SECRET_KEY, Seaweed
from test_connector_in_vllm import _prefill, _request, _settle, _step_until

BUCKET = "kvtier-connector"


@pytest.fixture(scope="module")
def server():
    with Seaweed(buckets=[BUCKET], anonymous=True) as server:
        yield server


def store(server: Seaweed, prefix: str, **overrides: Any) -> dict[str, Any]:
    return {
        "store_config": server.store_config(BUCKET, **overrides),
        "prefix": prefix,
        "request_timeout": 2.0,
        "max_retries": 1,
    }


@pytest.mark.parametrize("multi", [None, "offloading"])
def test_dumps_land_in_the_bucket_before_the_free_and_a_second_engine_loads_them(server, multi) -> None:
    prefix = f"dumps-{multi or 'alone'}"
    first = Cluster(connector_config(None, multi=multi, **store(server, prefix)))
    request = first.add(_request())
    _prefill(first, request)
    _settle(first)
    assert first.freed == [request.request_id]
    keys = first.keys_of(request, 6)
    objects = server.list_objects(BUCKET, prefix + "/")
    assert len(objects) == 6 and set(objects.values()) == {first.page}, objects
    first.shutdown()

    again = Cluster(connector_config(None, multi=multi, **store(server, prefix)))
    twin = again.add(_request(request_id=int(request.request_id.split("-")[1])))
    so = _step_until(again, lambda so: twin.request_id in so.num_scheduled_tokens)
    assert so.num_scheduled_tokens[twin.request_id] == 100 - 96
    rows = again.caches[0].view(again.num_blocks, -1).view(torch.int8)
    for key, block in zip(keys, again.blocks_of(twin.request_id)[:6]):
        assert bytes(rows[block].numpy().tobytes()) == bytes(_fill(key, again.page).numpy().tobytes())
    again.run(4)
    _settle(again)
    again.shutdown()


def test_kvtiers_url_with_the_environments_credentials(server, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    cluster = Cluster(connector_config(None, url=f"s3://{BUCKET}/by-url?endpoint={server.endpoint}"))
    request = cluster.add(_request())
    _prefill(cluster, request)
    _settle(cluster)
    assert len(server.list_objects(BUCKET, "by-url/")) == 6
    cluster.shutdown()


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"secret_key": "s3cr3t-wrong-value"}, r"kv_connector_extra_config\['store_config'\]\['access_key'\]"),
        ({"bucket": "no-such-bucket"}, r"kv_connector_extra_config\['store_config'\]\['bucket'\]"),
        ({"endpoint_override": "127.0.0.1:1"}, r"kv_connector_extra_config\['store_config'\]\['endpoint_override'\]"),
    ],
)
def test_a_bad_store_is_an_error_at_start_that_names_the_setting(server, extra, message) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        Cluster(connector_config(None, **store(server, "bad", **extra)))
    assert "s3cr3t-wrong-value" not in str(error.value)


def test_a_directory_and_a_bucket_together_are_refused(server, tmp_path) -> None:
    with pytest.raises(ConfigError, match="not both"):
        Cluster(connector_config(str(tmp_path), **store(server, "both")))

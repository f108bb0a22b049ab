"""An object store's settings pass the one door too (issue 42):
``check_settings`` takes kvtier's ``url`` or vLLM's obj tier's
``store_config`` and ``prefix``, with the requests' timeouts and retries,
checks each by ``kvtier::settings::ObjectTarget``'s rules, names what it
refuses as the caller wrote it, and returns one ``ObjectTarget`` that never
shows a secret. Nothing here talks to a server."""

from __future__ import annotations

import pytest

from kvtier import ConfigError
from kvtier._native import ObjectTarget, check_settings

EXTRA = "kv_connector_extra_config"
CONFIG = {"bucket": "kv-cache", "endpoint_override": "127.0.0.1:9000", "access_key": "AKID", "secret_key": "s3cr3t"}


def target(**values) -> ObjectTarget:
    return check_settings(values)["object_target"]


def refused(values, where=None) -> str:
    with pytest.raises(ConfigError) as error:
        check_settings(values, where)
    return str(error.value)


def test_vllms_store_config_and_kvtiers_url_name_the_same_place():
    vllms = target(store_config=CONFIG, prefix="/fleet/")
    ours = target(url="s3://kv-cache/fleet?endpoint=http://127.0.0.1:9000")
    for t in (vllms, ours):
        assert (t.bucket, t.prefix, t.endpoint) == ("kv-cache", "fleet", "http://127.0.0.1:9000")
    assert vllms.join("m_0123_r0") == "fleet/m_0123_r0"
    assert target(store_config=CONFIG).join("m_r0") == "m_r0", "no prefix: the bucket's top"


def test_an_empty_store_config_entry_counts_as_absent_as_in_vllm():
    t = target(store_config=dict(CONFIG, access_key="", secret_key="", region="", session_token=""))
    assert "AKID" not in repr(t)


def test_no_secret_is_ever_shown():
    t = target(store_config=dict(CONFIG, session_token="t0k3n"))
    assert "AKID" in repr(t)
    assert "s3cr3t" not in repr(t) and "t0k3n" not in repr(t)


@pytest.mark.parametrize(
    "values, named",
    [
        ({"store_config": dict(CONFIG, acess_key="x")}, "store_config['acess_key']"),
        ({"store_config": {"endpoint_override": "h:1"}}, "store_config['bucket']"),
        ({"store_config": dict(CONFIG, secret_key="")}, "store_config['secret_key']"),
        ({"store_config": dict(CONFIG, scheme="ftp")}, "store_config['scheme']"),
        ({"store_config": dict(CONFIG, bucket="Not_A_Bucket")}, "store_config"),
        ({"store_config": dict(CONFIG, bucket=7)}, "store_config['bucket']"),
        ({"store_config": "bucket=kv"}, "store_config"),
        ({"store_config": CONFIG, "prefix": "a/../b"}, "prefix"),
        ({"store_config": CONFIG, "prefix": 3}, "prefix"),
        ({"url": "s3://kv-cache", "store_config": CONFIG}, "url"),
        ({"url": "s3://kv-cache/x", "prefix": "y"}, "prefix"),
        ({"url": "http://kv-cache/x"}, "url"),
        ({"url": b"s3://kv-cache"}, "url"),
        ({"prefix": "fleet"}, "prefix"),
        ({"request_timeout": 1.0}, "request_timeout"),
        ({"url": "s3://kv-cache", "request_timeout": 0}, "request_timeout"),
        ({"url": "s3://kv-cache", "request_timeout": 61}, "request_timeout"),
        ({"url": "s3://kv-cache", "request_timeout": True}, "request_timeout"),
        ({"url": "s3://kv-cache", "connect_timeout": float("nan")}, "connect_timeout"),
        ({"url": "s3://kv-cache", "max_retries": 11}, "max_retries"),
        ({"url": "s3://kv-cache", "max_retries": -1}, "max_retries"),
        ({"url": "s3://kv-cache", "max_retries": False}, "max_retries"),
    ],
)
def test_each_refusal_names_the_setting(values, named):
    assert refused(values).startswith(named)
    # And as a connector's extra config spells it.
    spelled = named.replace(named.split("[")[0], f"{EXTRA}['{named.split('[')[0]}']", 1)
    assert refused(values, EXTRA).startswith(spelled)


def test_the_request_settings_reach_the_target():
    t = target(url="s3://kv-cache", request_timeout=0.5, connect_timeout=0.25, max_retries=0)
    shown = repr(t)
    assert "request_timeout: 500ms" in shown and "connect_timeout: 250ms" in shown and "max_retries: 0" in shown


def test_without_a_store_nothing_is_returned_for_it():
    assert "object_target" not in check_settings({"lookup_timeout": 1.0})
    assert "object_target" not in check_settings({"url": None, "store_config": None})

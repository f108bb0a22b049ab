"""One door for every setting (issue 41): ``kvtier._native.check_settings``
and the bindings that build tiers check each setting by the core's rules
(``kvtier::settings``), name it as the caller wrote it, and agree: a
``bool`` is never a number, one day bounds every duration, the policy
names are exactly ``lru`` and ``s3fifo``, a budget's other settings need a
capacity, and a capacity must hold a block.
"""

from __future__ import annotations

import pytest

from kvtier import ConfigError
from kvtier._native import BlockCopier, Lookup, VllmTransfers, check_settings

BLOCK = 4096
EXTRA = "kv_connector_extra_config"


def primary(blocks: int) -> memoryview:
    return memoryview(bytearray(blocks * BLOCK)).cast("B", (blocks, BLOCK))


NUMBERS = [
    "rescan_interval",
    "stale_temp_age",
    "shutdown_grace",
    "lookup_timeout",
    "lookup_concurrency",
    "n_read_threads",
    "n_write_threads",
    "copy_threads",
    "io_threads",
    "staging_bytes",
]


@pytest.mark.parametrize("name", NUMBERS)
@pytest.mark.parametrize("value", [True, False])
def test_a_bool_is_never_a_number(name, value):
    settings = {name: value}
    if name == "rescan_interval":
        settings["capacity_bytes"] = 1 << 20
    with pytest.raises(ConfigError, match=f"{name} is a "):
        check_settings(settings)
    with pytest.raises(ConfigError, match=rf"{EXTRA}\['{name}'\] is a "):
        check_settings(settings, EXTRA)


@pytest.mark.parametrize("name", ["stale_temp_age", "shutdown_grace", "lookup_timeout", "rescan_interval"])
def test_one_day_bounds_every_duration_everywhere(name):
    settings = {"capacity_bytes": 1 << 20} if name == "rescan_interval" else {}
    assert check_settings({**settings, name: 86_400})[name] == 86_400.0
    with pytest.raises(ConfigError, match=r"too long: at most 86400 \(a day\)|to 86400 seconds \(a day\)"):
        check_settings({**settings, name: 86_401})
    with pytest.raises(ConfigError, match=name):
        check_settings({**settings, name: "10"})


def test_a_wrong_type_names_the_setting():
    with pytest.raises(ConfigError, match="lookup_concurrency is a whole number, not str"):
        check_settings({"lookup_concurrency": "4"})
    with pytest.raises(ConfigError, match="n_read_threads is a whole number, not float"):
        check_settings({"n_read_threads": 2.0})


@pytest.mark.parametrize("policy", ["LRU", "S3-FIFO", "s3-fifo", "Lru", "mru", ""])
def test_policy_names_are_exactly_the_ones_the_error_lists(policy):
    with pytest.raises(ConfigError, match='eviction_policy is .*; it must be "lru" or "s3fifo"'):
        check_settings({"capacity_bytes": 1 << 20, "eviction_policy": policy})
    assert check_settings({"capacity_bytes": 1, "eviction_policy": "s3fifo"})["eviction_policy"] == "s3fifo"


@pytest.mark.parametrize("name, value", [("eviction_policy", "lru"), ("rescan_interval", 30.0)])
def test_a_budget_setting_without_a_capacity_is_refused(name, value):
    with pytest.raises(ConfigError, match=rf"{name} is set without capacity_bytes"):
        check_settings({name: value})
    with pytest.raises(ConfigError, match=rf"{EXTRA}\['{name}'\] is set without {EXTRA}\['capacity_bytes'\]"):
        check_settings({name: value, "capacity_bytes": None}, EXTRA)


def test_checked_values_come_back_as_the_bindings_take_them():
    checked = check_settings(
        {
            "capacity_bytes": 1 << 30,
            "stale_temp_age": None,
            "rescan_interval": 5,
            "lookup_timeout": None,
            "io_threads": 4,
            "shutdown_grace": 0,
        }
    )
    assert checked == {
        "capacity_bytes": 1 << 30,
        "eviction_policy": "lru",
        "stale_temp_age": None,
        "rescan_interval": 5.0,
        "lookup_timeout": None,
        "io_threads": 4,
        "shutdown_grace": 0.0,
    }
    with pytest.raises(ConfigError, match="not a setting kvtier knows"):
        check_settings({"capacity": 5})


@pytest.mark.parametrize("bad", [0, -1, 2**64, True, 1.5, "10G"])
def test_capacity_bytes_is_a_whole_positive_number(bad):
    with pytest.raises(ConfigError, match="capacity_bytes"):
        check_settings({"capacity_bytes": bad})


def test_a_capacity_smaller_than_one_block_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"capacity_bytes is 4095; it must hold at least one block \(4096 bytes\)"):
        VllmTransfers(tmp_path / "m_r0", primary(2), load_threads=1, store_threads=1, capacity_bytes=BLOCK - 1)
    transfers = VllmTransfers(tmp_path / "m_r0", primary(2), load_threads=1, store_threads=1, capacity_bytes=BLOCK)
    assert transfers.capacity_stats()["capacity_bytes"] == BLOCK
    transfers.shutdown()


@pytest.mark.parametrize(
    "setting",
    [
        {"load_threads": True},
        {"store_threads": False},
        {"load_threads": 0, "store_threads": 0},
        {"store_threads": 1025},
        {"load_threads": 600, "store_threads": 600},
        {"stale_temp_age": True, "capacity_bytes": BLOCK},
        {"rescan_interval": True, "capacity_bytes": BLOCK},
        {"eviction_policy": "lru"},
        {"eviction_policy": "LRU", "capacity_bytes": BLOCK},
    ],
)
def test_the_transfers_binding_holds_the_same_rules(tmp_path, setting):
    with pytest.raises(ConfigError):
        VllmTransfers(tmp_path / "m_r0", primary(1), **setting)


@pytest.mark.parametrize("setting", [{"concurrency": True}, {"group_timeout": True}, {"threads": False}])
def test_the_lookup_binding_refuses_bools(tmp_path, setting):
    with pytest.raises(ConfigError, match=next(iter(setting))):
        Lookup.vllm_fs(str(tmp_path), **setting)


@pytest.mark.parametrize("threads", [True, False, 0, 1025])
def test_the_copier_binding_holds_the_thread_limit(threads):
    with pytest.raises(ConfigError, match="threads"):
        BlockCopier([], [], 1, threads=threads)

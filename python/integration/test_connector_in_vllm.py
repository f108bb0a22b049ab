"""kvtier's KV connector driven through vLLM's real ``Scheduler`` (in one
process: ``connector_sim.Cluster``), alone and under vLLM's
``MultiConnector``: lookups and loads, the delayed free of a finished
request until ``finished_sending``, preemption fences, aborts, failed
dumps and workers reporting at different steps.

Run by ``vllm.sh`` with vLLM's sdist on ``KVTIER_VLLM_SDIST`` and a private,
offline ``HF_HOME`` holding a stand-in ``config.json`` for the sdist
helpers' model."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch

from connector_sim import Cluster, connector_config, create_request
from connector_sim import _fill  # the bytes a block's key is filled with

from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector

from kvtier import ConfigError
from kvtier.vllm.connector import StorageConnector


def _request(n: int = 100, max_tokens: int = 3, request_id: Any = None) -> Any:
    return create_request(request_id=request_id, num_tokens=n, max_tokens=max_tokens, block_size=16)


def _step_until(cluster: Cluster, done: Any, seconds: float = 30.0, pause: float = 0.005, **step: Any) -> Any:
    """Steps (``cluster.step(**step)``) until ``done(output)`` holds for a
    step's scheduler output and returns that output (or the last one after
    ``seconds``). Waits by the clock, not by a number of steps: on a loaded
    machine a lookup's answer or a dump takes longer than any fixed number
    of quick steps."""
    deadline = time.monotonic() + seconds
    while True:
        so = cluster.step(**step)
        if done(so) or time.monotonic() >= deadline:
            return so
        time.sleep(pause)


def _settle(cluster: Cluster, seconds: float = 60.0) -> None:
    """Steps until every request finished and was freed, and no dump is in
    flight (at most ``seconds``)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        engines = [cluster.engine(rank) for rank in range(len(cluster.workers))]
        if (
            not any(e.in_flight() for e in engines)
            and not cluster.scheduler.has_requests()
            and not cluster.connector._scheduler.has_delayed()
        ):
            return
        time.sleep(0.01)
        cluster.step()
    raise AssertionError("dumps still in flight")


def _prefill(cluster: Cluster, request: Any, **kwargs: Any) -> None:
    """Steps until ``request`` ran its prefill (the first steps may wait
    for the tier's lookup)."""
    so = _step_until(cluster, lambda so: request.request_id in so.num_scheduled_tokens, **kwargs)
    assert request.request_id in so.num_scheduled_tokens, f"{request.request_id} was not scheduled within 30 s"


def _allocated(cluster: Cluster, blocks: list[int]) -> bool:
    pool = cluster.scheduler.kv_cache_manager.block_pool.blocks
    return all(pool[b].ref_cnt > 0 for b in blocks)


@pytest.fixture
def root(tmp_path: Any) -> str:
    return str(tmp_path / "kv")


@pytest.fixture(params=["alone", "offloading", "offloading+example"])
def setup(request: Any) -> dict[str, Any]:
    """kvtier's connector alone, under MultiConnector next to
    OffloadingConnector (vLLM's HMA path: request_finished_all_groups), and
    next to OffloadingConnector and ExampleConnector, which has no HMA
    support (the non-HMA path: request_finished)."""
    return {"multi": None if request.param == "alone" else request.param}


def test_restart_hits_load_the_dumped_bytes(root: str, setup: dict[str, Any]) -> None:
    first = Cluster(connector_config(root, **setup))
    request = first.add(_request())
    _prefill(first, request)
    _settle(first)
    assert first.freed == [request.request_id]
    keys = first.keys_of(request, 6)
    assert first.check_files(keys) == {"present": 6, "absent": 0, "wrong": 0}
    first.shutdown()

    again = Cluster(connector_config(root, **setup))
    twin = again.add(_request(request_id=int(request.request_id.split("-")[1])))
    so = again.step()
    # The tier is being probed: vLLM asks again next step.
    assert twin.request_id not in so.num_scheduled_tokens
    so = _step_until(again, lambda so: twin.request_id in so.num_scheduled_tokens)
    # Six blocks came from the tier; the prompt's last 4 tokens are computed.
    assert so.num_scheduled_tokens[twin.request_id] == 100 - 96
    rows = again.caches[0].view(again.num_blocks, -1).view(torch.int8)
    for key, block in zip(keys, again.blocks_of(twin.request_id)[:6]):
        assert bytes(rows[block].numpy().tobytes()) == bytes(_fill(key, again.page).numpy().tobytes())
    assert again.worker().stats()["loaded_blocks"] == 6
    again.run(4)
    _settle(again)
    # Nothing new to dump: the request was not delayed.
    assert again.freed == []
    again.shutdown()


def test_a_prompt_of_whole_blocks_is_loaded_whole_and_computes_its_last_token(root: str) -> None:
    first = Cluster(connector_config(root))
    request = first.add(_request(n=96))
    _prefill(first, request)
    _settle(first)
    keys = first.keys_of(request)
    assert len(keys) == 6
    first.shutdown()

    again = Cluster(connector_config(root))
    twin = again.add(_request(n=96, request_id=int(request.request_id.split("-")[1])))
    so = _step_until(again, lambda so: twin.request_id in so.num_scheduled_tokens)
    # Every block loaded, the last counted a token short: vLLM computes it.
    assert so.num_scheduled_tokens[twin.request_id] == 1
    stats = again.worker().stats()
    assert (stats["loaded_blocks"], stats["load_failed_blocks"]) == (6, 0)
    rows = again.caches[0].view(again.num_blocks, -1).view(torch.int8)
    blocks = again.blocks_of(twin.request_id)
    for key, block in zip(keys[:5], blocks[:5]):
        assert bytes(rows[block].numpy().tobytes()) == bytes(_fill(key, again.page).numpy().tobytes())
    _settle(again)
    # The loaded blocks are not dumped again.
    assert again.worker().stats()["dumps"] == 0
    again.shutdown()


def test_a_finished_request_keeps_its_blocks_until_finished_sending(root: str, setup: dict[str, Any]) -> None:
    cluster = Cluster(connector_config(root, **setup), num_blocks=16)
    request = cluster.add(_request(n=100, max_tokens=50))
    cluster.engine().hold(lambda dump: True)
    _prefill(cluster, request)
    blocks = cluster.blocks_of(request.request_id)
    cluster.step(finish={request.request_id})
    # Finished, with its dump held: vLLM keeps the request and its blocks.
    assert request.request_id in cluster.scheduler.requests
    # Another request wants every block there is.
    other = cluster.add(_request(n=150, max_tokens=2))
    for _ in range(5):
        cluster.step()
        assert _allocated(cluster, blocks)
        assert cluster.reported == [[]]
    assert other not in cluster.scheduler.running
    cluster.engine().hold(None)
    _settle(cluster)
    assert cluster.reported[0].count(request.request_id) == 1
    assert cluster.freed.count(request.request_id) == 1
    assert cluster.reuse_violations == []
    assert cluster.check_files(cluster.keys_of(request, 6)) == {"present": 6, "absent": 0, "wrong": 0}
    assert cluster.connector.stats()["report_disagreements"] == 0
    cluster.shutdown()


def test_a_preemption_waits_for_its_own_dumps_only(root: str) -> None:
    cluster = Cluster(connector_config(root), num_blocks=14)
    keys_first: set[bytes] = set()
    release_at = [float("inf")]
    # The first request's dumps stay held all along; the second's until
    # release_at (set when its preemption comes).
    cluster.engine().hold(
        lambda dump: dump.keys[0] in keys_first or time.monotonic() < release_at[0]
    )
    first = cluster.add(_request(n=96, max_tokens=200))
    keys_first.update(cluster.keys_of(first))
    # vLLM preempts the request it scheduled last. A request waits for its
    # lookup's answer, and two lookups may be answered in either order: the
    # second request comes once the first runs, so it is the victim. Each
    # lookup is asked for by one step and waited for with no step between
    # (on a loaded machine an answer can take many quick steps, while the
    # first request would decode on).
    lookup = cluster.connector._scheduler.lookup
    cluster.step()
    lookup.wait_idle()
    _step_until(cluster, lambda so: first in cluster.scheduler.running)
    assert first in cluster.scheduler.running
    second = cluster.add(_request(n=96, max_tokens=200))
    cluster.step()
    lookup.wait_idle()
    preempted: set[str] = set()
    fence = 0.0
    for _ in range(80):
        so = cluster.scheduler.schedule()
        if so.preempted_req_ids:
            preempted = set(so.preempted_req_ids)
            # Checked before the fence: the first request's dumps never
            # end, so a fence on them would wait forever.
            assert preempted == {second.request_id}
            release_at[0] = time.monotonic() + 0.2
            started = time.monotonic()
            cluster.workers[0].handle_preemptions(so.kv_connector_metadata)
            fence = time.monotonic() - started
            break
        # Not this step's schedule after all: run it as a normal step.
        cluster._finish_step(so)
    assert preempted == {second.request_id}
    # The fence waited for the preempted request's dumps (held 0.2 s) ...
    assert fence >= 0.15
    # ... and not for the first request's, still held.
    held = [d for d in cluster.engine()._queued if d.keys[0] in keys_first]
    assert held
    assert cluster.worker().stats()["preemption_fences"] >= 1
    cluster.engine().hold(None)
    cluster.shutdown()


def test_an_abort_during_a_dump_frees_after_the_dump(root: str, setup: dict[str, Any]) -> None:
    cluster = Cluster(connector_config(root, **setup), num_blocks=32)
    request = cluster.add(_request(n=100, max_tokens=50))
    cluster.engine().hold(lambda dump: True)
    _prefill(cluster, request)
    blocks = cluster.blocks_of(request.request_id)
    cluster.abort(request.request_id)
    for _ in range(3):
        cluster.step()
        assert _allocated(cluster, blocks)
    assert cluster.freed == []
    cluster.engine().hold(None)
    _settle(cluster)
    assert cluster.freed == [request.request_id]
    assert cluster.reported[0] == [request.request_id]
    assert cluster.check_files(cluster.keys_of(request, 6)) == {"present": 6, "absent": 0, "wrong": 0}
    cluster.shutdown()


def test_a_failed_dump_is_still_reported_once(root: str) -> None:
    cluster = Cluster(connector_config(root), num_blocks=32)
    request = _request(n=64, max_tokens=2)
    keys = cluster.keys_of(request)
    # The directory a block file goes in is a regular file: its write fails.
    for key in keys[:2]:
        shard = os.path.dirname(os.path.dirname(cluster.key_file(key)))
        os.makedirs(os.path.dirname(shard), exist_ok=True)
        open(shard, "w").close()
    cluster.add(request)
    _prefill(cluster, request)
    _settle(cluster)
    stats = cluster.worker().stats()
    assert stats["dumps_failed"] == 1
    assert stats["task_failures"] == 1
    assert cluster.reported[0] == [request.request_id]
    assert cluster.freed == [request.request_id]
    counts = cluster.check_files(keys[:4])
    assert counts["wrong"] == 0
    cluster.shutdown()


def test_two_workers_reporting_at_different_steps(root: str) -> None:
    cluster = Cluster(connector_config(root, workers=2), num_blocks=32, workers=2)
    request = cluster.add(_request(n=64, max_tokens=2))
    release_at = [float("inf")]
    cluster.engine(1).hold(lambda dump: time.monotonic() < release_at[0])
    _prefill(cluster, request)
    blocks = cluster.blocks_of(request.request_id)
    _step_until(cluster, lambda so: cluster.reported[0], pause=0.01)
    # Worker 0 reported; worker 1's dump is held: vLLM keeps the blocks.
    assert cluster.reported[0] == [request.request_id]
    assert cluster.reported[1] == []
    assert cluster.freed == []
    assert _allocated(cluster, blocks)
    release_at[0] = 0.0
    _settle(cluster)
    assert cluster.reported[1] == [request.request_id]
    assert cluster.freed == [request.request_id]
    assert cluster.connector.stats()["report_disagreements"] == 0
    assert cluster.check_files(cluster.keys_of(request, 4), rank=1)["present"] == 4
    cluster.shutdown()


def test_a_failed_load_is_recomputed_and_its_lookups_miss(root: str) -> None:
    first = Cluster(connector_config(root))
    request = first.add(_request())
    _prefill(first, request)
    _settle(first)
    keys = first.keys_of(request, 6)
    damaged = first.key_file(keys[3])
    first.shutdown()
    # The fourth block's file is cut short: it cannot be loaded.
    with open(damaged, "r+b") as f:
        f.truncate(10)
    again = Cluster(connector_config(root))
    twin = again.add(_request(request_id=int(request.request_id.split("-")[1])))
    _prefill(again, twin)
    stats = again.worker().stats()
    # Three blocks loaded; the damaged one and those after it failed.
    assert (stats["loaded_blocks"], stats["load_failed_blocks"]) == (3, 3)
    # vLLM took the failed blocks back and recomputes from the fourth.
    assert twin.num_computed_tokens <= 3 * 16 + 16
    assert again.connector.stats()["load_failed_keys"] == 3
    lookup = again.connector._scheduler.lookup
    assert lookup.lookup(keys[2], twin.request_id) is True
    _settle(again)
    # The recomputed block was dumped again, whole.
    assert again.check_files(keys) == {"present": 6, "absent": 0, "wrong": 0}
    again.shutdown()


def test_a_byte_budget_bounds_the_dumped_files(root: str) -> None:
    probe = Cluster(connector_config(root + "-probe"))
    page = probe.page
    probe.shutdown()
    cluster = Cluster(connector_config(root, capacity_bytes=4 * page))
    request = cluster.add(_request())
    keys = cluster.keys_of(request, 6)
    # Another request already looked these blocks up: all absent then.
    lookup = cluster.connector._scheduler.lookup
    assert [lookup.lookup(key, "watcher") for key in keys] == [None] * 6
    lookup.flush()
    lookup.wait_idle()
    assert [lookup.lookup(key, "watcher") for key in keys] == [False] * 6
    _prefill(cluster, request)
    _settle(cluster)
    # Six blocks dumped in order, room for four: the first two were evicted.
    assert cluster.check_files(keys) == {"present": 4, "absent": 2, "wrong": 0}
    # Rank 0's changes reached the scheduler: the watcher's lookups are what
    # the files are (six stores made hits, two evictions made misses again).
    assert [lookup.lookup(key, "watcher") for key in keys] == [False] * 2 + [True] * 4
    assert cluster.connector.stats()["blocks_settled"] == 8
    lookup.cleanup("watcher")
    assert cluster.check_files(keys[2:]) == {"present": 4, "absent": 0, "wrong": 0}
    on_disk = sum(
        os.path.getsize(os.path.join(top, name))
        for top, _, names in os.walk(root)
        for name in names
        if name.endswith(".bin")
    )
    stats = cluster.worker().stats()
    assert on_disk == stats["capacity_resident_bytes"] == 4 * page
    assert (stats["capacity_evictions"], stats["capacity_capacity_bytes"]) == (2, 4 * page)
    assert cluster.freed == [request.request_id]
    cluster.shutdown()


def test_engines_sharing_a_root_count_each_others_dumps(root: str) -> None:
    # Two engines' connectors on one root, each with a budget of four
    # blocks and a rescan every 20 ms: the blocks b dumps are counted by a's
    # worker, which then holds b's four and nothing else.
    probe = Cluster(connector_config(root + "-probe"))
    page = probe.page
    probe.shutdown()
    shared = {"capacity_bytes": 4 * page, "rescan_interval": 0.02}
    a = Cluster(connector_config(root, **shared))
    b = Cluster(connector_config(root, **shared))
    request = b.add(_request())
    _prefill(b, request)
    _settle(b)
    assert b.check_files(b.keys_of(request, 6)) == {"present": 4, "absent": 2, "wrong": 0}
    # a's rescans may have seen a block b evicted again while it prefilled
    # (adopted, then forgotten): what a holds in the end is b's four.
    deadline = time.monotonic() + 10
    while a.worker().stats()["capacity_resident_bytes"] != 4 * page and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = a.worker().stats()
    assert stats["capacity_resident_bytes"] == 4 * page and stats["capacity_adopted"] >= 4, stats
    a.shutdown()
    b.shutdown()


def test_a_blocking_save_returns_with_its_dumps_done(root: str) -> None:
    cluster = Cluster(connector_config(root, blocking_save=True))
    request = cluster.add(_request())
    # Each dump is held for 2 s from when the first is seen: a save that
    # did not wait would return with them in flight, however fast the disk.
    first_seen: list[float] = []

    def held(dump: Any) -> bool:
        first_seen[:] = first_seen or [time.monotonic()]
        return time.monotonic() < first_seen[0] + 2.0

    cluster.engine().hold(held)
    _prefill(cluster, request)
    # wait_for_save waited: nothing in flight, every block on disk already.
    assert cluster.engine().in_flight() == 0
    assert cluster.check_files(cluster.keys_of(request, 6)) == {"present": 6, "absent": 0, "wrong": 0}
    _settle(cluster)
    cluster.shutdown()


def test_shutdown_is_bounded_and_holds_no_buffer_afterwards(root: str) -> None:
    import gc
    import weakref

    cluster = Cluster(connector_config(root, shutdown_grace=0.2), num_blocks=32)
    request = cluster.add(_request(n=100, max_tokens=50))
    engine = cluster.engine()
    # Dumps that would never start: shutdown must not wait for them.
    engine.hold(lambda dump: True)
    _prefill(cluster, request)
    assert engine.in_flight() >= 1
    staging = weakref.ref(engine._staging)
    started = time.monotonic()
    cluster.worker().shutdown()
    assert time.monotonic() - started < 5
    assert engine.stats["dumps_dropped_at_shutdown"] >= 1
    assert engine.in_flight() == 0
    gc.collect()
    # Nothing holds the staging area: not the copier, not the file writers.
    assert staging() is None
    # Every dump ended (dropped ones as failed): no task is left running.
    assert cluster.worker()._worker.tracker.running_tasks == 0
    cluster.scheduler.connector.shutdown()


class _DroppingMultiConnector(MultiConnector):
    """The seed's bug: a wrapper that does not forward ``request_finished``
    to kvtier's connector."""

    def request_finished(self, request: Any, blocks: list[int]) -> Any:
        return self._aggregate_request_finished(
            request,
            lambda c: (False, None) if isinstance(c, StorageConnector) else c.request_finished(request, blocks),
        )

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> Any:
        if not self._all_support_hma:
            return self.request_finished(request, block_ids[0])
        return self._aggregate_request_finished(
            request,
            lambda c: (False, None)
            if isinstance(c, StorageConnector)
            else c.request_finished_all_groups(request, block_ids),
        )


@pytest.mark.parametrize("multi", ["offloading", "offloading+example"])
def test_a_wrapper_that_drops_request_finished_is_caught(root: str, multi: str, monkeypatch: Any) -> None:
    import vllm.distributed.kv_transfer.kv_connector.factory as factory

    # Only the scheduler's connector is the buggy wrapper.
    real = factory.KVConnectorFactory.create_connector

    def create(config: Any, role: Any, kv_cache_config: Any = None) -> Any:
        connector = real(config, role, kv_cache_config)
        if isinstance(connector, MultiConnector) and role.name == "SCHEDULER":
            connector.__class__ = _DroppingMultiConnector
        return connector

    monkeypatch.setattr(factory.KVConnectorFactory, "create_connector", staticmethod(create))
    cluster = Cluster(connector_config(root, multi=multi), num_blocks=16)
    request = cluster.add(_request(n=100, max_tokens=50))
    # Held until the other request is scheduled onto the blocks (the
    # violation the sim records before the step's worker calls; at most a
    # minute: a fixed hold could run out first on a loaded machine), and
    # 3 s more: the step's forward pass writes the blocks meanwhile unless
    # a fence waits the 3 s out first, which is what the check below tells
    # apart.
    seen_at: list[float] = []
    release_at = time.monotonic() + 60.0

    def held(dump: Any) -> bool:
        if cluster.reuse_violations and not seen_at:
            seen_at.append(time.monotonic())
        return time.monotonic() < (seen_at[0] + 3.0 if seen_at else release_at)

    cluster.engine().hold(held)
    _prefill(cluster, request)
    blocks = cluster.blocks_of(request.request_id)
    # Another request waits for blocks, its lookup answered (waited for by
    # the clock: then the step after the finish schedules it at once).
    side = cluster.connector._scheduler
    answers: dict[str, Any] = {}
    looked_up = side.get_num_new_matched_tokens

    def recording(request: Any, num_computed_tokens: int) -> Any:
        answer = looked_up(request, num_computed_tokens)
        answers[request.request_id] = answer[0]
        return answer

    monkeypatch.setattr(side, "get_num_new_matched_tokens", recording)
    other = cluster.add(_request(n=150, max_tokens=2))
    _step_until(cluster, lambda so: answers.get(other.request_id) is not None, pause=0.01)
    assert answers.get(other.request_id) is not None
    assert other not in cluster.scheduler.running
    cluster.step(finish={request.request_id})
    # The free was not delayed: the check of the test above fails ...
    assert not _allocated(cluster, blocks)
    deadline = time.monotonic() + 30.0
    while other not in cluster.scheduler.running and time.monotonic() < deadline:
        cluster.step()
        time.sleep(0.01)
    # Seen before the step's fence (which then waited out the hold).
    assert cluster.reuse_violations
    # ... and kvtier's connector saw the unannounced finish and fenced the
    # dump before the forward pass wrote the blocks: the files are right,
    # and nothing is reported for a request vLLM no longer knows.
    assert cluster.connector.stats()["unannounced_finishes"] == 1
    cluster.engine().hold(None)
    _settle(cluster)
    assert request.request_id not in cluster.reported[0]
    assert cluster.check_files(cluster.keys_of(request, 6)) == {"present": 6, "absent": 0, "wrong": 0}
    cluster.shutdown()


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"root_dir": ""}, "root_dir is empty"),
        ({"root_dir": "/x", "staging_bytes": 0}, "staging_bytes"),
        ({"root_dir": "/x", "io_threads": True}, "io_threads"),
        ({"root_dir": "/x", "shutdown_grace": float("nan")}, "shutdown_grace"),
        ({"root_dir": "/x", "blocking_save": "yes"}, "blocking_save"),
        ({"root_dir": "/x", "rootdir": "/y"}, "does not know"),
        ({"root_dir": "/x", "capacity_bytes": 0}, "capacity_bytes"),
        ({"root_dir": "/x", "capacity_bytes": "10G"}, "capacity_bytes"),
        ({"root_dir": "/x", "eviction_policy": "mru"}, "eviction_policy"),
        ({"root_dir": "/x", "rescan_interval": -1}, "rescan_interval"),
        ({}, "needs 'root_dir'"),
    ],
)
def test_bad_settings_are_config_errors(extra: dict[str, Any], message: str) -> None:
    from connector_sim import create_scheduler, create_vllm_config

    config = create_vllm_config(
        kv_connector="StorageConnector",
        kv_connector_module_path="kvtier.vllm.connector",
        kv_role="kv_both",
        block_size=16,
        dtype="float32",
        kv_connector_extra_config=extra,
    )
    with pytest.raises(ConfigError, match=message):
        create_scheduler(config, num_blocks=16)

"""The end-to-end harness's KV event subscriber (e2e/kv_events_sub.py)
against vLLM's own ZMQ publisher, in vLLM's venv.

A run's work directory lives under the checkout, and a Unix socket's path
is limited to about 107 bytes: with the socket beside the run, a checkout
as deep as a CI runner's made the subscriber fail to connect ("File name
too long") and the fleet scenario fail. The subscriber now keeps its
socket in a short directory of its own, and counts what the engine
published last, up to its shutdown.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "e2e"))
import kv_events_sub  # noqa: E402
from kv_events_sub import KvEventSubscriber  # noqa: E402

pyzmq = pytest.importorskip("zmq")
vllm_kv_events = pytest.importorskip("vllm.distributed.kv_events")

#: sun_path holds 108 bytes, the terminating NUL included.
SUN_PATH_BYTES = 107


def storage_stored(hashes: list[int], medium: str = "STORAGE"):
    return vllm_kv_events.BlockStored(
        block_hashes=hashes, parent_block_hash=None, token_ids=[], block_size=32,
        lora_id=None, medium=medium, lora_name=None,
    )


def storage_removed(hashes: list[int], medium: str = "STORAGE"):
    return vllm_kv_events.BlockRemoved(block_hashes=hashes, medium=medium)


def test_the_socket_path_fits_however_deep_the_run_lives(tmp_path, monkeypatch):
    deep = tmp_path.joinpath(*["a-checkout-as-deep-as-a-ci-runners"] * 4)
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    with KvEventSubscriber() as events:
        path = events.endpoint.removeprefix("ipc://")
        assert len(os.fsencode(path)) <= SUN_PATH_BYTES, path
        assert Path(path).parent.is_dir()
    assert not Path(path).parent.exists(), "the subscriber's directory outlives it"


def test_a_failure_on_the_subscribers_thread_is_reported_at_once(monkeypatch):
    def no_context():
        raise pyzmq.ZMQError(msg="no context for a test")

    monkeypatch.setattr(pyzmq.Context, "instance", staticmethod(no_context))
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="did not start: .*no context for a test"):
        with KvEventSubscriber():
            pass
    assert time.monotonic() - started < 10, "the failure was waited out"


class SlowImport(importlib.abc.MetaPathFinder):
    """Makes importing vLLM's kv_events module take `seconds` (as torch's
    import does on a loaded machine)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def find_spec(self, name, path, target=None):
        if name == "vllm.distributed.kv_events":
            time.sleep(self.seconds)
        return None


def test_the_wait_for_the_subscriber_covers_its_connect_not_its_imports(monkeypatch):
    import vllm.distributed

    monkeypatch.setattr(kv_events_sub, "CONNECT_SECONDS", 1.0)
    monkeypatch.delitem(sys.modules, "vllm.distributed.kv_events")
    monkeypatch.delattr(vllm.distributed, "kv_events")
    monkeypatch.setattr(sys, "meta_path", [SlowImport(2.0), *sys.meta_path])
    with KvEventSubscriber() as events:
        assert events.endpoint.startswith("ipc://")


def test_the_batches_in_flight_when_the_subscriber_is_left_are_counted():
    publisher = None
    try:
        with KvEventSubscriber() as events:
            publisher = vllm_kv_events.ZmqEventPublisher(data_parallel_rank=0, endpoint=events.endpoint)
            # A SUB socket misses what is sent before its connection is up
            # (ZMQ's slow joiner): a first batch is sent until one arrives.
            for _ in range(200):
                publisher.publish(vllm_kv_events.KVEventBatch(ts=0.0, events=[storage_stored([0], medium="GPU")]))
                if wait_for_subscriber(lambda: events.batches > 0, 0.05):
                    break
            assert events.batches > 0, "the subscriber never connected"
            # Then a burst, and the subscriber is left at once, while the
            # publisher's thread is still sending it: what arrives then
            # still counts (the harness leaves it once the engine has ended).
            for step in range(1, 2001):
                batch = [storage_stored([step]), storage_removed([step - 1])]
                publisher.publish(vllm_kv_events.KVEventBatch(ts=float(step), events=batch))
    finally:
        if publisher is not None:
            publisher.shutdown()
    assert events.stored["STORAGE"] == list(range(1, 2001))
    assert events.removed["STORAGE"] == list(range(0, 2000))
    assert events.undecoded == 0


def wait_for_subscriber(condition, seconds: float) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()

"""The behaviours vLLM's own tests pin on its lookup manager, on kvtier's
vLLM-shaped adapter, driven as vLLM's tier manager drives it."""

from __future__ import annotations

import sys
import threading
import weakref

import pytest

from conftest import PATIENCE, Request, ScriptedBackend, native_threads
from kvtier import HIT, MISS, RETRY, KvtierError, Lookup, ShutdownError
from kvtier.vllm import AsyncLookupManager


class Tier(AsyncLookupManager):
    """A tier as vLLM writes one: a subclass implementing batch_lookup."""

    def __init__(self, backend: ScriptedBackend) -> None:
        self.backend = backend
        self.contexts: list[object] = []
        super().__init__("scripted")

    def batch_lookup(self, keys, req_context):
        self.contexts.append(req_context)
        return self.backend.batch_lookup(keys, req_context.req_id)


@pytest.fixture()
def backend():
    return ScriptedBackend(stored=[b"stored-1", b"stored-2"])


@pytest.fixture()
def manager(backend):
    tier = Tier(backend)
    yield tier
    tier.shutdown()


def step_end(manager: AsyncLookupManager) -> None:
    """End of a scheduler step, then wait for the worker (a test's shortcut
    for "some steps later")."""
    manager.on_schedule_end()
    manager.wait_idle()


def test_a_new_key_is_retry(manager):
    assert manager.lookup(b"stored-1", Request("a")) is RETRY


def test_after_flush_a_stored_key_hits_and_a_missing_one_misses(manager):
    a = Request("a")
    manager.lookup(b"stored-1", a)
    manager.lookup(b"absent", a)
    step_end(manager)
    assert manager.lookup(b"stored-1", a) is HIT
    assert manager.lookup(b"absent", a) is MISS


def test_several_keys_in_one_step_resolve_independently(manager):
    a, b = Request("a"), Request("b")
    keys = [(b"stored-1", a), (b"absent-1", a), (b"stored-2", b), (b"absent-2", b)]
    for key, request in keys:
        assert manager.lookup(key, request) is RETRY
    step_end(manager)
    assert [manager.lookup(key, request) for key, request in keys] == [HIT, MISS, HIT, MISS]


def test_the_backend_gets_the_requests_context(manager):
    a = Request("a")
    manager.lookup(b"stored-1", a)
    step_end(manager)
    assert manager.contexts == [a]


def test_cleanup_removes_a_requests_keys_and_keeps_a_shared_one(manager, backend):
    a, b = Request("a"), Request("b")
    manager.lookup(b"stored-1", a)
    manager.lookup(b"stored-2", a)
    manager.lookup(b"stored-2", b)
    step_end(manager)
    manager.on_request_finished("a")
    assert len(manager.native) == 1, "only the key b shares is left"
    assert manager.lookup(b"stored-2", b) is HIT
    calls = len(backend.calls)
    # a's private key is gone: asking again starts a new probe.
    assert manager.lookup(b"stored-1", b) is RETRY
    step_end(manager)
    assert len(backend.calls) == calls + 1


def test_an_empty_flush_submits_nothing(manager, backend):
    manager.flush()
    assert manager.native.flush() == 0
    manager.wait_idle()
    assert backend.calls == []
    assert manager.stats()["groups_submitted"] == 0


def test_a_key_asked_twice_in_a_step_is_probed_once(manager, backend):
    a, b = Request("a"), Request("b")
    manager.lookup(b"stored-1", a)
    manager.lookup(b"stored-1", a)
    manager.lookup(b"stored-1", b)
    step_end(manager)
    assert backend.probed_keys() == [b"stored-1"]
    assert manager.lookup(b"stored-1", b) is HIT


def test_cleanup_of_an_unknown_request_is_a_no_op(manager):
    manager.lookup(b"stored-1", Request("a"))
    manager.cleanup("nobody")
    manager.on_request_finished("nobody")
    assert len(manager.native) == 1
    step_end(manager)
    assert manager.lookup(b"stored-1", Request("a")) is HIT


def test_results_of_several_steps_all_become_visible(manager, backend):
    a = Request("a")
    for step in range(5):
        manager.lookup(b"stored-1" if step == 2 else b"key-%d" % step, a)
        manager.flush()
    manager.wait_idle()
    verdicts = [manager.lookup(b"stored-1" if s == 2 else b"key-%d" % s, a) for s in range(5)]
    assert verdicts == [MISS, MISS, HIT, MISS, MISS]
    assert len(backend.calls) == 5


def test_shutdown_stops_the_worker(backend):
    tier = Tier(backend)
    assert native_threads("kvtier_lookup_s", expect=1) == 1
    tier.lookup(b"stored-1", Request("a"))
    tier.flush()
    tier.shutdown()
    assert native_threads("kvtier_lookup_s", expect=0) == 0
    assert backend.calls, "queued work is finished first"
    with pytest.raises(ShutdownError):
        tier.lookup(b"stored-1", Request("a"))
    tier.shutdown()  # a second shutdown is harmless


def test_mark_miss_turns_a_hit_into_a_miss_without_a_reprobe(manager, backend):
    a = Request("a")
    manager.lookup(b"stored-1", a)
    step_end(manager)
    assert manager.lookup(b"stored-1", a) is HIT
    manager.mark_miss([b"stored-1"])  # its load failed
    assert manager.lookup(b"stored-1", a) is MISS
    step_end(manager)
    assert len(backend.calls) == 1, "no re-probe"
    manager.mark_miss([b"never-seen"])  # an unknown key is a no-op


def test_lookup_many_answers_a_request_in_one_call(manager, backend):
    a = Request("a")
    keys = [b"stored-1", b"stored-2", b"absent", b"stored-1"]
    verdicts, leading = manager.lookup_many(keys, a)
    assert (verdicts, leading) == ([RETRY, RETRY, RETRY, RETRY], 0)
    step_end(manager)
    assert manager.lookup_many(keys, a) == ([HIT, HIT, MISS, HIT], 2)
    assert backend.probed_keys() == [b"stored-1", b"stored-2", b"absent"]


def test_a_manager_without_a_tier_is_refused():
    with pytest.raises(TypeError, match="batch_lookup"):
        AsyncLookupManager("nothing")


def test_a_native_prober_serves_the_manager(tmp_path):
    key = b"\x01\x02\x03\x04" + (0).to_bytes(4, "big")
    path = tmp_path / "010" / "20_g0" / "01020304.bin"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"kv")
    manager = AsyncLookupManager("fs", lookup=Lookup.vllm_fs(tmp_path))
    try:
        assert manager.lookup(key, Request("a")) is RETRY
        step_end(manager)
        assert manager.lookup(key, Request("a")) is HIT
        assert manager.lookup(key, "a") is HIT, "a str id is a request too"
    finally:
        manager.shutdown()
    assert manager.native.closed


def test_a_dropped_manager_stops_its_worker(backend):
    tier = Tier(backend)
    freed = weakref.ref(tier)
    tier.lookup(b"stored-1", Request("a"))
    tier.flush()
    assert native_threads("kvtier_lookup_s", expect=1) == 1
    # The worker holds the manager weakly: no cycle, no collector needed.
    # Whether the group was probed depends on whether the worker took it
    # before the manager went (the test after this one pins that case).
    del tier
    assert native_threads("kvtier_lookup_s", expect=0) == 0
    assert freed() is None


def test_a_manager_freed_inside_its_own_batch_lookup(backend, monkeypatch):
    """Found in CI: the worker's call holds the manager, so when the
    scheduler lets go during a call, the manager (and the native lookup)
    is freed on the worker, which then shut itself down by joining itself
    and panicked. Now the worker finishes the call and exits."""
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    backend.gate("a")
    tier = Tier(backend)
    freed = weakref.ref(tier)
    tier.lookup(b"stored-1", Request("a"))
    tier.flush()
    assert backend.started.wait(PATIENCE)
    tier.lookup(b"stored-2", Request("b"))
    tier.flush()
    del tier
    assert freed() is not None, "the running call holds the manager"
    backend.release("a")
    assert native_threads("kvtier_lookup_s", expect=0) == 0
    assert freed() is None
    assert unraisable == [], [hook.exc_value for hook in unraisable]
    assert backend.calls == [("a", [b"stored-1"])], "b's group had no manager left to call"


def test_wait_idle_inside_batch_lookup_raises_instead_of_waiting_for_itself():
    raised: list[BaseException] = []
    called = threading.Event()

    class WaitsInItsCall(AsyncLookupManager):
        def batch_lookup(self, keys, req_context):
            try:
                self.wait_idle()
            except KvtierError as error:
                raised.append(error)
            finally:
                called.set()
            return [True] * len(keys)

    tier = WaitsInItsCall("waits")
    try:
        tier.lookup(b"k", Request("a"))
        tier.flush()
        # Not tier.wait_idle() here: the lookup is borrowed while it waits,
        # and the call's own wait_idle would then fail for that reason.
        assert called.wait(PATIENCE), "the call ended"
        assert [str(error) for error in raised] == [
            "wait_idle was called from inside a backend call, on the worker it would wait for"
        ]
        tier.wait_idle()
        assert tier.lookup(b"k", Request("a")) is HIT, "the call still answered"
    finally:
        tier.shutdown()

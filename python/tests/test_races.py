"""The races kvtier closes, driven from Python through the adapter: stale
answers after cleanup and key reuse, and mark_miss against newer lookups."""

from __future__ import annotations

from conftest import Request, ScriptedBackend
from kvtier import HIT, MISS, RETRY
from kvtier.vllm import AsyncLookupManager


class Tier(AsyncLookupManager):
    def __init__(self, backend: ScriptedBackend) -> None:
        self.backend = backend
        super().__init__("races")

    def batch_lookup(self, keys, req_context):
        return self.backend.batch_lookup(keys, req_context.req_id)


def test_a_stale_answer_after_cleanup_and_key_reuse_is_ignored():
    # The tier's answer changes between the two probes: the first call says
    # stored, every later one absent. b must see its own probe's answer.
    backend = ScriptedBackend(answer=lambda key, call: call == 1)
    backend.gate("a")
    tier = Tier(backend)
    try:
        tier.native.set_limits(pending_steps=1)
        a, b = Request("a"), Request("b")
        assert tier.lookup(b"K", a) is RETRY
        tier.flush()  # a's probe starts and hangs (a slow NFS stat)
        assert backend.started.wait(10)
        # Past its one-step budget the key is a miss; a finishes and its
        # overdue state goes with it.
        assert tier.lookup(b"K", a) is MISS
        tier.on_request_finished("a")
        # b reuses the key: a new incarnation, probed afresh.
        assert tier.lookup(b"K", b) is RETRY
        tier.flush()
        backend.release("a")  # a's late answer (stored) arrives first
        tier.wait_idle()
        assert [req for req, _ in backend.calls] == ["a", "b"]
        assert tier.lookup(b"K", b) is MISS, "b's own answer, not a's stale one"
        stats = tier.stats()
        assert stats["stale_results"] == 1
        assert stats["anomalies"] == 0
    finally:
        tier.shutdown()


def test_mark_miss_after_the_key_was_recreated_has_no_effect():
    backend = ScriptedBackend(stored=[b"K"])
    tier = Tier(backend)
    try:
        a, b = Request("a"), Request("b")
        tier.lookup(b"K", a)
        tier.flush()
        tier.wait_idle()
        assert tier.lookup(b"K", a) is HIT  # a's load of K starts
        tier.on_request_finished("a")
        backend.gate("b")
        assert tier.lookup(b"K", b) is RETRY  # a new lookup of K, in flight
        tier.flush()
        assert backend.started.wait(10)
        tier.mark_miss([b"K"])  # a's load fails now: too late to matter
        assert tier.stats()["marked_miss"] == 0
        backend.release("b")
        tier.wait_idle()
        assert tier.lookup(b"K", b) is HIT, "b's own answer stands"
        assert tier.stats()["anomalies"] == 0
    finally:
        tier.shutdown()


def test_a_failed_loads_mark_miss_turns_hit_into_miss_without_a_reprobe():
    backend = ScriptedBackend(stored=[b"K"])
    tier = Tier(backend)
    try:
        a = Request("a")
        tier.lookup(b"K", a)
        tier.flush()
        tier.wait_idle()
        assert tier.lookup(b"K", a) is HIT
        for _ in range(3):  # the scheduler would retry the doomed load forever
            tier.mark_miss([b"K"])
            assert tier.lookup(b"K", a) is MISS
            tier.flush()
        tier.wait_idle()
        assert len(backend.calls) == 1
        assert tier.stats()["marked_miss"] == 1
    finally:
        tier.shutdown()


def test_cleanup_during_flight_keeps_the_probe_for_the_next_request():
    backend = ScriptedBackend(stored=[b"K"])
    backend.gate("a")
    tier = Tier(backend)
    try:
        tier.lookup(b"K", Request("a"))
        tier.flush()
        assert backend.started.wait(10)
        tier.on_request_finished("a")
        assert tier.lookup(b"K", Request("b")) is RETRY  # joins a's probe
        assert tier.native.flush() == 0, "no second probe"
        backend.release("a")
        tier.wait_idle()
        assert tier.lookup(b"K", Request("b")) is HIT
        assert len(backend.calls) == 1
    finally:
        tier.shutdown()

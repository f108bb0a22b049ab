"""Secondary tiers whose stores are slow, for the harness's crash scenario:
store jobs reach the tier one every ``store_delay`` seconds, in order, so
an engine killed mid-run has stores in flight. And kvtier's connector with
slow dumps (``SlowStorageConnector``), for the connector's scenarios.

The delay runs beside the tier, not inside it: the wrapped tier's calls all
stay on the scheduler's thread (a lock hands the delayed submissions over
at the next scheduler call), as vLLM's contract has them.
"""

from __future__ import annotations

import collections
import os
import threading
import time

from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

from kvtier.vllm import FsTier, ObjectTier
from kvtier.vllm.connector import StorageConnector


class _SlowStores:
    """Holds the store jobs and lets one through every ``store_delay``
    seconds, submitted at the next scheduler call; mixed in before the tier
    class."""

    def __init__(self, *args, store_delay: float = 0.5, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._delay = float(store_delay)
        self._lock = threading.Lock()
        self._held: collections.deque = collections.deque()
        self._ready: list = []
        threading.Thread(target=self._let_through, daemon=True).start()

    def _let_through(self) -> None:
        while True:
            time.sleep(self._delay)
            with self._lock:
                if self._held:
                    self._ready.append(self._held.popleft())

    def _hold(self, job) -> None:
        with self._lock:
            self._held.append(job)

    def _release(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
        for job in ready:
            super().submit_store(job)

    def submit_store(self, job_metadata) -> None:
        self._release()
        self._hold(job_metadata)

    def get_finished_jobs(self):
        self._release()
        return super().get_finished_jobs()


class SlowStoreFsTier(_SlowStores, FsTier):
    """kvtier's ``FsTier`` with slow stores."""


class SlowStoreVllmFsTier(_SlowStores, FileSystemTierManager):
    """vLLM's fs tier with slow stores."""


class SlowStoreObjectTier(_SlowStores, ObjectTier):
    """kvtier's ``ObjectTier`` with slow stores."""


class SlowStorageConnector(StorageConnector):
    """kvtier's connector on an emulated slow storage that takes
    ``KVTIER_E2E_DUMP_DELAY`` seconds a dump, one dump at a time (an
    environment variable the engine's processes inherit): a dump may start
    only once the storage is done with the one before it and its own time
    has passed, so an engine has dumps in flight across steps: requests
    finish, are preempted or aborted, or the engine is killed, while dumps
    still hold their blocks. The delay is the dump engine's hold, a queue
    the dumps wait in; nothing else of the connector changes."""

    def register_kv_caches(self, kv_caches) -> None:
        super().register_kv_caches(kv_caches)
        delay = float(os.environ.get("KVTIER_E2E_DUMP_DELAY", "0"))
        engine = self._worker.engine if self._worker is not None else None
        if delay > 0 and engine is not None:
            free_at = [0.0]
            release: dict = {}

            def held(dump) -> bool:
                if dump.job not in release:
                    # The storage takes the dumps in the order they came.
                    free_at[0] = max(free_at[0], dump.submitted) + delay
                    release[dump.job] = free_at[0]
                return time.monotonic() < release[dump.job]

            engine.hold(held)

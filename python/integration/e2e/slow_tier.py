"""Secondary tiers whose stores are slow, for the harness's crash scenario:
store jobs reach the tier one every ``store_delay`` seconds, in order, so
an engine killed mid-run has stores in flight.

The delay runs beside the tier, not inside it: the wrapped tier's calls all
stay on the scheduler's thread (a lock hands the delayed submissions over
at the next scheduler call), as vLLM's contract has them.
"""

from __future__ import annotations

import collections
import threading
import time

from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

from kvtier.vllm import FsTier


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

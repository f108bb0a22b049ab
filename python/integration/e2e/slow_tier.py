"""Secondary tiers whose stores are slow, for the harness's crash scenario:
each store job waits ``store_delay`` seconds on a thread of its own before
it reaches the tier, so an engine killed mid-run has stores in flight.

The delay runs beside the tier, not inside it: the wrapped tier's calls all
stay on the scheduler's thread (a lock hands the delayed submissions over
at the next scheduler call), as vLLM's contract has them.
"""

from __future__ import annotations

import threading
import time

from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

from kvtier.vllm import FsTier


class _SlowStores:
    """Holds each store job for ``store_delay`` seconds, then lets the next
    scheduler call submit it."""

    def _init_slow(self, store_delay: float) -> None:
        self._delay = float(store_delay)
        self._lock = threading.Lock()
        self._ready: list = []
        self._held = 0

    def _hold(self, job) -> None:
        self._held += 1

        def release() -> None:
            time.sleep(self._delay)
            with self._lock:
                self._ready.append(job)

        threading.Thread(target=release, daemon=True).start()

    def _release(self, submit) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
        for job in ready:
            self._held -= 1
            submit(job)


class SlowStoreFsTier(_SlowStores, FsTier):
    """kvtier's ``FsTier`` with slow stores."""

    def __init__(self, *args, store_delay: float = 0.5, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._init_slow(store_delay)

    def submit_store(self, job_metadata) -> None:
        self._release(super().submit_store)
        self._hold(job_metadata)

    def get_finished_jobs(self):
        self._release(super().submit_store)
        return super().get_finished_jobs()


class SlowStoreVllmFsTier(_SlowStores, FileSystemTierManager):
    """vLLM's fs tier with slow stores."""

    def __init__(self, *args, store_delay: float = 0.5, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._init_slow(store_delay)

    def submit_store(self, job_metadata) -> None:
        self._release(super().submit_store)
        self._hold(job_metadata)

    def get_finished_jobs(self):
        self._release(super().submit_store)
        return super().get_finished_jobs()

"""A pure-Python async lookup manager after the reference design
(shared/reference/lookup-protocol.md): the baseline the Python benchmarks
measure kvtier against. Written for this benchmark from the protocol's
description, not taken from any engine; it keeps the reference's
structure (one worker thread, a queue per direction, per-request groups
published as each is done, generations, results drained on the first
lookup after a flush) and none of kvtier's fixes, which the benchmark does
not exercise.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterable, Optional

PENDING, IN_FLIGHT, RESOLVED = 0, 1, 2


class _State:
    __slots__ = ("generation", "phase", "result", "requests")

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.phase = PENDING
        self.result: Optional[bool] = None
        self.requests: set[str] = set()


class ReferenceManager:
    """lookup / flush / cleanup / mark_miss / shutdown, as the reference."""

    def __init__(self, batch_lookup: Callable[[list[bytes], str], Iterable[bool]]) -> None:
        self._batch_lookup = batch_lookup
        self._states: dict[bytes, _State] = {}
        self._request_keys: dict[str, set[bytes]] = {}
        self._batch: list[tuple[bytes, str, int]] = []
        self._next_generation = 0
        self._submissions: queue.SimpleQueue = queue.SimpleQueue()
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._drain_next = False
        self._idle = threading.Condition()
        self._outstanding = 0
        self._worker = threading.Thread(target=self._run, name="reference-lookup", daemon=True)
        self._worker.start()

    # Scheduler thread ---------------------------------------------------

    def lookup(self, key: bytes, req_id: str) -> Optional[bool]:
        if self._drain_next:
            self.drain()
            self._drain_next = False
        state = self._states.get(key)
        if state is None:
            state = _State(self._next_generation)
            self._next_generation += 1
            self._states[key] = state
            self._batch.append((key, req_id, state.generation))
        state.requests.add(req_id)
        keys = self._request_keys.get(req_id)
        if keys is None:
            keys = self._request_keys[req_id] = set()
        keys.add(key)
        return state.result

    def flush(self) -> int:
        self.drain()
        self._drain_next = True
        batch, self._batch = self._batch, []
        submitted = []
        for key, req_id, generation in batch:
            state = self._states.get(key)
            if state is None or state.generation != generation:
                continue
            state.phase = IN_FLIGHT
            submitted.append((key, req_id, generation))
        if submitted:
            with self._idle:
                self._outstanding += 1
            self._submissions.put(submitted)
        return len(submitted)

    def drain(self) -> None:
        while True:
            try:
                results = self._results.get_nowait()
            except queue.Empty:
                return
            for key, generation, found in results:
                state = self._states.get(key)
                if state is None or state.generation != generation:
                    continue
                if not state.requests:
                    del self._states[key]
                    continue
                state.result = found
                state.phase = RESOLVED

    def mark_miss(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            state = self._states.get(key)
            if state is not None:
                state.result = False
                state.phase = RESOLVED

    def cleanup(self, req_id: str) -> None:
        for key in self._request_keys.pop(req_id, ()):
            state = self._states[key]
            state.requests.discard(req_id)
            if not state.requests and state.phase != IN_FLIGHT:
                del self._states[key]

    def wait_idle(self) -> None:
        with self._idle:
            self._idle.wait_for(lambda: self._outstanding == 0)
        self.drain()

    def shutdown(self) -> None:
        self._submissions.put(None)
        self._worker.join()
        self.drain()

    # Worker thread ------------------------------------------------------

    def _run(self) -> None:
        while True:
            submitted = self._submissions.get()
            if submitted is None:
                return
            groups: dict[str, list[tuple[bytes, int]]] = {}
            for key, req_id, generation in submitted:
                groups.setdefault(req_id, []).append((key, generation))
            for req_id, entries in groups.items():
                keys = [key for key, _ in entries]
                try:
                    found = list(self._batch_lookup(keys, req_id))
                except Exception:
                    found = [False] * len(keys)
                self._results.put(
                    [(key, generation, hit) for (key, generation), hit in zip(entries, found)]
                )
            with self._idle:
                self._outstanding -= 1
                self._idle.notify_all()

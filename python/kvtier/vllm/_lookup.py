"""``AsyncLookupManager``: vLLM's per-tier lookup manager contract on kvtier's lookup."""

from __future__ import annotations

import logging
import weakref
from typing import Any, Iterable, Optional, Sequence

from .._native import Lookup, WorkerLostError
from ._compat import PrivateLookupState

logger = logging.getLogger("kvtier.vllm")


class AsyncLookupManager(PrivateLookupState):
    """vLLM's per-tier async lookup manager, over kvtier.

    ``lookup`` takes a key (``bytes``) and the request's context (an object
    with ``req_id``, or the id itself as a ``str``). Give ``lookup=`` a
    native ``kvtier.Lookup``, or subclass and implement ``batch_lookup``.
    """

    def __init__(self, tier_type: str = "kvtier", *, lookup: Optional[Lookup] = None) -> None:
        self._tier_type = tier_type
        #: Worker losses seen by ``flush`` (their keys were answered as misses).
        self.flush_errors = 0
        self._contexts: Optional[dict[str, Any]] = None
        self._last_context: Any = None
        if lookup is None:
            if type(self).batch_lookup is AsyncLookupManager.batch_lookup:
                raise TypeError(
                    "give AsyncLookupManager a native prober (lookup=kvtier.Lookup.vllm_fs(...)) "
                    "or subclass it and implement batch_lookup(keys, req_context)"
                )
            # The worker hands batch_lookup the request's context, as vLLM's
            # does. It holds the manager weakly: a manager nobody uses is
            # freed (and its worker stopped) at once, not by the cycle GC.
            self._contexts = {}
            manager = weakref.ref(self)

            def probe(keys: list[bytes], req_id: str) -> Iterable[bool]:
                owner = manager()
                if owner is None:
                    raise RuntimeError("the lookup manager was freed")
                return owner._probe(keys, req_id)

            lookup = Lookup.python(probe, name=f"kvtier_lookup_{tier_type}")
        self._lookup = lookup
        if self._contexts is None and type(self).lookup is AsyncLookupManager.lookup:
            # No Python frame between the scheduler and the native call.
            self.lookup = lookup.lookup  # type: ignore[method-assign]

    @property
    def tier_type(self) -> str:
        """The tier's name, as given."""
        return self._tier_type

    @property
    def native(self) -> Lookup:
        """The ``kvtier.Lookup`` underneath (for ``set_limits``, ``stats``)."""
        return self._lookup

    # The backend side: override in a subclass for a Python backend.

    def batch_lookup(self, keys: list[bytes], req_context: Any) -> Iterable[bool]:
        """Whether the tier holds each of ``keys``, in order. Runs on kvtier's
        worker thread; an exception makes the group's keys misses."""
        raise NotImplementedError

    def _probe(self, keys: list[bytes], req_id: str) -> Iterable[bool]:
        contexts = self._contexts or {}
        return self.batch_lookup(keys, contexts.get(req_id, req_id))

    # The scheduler side.

    def lookup(self, key: bytes, req_context: Any) -> Optional[bool]:
        """``True`` (HIT), ``False`` (MISS) or ``None`` (RETRY next step)."""
        if req_context is not self._last_context and self._contexts is not None:
            self._remember(req_context)
        return self._lookup.lookup(key, req_context)

    def lookup_many(self, keys: Sequence[bytes], req_context: Any) -> tuple[list[Optional[bool]], int]:
        """One request's keys in one native call: their verdicts and how many
        leading keys are hits."""
        if req_context is not self._last_context and self._contexts is not None:
            self._remember(req_context)
        return self._lookup.lookup_many(keys, req_context)

    def _remember(self, req_context: Any) -> None:
        """Keeps the context batch_lookup gets for the request's groups. A
        scheduler asks for one request's keys in a row, so this runs once
        per request per step, not once per key."""
        self._last_context = req_context
        req_id = req_context if isinstance(req_context, str) else req_context.req_id
        self._contexts[req_id] = req_context

    def flush(self) -> None:
        """Ends the step: the step's new keys go to the prober. Never waits.
        A lost worker is logged, not raised: its keys are misses."""
        self._apply_forged_answers()
        try:
            self._lookup.flush()
        except WorkerLostError as error:
            self.flush_errors += 1
            logger.warning("kvtier lookup worker of tier %s is lost: %s", self._tier_type, error)

    def drain_results(self) -> None:
        """Applies the answers published so far (every call does this first)."""
        self._lookup.drain()
        self._apply_forged_answers()

    def mark_miss(self, keys: Iterable[bytes]) -> None:
        """The loads of ``keys`` failed: their cached hits become misses,
        without a re-probe. A key looked up again since (pending or in
        flight) is not touched."""
        self._lookup.mark_miss(keys)

    def settle(self, keys: Iterable[bytes], present: bool) -> int:
        """The tier stored (``present``) or deleted the blocks of ``keys``:
        their lookups say so from now on, and a probe still in flight for
        one of them can no longer override it. Returns how many changed."""
        return self._lookup.settle(keys, present)

    def cleanup(self, req_id: str) -> None:
        """Forgets a finished request; an unknown id is a no-op."""
        self._lookup.cleanup(req_id)
        if self._contexts is not None:
            self._contexts.pop(req_id, None)
            self._last_context = None

    def on_schedule_end(self) -> None:
        """The tier manager's end-of-step hook: ``flush()``."""
        self.flush()

    def on_request_finished(self, req_id: str) -> None:
        """The tier manager's request-finished hook: ``cleanup(req_id)``."""
        self.cleanup(req_id)

    def wait_idle(self) -> int:
        """Blocks (without the GIL) until every submitted group is answered.
        For tests and orderly pauses. From inside ``batch_lookup`` it would
        wait for the call making it, so there it raises ``KvtierError``."""
        return self._lookup.wait_idle()

    def stats(self) -> dict[str, int]:
        """The lookup counters."""
        return self._lookup.stats()

    def shutdown(self) -> None:
        """Stops the worker (without holding the GIL, so a Python
        ``batch_lookup`` in progress can finish) and applies its last answers."""
        self._lookup.shutdown()

    def __repr__(self) -> str:
        return f"AsyncLookupManager({self._tier_type!r}, {self._lookup!r})"

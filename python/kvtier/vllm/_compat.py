"""Read-only views of kvtier's lookup state in the shape of vLLM's private
attributes.

vLLM's own tests of its lookup manager and tiers read the manager's
private state (``_lookup_state``, ``_req_keys``, ``_lookup_batch``,
``_pending_results``, ``_lookup_queue``, ``_thread``). kvtier keeps that
state natively, in its lookup table; these views answer the same questions
from it, so those tests run unmodified against kvtier. They are a
compatibility layer for tests and debugging, not an API: nothing here is
on a scheduler's path, and nothing here changes the table.

The one place a view takes input is ``_pending_results.put``: vLLM's tests
put back what ``get`` returned (here a token: the answers stay where they
are, published natively), and forge answers to check the manager's rules.
A forged answer is checked as vLLM's manager checks it, against the key's
state in kvtier's table: one for an older generation is stale and dropped
(kvtier's table drops stale answers the same way), and one for a key
already resolved in that generation raises ``AssertionError``, as vLLM's
enqueue-once assertion does (kvtier's table can never receive one: an
answer names the group it belongs to, and a resolved key's group is gone).
kvtier takes a key's answer only from its prober, so a forged answer for a
key still waiting for its probe raises ``NotImplementedError``.
"""

from __future__ import annotations

import enum
import queue
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Optional


class LookupPhase(enum.Enum):
    """Where a key's lookup stands, in vLLM's terms."""

    PENDING = enum.auto()  # looked up this step; goes out at the next flush
    IN_FLIGHT = enum.auto()  # submitted to the prober, answer not applied yet
    RESOLVED = enum.auto()  # the verdict is known


_PHASES = {
    "pending": LookupPhase.PENDING,
    "in_flight": LookupPhase.IN_FLIGHT,
    # In flight past its pending budget: kvtier already answers it as a
    # miss, but its probe is still out.
    "overdue": LookupPhase.IN_FLIGHT,
    "resolved": LookupPhase.RESOLVED,
}


@dataclass(frozen=True)
class LookupStateView:
    """One key's state: its generation, phase, verdict (``None`` until
    resolved) and how many live requests asked for it."""

    generation: int
    phase: LookupPhase
    result: Optional[bool]
    requesters: int


class LookupStates(Mapping):
    """``_lookup_state``: key → ``LookupStateView`` of every tracked key."""

    def __init__(self, inspector: Any) -> None:
        self._inspector = inspector

    def __getitem__(self, key: bytes) -> LookupStateView:
        state = self._inspector.key_state(key)
        if state is None:
            raise KeyError(key)
        generation, phase, found, requesters = state
        return LookupStateView(generation, _PHASES[phase], found, requesters)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and self._inspector.key_state(key) is not None

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._inspector.keys())

    def __len__(self) -> int:
        return len(self._inspector.keys())


class RequestKeys(Mapping):
    """``_req_keys``: live request id → the keys it asked for."""

    def __init__(self, inspector: Any) -> None:
        self._inspector = inspector

    def __getitem__(self, req_id: str) -> frozenset[bytes]:
        keys = self._inspector.request_keys(req_id) if isinstance(req_id, str) else None
        if keys is None:
            raise KeyError(req_id)
        return frozenset(keys)

    def __iter__(self) -> Iterator[str]:
        return iter(self._inspector.request_ids())

    def __len__(self) -> int:
        return len(self._inspector.request_ids())


class _Published:
    """What ``_pending_results.get`` returns: a token for the answers the
    prober published (they stay in kvtier's publication stack, applied by
    the manager's next call). ``put`` takes it back."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<answers published by kvtier's prober>"


_PUBLISHED = _Published()


class PublishedAnswers:
    """``_pending_results``: the answers published and not applied yet."""

    #: How often ``get`` looks for published answers while it waits.
    POLL_SECONDS = 0.001

    def __init__(self, inspector: Any) -> None:
        self._inspector = inspector
        self._forged: list[list[tuple[bytes, int, bool]]] = []

    def empty(self) -> bool:
        return not self._forged and not self._inspector.published()

    def qsize(self) -> int:
        return len(self._forged) + int(self._inspector.published())

    def get(self, block: bool = True, timeout: Optional[float] = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._forged:
                return self._forged.pop(0)
            if self._inspector.published():
                return _PUBLISHED
            if not block or (deadline is not None and time.monotonic() >= deadline):
                raise queue.Empty
            time.sleep(self.POLL_SECONDS)

    def get_nowait(self) -> Any:
        return self.get(block=False)

    def put(self, item: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        if item is _PUBLISHED:
            return
        self._forged.append([(bytes(key), int(generation), bool(found)) for key, generation, found in item])

    def put_nowait(self, item: Any) -> None:
        self.put(item)

    def apply_forged(self) -> None:
        """Checks the forged answers against the table, as vLLM's manager
        would apply them (see the module's docs)."""
        forged, self._forged = self._forged, []
        for batch in forged:
            for key, generation, _found in batch:
                state = self._inspector.key_state(key)
                # guard: N5-a-forged-stale-answer-is-dropped
                if state is None or state[0] != generation:
                    continue  # stale: the key was cleaned up (and reused) since
                if state[1] == "resolved":
                    raise AssertionError(
                        f"a second answer for generation {generation} of a resolved key: "
                        "each generation is probed (and answered) once"
                    )
                raise NotImplementedError(
                    "kvtier takes a key's answer only from its prober, not from _pending_results"
                )


class SubmittedGroups:
    """``_lookup_queue``: ``empty()`` when no group submitted to the prober
    is still waiting for its answer."""

    def __init__(self, inspector: Any) -> None:
        self._inspector = inspector

    def empty(self) -> bool:
        return self._inspector.outstanding_groups() == 0

    def qsize(self) -> int:
        return self._inspector.outstanding_groups()


class ProberWorker:
    """``_thread``: the prober's worker, alive until shutdown."""

    def __init__(self, inspector: Any, name: str) -> None:
        self._inspector = inspector
        self.name = name
        self.daemon = True

    def is_alive(self) -> bool:
        return not self._inspector.closed()

    def join(self, timeout: Optional[float] = None) -> None:
        """A prober is joined by the manager's ``shutdown``, not by this view."""


class PrivateLookupState:
    """The private attributes of vLLM's ``AsyncLookupManager``, as read-only
    views of the native lookup ``self._lookup`` (see the module's docs)."""

    _lookup: Any
    _tier_type: str

    def _views(self) -> dict[str, Any]:
        views = self.__dict__.get("_compat_views")
        if views is None:
            inspector = self._lookup.inspect()
            views = {
                "inspector": inspector,
                "states": LookupStates(inspector),
                "requests": RequestKeys(inspector),
                "published": PublishedAnswers(inspector),
                "submitted": SubmittedGroups(inspector),
                "worker": ProberWorker(inspector, f"kvtier_lookup_{self._tier_type}"),
            }
            self.__dict__["_compat_views"] = views
        return views

    @property
    def _lookup_state(self) -> LookupStates:
        return self._views()["states"]

    @property
    def _req_keys(self) -> RequestKeys:
        return self._views()["requests"]

    @property
    def _lookup_batch(self) -> list[tuple[bytes, str, int]]:
        return self._views()["inspector"].batched()

    @property
    def _pending_results(self) -> PublishedAnswers:
        return self._views()["published"]

    @property
    def _lookup_queue(self) -> SubmittedGroups:
        return self._views()["submitted"]

    @property
    def _thread(self) -> ProberWorker:
        return self._views()["worker"]

    def _apply_forged_answers(self) -> None:
        views = self.__dict__.get("_compat_views")
        if views is not None:
            views["published"].apply_forged()

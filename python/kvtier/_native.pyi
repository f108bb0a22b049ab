"""Type stubs of kvtier's native module (written in Rust with PyO3)."""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any, Iterable, Mapping, Optional, Protocol, Sequence, Union

__version__: str

class KvtierError(Exception):
    """The base of every exception kvtier raises."""

class ConfigError(KvtierError):
    """A setting or argument is out of range."""

class WorkerLostError(KvtierError):
    """The prober's worker is gone; the keys it was given are misses."""

class ShutdownError(KvtierError):
    """The lookup was shut down, or shutting down gave up on stuck groups."""

class TierError(KvtierError):
    """A tier could not be opened or used."""

class WireError(KvtierError):
    """Bytes that are not an encoded step or report of this version."""

class StepError(KvtierError):
    """A step out of sequence; nothing was taken."""

class ReportError(KvtierError):
    """A worker report out of sequence or from no such worker; nothing was taken."""

class InternalError(KvtierError):
    """A bug in kvtier: a Rust panic caught at the boundary."""

class _HasReqId(Protocol):
    req_id: str

#: A request: its id, or vLLM's request context (anything with ``req_id``).
_RequestLike = Union[str, _HasReqId]
_Path = Union[str, os.PathLike[str]]

class _Backend(Protocol):
    def batch_lookup(self, keys: list[bytes], req_id: str) -> Iterable[bool]: ...

class Lookup:
    """Async secondary-tier lookup for a scheduler thread."""

    @staticmethod
    def vllm_fs(
        rank_dir: _Path,
        *,
        concurrency: int = 4,
        group_timeout: Optional[float] = 2.0,
        shutdown_grace: float = 1.0,
        threads: int = 2,
    ) -> Lookup: ...
    @staticmethod
    def fs(
        root: _Path,
        namespace: str,
        *,
        concurrency: int = 4,
        group_timeout: Optional[float] = 2.0,
        shutdown_grace: float = 1.0,
        threads: int = 2,
    ) -> Lookup: ...
    @staticmethod
    def s3(
        url: str,
        *,
        access_key_id: Optional[str] = None,
        secret_access_key: Optional[str] = None,
        region: Optional[str] = None,
        concurrency: int = 4,
        group_timeout: Optional[float] = 2.0,
        shutdown_grace: float = 1.0,
        threads: int = 2,
    ) -> Lookup: ...
    @staticmethod
    def object_dir(
        root: _Path,
        namespace: str,
        *,
        concurrency: int = 4,
        group_timeout: Optional[float] = 2.0,
        shutdown_grace: float = 1.0,
        threads: int = 2,
    ) -> Lookup: ...
    @staticmethod
    def python(
        backend: Union[_Backend, Any],
        *,
        name: str = "kvtier-lookup",
    ) -> Lookup: ...
    def lookup(self, key: bytes, request: _RequestLike) -> Optional[bool]: ...
    def lookup_many(
        self, keys: Iterable[bytes], request: _RequestLike
    ) -> tuple[list[Optional[bool]], int]: ...
    def flush(self) -> int: ...
    def drain(self) -> int: ...
    def wait_idle(self) -> int: ...
    def mark_miss(self, keys: Iterable[bytes]) -> int: ...
    def cleanup(self, request: _RequestLike) -> None: ...
    def set_limits(
        self,
        *,
        pending_steps: Optional[int] = ...,
        pending_time: Optional[float] = ...,
        max_outstanding_keys: Optional[int] = None,
        max_outstanding_groups: Optional[int] = None,
        skip_unwanted: Optional[bool] = None,
    ) -> None: ...
    def stats(self) -> dict[str, int]: ...
    def shutdown(self) -> Optional[dict[str, int]]: ...
    def __len__(self) -> int: ...
    @property
    def request_count(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Lookup: ...
    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> bool: ...

def shutdown_all() -> int:
    """Shuts down every lookup still running (registered with ``atexit``)."""

class _StoreTask(Protocol):
    def done(self) -> bool: ...
    def wait(self) -> Any: ...

class SaveStep:
    """One step's save metadata, as every worker takes it."""

    @property
    def step(self) -> int: ...
    @property
    def requests(self) -> list[str]: ...
    @property
    def preempted(self) -> list[str]: ...
    @property
    def finished(self) -> list[str]: ...
    def is_empty(self) -> bool: ...
    def encode(self) -> bytes: ...
    @staticmethod
    def decode(data: bytes) -> SaveStep: ...

class SaveScheduler:
    """The scheduler's half of deferred save completion."""

    def __init__(self) -> None: ...
    def record_step(
        self, saves: Union[Mapping[str, int], Iterable[tuple[_RequestLike, int]]]
    ) -> SaveStep: ...
    def request_finished(self, request: _RequestLike) -> bool: ...
    def preempt(self, requests: Iterable[_RequestLike]) -> None: ...
    def is_delayed(self, request: _RequestLike) -> bool: ...
    @property
    def delayed_count(self) -> int: ...
    def stats(self) -> dict[str, int]: ...

class WorkerReport:
    """What one worker reports after a step."""

    @property
    def worker(self) -> int: ...
    @property
    def step(self) -> int: ...
    @property
    def finished(self) -> list[str]: ...
    def stats(self) -> dict[str, int]: ...
    def encode(self) -> bytes: ...
    @staticmethod
    def decode(data: bytes) -> WorkerReport: ...

class SaveTracker:
    """One worker's deferred save completion over Python store tasks."""

    def __init__(self, *, blocking: bool = False) -> None: ...
    def begin_step(self, step: SaveStep) -> None: ...
    @property
    def next_step(self) -> int: ...
    def submit(self, task: _StoreTask, requests: Sequence[_RequestLike]) -> int: ...
    def submit_failed(self, requests: Sequence[_RequestLike], error: str) -> None: ...
    def poll(self) -> int: ...
    def get_finished(self, finished: Iterable[_RequestLike]) -> list[str]: ...
    def finish_step(self, rank: int, step: SaveStep) -> WorkerReport: ...
    def handle_preemptions(self, requests: Iterable[_RequestLike]) -> int: ...
    def wait_all(self) -> list[str]: ...
    def is_tracked(self, request: _RequestLike) -> bool: ...
    @property
    def running_tasks(self) -> int: ...
    @property
    def tracked_requests(self) -> int: ...
    def stats(self) -> dict[str, int]: ...

class ReportAggregator:
    """Frees a delayed request once every worker reported it."""

    def __init__(self, workers: int) -> None: ...
    def expect(self, request: _RequestLike) -> bool: ...
    def accept(self, report: WorkerReport) -> tuple[list[str], list[str]]: ...
    @property
    def waiting(self) -> int: ...
    def is_waiting(self, request: _RequestLike) -> bool: ...

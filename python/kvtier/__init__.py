"""kvtier: KV-cache tiering for Python serving engines.

The scheduler's async lookup (``Lookup``) probes a secondary tier without
blocking the scheduler: native probers (vLLM's file-system layout,
kvtier's own fs tier, S3-compatible object stores) run on threads that never
take the GIL; a Python backend runs on a worker thread that takes it for
each call. Deferred save completion (``SaveScheduler``, ``SaveTracker``,
``ReportAggregator``) frees a finished request's blocks only once no save
reads them, across processes through the wire form of ``SaveStep`` and
``WorkerReport``. ``kvtier.vllm`` holds the vLLM-shaped lookup manager and
vLLM's block layout.

>>> import kvtier
>>> lookup = kvtier.Lookup.python(lambda keys, req_id: [k.startswith(b"a") for k in keys])
>>> lookup.lookup(b"abc", "req-1") is None   # new key: retry next step
True
>>> lookup.flush()
1
>>> _ = lookup.wait_idle()                    # a scheduler would just ask next step
>>> lookup.lookup(b"abc", "req-1")
True
>>> _ = lookup.shutdown()
"""

from ._native import (
    BusyError,
    ConfigError,
    ForkError,
    InternalError,
    KvtierError,
    Lookup,
    ReportAggregator,
    ReportError,
    SaveScheduler,
    SaveStep,
    SaveTracker,
    ShutdownError,
    StepError,
    TierError,
    WireError,
    WorkerLostError,
    WorkerReport,
    __version__,
)

#: A lookup's verdicts, as the scheduler reads them.
HIT = True
MISS = False
RETRY = None

__all__ = [
    "HIT",
    "MISS",
    "RETRY",
    "BusyError",
    "ConfigError",
    "ForkError",
    "InternalError",
    "KvtierError",
    "Lookup",
    "ReportAggregator",
    "ReportError",
    "SaveScheduler",
    "SaveStep",
    "SaveTracker",
    "ShutdownError",
    "StepError",
    "TierError",
    "WireError",
    "WorkerLostError",
    "WorkerReport",
    "__version__",
]

"""pytest plugin: runs vLLM's own tier tests against kvtier.

Loaded with ``-p kvtier_vllm_plugin`` before any test module is imported,
it puts kvtier's classes where vLLM's tier modules look theirs up; the
tests themselves are vLLM's, unmodified.

- ``KVTIER_VLLM_MODE=python``: ``kvtier.vllm.AsyncLookupManager`` (and its
  ``LookupPhase``) replaces vLLM's, so vLLM's fs and object tiers, and the
  tests' own managers, probe through kvtier's lookup, their
  ``batch_lookup`` a Python backend on kvtier's worker thread.
- ``KVTIER_VLLM_MODE=native``: the same, and ``kvtier.vllm.FsTier`` (native
  lookups, loads and stores) replaces vLLM's ``FileSystemTierManager``, as
  that name and as the ``fs`` type of vLLM's tier factory.

Two of vLLM's fs tier tests inject a store failure by replacing the fs
tier's ``batch_store_block`` with a wrapper that raises for one path and
calls the original otherwise. kvtier's tier stores natively and never
calls that function, so in native mode the plugin stands a no-op in for it
(kvtier does the store) and asks a replacement, with the job's paths, before
each store job: when the replacement raises, the job is refused through
``VllmTransfers.refuse`` and reported failed, as a store that failed on its
own would be. Those tests then check kvtier's handling of a failed store
(no event for it, nothing left in flight).
"""

import os

MODE = os.environ.get("KVTIER_VLLM_MODE", "python")
if MODE not in ("python", "native"):
    raise RuntimeError(f"KVTIER_VLLM_MODE is {MODE!r}: use python or native")

import kvtier.vllm  # noqa: E402

# Before vLLM's tier modules are imported: they subclass the lookup
# manager when they are.
import vllm.v1.kv_offload.tiering.async_lookup as _async_lookup  # noqa: E402

_async_lookup.AsyncLookupManager = kvtier.vllm.AsyncLookupManager
_async_lookup.LookupPhase = kvtier.vllm.LookupPhase

if MODE == "native":
    import vllm.v1.kv_offload.tiering.fs.manager as _fs_manager  # noqa: E402
    from kvtier.vllm.tier import FsTier  # noqa: E402

    def _stored_natively(paths, *args, **kwargs):
        """Stands in for vLLM's ``batch_store_block``: kvtier's tier stores
        natively, after asking a test's replacement (see the module docs)."""

    _fs_manager.batch_store_block = _stored_natively

    class FsTierUnderVllmTests(FsTier):
        """``kvtier.vllm.FsTier``, asking a test's replacement of vLLM's
        ``batch_store_block`` before each store job."""

        def submit_store(self, job_metadata):
            replacement = _fs_manager.batch_store_block
            if replacement is not _stored_natively:
                paths = [self.file_mapper.get_file_name(key) for key in job_metadata.keys]
                try:
                    replacement(paths, None, [], self.block_size_bytes, False)
                except OSError as error:
                    self._transfers.refuse(
                        job_metadata.job_id, job_metadata.keys, False, f"the test injected {error}"
                    )
                    return
            super().submit_store(job_metadata)

    _fs_manager.FileSystemTierManager = FsTierUnderVllmTests


# How many of kvtier's objects the tests built: a substitution that did not
# take would leave vLLM's classes in use and these at zero.
BUILT = {"lookup managers": 0, "fs tiers": 0}


def _counting(cls, what):
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        BUILT[what] += 1
        init(self, *args, **kwargs)

    cls.__init__ = __init__


_counting(kvtier.vllm.AsyncLookupManager, "lookup managers")
if MODE == "native":
    _counting(FsTier, "fs tiers")


def pytest_report_header(config):
    return f"kvtier substitution: {MODE} mode"


def pytest_terminal_summary(terminalreporter):
    built = ", ".join(f"{count} {what}" for what, count in BUILT.items())
    terminalreporter.write_line(f"kvtier ({MODE} mode) built {built}")


def pytest_sessionfinish(session):
    needed = ["lookup managers"] + (["fs tiers"] if MODE == "native" else [])
    if session.testscollected and any(BUILT[what] == 0 for what in needed):
        session.exitstatus = 1
        print(f"\nkvtier's classes were never used ({BUILT}): the substitution did not take")

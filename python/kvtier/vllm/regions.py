"""``kvtier.vllm.regions``: removes the shared offload regions that killed
vLLM engines left in ``/dev/shm``.

vLLM's tiered offloading maps one region per engine,
``/dev/shm/vllm_offload_<engine id>.mmap`` (up to ``cpu_bytes_to_use`` of
RAM), and unlinks it in its orderly teardown. vLLM's server aborts its
engine at SIGTERM unless ``--shutdown-timeout`` is above 0: the engine's
processes are killed, no teardown runs, and the region stays until the
machine reboots, one more with every restart.

kvtier's vLLM components (``kvtier.vllm.FsTier``, ``CpuTieringSpec`` and
the ``StorageConnector``) call ``remove_orphaned_regions()`` once per
process as they start. It removes a region only when all of these hold:

- its name is ``vllm_offload_<id>.mmap`` and it is a regular file (not a
  link) in the directory;
- it belongs to this process's user;
- no running process has it open or mapped (every process's
  ``/proc/<pid>/fd`` and ``/proc/<pid>/maps`` is read; a process of this
  user of which neither can be read keeps every region).

A live engine always holds its region (its processes keep the file open
from its creation to their teardown), so it is never removed. Processes in
another PID namespace are not seen in ``/proc``: where engines in other
containers share this ``/dev/shm`` under the same user, set
``KVTIER_KEEP_OFFLOAD_REGIONS=1`` to turn the removal off.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from typing import Optional

logger = logging.getLogger("kvtier.vllm")

__all__ = ["remove_orphaned_regions", "REGION_PATTERN"]

#: The names of vLLM's offload regions.
REGION_PATTERN = re.compile(r"vllm_offload_[A-Za-z0-9_.-]+\.mmap")

#: Set to anything but "" or "0" to keep every region.
KEEP_ENV = "KVTIER_KEEP_OFFLOAD_REGIONS"

_done_in_process: Optional[int] = None


class _Unreadable(Exception):
    """A process of this user whose open files could not be read."""


def remove_orphaned_regions(directory: str = "/dev/shm", proc: str = "/proc") -> list[str]:
    """Removes the offload regions in ``directory`` that no running process
    holds (see the module's docs) and returns their paths. Never raises:
    what cannot be read or removed is logged and kept."""
    if os.environ.get(KEEP_ENV, "") not in ("", "0"):
        return []
    try:
        candidates = _candidates(directory)
        if not candidates:
            return []
        held = _held_paths(proc)
    except _Unreadable as error:
        logger.warning("kvtier: offload regions left as they are: %s", error)
        return []
    except OSError as error:
        logger.warning("kvtier: cannot look for offload regions that stopped engines left: %s", error)
        return []
    removed = []
    for path, size in candidates:
        # guard: N15-a-region-a-process-holds-is-kept
        if path in held:
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError as error:
            logger.warning("kvtier: cannot remove %s that a stopped engine left: %s", path, error)
            continue
        removed.append(path)
        logger.warning(
            "kvtier: removed %s (%d MiB), an offload region a stopped vLLM engine left: no running "
            "process had it open or mapped",
            path,
            size >> 20,
        )
    return removed


def remove_orphaned_regions_once() -> list[str]:
    """``remove_orphaned_regions()`` the first time this process calls it
    (an engine's components all start in it); ``[]`` afterwards."""
    global _done_in_process
    if _done_in_process == os.getpid():
        return []
    _done_in_process = os.getpid()
    return remove_orphaned_regions()


def _candidates(directory: str) -> list[tuple[str, int]]:
    """The regions of this user in ``directory``: (path, bytes)."""
    found = []
    uid = os.geteuid()
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for entry in entries:
        if not REGION_PATTERN.fullmatch(entry.name):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        # guard: N16-only-this-users-regular-files
        if stat.S_ISREG(info.st_mode) and info.st_uid == uid:
            found.append((os.path.join(directory, entry.name), info.st_size))
    return found


def _held_paths(proc: str) -> set[str]:
    """Every path some running process has open or mapped (a deleted
    file's too, without the kernel's `` (deleted)`` mark)."""
    held: set[str] = set()
    uid = os.geteuid()
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        base = os.path.join(proc, pid)
        try:
            owner = os.stat(base).st_uid
        except OSError:
            continue  # exited
        read = [_read_fds(base, held), _read_maps(base, held)]
        if None in read:
            continue  # exited meanwhile
        # A process whose descriptors and mappings both stay hidden might
        # hold a region. One whose mappings alone are hidden (a process
        # with more privileges than this one, such as a sandbox's init)
        # is judged by its descriptors: a live vLLM engine keeps its
        # region's descriptor open until its teardown.
        if not any(read) and owner == uid:
            raise _Unreadable(f"process {pid} of this user cannot be inspected")
    return held


def _read_fds(base: str, held: set[str]) -> Optional[bool]:
    """Adds the paths process ``base`` has open; False when that cannot be
    read, None when the process is gone."""
    try:
        fds = os.listdir(os.path.join(base, "fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    except PermissionError:
        return False
    for fd in fds:
        try:
            held.add(_undeleted(os.readlink(os.path.join(base, "fd", fd))))
        except OSError:
            continue  # closed meanwhile
    return True


def _read_maps(base: str, held: set[str]) -> Optional[bool]:
    """Adds the paths process ``base`` has mapped; False when that cannot
    be read, None when the process is gone."""
    try:
        with open(os.path.join(base, "maps"), errors="replace") as maps:
            for line in maps:
                # address perms offset dev inode path
                parts = line.split(None, 5)
                if len(parts) == 6:
                    held.add(_undeleted(parts[5].rstrip("\n")))
    except (FileNotFoundError, ProcessLookupError):
        return None
    except PermissionError:
        return False
    return True


def _undeleted(path: str) -> str:
    return path[: -len(" (deleted)")] if path.endswith(" (deleted)") else path

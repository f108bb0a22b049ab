"""``kvtier.vllm.regions``: the offload regions a killed engine left are
removed at the next start, and nothing else: not a region a live process
has open or mapped, not another user's, not a name of another pattern, not
a link or a directory."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kvtier.vllm import regions
from kvtier.vllm.regions import remove_orphaned_regions

#: A child that holds ``argv[1]`` open (``open``) or only mapped (``map``:
#: the descriptor closed after mmap), says so on stdout, then sleeps.
HOLDER = """
import mmap, os, sys, time
fd = os.open(sys.argv[2], os.O_RDWR)
if sys.argv[1] == "map":
    region = mmap.mmap(fd, 4096)
    os.close(fd)
print("ready", flush=True)
time.sleep(60)
"""


def region(directory, name: str, size: int = 4096) -> str:
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def hold(how: str, path: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", HOLDER, how, path], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def test_only_regions_no_process_holds_are_removed(tmp_path, monkeypatch):
    monkeypatch.delenv(regions.KEEP_ENV, raising=False)
    orphan = region(tmp_path, "vllm_offload_0c196394-6e00-4432-9264-9bc6fcaed7b3.mmap", 1 << 20)
    opened = region(tmp_path, "vllm_offload_opened.mmap")
    mapped = region(tmp_path, "vllm_offload_mapped.mmap")
    mine = region(tmp_path, "vllm_offload_mine.mmap")
    others = [
        region(tmp_path, "vllm_offload_x.mmap.bak"),
        region(tmp_path, "psm_0123abcd"),
        region(tmp_path, "other_offload_x.mmap"),
    ]
    target = region(tmp_path, "target")
    os.symlink(target, tmp_path / "vllm_offload_link.mmap")
    os.mkdir(tmp_path / "vllm_offload_dir.mmap")
    children = [hold("open", opened), hold("map", mapped)]
    fd = os.open(mine, os.O_RDONLY)
    try:
        removed = remove_orphaned_regions(str(tmp_path))
        assert removed == [orphan]
        assert not os.path.exists(orphan)
        for path in [opened, mapped, mine, target, *others]:
            assert os.path.exists(path), path
        assert os.path.islink(tmp_path / "vllm_offload_link.mmap")
        assert os.path.isdir(tmp_path / "vllm_offload_dir.mmap")
        assert remove_orphaned_regions(str(tmp_path)) == []
    finally:
        os.close(fd)
        for child in children:
            child.kill()
            child.wait()
    # Their holders gone, they are orphans too.
    assert sorted(remove_orphaned_regions(str(tmp_path))) == sorted([opened, mapped, mine])


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_another_users_region_is_kept(tmp_path, monkeypatch):
    monkeypatch.delenv(regions.KEEP_ENV, raising=False)
    theirs = region(tmp_path, "vllm_offload_theirs.mmap")
    os.chown(theirs, 65534, 65534)
    assert remove_orphaned_regions(str(tmp_path)) == []
    assert os.path.exists(theirs)


def test_the_environment_can_keep_every_region(tmp_path, monkeypatch):
    orphan = region(tmp_path, "vllm_offload_a.mmap")
    monkeypatch.setenv(regions.KEEP_ENV, "1")
    assert remove_orphaned_regions(str(tmp_path)) == []
    assert os.path.exists(orphan)
    monkeypatch.setenv(regions.KEEP_ENV, "0")
    assert remove_orphaned_regions(str(tmp_path)) == [orphan]


def test_a_process_of_this_user_that_cannot_be_read_keeps_every_region(tmp_path, monkeypatch):
    """A process whose open files this user cannot see (not dumpable, say)
    might hold a region: nothing is removed."""
    monkeypatch.delenv(regions.KEEP_ENV, raising=False)
    orphan = region(tmp_path, "vllm_offload_a.mmap")
    real_listdir = os.listdir

    hidden = f"/proc/{os.getpid()}"
    real_open = open

    def listdir(path):
        if str(path) == f"{hidden}/fd":
            raise PermissionError(13, "Permission denied", path)
        return real_listdir(path)

    def guarded_open(path, *args, **kwargs):
        if str(path) == f"{hidden}/maps":
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(regions.os, "listdir", listdir)
    monkeypatch.setattr("builtins.open", guarded_open)
    assert remove_orphaned_regions(str(tmp_path)) == []
    assert os.path.exists(orphan)


def test_a_missing_directory_is_no_error(tmp_path):
    assert remove_orphaned_regions(str(tmp_path / "gone")) == []


def test_the_once_per_process_call_looks_once(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(regions, "_done_in_process", None)
    monkeypatch.setattr(regions, "remove_orphaned_regions", lambda: calls.append(time.monotonic()) or [])
    regions.remove_orphaned_regions_once()
    regions.remove_orphaned_regions_once()
    assert len(calls) == 1

"""Shared pieces of the Python package's tests: a scripted Python backend,
store tasks completed by the test, and an S3 server on loopback."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import socket
import threading
import time
from typing import Callable, Iterable, Optional

import pytest

# Nothing here may look for cloud credentials: no instance-metadata lookups.
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")

#: How long a test waits for something that should take milliseconds.
PATIENCE = 10.0


class ScriptedBackend:
    """A Python backend whose answers and timing the test controls.

    ``stored`` is the set of keys the tier holds (or a function of the key
    and the call number); ``gate(req_id)`` makes that request's calls wait
    until ``release(req_id)``. Every call is recorded in ``calls``."""

    def __init__(self, stored: Iterable[bytes] = (), answer: Optional[Callable[[bytes, int], bool]] = None):
        self.stored = set(stored)
        self.answer = answer
        self.calls: list[tuple[str, list[bytes]]] = []
        self.started = threading.Event()
        self._gates: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def gate(self, req_id: str) -> None:
        self._gates[req_id] = threading.Event()

    def release(self, req_id: str) -> None:
        self._gates[req_id].set()

    def batch_lookup(self, keys: list[bytes], req_id: str) -> list[bool]:
        with self._lock:
            self.calls.append((req_id, list(keys)))
            number = len(self.calls)
        self.started.set()
        gate = self._gates.get(req_id)
        if gate is not None and not gate.wait(PATIENCE):
            raise TimeoutError(f"the test never released {req_id}")
        if self.answer is not None:
            return [self.answer(key, number) for key in keys]
        return [key in self.stored for key in keys]

    def probed_keys(self) -> list[bytes]:
        return [key for _, keys in self.calls for key in keys]


class Request:
    """vLLM's request context: what its tier manager passes to lookup."""

    def __init__(self, req_id: str) -> None:
        self.req_id = req_id


class GatedTask:
    """A store task the test completes: ``done()`` until ``finish()``."""

    def __init__(self, fail: Optional[str] = None) -> None:
        self._done = threading.Event()
        self.fail = fail
        self.waits = 0

    def finish(self) -> None:
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        self.waits += 1
        if not self._done.wait(PATIENCE):
            raise TimeoutError("the test never finished the task")
        if self.fail:
            raise OSError(self.fail)


@contextlib.contextmanager
def watchdog(seconds: float = PATIENCE):
    """Ends the test run, with every thread's stack, if the block hangs:
    a deadlock fails instead of holding the suite forever."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def native_threads(prefix: str, expect: Optional[int] = None) -> int:
    """Threads of this process whose name starts with ``prefix`` (Linux
    keeps the first 15 bytes): kvtier's workers are native threads, which
    ``threading`` does not list. With ``expect``, waits (a new thread names
    itself once it runs) until the count is that, or PATIENCE ran out."""
    deadline = time.monotonic() + PATIENCE
    while True:
        count = _count_threads(prefix)
        if expect is None or count == expect or time.monotonic() > deadline:
            return count
        time.sleep(0.005)


def _count_threads(prefix: str) -> int:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                names.append(comm.read().strip())
        except (FileNotFoundError, ProcessLookupError):
            pass  # the thread exited meanwhile (ENOENT or ESRCH)
    return sum(name.startswith(prefix[:15]) for name in names)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint():
    """An S3-compatible server on loopback: the one CI started
    (``KVTIER_S3_ENDPOINT``), else moto's server in this process."""
    endpoint = os.environ.get("KVTIER_S3_ENDPOINT")
    if endpoint:
        yield endpoint
        return
    server_module = pytest.importorskip("moto.server")
    port = free_port()
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture()
def s3_client(s3_endpoint):
    boto3 = pytest.importorskip("boto3")
    return boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )

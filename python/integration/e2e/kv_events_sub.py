"""A test subscriber to an engine's KV events, as a router would be: a ZMQ
SUB socket on the local ``ipc://`` endpoint the engine publishes on
(``kv_events_config``, publisher ``zmq``), decoding each batch with vLLM's
own event types, on a thread of its own.

    with KvEventSubscriber() as events:   # before the engine starts
        ...                               # the engine runs on events.endpoint
    events.stored["STORAGE"], events.removed["STORAGE"]

The socket lives in a directory of its own under the system's temporary
directory, not the run's: a Unix socket's path is limited to about 107
bytes, which a deep checkout's work directory can pass (the subscriber's
connect, and the engine's bind, then fail with "File name too long"). On
leaving, the subscriber keeps reading until the socket has been quiet for
half a second, so the events the engine published last are counted too.

``stored`` and ``removed`` map a medium (``GPU``, ``CPU``, ``STORAGE``) to
the block hashes of its ``BlockStored`` and ``BlockRemoved`` events, in the
order published.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections import defaultdict
from pathlib import Path

#: How long the socket must stay quiet, once asked to stop, before the
#: subscriber stops reading.
DRAIN_QUIET_MS = 500
#: How long entering waits for the subscriber's thread to connect.
CONNECT_SECONDS = 30.0


class KvEventSubscriber:
    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="kvtier-ev-"))
        self.endpoint = f"ipc://{self._dir / 'events.sock'}"
        self.stored: dict[str, list] = defaultdict(list)
        self.removed: dict[str, list] = defaultdict(list)
        self.batches = 0
        self.undecoded = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._modules: tuple = ()

    def __enter__(self) -> "KvEventSubscriber":
        # The imports first, here: vLLM's brings torch, which on a loaded
        # machine takes longer than the wait below is meant for (a connect).
        import msgspec
        import zmq
        from vllm.distributed import kv_events

        self._modules = (msgspec, zmq, kv_events)
        self._thread.start()
        if not self._ready.wait(CONNECT_SECONDS) or self._failed is not None:
            raise RuntimeError(f"the KV event subscriber did not start: {self._failed!r}")
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)
        shutil.rmtree(self._dir, ignore_errors=True)

    def _run(self) -> None:
        msgspec, zmq, kv_events = self._modules
        sub = None
        try:
            decoder = msgspec.msgpack.Decoder(type=kv_events.KVEventBatch)
            sub = zmq.Context.instance().socket(zmq.SUB)
            # The engine binds the endpoint once it is up; a SUB socket
            # connected before that reconnects by itself.
            sub.connect(self.endpoint)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
        except Exception as error:
            # Whatever fails here is reported by __enter__, not waited out.
            self._failed = error
            if sub is not None:
                sub.close(linger=0)
            return
        finally:
            self._ready.set()
        try:
            while True:
                stopping = self._stop.is_set()
                if not sub.poll(DRAIN_QUIET_MS if stopping else 100):
                    if stopping:
                        break  # asked to stop, and nothing more came
                    continue
                frames = sub.recv_multipart()
                try:
                    batch = decoder.decode(frames[-1])
                except msgspec.DecodeError:
                    self.undecoded += 1
                    continue
                self.batches += 1
                for event in batch.events:
                    if isinstance(event, kv_events.BlockStored):
                        self.stored[event.medium or "GPU"].extend(event.block_hashes)
                    elif isinstance(event, kv_events.BlockRemoved):
                        self.removed[event.medium or "GPU"].extend(event.block_hashes)
        finally:
            sub.close(linger=0)

    def summary(self) -> str:
        media = sorted(set(self.stored) | set(self.removed))
        counts = ", ".join(f"{m}: {len(self.stored[m])} stored, {len(self.removed[m])} removed" for m in media)
        return f"{self.batches} batches ({counts or 'no blocks'})"

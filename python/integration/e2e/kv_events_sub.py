"""A test subscriber to an engine's KV events, as a router would be: a ZMQ
SUB socket on the local ``ipc://`` endpoint the engine publishes on
(``kv_events_config``, publisher ``zmq``), decoding each batch with vLLM's
own event types, on a thread of its own.

    with KvEventSubscriber(path) as events:   # before the engine starts
        ...                                   # the engine runs
    events.stored["STORAGE"], events.removed["STORAGE"]

``stored`` and ``removed`` map a medium (``GPU``, ``CPU``, ``STORAGE``) to
the block hashes of its ``BlockStored`` and ``BlockRemoved`` events, in the
order published.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path


class KvEventSubscriber:
    def __init__(self, socket_path: Path) -> None:
        self.endpoint = f"ipc://{socket_path}"
        self.stored: dict[str, list] = defaultdict(list)
        self.removed: dict[str, list] = defaultdict(list)
        self.batches = 0
        self.undecoded = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._ready = threading.Event()

    def __enter__(self) -> "KvEventSubscriber":
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the KV event subscriber did not start")
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        import msgspec
        import zmq
        from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        context = zmq.Context.instance()
        sub = context.socket(zmq.SUB)
        # The engine binds the endpoint once it is up; a SUB socket
        # connected before that reconnects by itself.
        sub.connect(self.endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._ready.set()
        try:
            while not self._stop.is_set():
                if not sub.poll(100):
                    continue
                frames = sub.recv_multipart()
                try:
                    batch = decoder.decode(frames[-1])
                except msgspec.DecodeError:
                    self.undecoded += 1
                    continue
                self.batches += 1
                for event in batch.events:
                    if isinstance(event, BlockStored):
                        self.stored[event.medium or "GPU"].extend(event.block_hashes)
                    elif isinstance(event, BlockRemoved):
                        self.removed[event.medium or "GPU"].extend(event.block_hashes)
        finally:
            sub.close(linger=0)

    def summary(self) -> str:
        media = sorted(set(self.stored) | set(self.removed))
        counts = ", ".join(f"{m}: {len(self.stored[m])} stored, {len(self.removed[m])} removed" for m in media)
        return f"{self.batches} batches ({counts or 'no blocks'})"

"""A fleet on one bucket: engine processes standing for hosts, each with
its own CPU tier and its own directories, sharing nothing but a bucket of
a real S3 server (SeaweedFS, ``seaweed.py``) through kvtier's
``ObjectTier``.

- host A computes the prompts and stores their blocks (kvtier's ``url``,
  credentials from the environment), prompts 4-5 a second after 0-3; the
  bucket then holds exactly vLLM's raw blocks, one object each, and no
  unfinished upload;
- host B (vLLM's ``store_config`` and ``prefix``, explicit credentials)
  serves every prompt token from A's objects: 0 computed, the same tokens
  and logprobs as the run without offloading;
- an unfinished multipart upload of a block's name is planted, as a
  multipart writer killed mid-upload (vLLM's obj tier through the AWS SDK)
  leaves one;
- host C aborts that stale upload at start, and runs while the server is
  stopped for a few seconds between two batches: during the outage its
  lookups turn to misses and its stores fail (reported, counted), the
  prompts are computed with the same outputs, and the budget's recency is
  not reordered by the deletions that failed; once the server is back, the
  tier serves A's blocks again;
- host D is SIGKILLed while its stores are in flight: no partial object
  is visible and no upload left (kvtier writes a block with one PUT);
- every host has the same byte budget (``capacity_bytes``, below what they
  write together) and reconciles with a listing every second: the
  bucket's bytes (listed objects) stay within it at every sample.
"""

from __future__ import annotations

import glob
import os
import random
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from e2e_common import BLOCK_BYTES, HERE, PROMPT_TOKENS, PROMPTS, check, tail, wait_for_group

sys.path.insert(0, str(HERE.parent))
from seaweed import ACCESS_KEY, SECRET_KEY, Seaweed  # noqa: E402

if TYPE_CHECKING:
    from harness import Harness

BUCKET = "kvtier-fleet"
PREFIX = "fleet"
#: How long the outage lasts once host C's batch during it has run.
OUTAGE_SECONDS = 4.0
#: Request settings of every host: a stopped server costs a job at most
#: (retries + 1) x request_timeout, and a lookup group at most
#: lookup_timeout (its refused connections end it sooner). Every host gives
#: a group 10 s: B and C must load every block, and on a loaded 2-core machine a
#: group of 18 HEADs once took more than 1 s, and its prompt was computed.
REQUESTS = {"request_timeout": 2.0, "connect_timeout": 1.0, "max_retries": 1, "lookup_timeout": 10.0}
#: The fleet's budget: 128 blocks, where A stores 108 and C and D 36 each
#: (C then evicts 16 of A's, D what it adds).
CAPACITY = 128 * BLOCK_BYTES
BUDGET = {"capacity_bytes": CAPACITY, "rescan_interval": 1.0}


def url_form(server: Seaweed) -> dict:
    return {"url": f"s3://{BUCKET}/{PREFIX}?endpoint={server.endpoint}", **REQUESTS, **BUDGET}


def vllm_form(server: Seaweed) -> dict:
    return {"store_config": server.store_config(BUCKET), "prefix": PREFIX, **REQUESTS, **BUDGET}


CREDENTIALS = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}


def tier_counts(name: str, log: str) -> dict:
    """The figures the tier logs at shutdown (``NativeTier.shutdown``)."""
    found = re.search(
        r"loaded (\d+) blocks \((\d+) failed\) and stored (\d+) \((\d+) failed\)", log
    )
    check(found is not None, f"{name}: the tier logged no transfer figures at shutdown\n{tail(log)}")
    loaded, load_failed, stored, store_failed = map(int, found.groups())
    return {"loaded": loaded, "load_failed": load_failed, "stored": stored, "store_failed": store_failed}


class Sampler:
    """Samples the bucket's bytes (every object below the prefix) on a
    thread while the hosts run; the largest sample is what the budget's
    check reads."""

    def __init__(self, server: Seaweed, bucket: str = BUCKET, prefix: str = f"{PREFIX}/") -> None:
        self.server, self.samples, self.largest = server, 0, 0
        self.bucket, self.prefix = bucket, prefix
        #: Every key seen, in the order it first appeared (a failed check
        #: names what was gone by the rank at which it was written).
        self.arrivals: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                listed = self.server.list_objects(self.bucket, self.prefix)
                total = sum(listed.values())
            except OSError:
                continue  # the server is stopped (the outage)
            for key in listed:
                self.arrivals.setdefault(key, len(self.arrivals))
            self.samples += 1
            self.largest = max(self.largest, total)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()


def run(h: "Harness") -> None:
    server_dir = h.work / "seaweed"
    shutil.rmtree(server_dir, ignore_errors=True)
    with Seaweed(server_dir, buckets=[BUCKET], anonymous=True) as server, Sampler(server) as sampler:
        hosts(h, server, sampler)
    check(
        sampler.largest <= CAPACITY,
        f"fleet budget: the bucket held {sampler.largest} bytes, over the budget of {CAPACITY}",
    )
    h.notes.append(
        f"fleet budget: at most {sampler.largest} of {CAPACITY} bytes in the bucket over {sampler.samples} samples"
    )


def hosts(h: "Harness", server: Seaweed, sampler: Sampler) -> None:
    blocks = PROMPTS * PROMPT_TOKENS // 32

    # Host A: computes and stores, prompts 0-3, then 4-5 at least a second
    # later: the budget's recency at each host's start is the objects' last
    # modified time, in whole seconds, so C's evictions take blocks of
    # prompts 0-3 (which C only runs while the server is down), never of
    # 4-5 (which it loads once the server is back).
    pause = h.work / "runs" / "fleet-a-pause"
    shutil.rmtree(pause, ignore_errors=True)
    pause.mkdir(parents=True)
    settings = h.settings(
        "object",
        h.work / "fleet-a",
        object=url_form(server),
        env=CREDENTIALS,
        pause=str(pause),
        then=[h.prompts[4:6]],
    )
    settings["prompts"] = h.prompts[0:4]
    started = time.monotonic()
    process, run_dir = h.start("fleet-a", settings)
    wait_ready(process, run_dir, pause, "phase1")
    first = 4 * PROMPT_TOKENS // 32
    deadline = time.monotonic() + 120
    while len(server.list_objects(BUCKET, f"{PREFIX}/")) < first and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.1)
    (pause / "phase1").touch()
    a = h._ended(process, run_dir, started)
    a["outputs"] = {(str(int(k[2:]) + 4) if k.startswith("1.") else k): v for k, v in a["outputs"].items()}
    h.same_outputs("fleet host A", a["outputs"])
    objects = server.list_objects(BUCKET, f"{PREFIX}/")
    check(len(objects) == blocks, f"fleet host A: {len(objects)} objects in the bucket, {blocks} blocks computed")
    check(
        set(objects.values()) == {BLOCK_BYTES},
        f"fleet host A: objects of other sizes than a block: {sorted(set(objects.values()))}",
    )
    check(not server.list_uploads(BUCKET), "fleet host A: unfinished uploads left")

    # Host B: another host, vLLM's own settings: every prompt token from A's.
    b = h.run("fleet-b", h.settings("object", h.work / "fleet-b", object=vllm_form(server)))
    h.all_from_tier("fleet host B", b)
    h.same_outputs("fleet host B", b["outputs"])
    counts = tier_counts("fleet host B", b["log"])
    check(counts["loaded"] == blocks, f"fleet host B: {counts} (loaded {blocks} expected)")
    h.notes.append(
        f"fleet: host B's generate() {b['seconds']:.2f} s loading every prompt block from the bucket, "
        f"{b['seconds'] / h.baseline_seconds:.2f}x the baseline's {h.baseline_seconds:.2f} s computing them"
    )
    planted = plant_upload(server)
    outage(h, server, planted, sorted(objects, key=lambda key: sampler.arrivals.get(key, -1)))
    killed(h, server)


def fresh_prompts(seed: int) -> list:
    rng = random.Random(seed)
    return [[rng.randrange(1, 8000) for _ in range(PROMPT_TOKENS)] for _ in range(2)]


def killed(h: "Harness", server: Seaweed) -> None:
    """Host D, last: new prompts, its stores held 2 s each, killed
    (SIGKILL, its process group) once one of them is in the bucket. (Held
    0.5 s, all 36 landed before the kill once, on a loaded 2-core machine:
    16 write threads take three rounds.)"""
    before = set(server.list_objects(BUCKET, f"{PREFIX}/"))
    settings = h.settings(
        "object", h.work / "fleet-d", object=vllm_form(server), store_delay=2.0, linger=300
    )
    settings["prompts"] = fresh_prompts(7)
    process, run_dir = h.start("fleet-d-killed", settings)
    deadline = time.monotonic() + 600
    while process.poll() is None and time.monotonic() < deadline:
        if set(server.list_objects(BUCKET, f"{PREFIX}/")) - before:
            break
        time.sleep(0.05)
    log = (run_dir / "engine.log").read_text()
    check(process.poll() is None, f"fleet host D: it ended before any store landed\n{tail(log)}")
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    wait_for_group(process.pid, timeout=120)
    for left in glob.glob("/dev/shm/vllm_offload_*"):
        os.unlink(left)  # a SIGKILL leaves the killed engine's region
    objects = server.list_objects(BUCKET, f"{PREFIX}/")
    added = set(objects) - before
    check(len(added) < 36, f"fleet host D: all its {len(added)} stores landed before the kill")
    partial = {key: size for key, size in objects.items() if size != BLOCK_BYTES}
    check(not partial, f"fleet host D: partial objects visible after the kill: {partial}")
    check(not server.list_uploads(BUCKET), "fleet host D: the kill left an unfinished upload")
    h.notes.append(f"fleet kill: host D killed with {len(added)} of 36 stores landed, no partial object, no upload")


def wait_ready(process, run_dir: Path, pause: Path, phase: str) -> None:
    """Waits until the engine is done with the batch before ``phase``
    (it wrote ``<pause>/<phase>.ready``)."""
    deadline = time.monotonic() + 600
    while not (pause / f"{phase}.ready").exists():
        log = (run_dir / "engine.log").read_text()
        check(
            process.poll() is None and time.monotonic() < deadline,
            f"{run_dir.name}: not ready for {phase}\n{tail(log)}",
        )
        time.sleep(0.05)


def plant_upload(server: Seaweed) -> str:
    """Starts a multipart upload of a block's name of A's rank prefix and
    leaves it unfinished (what a multipart writer killed mid-upload leaves).
    Returns its key."""
    sample = next(iter(server.list_objects(BUCKET, f"{PREFIX}/")))
    # A block name of the layout: its hash's first five hex digits are the
    # directories'.
    below, fan_out, shard, _ = sample.rsplit("/", 3)
    digits = fan_out + shard.split("_g")[0]
    planted = f"{below}/{fan_out}/{shard}/{digits}{'a' * (32 - len(digits))}.bin"
    server.start_upload(BUCKET, planted)
    check(server.list_uploads(BUCKET) == [planted], "fleet: the planted upload is not listed")
    return planted


def outage(h: "Harness", server: Seaweed, planted: str, written: list) -> None:
    """Host C: aborts the planted upload at start; new prompts with the
    server up (their 36 blocks put the prefix 16 over the budget: C evicts
    A's oldest, prompt 0's), A's prompts 0-1 with it stopped, A's prompts
    4-5 (the newest of A's, seconds younger than prompt 0's) once it is
    back. ``written``: A's objects in the order they appeared."""
    fresh = fresh_prompts(42)
    pause = h.work / "runs" / "fleet-c-pause"
    shutil.rmtree(pause, ignore_errors=True)
    pause.mkdir(parents=True)
    settings = h.settings(
        "object",
        h.work / "fleet-c",
        object=vllm_form(server),
        pause=str(pause),
        then=[h.prompts[0:2], h.prompts[4:6]],
        # Alone on the bucket: every unfinished upload is a dead writer's.
        tier_options={"stale_temp_age": 1.0},
    )
    settings["prompts"] = fresh
    process, run_dir = h.start("fleet-c-outage", settings)
    started = time.monotonic()

    wait_ready(process, run_dir, pause, "phase1")
    # The fresh prompts' stores may still be in flight: let them land.
    time.sleep(1.0)
    stored_before = len(server.list_objects(BUCKET, f"{PREFIX}/"))
    server.stop()
    stopped = time.monotonic()
    (pause / "phase1").touch()
    wait_ready(process, run_dir, pause, "phase2")
    during = time.monotonic() - stopped
    time.sleep(max(0.0, OUTAGE_SECONDS - during))
    server.start()
    # Served again, A's objects too, before the batch that needs them.
    server.wait_serving(BUCKET, next(iter(server.list_objects(BUCKET, f"{PREFIX}/"))))
    present = server.list_objects(BUCKET, f"{PREFIX}/")
    (pause / "phase2").touch()
    c = h._ended(process, run_dir, started)
    outputs = c["outputs"]
    h.same_outputs(
        "fleet host C, during the outage",
        {k[2:]: v for k, v in outputs.items() if k.startswith("1.")},
        only={0, 1},
    )
    h.same_outputs(
        "fleet host C, after the outage",
        {str(int(k[2:]) + 4): v for k, v in outputs.items() if k.startswith("2.")},
        only={4, 5},
    )
    check(not server.list_uploads(BUCKET), f"fleet host C: the stale upload {planted} was not aborted")
    m = c["metrics"]
    loaded = m.get("vllm:prompt_tokens_by_source{source=external_kv_transfer}")
    check(
        loaded == 2 * PROMPT_TOKENS,
        f"fleet host C: {loaded} prompt tokens loaded; A's prompts 4-5 ({2 * PROMPT_TOKENS}) after the outage: {m}\n"
        f"A's objects gone before the batch, by the rank A wrote them at: "
        f"{[rank for rank, key in enumerate(written) if key not in present]}\n"
        + "\n".join(line for line in c["log"].splitlines() if "kvtier" in line and "INFO" in line),
    )
    counts = tier_counts("fleet host C", c["log"])
    check(counts["store_failed"] > 0, f"fleet host C: no store failed during the outage: {counts}")
    stored_after = len(server.list_objects(BUCKET, f"{PREFIX}/"))
    h.notes.append(
        f"fleet outage: host C's batch ran {during:.1f} s with the server stopped; "
        f"{counts['store_failed']} block stores failed, {stored_after - stored_before} objects added afterwards; "
        f"A's prompts 4-5 loaded once it was back; the stale upload aborted at start"
    )

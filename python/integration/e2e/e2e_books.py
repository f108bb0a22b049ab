"""The fleet's books end to end: engine processes standing for hosts, each
with its own CPU tier and directories, sharing a bucket of a real S3
server (SeaweedFS) and one budget and recency in a real Valkey
(``index``), the budget below the working set.

- host A computes the six prompts, each once the books committed the
  blocks of the one before; the books keep the prefix within the budget at
  every store (the bucket is sampled every 0.2 s throughout); a subscriber
  to A's KV events (ZMQ, as a router) sees the blocks stored in the bucket
  and those A evicted (``BlockStored``, ``BlockRemoved``): prompt 0's, the
  least recent;
- host B serves A's newest prompts (4-5) from the bucket through kvtier's
  KV connector on the same books (its scheduler's lookups ask them): every
  block loaded, only each prompt's last token computed, the same tokens as
  without offloading;
- host C stores new prompts, then Valkey is restarted (its books lost):
  C's next batch runs (nothing hangs), the books are rebuilt from a
  listing, and A's prompts 4-5 are loaded from the bucket again; then
  SeaweedFS is stopped under C's last batch: the loads of A's prompt 3
  (hits in the books) fail and are recomputed, the same tokens; its stores
  fail, and once the server is back and C's leases have ended, every entry
  the books commit has its object;
- host D is SIGKILLed while its stores are in flight: its reservations
  stay counted until their leases end; then a sweep (another process's
  upkeep) settles them: nothing held, no object the books do not count.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import sys
import time
from typing import TYPE_CHECKING

from e2e_common import BLOCK_BYTES, HERE, PROMPT_TOKENS, PROMPTS, check, tail, wait_for_group
from e2e_fleet import CREDENTIALS, REQUESTS, Sampler, fresh_prompts, tier_counts, wait_ready
from kv_events_sub import KvEventSubscriber

sys.path.insert(0, str(HERE.parent))
from seaweed import Seaweed  # noqa: E402
from valkey import Valkey  # noqa: E402

if TYPE_CHECKING:
    from harness import Harness

BUCKET = "kvtier-books"
PREFIX = "books"
#: 90 blocks: A's six prompts (108 blocks) do not fit, and what C and D
#: add evicts A's oldest prompts (0-3), never 4-5, which B and C load.
CAPACITY = 90 * BLOCK_BYTES
#: Short leases: a killed host's space comes back within seconds, and the
#: upkeep (every third of a lease) rebuilds lost books within one.
LEASE = 3.0


def books_form(server: Seaweed, valkey: Valkey) -> dict:
    return {
        "store_config": server.store_config(BUCKET),
        "prefix": PREFIX,
        **REQUESTS,
        "capacity_bytes": CAPACITY,
        "index": valkey.url,
        "index_lease": LEASE,
    }


def books_status(valkey: Valkey) -> dict:
    """The books' meta hash (every namespace's: one here), or {} when lost."""
    keys = valkey.ask("KEYS", "kvtier:*:meta")
    if not keys:
        return {}
    fields = valkey.ask("HGETALL", keys[0])
    return dict(zip(fields[0::2], fields[1::2]))


def run(h: "Harness") -> None:
    server_dir, valkey_dir = h.work / "books-seaweed", h.work / "books-valkey"
    for directory in (server_dir, valkey_dir):
        shutil.rmtree(directory, ignore_errors=True)
    with Seaweed(server_dir, buckets=[BUCKET], anonymous=True) as server, Valkey(valkey_dir) as valkey:
        with Sampler(server, BUCKET, f"{PREFIX}/") as sampler:
            hosts(h, server, valkey)
        check(
            sampler.largest <= CAPACITY,
            f"books: the bucket held {sampler.largest} bytes, over the budget of {CAPACITY}",
        )
        h.notes.append(
            f"books: at most {sampler.largest} of {CAPACITY} bytes in the bucket over {sampler.samples} samples"
        )


def hosts(h: "Harness", server: Seaweed, valkey: Valkey) -> None:
    form = books_form(server, valkey)
    # Host A: every prompt computed and stored through the books, one at a
    # time, each once the one before has its blocks committed: the books'
    # recency then ranks the prompts, and prompt 0 is evicted. (A tier
    # that falls behind stores several prompts at once, their commits
    # interleave, and the least recent blocks are the first few of each:
    # docs/design.md, "The fleet's books in Valkey".) A router's view: a
    # subscriber to A's KV events.
    with KvEventSubscriber() as events:
        a = stored_in_turn(h, valkey, h.settings(
            "object", h.work / "books-a", object=form, env=CREDENTIALS, max_num_seqs=1,
            kv_events=events.endpoint, tier_options={"enable_kv_events": True, "shutdown_grace": 30.0},
        ))
    h.same_outputs("books host A", a["outputs"])
    stored, removed = events.stored["STORAGE"], set(events.removed["STORAGE"])
    per_prompt = PROMPT_TOKENS // 32
    check(
        len(stored) == PROMPTS * per_prompt and removed == set(stored[:per_prompt]),
        f"books host A: its KV events say {len(stored)} blocks stored in the bucket and {len(removed)} "
        f"removed, at the places {sorted(stored.index(b) for b in removed if b in stored)} of the order stored "
        f"(prompt 0's, the oldest, are 0-{per_prompt - 1}), for a budget of {CAPACITY // BLOCK_BYTES}: "
        f"{events.summary()}",
    )
    h.notes.append(f"books host A's KV events: {events.summary()}")
    status = books_status(valkey)
    check(
        0 < int(status.get("committed", 0)) <= CAPACITY,
        f"books host A: the books hold {status} (capacity {CAPACITY})",
    )
    # What B loads is what A stored: every prompt block, none failed or
    # dropped at its shutdown (else B's check below could only say that
    # fewer blocks loaded, not why).
    counts = tier_counts("books host A", a["log"])
    dropped = [line for line in a["log"].splitlines() if "queued stores" in line]
    check(
        counts["stored"] == PROMPTS * per_prompt and counts["store_failed"] == 0 and not dropped,
        f"books host A: stored {counts} of {PROMPTS * per_prompt} prompt blocks; {dropped}; "
        f"the books: {status}\n{tail(a['log'])}",
    )
    h.notes.append(f"books host A: {counts}; the books: {status}")
    # Host B: A's newest prompts, from the bucket, through kvtier's KV
    # connector on the same books (its scheduler's lookups ask them over a
    # connection of their own, its workers' loads pin there): every block
    # loaded, each prompt's last token computed by vLLM itself.
    settings = h.settings(None, h.work / "books-b", connector={"mode": "alone", "options": form})
    settings["prompts"] = h.prompts[4:6]
    b = h.run("books-b", settings)
    h.same_outputs("books host B", {str(int(k) + 4): v for k, v in b["outputs"].items()}, only={4, 5})
    loaded = b["metrics"].get("vllm:prompt_tokens_by_source{source=external_kv_transfer}")
    computed = b["metrics"].get("vllm:prompt_tokens_by_source{source=local_compute}")
    check(
        loaded == 2 * (PROMPT_TOKENS - 1) and computed == 2,
        f"books host B: {loaded} prompt tokens loaded and {computed} computed of A's prompts 4-5: {b['metrics']}",
    )
    # B's time is noted, not checked (a run computing the two prompts
    # without a tier, to set it against, cost CI an engine process for a
    # figure: bench_connector.py measures loads against recomputing).
    h.notes.append(
        f"books host B (the KV connector): generate() of A's prompts 4-5, every prompt block from the bucket "
        f"through the books, {b['seconds']:.2f} s"
    )
    restarted(h, server, valkey, form)
    sample = next(iter(server.list_objects(BUCKET, f"{PREFIX}/")))
    killed(h, server, valkey, form, rank_prefix=sample.rsplit("/", 3)[0])


def stored_in_turn(h: "Harness", valkey: Valkey, settings: dict) -> dict:
    """One engine process runs the prompts one batch each; the next batch
    starts once the books committed every block of the ones before. Its
    output, checked clean as ``Harness.run`` checks one, keyed by prompt."""
    per_prompt = PROMPT_TOKENS // 32
    pause = h.work / "runs" / "books-a-pause"
    shutil.rmtree(pause, ignore_errors=True)
    pause.mkdir(parents=True)

    def in_turn(process, run_dir) -> None:
        for phase in range(1, PROMPTS):
            wait_ready(process, run_dir, pause, f"phase{phase}")
            deadline = time.monotonic() + 120
            while int(books_status(valkey).get("commits", 0)) < phase * per_prompt:
                check(
                    time.monotonic() < deadline,
                    f"books host A: {books_status(valkey)} after prompts 0-{phase - 1}, not their "
                    f"{phase * per_prompt} blocks, in 120 s\n{tail((run_dir / 'engine.log').read_text())}",
                )
                time.sleep(0.05)
            (pause / f"phase{phase}").touch()

    settings = dict(settings, prompts=h.prompts[:1], pause=str(pause), then=[[p] for p in h.prompts[1:]])
    result = h.run("books-a", settings, drive=in_turn)
    result["outputs"] = {key.split(".")[0]: out for key, out in result["outputs"].items()}
    return result


def restarted(h: "Harness", server: Seaweed, valkey: Valkey, form: dict) -> None:
    """Host C: a new prompt; Valkey restarted (books lost); another new
    prompt runs meanwhile (its lookups miss, its stores are refused until
    the books are back); once the books are rebuilt, A's prompts 4-5 load."""
    pause = h.work / "runs" / "books-c-pause"
    shutil.rmtree(pause, ignore_errors=True)
    pause.mkdir(parents=True)
    settings = h.settings(
        "object",
        h.work / "books-c",
        object=form,
        pause=str(pause),
        then=[fresh_prompts(5)[:1], h.prompts[4:6], fresh_prompts(7)[:1] + h.prompts[3:4]],
    )
    settings["prompts"] = fresh_prompts(43)[:1]
    process, run_dir = h.start("books-c-restart", settings)
    started = time.monotonic()
    wait_ready(process, run_dir, pause, "phase1")
    epoch = books_status(valkey).get("epoch")
    valkey.stop()
    valkey.start()
    restarted_at = time.monotonic()
    (pause / "phase1").touch()
    wait_ready(process, run_dir, pause, "phase2")
    during = time.monotonic() - restarted_at
    # Rebuilt by the engine's upkeep, from a listing.
    deadline = time.monotonic() + 60
    while books_status(valkey).get("status") != "ready" and time.monotonic() < deadline:
        time.sleep(0.1)
    rebuilt = books_status(valkey)
    check(
        rebuilt.get("status") == "ready" and rebuilt.get("epoch") != epoch,
        f"books host C: not rebuilt after the restart: {rebuilt}\n{tail((run_dir / 'engine.log').read_text())}",
    )
    rebuilt_after = time.monotonic() - restarted_at
    (pause / "phase2").touch()
    # SeaweedFS stopped under C's last batch (a new prompt): its stores
    # fail; once it is back and their leases have ended, no entry of the
    # books names an object that was never written.
    wait_ready(process, run_dir, pause, "phase3")
    time.sleep(1.0)  # phase 2's stores land
    server.stop()
    (pause / "phase3").touch()
    while process.poll() is None and not (run_dir / "out.json").exists():
        time.sleep(0.1)
    server.start()
    server.wait_serving(BUCKET, next(iter(server.list_objects(BUCKET, f"{PREFIX}/"))))
    c = h._ended(process, run_dir, started)
    h.same_outputs(
        "books host C, after the rebuild",
        {str(int(k[2:]) + 4): v for k, v in c["outputs"].items() if k.startswith("2.")},
        only={4, 5},
    )
    loaded = c["metrics"].get("vllm:prompt_tokens_by_source{source=external_kv_transfer}")
    check(
        loaded == 2 * PROMPT_TOKENS,
        f"books host C: {loaded} prompt tokens loaded; A's prompts 4-5 ({2 * PROMPT_TOKENS}) after the rebuild: {c['metrics']}",
    )
    check("3.0" in c["outputs"], f"books host C: no output for the prompt run while S3 was stopped: {sorted(c['outputs'])}")
    # A's prompt 3: hits in the books, loads that fail, recomputed.
    check("3.1" in c["outputs"], f"books host C: no output for A's prompt 3 while S3 was stopped")
    h.same_outputs("books host C, S3 stopped", {"3": c["outputs"]["3.1"]}, only={3})
    counts = tier_counts("books host C", c["log"])
    check(counts["store_failed"] > 0, f"books host C: no store failed while S3 was stopped: {counts}")
    check(counts["load_failed"] > 0, f"books host C: no load failed while S3 was stopped: {counts}")
    # C's leases end with it; another process's upkeep settles what C held.
    time.sleep(LEASE + 1.0)
    sample = next(iter(server.list_objects(BUCKET, f"{PREFIX}/")))
    sweep(form, sample.rsplit("/", 3)[0])
    committed = set(valkey.ask("HKEYS", valkey.ask("KEYS", "kvtier:*:blocks")[0]))
    listed = set(server.list_objects(BUCKET, f"{PREFIX}/"))
    check(
        committed <= listed and int(books_status(valkey).get("held", -1)) == 0,
        f"books host C: after the S3 outage the books commit {len(committed - listed)} objects never written: "
        f"{sorted(committed - listed)[:5]}; {books_status(valkey)}",
    )
    h.notes.append(
        f"books restart: host C's batch ran {during:.1f} s across the Valkey restart; "
        f"books rebuilt {rebuilt_after:.1f} s after it ({rebuilt.get('committed')} bytes committed); "
        f"A's prompts 4-5 loaded afterwards; then S3 stopped under a new prompt: {counts['store_failed']} "
        f"block stores failed, every committed entry's object listed afterwards; {counts}"
    )


def killed(h: "Harness", server: Seaweed, valkey: Valkey, form: dict, rank_prefix: str) -> None:
    """Host D, SIGKILLed while its stores are in flight; then a sweep by
    another process once its leases have ended."""
    before = set(server.list_objects(BUCKET, f"{PREFIX}/"))
    settings = h.settings("object", h.work / "books-d", object=form, store_delay=0.5, linger=300)
    settings["prompts"] = fresh_prompts(11)
    process, run_dir = h.start("books-d-killed", settings)
    # Killed once one of its stores has landed and, if the polling catches
    # one, while another holds a reservation in the books.
    deadline = time.monotonic() + 600
    landed = None
    while process.poll() is None and time.monotonic() < deadline:
        if landed is None and set(server.list_objects(BUCKET, f"{PREFIX}/")) - before:
            landed = time.monotonic()
        if landed is not None and (
            int(books_status(valkey).get("held", 0)) > 0 or time.monotonic() - landed > 10
        ):
            break
        time.sleep(0.005)
    check(process.poll() is None, f"books host D: it ended before any store landed\n{tail((run_dir / 'engine.log').read_text())}")
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    wait_for_group(process.pid, timeout=120)
    for left in glob.glob("/dev/shm/vllm_offload_*"):
        os.unlink(left)  # a SIGKILL leaves the killed engine's region
    held = int(books_status(valkey).get("held", 0))
    time.sleep(LEASE + 1.0)
    swept = sweep(form, rank_prefix)
    after = books_status(valkey)
    objects = server.list_objects(BUCKET, f"{PREFIX}/")
    check(int(after.get("held", -1)) == 0, f"books host D: still held after its leases and a sweep: {after}")
    check(
        sum(objects.values()) <= int(after.get("committed", 0)),
        f"books host D: {sum(objects.values())} bytes in the bucket, {after.get('committed')} committed",
    )
    check(not server.list_uploads(BUCKET), "books host D: the kill left an unfinished upload")
    h.notes.append(
        f"books kill: host D killed with {held} bytes held; after its leases another process's upkeep "
        f"(at its start, then a reconcile settling {swept['evicted']} more) left nothing held, every object counted"
    )


def sweep(form: dict, rank: str) -> dict:
    """Another host's upkeep, now: a process of vLLM's venv opens the
    books' transfers and reconciles (settles expired entries)."""
    import json
    import subprocess

    code = """
import json, sys
import numpy as np
from kvtier._native import VllmTransfers, check_settings
form = json.loads(sys.argv[1])
settings = check_settings(form)
rank = sys.argv[2]
view = memoryview(np.zeros((1, %d), dtype=np.uint8))
t = VllmTransfers.objects(settings["object_target"], rank, view, load_threads=1, store_threads=1,
                          capacity_bytes=settings["capacity_bytes"], index=settings["index"],
                          index_lease=settings["index_lease"])
report = t.reconcile()
t.shutdown(0.0)
print(json.dumps(report))
""" % BLOCK_BYTES
    env = dict(os.environ, **CREDENTIALS)
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(form), rank], capture_output=True, text=True, env=env, timeout=120
    )
    check(done.returncode == 0, f"books sweep failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])

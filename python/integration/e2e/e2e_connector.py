"""The end-to-end harness's scenarios for kvtier's KV connector
(``kvtier.vllm.StorageConnector``), alone and under vLLM's MultiConnector
next to OffloadingConnector (CPU offloading through ``CpuTieringSpec``).
For each of the two setups:

- deferred dumps under pressure: a KV cache that preempts, two prompts
  aborted mid-flight, dumps trickling (each waits its turn), so requests
  finish, are preempted and aborted while dumps hold their blocks; the
  survivors' outputs equal the run without a connector, every prompt
  block is in a file of a block's size, the engine exits cleanly;
- restart: a fresh engine on those files loads every prompt block (vLLM
  computes each prompt's last token itself) and gives the outputs of the
  run without a connector;
- SIGKILL mid-dump: an engine killed while dumps are queued and being
  written leaves no partial block; the next engine (sweeping the dead
  writer's temporary files) gives the same outputs.

Once, with the connector alone:

- no block overwritten while it was dumped: a connector whose
  ``wait_for_save`` waits for its dumps (vLLM's synchronous reference)
  writes the same prompt blocks, at the same paths, as the deferred run
  under pressure did (equal up to the CPU kernels' run-to-run rounding; a
  block overwritten by another request would differ wholesale);
- vLLM's own fs tier, through tiering, serves a fresh engine every prompt
  block from the connector's directory: the same layout and format.
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from e2e_common import (
    BLOCK_BYTES,
    PREEMPT_BLOCKS,
    PROMPT_TOKENS,
    PROMPTS,
    block_files,
    check,
    kv_drift,
    temp_files,
)

if TYPE_CHECKING:
    from pathlib import Path

    from harness import Harness

#: Prompt blocks: 18 per prompt, each dumped once it is full.
PROMPT_BLOCKS = PROMPTS * PROMPT_TOKENS // 32
#: Seconds between two dumps' starts in the pressure run, and in the run
#: that is killed (long enough that most dumps are still queued).
TRICKLE, KILL_TRICKLE = 0.05, 2.0


def _connector(mode: str, **extra) -> dict:
    return {"mode": mode, **extra}


def _from_connector(name: str, result: dict) -> None:
    """Every prompt block came from the connector; vLLM computes each
    prompt's last token itself (its block is loaded whole, counting one
    token less)."""
    m = result["metrics"]
    computed = m.get("vllm:prompt_tokens_by_source{source=local_compute}")
    loaded = m.get("vllm:prompt_tokens_by_source{source=external_kv_transfer}")
    check(
        loaded == PROMPTS * (PROMPT_TOKENS - 1) and computed == PROMPTS,
        f"{name}: {computed} prompt tokens computed and {loaded} loaded: {m}",
    )


def pressure(h: "Harness", mode: str, restart: bool = True) -> "Path":
    root = h.work / f"connector-{mode}"
    shutil.rmtree(root, ignore_errors=True)
    aborted = {1, 4}
    settings = h.settings(
        None,
        root,
        connector=_connector(mode, dump_delay=TRICKLE),
        num_gpu_blocks=PREEMPT_BLOCKS,
        abort=sorted(aborted),
    )
    preemptions = h.run_preempted(f"connector-{mode}-pressure", f"connector {mode} (pressure)", settings, aborted)
    blocks = block_files(root)
    # Prompt blocks, and the survivors' first generated block.
    check(len(blocks) >= PROMPT_BLOCKS, f"connector {mode}: {len(blocks)} blocks dumped")
    check(all(p.stat().st_size == BLOCK_BYTES for p in blocks), f"connector {mode}: blocks of another size")
    h.notes.append(
        f"connector {mode}: {preemptions} preemptions and {len(aborted)} aborts with dumps trickling, "
        f"{len(blocks)} blocks dumped"
    )
    if restart:
        again = h.run(f"connector-{mode}-restart", h.settings(None, root, connector=_connector(mode)))
        _from_connector(f"connector {mode} (restart)", again)
        h.same_outputs(f"connector {mode} (restart)", again["outputs"])
        h.notes.append(f"connector {mode}: the restart loaded every prompt block, computing each prompt's last token")
    return root


def killed(h: "Harness", mode: str) -> None:
    root = h.work / f"connector-{mode}-killed"
    shutil.rmtree(root, ignore_errors=True)
    settings = h.settings(None, root, connector=_connector(mode, dump_delay=KILL_TRICKLE), linger=300)
    what = f"connector {mode} kill"
    stored = h.kill_once_stored(what, f"connector-{mode}-killed-1", root, settings, files=2)
    check(len(stored) < PROMPT_BLOCKS, f"{what}: every dump finished before the kill")
    second = h.run(
        f"connector-{mode}-killed-2",
        h.settings(None, root, connector=_connector(mode, options={"stale_temp_age": 0})),
    )
    h.same_outputs(f"connector {mode} kill (restart)", second["outputs"])
    loaded = second["metrics"].get("vllm:prompt_tokens_by_source{source=external_kv_transfer}", 0)
    check(loaded > 0, f"connector {mode} kill: the restart loaded nothing")
    check(all(p.stat().st_size == BLOCK_BYTES for p in block_files(root)), f"connector {mode}: a partial block")
    check(not temp_files(root), f"connector {mode} kill: temporary files not swept: {temp_files(root)}")
    h.notes.append(
        f"connector {mode} kill: {len(stored)} of {PROMPT_BLOCKS} blocks dumped before the SIGKILL, none partial; "
        f"the restart loaded {loaded} prompt tokens"
    )


def blocking_and_cross(h: "Harness", deferred: "Path") -> None:
    """Deferred dumps write what a blocking save writes; vLLM's fs tier
    reads the connector's files."""
    root = h.work / "connector-blocking"
    shutil.rmtree(root, ignore_errors=True)
    result = h.run("connector-blocking", h.settings(None, root, connector=_connector("alone", blocking=True)))
    h.same_outputs("connector blocking", result["outputs"])
    reference = {p.relative_to(root): p for p in block_files(root)}
    ours = {p.relative_to(deferred): p for p in block_files(deferred)}
    check(len(reference) == PROMPT_BLOCKS, f"connector blocking: {len(reference)} blocks written")
    missing = set(reference) - set(ours)
    check(not missing, f"connector: {len(missing)} blocks the blocking save wrote are not where the deferred run put them")
    drift = max(kv_drift(reference[p].read_bytes(), ours[p].read_bytes()) for p in reference)
    check(drift <= 1e-4, f"connector: a deferred dump differs from the blocking save's by {drift}")
    # vLLM's own fs tier, through tiering, on a copy of the connector's files.
    copy = h.work / "connector-read-by-vllm"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(deferred, copy)
    read = h.run("connector-read-by-vllm-fs-tier", h.settings("vllm", copy))
    h.all_from_tier("vLLM's fs tier on the connector's files", read)
    h.same_outputs("vLLM's fs tier on the connector's files", read["outputs"])
    h.notes.append(
        f"connector: {len(reference)} prompt blocks of the blocking save at the same paths as the deferred "
        f"run's, largest difference {drift:.1e}; vLLM's fs tier served every prompt token from them"
    )

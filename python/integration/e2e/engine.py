"""One real vLLM engine process for the end-to-end harness (``e2e.py``).

Runs the prompts of a scenario through ``vllm.LLM`` on the CPU backend,
with vLLM's tiering through ``kvtier.vllm.cpu.CpuTieringSpec`` and one
secondary tier (kvtier's ``FsTier`` or vLLM's own fs tier), or without
offloading; writes what came out (tokens, logprobs, vLLM's metrics) as JSON.

    python engine.py SETTINGS.json OUT.json

SETTINGS holds ``model``, ``prompts`` (token ids), ``max_tokens``, ``tier``
(``"kvtier"``, ``"vllm"``, ``"both"`` with ``roots`` for each, or ``null``),
``root``, and optionally ``connector`` (kvtier's KV connector instead of
tiering, on ``root``; see ``connector_config``),
``kv_space_gib``, ``cpu_bytes``, ``max_num_seqs``, ``num_gpu_blocks`` (a
KV cache of that many blocks), ``warmup`` (token ids run once before the
timed prompts), ``model_len``, ``load_format``, ``tier_options`` (more
settings of the tier), ``object`` (with ``tier`` ``"object"``: kvtier's
``ObjectTier``'s ``url`` or ``store_config`` and ``prefix``), ``env``
(environment variables for the engine's processes), ``then`` and
``pause`` (later batches of prompts, each run once the harness creates
``<pause>/phase<n>`` after the engine wrote ``<pause>/phase<n>.ready``),
``offload_block_size`` (tokens per offloaded block,
a multiple of the engine's 32), ``abort`` (indices of
prompts to abort once they have started), ``store_delay`` (seconds each
store job is held before it reaches the tier: makes stores slow enough to
be in flight), ``linger`` (seconds to wait after the prompts before the
shutdown, while the engine core goes on with its stores), ``barrier`` (a
directory: once the engine is up it writes ``<barrier>/<pid>.ready`` and
waits, at most 10 minutes, for ``<barrier>/go``, so that engines started
together run their prompts together), ``kv_events`` (an ``ipc://``
endpoint the engine publishes its KV events on, through ZMQ).
"""

from __future__ import annotations

import json
import os
import sys
import time
import logging

# kvtier's own log lines (INFO and up), in every process of the engine: the
# engine core and the workers are spawned, and import this module too.
_handler = logging.StreamHandler()
_handler.setFormatter(logging.Formatter("(pid=%(process)d) %(levelname)s %(name)s: %(message)s"))
logging.getLogger("kvtier").addHandler(_handler)
logging.getLogger("kvtier").setLevel(logging.INFO)


def tier_configs(settings: dict) -> list:
    """The secondary tiers the scenario runs: one, or (``"both"``) kvtier's
    and vLLM's side by side, each on its own root, fed the same chunks."""
    if settings["tier"] == "both":
        roots = settings["roots"]
        return [tier_config(dict(settings, tier=tier, root=roots[tier])) for tier in ("kvtier", "vllm")]
    return [tier_config(settings)]


def tier_config(settings: dict) -> dict:
    root = settings["root"]
    if settings["tier"] == "object":
        # kvtier's object tier: ``object`` holds its url, or vLLM's
        # store_config and prefix, and its request settings.
        tier = {"type": "ObjectTier", "module_path": "kvtier.vllm", **settings["object"]}
        if settings.get("store_delay"):
            tier.update(type="SlowStoreObjectTier", module_path="slow_tier", store_delay=settings["store_delay"])
        return {**tier, **settings.get("tier_options", {})}
    tier = {"type": "fs", "root_dir": root} if settings["tier"] == "vllm" else {
        "type": "FsTier", "module_path": "kvtier.vllm", "root_dir": root}
    if settings.get("store_delay"):
        slow = "SlowStoreVllmFsTier" if settings["tier"] == "vllm" else "SlowStoreFsTier"
        tier.update(type=slow, module_path="slow_tier", store_delay=settings["store_delay"])
    tier.update(settings.get("tier_options", {}))
    return tier


def transfer_config(settings: dict):
    from vllm.config import KVTransferConfig

    extra = {
        "spec_name": "CpuTieringSpec",
        "spec_module_path": "kvtier.vllm.cpu",
        "cpu_bytes_to_use": settings.get("cpu_bytes", 64 << 20),
        "secondary_tiers": tier_configs(settings),
    }
    if settings.get("offload_block_size"):
        # Offloaded blocks of several engine blocks (chunks).
        extra["block_size"] = settings["offload_block_size"]
    return KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both", kv_connector_extra_config=extra)


def connector_config(settings: dict):
    """kvtier's connector (``connector``: ``{"mode": "alone" | "multi",
    "dump_delay": s, "blocking": bool, "options": {...}}``), alone or under
    MultiConnector next to vLLM's OffloadingConnector (CPU offloading
    through ``CpuTieringSpec``, no secondary tier)."""
    from vllm.config import KVTransferConfig

    connector = settings["connector"]
    ours = {
        "kv_connector": "SlowStorageConnector" if connector.get("dump_delay") else "StorageConnector",
        "kv_connector_module_path": "slow_tier" if connector.get("dump_delay") else "kvtier.vllm.connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "blocking_save": bool(connector.get("blocking")),
            **connector.get("options", {}),
        },
    }
    # The blocks in a directory, unless the options name a bucket.
    if not {"url", "store_config"} & set(connector.get("options", {})):
        ours["kv_connector_extra_config"]["root_dir"] = settings["root"]
    if connector.get("dump_delay"):
        os.environ["KVTIER_E2E_DUMP_DELAY"] = str(connector["dump_delay"])
    if connector["mode"] == "alone":
        return KVTransferConfig(kv_load_failure_policy="recompute", **ours)
    offloading = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "CpuTieringSpec",
            "spec_module_path": "kvtier.vllm.cpu",
            "cpu_bytes_to_use": settings.get("cpu_bytes", 64 << 20),
        },
    }
    return KVTransferConfig(
        kv_connector="MultiConnector",
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={"connectors": [ours, offloading]},
    )


def metrics(llm) -> dict:
    """vLLM's counters that say where prompt tokens came from, and kvtier's
    own (``vllm:kvtier_*``: its lookups' verdicts and timeouts, which a
    failed check then shows)."""
    wanted = {
        "vllm:prompt_tokens",
        "vllm:prompt_tokens_by_source",
        "vllm:prompt_tokens_cached_by_source",
        "vllm:external_prefix_cache_hits",
        "vllm:external_prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:num_preemptions",
    }
    out: dict = {}
    for metric in llm.get_metrics():
        if (metric.name not in wanted and not metric.name.startswith("vllm:kvtier_")) or not hasattr(metric, "value"):
            continue
        labels = ",".join(f"{k}={v}" for k, v in sorted(metric.labels.items()) if k not in ("model_name", "engine"))
        out[f"{metric.name}{{{labels}}}" if labels else metric.name] = metric.value
    return out


def main() -> None:
    settings = json.load(open(sys.argv[1]))
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(settings.get("kv_space_gib", 1))
    # The process's environment for the scenario (an object store's
    # credentials, say); the engine's own processes inherit it.
    os.environ.update(settings.get("env", {}))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = {}
    if settings.get("load_format"):
        kwargs["load_format"] = settings["load_format"]
    if settings.get("num_gpu_blocks"):
        kwargs["num_gpu_blocks_override"] = settings["num_gpu_blocks"]
    if settings.get("kv_events"):
        # KV events published on a local endpoint (``ipc://``) for a
        # subscriber of the harness's.
        from vllm.config import KVEventsConfig

        kwargs["kv_events_config"] = KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=settings["kv_events"]
        )
    if settings.get("connector"):
        kwargs["kv_transfer_config"] = connector_config(settings)
    elif settings["tier"]:
        kwargs["kv_transfer_config"] = transfer_config(settings)
    llm = LLM(
        model=settings["model"],
        skip_tokenizer_init=True,
        enforce_eager=True,
        block_size=32,
        dtype="float32",
        max_model_len=settings.get("model_len", 1024),
        max_num_seqs=settings.get("max_num_seqs", 16),
        enable_prefix_caching=True,
        seed=0,
        disable_log_stats=False,
        **kwargs,
    )
    params = SamplingParams(
        temperature=0.0, max_tokens=settings["max_tokens"], ignore_eos=True, detokenize=False, logprobs=1
    )
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in settings["prompts"]]
    if settings.get("warmup"):
        # One short prompt of its own first: the timed run then pays no
        # first-call costs (kernel selection, allocations).
        llm.generate([TokensPrompt(prompt_token_ids=settings["warmup"])], params, use_tqdm=False)
    if settings.get("barrier"):
        wait_at_barrier(settings["barrier"])
    started = time.perf_counter()
    outputs, steps = run(llm, prompts, params, set(settings.get("abort", ())))
    for phase, more in enumerate(settings.get("then", ()), start=1):
        # A later batch of prompts, after the harness's go (``pause``):
        # the harness changes the world between two batches (stops a
        # server, starts it again).
        wait_at_barrier(settings["pause"], f"phase{phase}")
        later, _ = run(llm, [TokensPrompt(prompt_token_ids=ids) for ids in more], params, set())
        outputs.update({f"{phase}.{i}": out for i, out in later.items()})
    seconds = time.perf_counter() - started
    result = {
        "outputs": outputs,
        "seconds": seconds,
        "step_seconds": steps,
        "metrics": metrics(llm),
    }
    json.dump(result, open(sys.argv[2], "w"))
    # The engine core keeps stepping while the tiers have work in flight:
    # lingering lets slow stores trickle out (the crash scenario kills the
    # engine meanwhile).
    time.sleep(settings.get("linger", 0))
    # An orderly shutdown, as a server's: the harness checks what it prints
    # and what it leaves. vLLM gives its engine processes 5 s after SIGTERM
    # by default, then kills them (and their /dev/shm region stays); the
    # harness gives them 60 s, so a loaded machine does not turn vLLM's
    # deadline into a leak of kvtier's.
    llm.llm_engine.engine_core.shutdown(timeout=60)
    del llm


def wait_at_barrier(barrier: str, name: str = "go") -> None:
    """Says this engine is up (or done with a batch: ``<name>.ready``),
    then waits for the harness's ``<barrier>/<name>``."""
    ready = f"{os.getpid()}.ready" if name == "go" else f"{name}.ready"
    open(os.path.join(barrier, ready), "w").close()
    deadline = time.monotonic() + 600
    while not os.path.exists(os.path.join(barrier, name)):
        if time.monotonic() > deadline:
            raise SystemExit("no go at the barrier within 10 minutes")
        time.sleep(0.01)


def run(llm, prompts, params, abort: set) -> tuple:
    """Runs the prompts through the engine step by step; the prompts in
    ``abort`` are aborted once they have produced a token. Returns the
    outputs and each ``engine.step()``'s seconds."""
    engine = llm.llm_engine
    ids = {}
    for i, prompt in enumerate(prompts):
        request_id = f"p{i}"
        engine.add_request(request_id, prompt, params)
        ids[request_id] = i
    outputs: dict = {}
    aborted: set = set()
    steps = []
    while engine.has_unfinished_requests():
        started = time.perf_counter()
        produced = engine.step()
        steps.append(time.perf_counter() - started)
        for output in produced:
            i = ids[output.request_id]
            completion = output.outputs[0]
            if i in abort and output.request_id not in aborted and completion.token_ids:
                engine.abort_request([output.request_id])
                aborted.add(output.request_id)
                continue
            if output.finished and output.request_id not in aborted:
                outputs[str(i)] = {
                    "tokens": list(completion.token_ids),
                    "logprobs": [
                        step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids)
                    ],
                }
    return outputs, steps


if __name__ == "__main__":
    main()

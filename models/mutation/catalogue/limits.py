"""Caps on what a caller can make the library hold (threads, workers, sizes): H*."""

from ..defs import TEST, Mutation

MUTATIONS = [
    Mutation(
        "H1-aggregator-workers-capped",
        "a report aggregator sizes its per-worker vectors by any worker count: 2**40 aborts the process",
        [("        if workers > Self::MAX_WORKERS {", "        if false {")],
        TEST + ["-p", "kvtier", "--test", "save", "an_aggregator_for_more_workers_than_the_cap"],
    ),
    Mutation(
        "H2-transfer-threads-capped",
        "vLLM transfers take any thread counts: their sum wraps to 0 or sizes an allocation that aborts",
        [("            Some(threads) if threads <= MAX_IO_THREADS => {}", "            Some(_) => {}")],
        TEST + ["-p", "kvtier", "--test", "vllm_transfers", "thread_counts_past_the_cap"],
    ),
    Mutation(
        "H2-copier-threads-capped",
        "a KV copier starts as many threads as asked",
        [("let threads = threads.clamp(1, crate::settings::MAX_IO_THREADS);", "let threads = threads.max(1);")],
        TEST + ["-p", "kvtier", "--lib", "offload::copier::tests::a_thread_count_past_the_cap"],
    ),
    Mutation(
        "H3-nul-in-a-path-refused",
        "a vLLM rank directory holding a NUL is accepted, and every key then misses",
        [("        if rank_dir.as_os_str().as_encoded_bytes().contains(&0) {", "        if false {")],
        TEST + ["-p", "kvtier", "--test", "vllm_layout", "a_rank_directory_with_a_nul"],
    ),
    Mutation(
        "H3-nul-in-a-thread-name-refused",
        "a worker thread's name holding a NUL reaches the thread builder, which panics",
        [("        if name.contains('\\0') {", "        if false {")],
        TEST + ["-p", "kvtier", "--test", "stuck_backend", "a_thread_name_with_a_nul"],
    ),
    Mutation(
        "H4-credentials-checked",
        "an S3 credential with CR/LF is accepted; every request then fails inside the client",
        [("                check_credential(name, value)?;", "                let _ = (name, value);")],
        TEST + ["-p", "kvtier", "--features", "object-store", "--lib", "a_credential_with_a_control_byte"],
    ),
    Mutation(
        "H5-stuck-worker-left-behind",
        "a graced shutdown joins a worker stuck in its backend call, and waits forever",
        [("            if unpublished > 0 {", "            if false {")],
        TEST + ["-p", "kvtier", "--test", "stuck_backend", "a_stuck_call_makes_a_graced_shutdown"],
    ),
    Mutation(
        "H6-prober-settings-capped",
        "a native prober's concurrency is not capped: 2**62 reaches a semaphore that panics",
        [("        if !(1..=MAX_CONCURRENT_GROUPS).contains(&self.max_concurrent_groups) {",
          "        if self.max_concurrent_groups == 0 {")],
        TEST + ["-p", "kvtier", "--features", "tokio", "--lib", "tokio::config::tests::settings_past_their_caps"],
    ),
]

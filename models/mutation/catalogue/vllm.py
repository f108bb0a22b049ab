"""vLLM's transfers (src/tier/vllm/): V*, and the KV copier (src/offload/): C*."""

from ..defs import MODELS, TEST, Mutation, pytest

MUTATIONS = [
    Mutation(
        "V1-a-load-writes-its-block-alone",
        "a load claims its block whoever holds it",
        [(".compare_exchange(0, WRITER, Ordering::Acquire, Ordering::Relaxed)",
          ".compare_exchange(claim.load(Ordering::Relaxed), WRITER, Ordering::Acquire, Ordering::Relaxed)")],
        TEST + ["-p", "kvtier", "--lib", "--test", "vllm_transfers"],
    ),
    Mutation(
        "V1-stores-never-read-a-block-being-loaded",
        "a store claims a block a load is writing",
        [("(readers < WRITER - 1).then(|| readers + 1)", "Some(readers.wrapping_add(1))")],
        TEST + ["-p", "kvtier", "--lib", "vllm::region"],
    ),
    Mutation(
        "V2-one-job-per-id-in-flight",
        "a job id still in flight is taken again, so one report answers for two jobs",
        [("        if self.jobs.is_tracked(&job) {", "        if false && self.jobs.is_tracked(&job) {")],
        TEST + ["-p", "kvtier", "--test", "vllm_transfers", "an_id_in_flight"],
    ),
    Mutation(
        "V3-a-present-block-is-not-rewritten",
        "a store rewrites a block that is already in the tier",
        [("        Ok(metadata) if metadata.is_file() && metadata.len() == bytes.len() as u64 => {",
          "        Ok(metadata) if false && metadata.is_file() => {")],
        TEST + ["-p", "kvtier", "--test", "vllm_transfers", "a_block_already_stored"],
    ),
    Mutation(
        "V3-stores-publish-whole-blocks",
        "a store writes the block under its final name instead of renaming a whole temporary file",
        [("    let (file, tmp) = create_temp_in_shard(", "    let (_, stray) = create_temp_in_shard("),
         ("        |suffix| vllm_temp_name(&name, suffix),\n    )?;",
          "        |suffix| vllm_temp_name(&name, suffix),\n    )?;\n    let _ = fs::remove_file(&stray);\n"
          "    let (file, tmp) = (File::create(path).map_err(|e| TierError::io(\"create\", path, e))?, path.to_path_buf());"),
         ("    fs::rename(tmp, path)\n", "    let _ = (tmp, path);\n    Ok(())\n")],
        TEST + ["-p", "kvtier", "--lib", "a_load_racing_a_store"],
    ),
    Mutation(
        "V4-a-longer-file-is-refused",
        "a load takes the first block's worth of a longer file (another layout's block) as the block",
        [("    if metadata.len() > expected {", "    if false && metadata.len() > expected {")],
        TEST + ["-p", "kvtier", "--test", "vllm_transfers", "a_short_or_long_file_is_removed"],
    ),
    Mutation(
        "V9-a-wrong-sized-block-is-replaced",
        "a store keeps any regular file at the block's name, whatever its size, and reports the block stored",
        [("        Ok(metadata) if metadata.is_file() && metadata.len() == bytes.len() as u64 => {",
          "        Ok(metadata) if metadata.is_file() => {")],
        TEST + ["-p", "kvtier", "--test", "vllm_transfers", "a_wrong_sized_file_is_replaced"],
    ),
    Mutation(
        "V9-a-longer-block-is-removed",
        "a block file longer than a block stays in place: every lookup answers hit and every load of it fails",
        [("        remove_if_same_file(path, &metadata);\n        return Err(corrupt(metadata.len()));",
          "        return Err(corrupt(metadata.len()));")],
        TEST + ["-p", "kvtier", "--test", "vllm_transfers", "a_short_or_long_file_is_removed"],
    ),
    Mutation(
        "V4-a-short-block-is-removed",
        "a short (damaged) block file is left in place, so every lookup finds it and every load fails",
        [("        remove_if_same_file(path, &metadata);\n        return Err(corrupt(got as u64));",
          "        return Err(corrupt(got as u64));")],
        TEST + ["-p", "kvtier", "--test", "vllm_transfers", "a_short_or_long_file_is_removed"],
    ),
    Mutation(
        "V4-loads-stop-at-the-first-failure",
        "a load goes on past a block that failed and reports success",
        [("                loaded?;", "                let _ = loaded;")],
        TEST + ["-p", "kvtier", "--test", "vllm_transfers", "a_failed_load_keeps"],
    ),
    Mutation(
        "V4-only-the-failed-tail-is-given-up",
        "a failed load gives up every block of the job, also those it loaded",
        [("        &self.keys[self.done_keys().len()..]", "        &self.keys[..]")],
        TEST + ["-p", "kvtier", "--test", "vllm_transfers", "a_failed_load_keeps"],
    ),
    Mutation(
        "V5-shutdown-drops-queued-loads",
        "shutdown runs the loads still queued, whose blocks nobody will use",
        [("report.loads_dropped = pool.discard_lanes(&[TransferKind::Load.lane()]);",
          "report.loads_dropped = 0;")],
        TEST + ["-p", "kvtier", "--test", "vllm_transfers", "shutdown_drops_the_loads_still_queued"],
    ),
    Mutation(
        "V6-shutdown-drains-queued-stores",
        "shutdown drops the stores still queued at once instead of giving them their grace",
        [("            while queue.lanes.iter().any(|lane| !lane.is_empty()) {",
          "            while false && queue.lanes.iter().any(|lane| !lane.is_empty()) {")],
        TEST + ["-p", "kvtier", "--test", "vllm_transfers", "shutdown_lets_queued_stores_finish"],
    ),
    Mutation(
        "V7-shutdown-releases-the-primary-memory",
        "shutdown keeps the primary memory (vLLM's buffer export) until the object is dropped",
        [("        let region = self.region.take();\n        debug_assert!(",
          "        let region: Option<Arc<PrimaryRegion>> = None;\n        debug_assert!(")],
        TEST + ["-p", "kvtier", "--test", "vllm_transfers", "shutdown_gives_the_primary_memory_back"],
    ),
    Mutation(
        "V8-only-stale-temporaries-are-swept",
        "the sweep removes a temporary file however young, which a live writer may own",
        [("        if file.entry != Entry::Temp || !stale {", "        if file.entry != Entry::Temp {")],
        TEST + ["-p", "kvtier", "--test", "vllm_transfers", "a_sweep_removes_stale_temporary_files"],
    ),
    Mutation(
        "V5-threads-serve-their-lane-first",
        "an I/O thread takes the other lane's jobs first",
        [("        preferred.pop_front().or_else(|| other.pop_front())",
          "        other.pop_front().or_else(|| preferred.pop_front())")],
        TEST + ["-p", "kvtier", "--lib", "a_thread_serves_its_own_lane_first"],
    ),
    Mutation(
        "V10-only-the-layouts-temporaries-are-swept",
        "any name with a decimal temporary suffix in vLLM's layout is swept, a foreign report.bin_2.tmp too",
        [("        Some((block, _)) if block_key(fan_out, shard, block).is_some() => Entry::Temp,",
          "        Some(_) => Entry::Temp,")],
        TEST + ["-p", "kvtier", "--test", "vllm_transfers", "a_sweep_removes_stale_temporary_files"],
    ),
    Mutation(
        "C1-pages-fit-their-rows",
        "a layout whose pages overrun their engine or offload rows is taken",
        [("            if tensor.page == 0\n                || tensor.engine.stride < tensor.page\n                || tensor.offload.stride < chunk\n",
          "            if tensor.page == 0\n")],
        TEST + ["-p", "kvtier", "--lib", "a_layout_whose_pages_overrun_their_rows"],
    ),
    Mutation(
        "C1-layers-fit-their-pages",
        "a layer that copies more bytes than its tensor's page is taken",
        [("                if layer.bytes > tensor.page {", "                if false {")],
        TEST + ["-p", "kvtier", "--lib", "a_layout_whose_pages_overrun_their_rows"],
    ),
    Mutation(
        "C2-a-group-enters-its-first-chunk-at-its-offset",
        "a group whose first block starts inside a chunk is copied from the chunk's first slot",
        [("            let skip = transfer.block_indices[g] % per_chunk;", "            let skip = 0;")],
        MODELS + ["proptest_offload"],
    ),
    Mutation(
        "C2-a-job-uses-every-id-it-names",
        "a job naming more blocks or chunks than its groups use is taken",
        [("        if next_block != transfer.engine_blocks.len() || next_chunk != transfer.chunks.len() {",
          "        if false {")],
        TEST + ["-p", "kvtier", "--lib", "a_job_that_reaches_outside_the_memory"],
    ),
    Mutation(
        "C3-every-copy-stays-in-its-rows",
        "an engine block past the end of the KV cache is copied to or from",
        [("                    let engine = tensor.engine.at(block, 0).ok_or_else(|| {",
          "                    let engine = Some(tensor.engine.base.wrapping_add((block as usize).wrapping_mul(tensor.engine.stride))).ok_or_else(|| {")],
        TEST + ["-p", "kvtier", "--lib", "a_job_that_reaches_outside_the_memory"],
    ),
    Mutation(
        "C4-one-job-per-id-in-flight",
        "a job id still in flight is taken again, so one report answers for two jobs",
        [("        if self.jobs.is_tracked(&Job::named(id)) {", "        if false {")],
        pytest("tests/test_copier.py::test_an_id_in_flight_is_refused_and_a_shut_down_copier_takes_nothing"),
    ),
    Mutation(
        "C5-reported-after-the-last-copy",
        "a job is reported while its copies still run",
        [("                run(direction, &copies);",
          "                std::thread::spawn(move || {\n                    std::thread::sleep(Duration::from_millis(50));\n                    run(direction, &copies);\n                });")],
        MODELS + ["proptest_offload"],
    ),
    Mutation(
        "C6-wait-fences-the-named-jobs",
        "a preemption's fence returns without waiting for the jobs it names",
        [("        self.jobs.handle_preemptions(&named)", "        named.len() * 0")],
        MODELS + ["proptest_offload"],
    ),
    Mutation(
        "C7-shutdown-lets-go-of-the-memory",
        "the copier holds the engine's memory past its shutdown",
        [("        drop(self.keep_alive.take());", "        std::mem::forget(self.keep_alive.take());")],
        TEST + ["-p", "kvtier", "--lib", "shutdown_runs_what_was_submitted_then_lets_go_of_the_memory"],
    ),
]

#: Added after the registry's order was fixed: appended after every
#: catalogue (catalogue/__init__.py), so the CI sample keeps its members.
APPENDED = [
    Mutation(
        "V12-a-store-makes-directories-an-eviction-removes",
        "a vLLM store makes its directories with create_dir_all, which fails (AlreadyExists) when an eviction removes one between its mkdir and its check",
        [("        || create_shards(path, true),",
          "        || fs::create_dir_all(path.parent().unwrap()).map_err(|e| TierError::io(\"create\", path, e)),")],
        TEST + ["-p", "kvtier", "--lib", "stores_succeed_while_evictions_remove_their_directories"],
    ),
]

"""The file-system and object tiers (src/tier/): F*."""

from ..defs import MODELS, TEST, Mutation

MUTATIONS = [
    Mutation(
        "F10-debug-redacts-the-secret",
        "S3Options' Debug prints the secret access key (into every log line that shows the options)",
        [("&self.secret_access_key.as_ref().map(|_| \"<redacted>\"),", "&self.secret_access_key,")],
        TEST + ["-p", "kvtier", "--lib", "debug_output_never_shows_the_secret"],
    ),
    Mutation(
        "F9-a-failed-head-fails-the-group",
        "a failed head makes only its key a miss and the group counts as answered (an outage never reaches the lookup's stats)",
        [("                    return Err(error);\n", "                    drop(error);\n")],
        TEST + ["-p", "kvtier", "--test", "object_tier", "a_failing_store_shows_in_the_lookup_stats"],
    ),
    Mutation(
        "F1-atomic-publish",
        "a save writes the block under its final name instead of renaming a finished temporary file",
        [("    let (mut file, tmp) = create_temp_in_shard(", "    let (_, stray) = create_temp_in_shard("),
         ("        |suffix| kvtier_temp_name(name, suffix),\n    )?;",
          "        |suffix| kvtier_temp_name(name, suffix),\n    )?;\n    let _ = fs::remove_file(&stray);\n"
          "    let (mut file, tmp) = (fs::File::create(path).map_err(|e| TierError::io(\"create\", path, e))?, path.to_path_buf());"),
         ("        fs::rename(&tmp, path)\n", "        Ok(())\n")],
        TEST + ["-p", "kvtier", "--test", "fs_tier", "concurrent_saves"],
    ),
    Mutation(
        "F2-checksum",
        "load does not compare the payload with its checksum",
        [("    if crc32fast::hash(payload) != checksum {", "    if crc32fast::hash(payload) != checksum && false {")],
        TEST + ["-p", "kvtier", "--test", "fs_tier", "damaged"],
    ),
    Mutation(
        "F2-length",
        "load accepts a block shorter than its header says",
        [("    if found < length {", "    if found < length && false {")],
        # The fs tier compares the file's size with the header before it
        # decodes, so the decoder's own check is seen by its unit test and by
        # the object tier's local store.
        TEST + ["-p", "kvtier", "--lib", "tier::format"],
    ),
    Mutation(
        "F3-failed-write-cleans-up",
        "a failed save leaves its temporary file behind",
        [("        let _ = fs::remove_file(&tmp);\n", "")],
        TEST + ["-p", "kvtier", "--test", "fs_tier", "refuses"],
    ),
    Mutation(
        "F4-only-hex-names-skip-encoding",
        "an object location skips percent-encoding even for a name with characters that need it",
        [("            .all(|b| b.is_ascii_alphanumeric() || b == b'/' || b == b'.')",
          "            .all(|_| true)")],
        TEST + ["-p", "kvtier", "--lib", "tier::object"],
    ),
    Mutation(
        "F5-load-checks-the-promised-length",
        "a load reads whatever length a block's header promises, past max_block_bytes",
        [("    if length > limit {", "    if false {")],
        TEST + ["-p", "kvtier", "--test", "fs_tier", "a_load_is_bounded"],
    ),
    Mutation(
        "F6-store-refuses-linked-shards",
        "a store writes through a shard directory linked outside the root",
        [("        if !follow {\n            refuse_link(dir)?;", "        if false {\n            refuse_link(dir)?;")],
        TEST + ["-p", "kvtier", "--test", "fs_tier", "symlinks_below_the_root"],
    ),
    Mutation(
        "F7-a-long-key-fails-alone",
        "a key too long for a file name is stat'ed, and its error fails the whole group",
        [("                if !relative_name_fits(&name) {", "                if false {")],
        TEST + ["-p", "kvtier", "--test", "fs_tier", "a_key_too_long"],
    ),
    Mutation(
        "F11-vllm-key-holds-a-hash",
        "a vLLM key of four bytes or fewer (no hash) names a file in the rank directory",
        [(".filter(|&n| n > 0)", "")],
        TEST + ["-p", "kvtier", "--lib", "a_key_without_a_hash_is_refused"],
    ),
    Mutation(
        "F12-vllm-bad-key-fails-alone",
        "a vLLM key whose file name cannot exist is stat'ed, and its error fails the whole group",
        [("if push_vllm_path(key.as_ref(), &mut name).is_err() || !name_fits(&name) {", "if false {"),
         ("push_vllm_path(key.as_ref(), name).is_ok() && name_fits(name)",
          "push_vllm_path(key.as_ref(), name).is_ok()")],
        TEST + ["-p", "kvtier", "--test", "vllm_layout", "a_key_that_names_no_file"],
    ),
    Mutation(
        "F13-pool-finishes-queued-jobs",
        "an I/O thread exits at shutdown without running the saves still queued",
        [("                if let Some(job) = queue.pop(lane) {\n",
          "                if queue.closing {\n                    break None;\n                }\n                if let Some(job) = queue.pop(lane) {\n")],
        TEST + ["-p", "kvtier", "--test", "fs_tier", "dropping_the_tier_finishes_every_queued_save"],
    ),
    Mutation(
        "F8-endpoint-has-no-query",
        "an endpoint with a query is accepted (every HEAD of a block becomes a HEAD of the bucket)",
        [("    if parsed.query().is_some() {", "    if false {")],
        TEST + ["-p", "kvtier", "--lib", "tier::s3"],
    ),
    Mutation(
        "F8-endpoint-is-canonical",
        "an endpoint the URL parser rewrites is accepted as written (object_store then panics on it)",
        [("    if parsed.as_str().trim_end_matches('/') != endpoint.trim_end_matches('/') {",
          "    if false {")],
        TEST + ["-p", "kvtier", "--lib", "tier::s3"],
    ),
    Mutation(
        "F14-a-key-round-trips-to-its-path",
        "a path that only resembles a block's (a padded group, another fan-out) is taken as naming a key",
        [("    path.split('/').eq([fan_out, shard, file]).then_some(key)", "    Some(key)")],
        MODELS + ["fuzz_corpus", "vllm_block_path"],
    ),
    # Operators' fixes (issue 40): only the layout's own files, emptied
    # directories removed, a store racing that removal, the trim's exit
    # status, settings before the scan, stopped engines' regions, figures.
    Mutation(
        "F15-only-the-layouts-temporaries-are-swept",
        "any name with a store's suffix counts as a temporary file of the tier: a foreign notes.bin.<hex>.tmp is swept",
        [("        Some((block, _)) if is_kvtier_block(fan_out, shard, block) => Entry::Temp,",
          "        Some(_) => Entry::Temp,")],
        TEST + ["-p", "kvtier", "--lib", "tier::names"],
    ),
    Mutation(
        "F16-only-the-layouts-blocks-are-counted",
        "any hex-named .bin two levels down is a block, wherever it sits: a trim deletes files the layout never wrote",
        [("    path.split('/').eq([fan_out, shard, name])", "    !path.is_empty()")],
        TEST + ["-p", "kvtier-cli", "--test", "trim", "trim_deletes_only_the_files_the_layout_writes"],
    ),
    Mutation(
        "F17-a-tool-refuses-a-directory-that-is-no-tier",
        "kvtier trim scans and trims any directory it is pointed at, / included",
        [("    if fs::symlink_metadata(&mark).is_ok_and(|m| m.is_file()) {", "    if true {")],
        TEST + ["-p", "kvtier-cli", "--test", "trim", "trim_refuses_a_directory_that_is_not_a_tier"],
    ),
    Mutation(
        "F18-emptied-directories-are-removed",
        "an eviction leaves the shard and fan-out directories it emptied: du counts them past the budget",
        [("    let shard = path.parent().filter(|shard| fs::remove_dir(shard).is_ok());",
          "    let shard: Option<&Path> = None;")],
        TEST + ["-p", "kvtier", "--test", "fs_directories", "ten_thousand_evictions_leave_no_directory_without_a_block"],
    ),
    Mutation(
        "F21-a-scan-prunes-empty-layout-directories",
        "a deleting scan walks past the layout's empty directories and leaves them",
        [("                pruned += usize::from(prune && fs::remove_dir(&shard_path).is_ok());",
          "                pruned += usize::from(prune && false);")],
        TEST + ["-p", "kvtier", "--lib", "tier::tree"],
    ),
    Mutation(
        "F19-a-store-whose-directory-was-removed-tries-again",
        "a store fails when an eviction removes its (empty) directory between its mkdir and its create",
        [("                if source.kind() == io::ErrorKind::NotFound && attempt < SHARD_RETRIES => {}",
          "                if false => {}")],
        TEST + ["-p", "kvtier", "--test", "fs_directories", "stores_into_directories_that_evictions_remove_meanwhile"],
    ),
    Mutation(
        "F20-trim-fails-when-it-could-not-delete",
        "kvtier trim exits 0 after files it meant to delete stayed",
        [("    if report.failed > 0 {\n        let named", "    if false {\n        let named")],
        TEST + ["-p", "kvtier-cli", "--test", "trim", "trim_names_what_it_could_not_delete_and_fails"],
    ),
]

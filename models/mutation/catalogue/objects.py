"""Issue 42's mutations, appended after issue 41's so that the CI sample
(record.fixed_sample, taken in registry order) keeps its members: vLLM's layout
in an object store (src/tier/vllm/bucket.rs), the object store's settings
(src/settings/object.rs, python/src/door.rs), the budget across hosts
(src/tier/object_budget.rs, src/tier/vllm/budgeted.rs), stale multipart
uploads (src/tier/s3/uploads.rs) and kvtier.vllm.ObjectTier."""

from ..defs import TEST, Mutation, in_vllm, pytest

MUTATIONS = [
    Mutation(
        "O1-a-present-object-is-not-written-again",
        "a store writes a block another host stored already: a second PUT of every shared block",
        [("                Ok(meta) if meta.size == block.len() as u64 => return Ok(Stored::Present),",
          "                Ok(meta) if false && meta.size == block.len() as u64 => return Ok(Stored::Present),")],
        TEST + ["-p", "kvtier", "--test", "vllm_objects", "a_block_already_there_is_not_written_again"],
    ),
    Mutation(
        "O2-a-load-refuses-an-object-of-another-length",
        "an object of another length than a block is loaded as far as it goes and stays in the bucket",
        [("        if got.meta.size != expected {", "        if false {")],
        TEST + ["-p", "kvtier", "--lib", "tier::vllm::bucket::tests::an_object_of_another_length"],
    ),
    Mutation(
        "O3-a-bad-key-misses-alone",
        "a key that names no block is sent to the store as a HEAD of another object",
        [("                let location = self.location_of(keys[i].as_ref()).ok();",
          "                let location = Some(self.location_of(keys[i].as_ref()).unwrap_or_else(|_| ObjectPath::from(\"x\")));")],
        TEST + ["-p", "kvtier", "--test", "vllm_objects", "a_block_one_host_stores_is_vllms_raw_object"],
    ),
    Mutation(
        "O4-store-config-keys-are-vllms",
        "an unknown store_config key (a typo of access_key) is ignored: the tier runs on other credentials",
        [("            let Some(slot) = KEYS.iter().position(|known| *known == key) else {",
          "            let Some(slot) = KEYS.iter().position(|known| *known == key) else { continue };\n            if false {")],
        TEST + ["-p", "kvtier", "--lib", "settings::object::tests::bad_entries_are_named"],
    ),
    Mutation(
        "O5-the-object-store-settings-pass-the-door",
        "check_settings lets url and store_config through unchecked and builds no target",
        [("    let target = target_of(spelling, values)?;",
          "    let target: Option<kvtier::settings::ObjectTarget> = None;")],
        pytest("tests/test_object_settings.py"),
    ),
    Mutation(
        "O6-a-bad-store-is-refused-at-start",
        "ObjectTier starts on wrong credentials or a missing bucket; every lookup and job fails later",
        [("        target.check_reachable(self.rank_prefix)\n", "")],
        in_vllm("own", "test_object_tier_in_vllm.py", "test_a_bad_store_is_an_error_at_start"),
    ),
    Mutation(
        "O7-a-refused-first-request-names-its-setting",
        "refused credentials are reported as an endpoint that does not answer",
        [("        if CREDENTIAL_CODES.iter().any(|code| text.contains(code)) {", "        if false {")],
        TEST + ["-p", "kvtier", "--lib", "settings::object::tests::a_refused_first_request"],
    ),
    Mutation(
        "O8-a-reconcile-adopts-what-other-hosts-wrote",
        "a reconcile merges an empty listing: other hosts' blocks are never counted, the prefix grows past the budget",
        [("                found.into_iter().map(|meta| (meta.location, meta.size)),",
          "                Vec::<(ObjectPath, u64)>::new(),")],
        TEST + ["-p", "kvtier", "--test", "object_capacity", "hosts_sharing_a_prefix"],
    ),
    Mutation(
        "O9-bucket-stores-get-room-before-they-write",
        "vLLM's stores on a bucket write without asking the budget: the prefix grows past capacity_bytes",
        [("        let room = match budget {", "        let room = match None::<&ObjectBudget> {")],
        TEST + ["-p", "kvtier", "--test", "vllm_objects", "a_budget_bounds_the_rank_prefix"],
    ),
    Mutation(
        "O11-the-rescan-interval-reconciles-the-bucket",
        "rescan_interval starts no reconcile: each host keeps its own books and the prefix holds several budgets",
        [("        let reconciler = config.rescan_interval().map(|interval| {",
          "        let reconciler = None::<std::time::Duration>.map(|interval| {")],
        TEST + ["-p", "kvtier", "--test", "vllm_objects", "a_rescan_interval_reconciles"],
    ),
    Mutation(
        "O12-the-object-tiers-budget-reaches-the-transfers",
        "kvtier.vllm.ObjectTier takes capacity_bytes and drops it: the prefix is unbounded",
        [("            settings=settings,",
          "            settings=dict(settings, capacity_bytes=None, eviction_policy=None, rescan_interval=None),")],
        in_vllm("own", "test_object_tier_in_vllm.py", "test_capacity_bytes_bounds_the_prefix"),
    ),
    Mutation(
        "O14-only-the-layouts-stale-uploads-are-aborted",
        "every stale upload below the prefix is aborted, another writer's objects' too",
        [("        if !is_block(&normalised.join(\"/\")) {", "        if false && !is_block(&normalised.join(\"/\")) {")],
        TEST + ["-p", "kvtier", "--lib", "tier::s3::uploads::tests::only_old_uploads_of_blocks_are_stale"],
    ),
    Mutation(
        "O16-a-start-aborts-stale-uploads",
        "a start on a bucket aborts no stale upload: a killed writer's parts stay, unlisted and billed",
        [("                    match layout.abort_stale_uploads(older_than).await {",
          "                    match Ok::<_, TierError>(crate::tier::StaleUploads::default()) {")],
        TEST + ["-p", "kvtier", "--test", "vllm_objects", "a_start_on_a_bucket_aborts"],
    ),
    Mutation(
        "O17-a-budget-start-aborts-stale-uploads",
        "ObjectTier::with_budget aborts no stale upload: a killed writer's parts stay, unlisted and billed",
        [("        if let Err(error) = self.abort_stale_uploads(budget.sweep_age()).await {",
          "        if let Err(error) = Ok::<(), TierError>(()) {")],
        TEST + ["-p", "kvtier", "--test", "object_capacity", "a_budgets_start_aborts"],
    ),
    Mutation(
        "O18-a-profile-is-its-own-section",
        "every section of an AWS shared file is read as the profile: another profile's keys are used",
        [("            inside = name.trim() == section;", "            inside = true;")],
        TEST + ["-p", "kvtier", "--lib", "tier::s3::profile::tests::a_named_profile_takes_its_sections"],
    ),
    Mutation(
        "O19-the-shared-files-credentials-are-used",
        "the AWS shared credentials file is read and its keys dropped: a machine configured by it has no credentials",
        [("    if let (Some(key), Some(secret)) = (&found.access_key_id, &found.secret_access_key) {",
          "    if let (Some(key), Some(secret), false) = (&found.access_key_id, &found.secret_access_key, true) {")],
        TEST + ["-p", "kvtier-cli", "--test", "trim_s3", "credentials_come_from_the_aws_shared_files_profile"],
    ),
    Mutation(
        "O20-an-unreachable-store-ends-the-admission",
        "a store that needs room goes on choosing victims while the store does not answer: every round tries (and rotates) another block, and it fails as busy",
        [("                    if let (_, Some(error)) = delete_all(store, victims, None).await {",
          "                    if let (_, Some(error)) = (delete_all(store, victims, None).await.0, None::<TierError>) {")],
        TEST + ["-p", "kvtier", "--test", "object_outage"],
    ),
]

"""kvtier's Python code inside vLLM: the tier (N*) and the connector (K*),
in the venv python/integration/vllm.sh makes. Run by name."""

from ..defs import Mutation, in_vllm

MUTATIONS = [
    Mutation(
        "N1-a-failed-load-gives-up-only-its-tail",
        "a failed load marks every key of the job a miss, also those it loaded",
        [("self._lookup_manager.mark_miss(keys[done:])", "self._lookup_manager.mark_miss(keys)")],
        in_vllm("native", "test_fs_tier.py", "test_batched_partial_load_failure_keeps_loaded_blocks"),
    ),
    Mutation(
        "N1-a-failed-load-keeps-its-leading-blocks",
        "a failed load reports no successful keys, so the primary tier drops the blocks it loaded",
        [("successful_keys = tuple(keys[:done]) or None", "successful_keys = None")],
        in_vllm("native", "test_fs_tier.py", "test_batched_partial_load_failure_keeps_loaded_blocks"),
    ),
    Mutation(
        "N2-events-only-for-stores-that-succeeded",
        "a store job that failed still emits a stored event",
        [("elif success and keys and not is_load", "elif keys and not is_load")],
        in_vllm("native", "test_fs_tier.py", "test_mixed_job_results_emit_event_only_for_successful_job"),
    ),
    Mutation(
        "N3-the-native-lookup-answers-vllms-verdicts",
        "the tier's native lookup answers True/False/None instead of vLLM's LookupResult",
        [("        lookup.set_verdicts(LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY)\n", "")],
        in_vllm("native", "test_fs_tier.py", "test_lookup_empty_tier"),
    ),
    Mutation(
        "N4-a-layout-vllm-does-not-share-is-refused",
        "the tier runs on although this vLLM names its block files differently",
        [("        if os.path.normpath(ours) != os.path.normpath(theirs):", "        if False:")],
        in_vllm("own", "test_kvtier_in_vllm.py", "test_a_vllm_whose_file_names_kvtier_does_not_know_is_refused"),
    ),
    Mutation(
        "N5-a-forged-stale-answer-is-dropped",
        "the compatibility view checks a forged answer without its generation",
        [("                if state is None or state[0] != generation:", "                if state is None:")],
        in_vllm("python", "test_async_lookup.py", "test_stale_result_ignored_after_cleanup_and_key_reuse"),
    ),
    Mutation(
        "N6-no-miss-marked-after-shutdown",
        "a load that ends after shutdown marks its keys a miss on the closed lookup, which raises mid-report",
        [("                if not self._closed:", "                if True:")],
        in_vllm("own", "test_cpu_tiering_in_vllm.py", "test_jobs_that_end_at_shutdown_are_still_reported_without_an_error"),
    ),
    Mutation(
        "N7-root-dir-checked",
        "FsTier hands root_dir to vLLM's FileMapper unchecked: None becomes ./None",
        [("    if not isinstance(root_dir, (str, os.PathLike)):", "    if False:")],
        in_vllm("own", "test_kvtier_in_vllm.py", "test_a_bad_root_dir_is_a_configuration_error"),
    ),
    Mutation(
        "N8-capacity-bytes-reaches-the-tier",
        "kvtier.vllm.FsTier takes \"capacity_bytes\" and ignores it: its files grow without bound",
        [("            \"capacity_bytes\": capacity_bytes,", "            \"capacity_bytes\": None,")],
        in_vllm("own", "test_kvtier_in_vllm.py", "test_capacity_bytes_in_the_tier_config"),
    ),
    Mutation(
        "N12-only-the-first-shutdown-reports",
        "a second shutdown asks the closed lookup for its counters, which raises (vLLM's own fs-tier test shuts down twice)",
        [("        if not self._closed:\n            stats = self._lookup_manager.native.stats()",
          "        if True:\n            stats = self._lookup_manager.native.stats()")],
        in_vllm("own", "test_kvtier_in_vllm.py", "test_a_tier_shut_down_twice_raises_nothing"),
    ),
    Mutation(
        "N9-no-settle-after-shutdown",
        "changes reported after shutdown are settled into the closed lookup, which raises mid-report",
        [("        if not changes or self._closed:", "        if not changes:")],
        in_vllm("own", "test_cpu_tiering_in_vllm.py", "test_jobs_that_end_at_shutdown_are_still_reported_without_an_error"),
    ),
    Mutation(
        "N10-evictions-are-removed-events",
        "an eviction is not a removed KV event: routers keep sending requests for a block that is gone",
        [("        if not present and self.events is not None:", "        if False:")],
        in_vllm("own", "test_kvtier_in_vllm.py", "test_the_tiers_lookups_learn_of_its_stores_and_evictions"),
    ),
    Mutation(
        "N11-the-tier-records-its-changes",
        "the tier never records its changes: an evicted hit still leads to a load, a completed store stays a miss",
        [("        self._transfers.record_changes(True)", "        self._transfers.record_changes(False)")],
        in_vllm("own", "test_kvtier_in_vllm.py", "test_the_tiers_lookups_learn_of_its_stores_and_evictions"),
    ),
    Mutation(
        "N13-rescan-interval-reaches-the-tier",
        "the tier takes rescan_interval and never passes it on: engines sharing a directory never learn of each other's blocks",
        [("            \"rescan_interval\": rescan_interval,", "            \"rescan_interval\": None,")],
        in_vllm("own", "test_kvtier_in_vllm.py", "test_engines_sharing_a_directory"),
    ),
    Mutation(
        "N14-settings-are-checked-before-the-scan",
        "kvtier.vllm.FsTier builds its transfers (whose startup scan trims) before any setting is checked",
        [("        settings = check_settings(settings)\n", ""),
         ("        lookup = Lookup.vllm_fs(\n"
          "            rank_dir, concurrency=settings[\"lookup_concurrency\"], group_timeout=settings[\"lookup_timeout\"]\n"
          "        )\n        try:",
          "        try:"),
         ("        except BaseException:\n            lookup.shutdown()\n            raise\n",
          "        except BaseException:\n            raise\n        lookup = Lookup.vllm_fs(\n"
          "            rank_dir, concurrency=settings[\"lookup_concurrency\"], group_timeout=settings[\"lookup_timeout\"]\n"
          "        )\n")],
        in_vllm("own", "test_operators_in_vllm.py", "test_a_refused_configuration_deletes_nothing"),
    ),
    Mutation(
        "N15-a-region-a-process-holds-is-kept",
        "kvtier removes every offload region at start, a live engine's too",
        [("        if path in held:\n            continue", "        if False:\n            continue")],
        in_vllm("package", "test_regions.py", "test_only_regions_no_process_holds_are_removed"),
    ),
    Mutation(
        "N16-only-this-users-regular-files",
        "kvtier takes a link, a directory or another user's file named like a region for an offload region",
        [("        if stat.S_ISREG(info.st_mode) and info.st_uid == uid:", "        if True:")],
        in_vllm("package", "test_regions.py", "test_only_regions_no_process_holds_are_removed"),
    ),
    Mutation(
        "N17-counters-report-their-increase",
        "the figures report running totals as counter increases: /metrics counts every total again at each step",
        [("            increase = total - self._reported.get(key, 0)", "            increase = total")],
        in_vllm("own", "test_operators_in_vllm.py", "test_the_tiers_figures"),
    ),
    Mutation(
        "K1-a-request-with-recorded-dumps-delays-its-free",
        "the connector's request_finished answers False for a request whose dumps are recorded: vLLM frees "
        "its blocks under the running dump (and a worker's later report names a request vLLM forgot)",
        [("        delay = self.saves.request_finished(req_id)",
          "        self.saves.request_finished(req_id)\n        delay = False")],
        in_vllm("connector", "test_connector_in_vllm.py", "test_a_finished_request_keeps_its_blocks_until"),
    ),
    Mutation(
        "K2-an-unanswered-lookup-retries",
        "get_num_new_matched_tokens answers the hits so far while the tier is still being probed: a "
        "request computes blocks the tier holds",
        [("        if leading < len(keys) and verdicts[leading] is None:", "        if False:")],
        in_vllm("connector", "test_connector_in_vllm.py", "test_restart_hits_load_the_dumped_bytes"),
    ),
    Mutation(
        "K3-preempted-requests-are-fenced",
        "preemptions are not passed on to the workers: no fence, the preempted blocks are reused under "
        "their dumps",
        [("            self.saves.preempt(preempted)", "            pass")],
        in_vllm("connector", "test_connector_in_vllm.py", "test_a_preemption_waits_for_its_own_dumps_only"),
    ),
    Mutation(
        "K4-failed-loads-are-reported",
        "blocks that failed to load are not reported to vLLM: it runs the request on blocks never loaded",
        [("                self._load_errors.update(result.failed_blocks)", "                pass")],
        in_vllm("connector", "test_connector_in_vllm.py", "test_a_failed_load_is_recomputed"),
    ),
    Mutation(
        "K5-blocking-save-waits-for-its-dumps",
        "blocking_save is ignored: wait_for_save returns with its dumps in flight",
        [("        self.blocking = settings.blocking_save", "        self.blocking = False")],
        in_vllm("connector", "test_connector_in_vllm.py", "test_a_blocking_save_returns_with_its_dumps_done"),
    ),
    Mutation(
        "K6-unannounced-finishes-are-not-reported",
        "a request vLLM finished without telling the connector is reported in finished_sending: vLLM "
        "meets an id it no longer knows",
        [("        gone = finished & self._forgotten", "        gone = set()")],
        in_vllm("connector", "test_connector_in_vllm.py", "test_a_wrapper_that_drops_request_finished"),
    ),
    Mutation(
        "K7-settings-are-checked",
        "the connector's int settings are taken unchecked: staging_bytes=0, io_threads=True pass",
        [("        checked = check_settings(values, \"kv_connector_extra_config\")",
          "        checked = dict(values)")],
        in_vllm("connector", "test_connector_in_vllm.py", "test_bad_settings_are_config_errors"),
    ),
    Mutation(
        "K8-unannounced-finishes-are-fenced",
        "a finish vLLM did not announce is not fenced: the blocks vLLM handed on are written under the "
        "dump, whose file gets another request's bytes",
        [("                self.saves.preempt([req_id])", "                pass")],
        in_vllm("connector", "test_connector_in_vllm.py", "test_a_wrapper_that_drops_request_finished"),
    ),
    Mutation(
        "K9-recomputed-blocks-are-dumped-again",
        "blocks recomputed after a failed load are taken as dumped: their files stay missing",
        [("            if index is not None and req.saved is not None:", "            if False:")],
        in_vllm("connector", "test_connector_in_vllm.py", "test_a_failed_load_is_recomputed"),
    ),
    Mutation(
        "K10-shutdown-lets-go-of-the-staging-area",
        "a shut-down worker keeps its staging area (64 MiB by default) for as long as the connector lives",
        [("        self._staging = None", "        pass")],
        in_vllm("connector", "test_connector_in_vllm.py", "test_shutdown_is_bounded_and_holds_no_buffer"),
    ),
    Mutation(
        "K11-the-connectors-budget-reaches-its-transfers",
        "the connector takes capacity_bytes and ignores it: its dumps grow without bound",
        [("            capacity_bytes=self.settings.capacity_bytes,", "            capacity_bytes=None,")],
        in_vllm("connector", "test_connector_in_vllm.py", "test_a_byte_budget_bounds_the_dumped_files"),
    ),
    Mutation(
        "K12-rank-0-records-its-changes",
        "the connector's rank 0 never records its dumps and evictions: the scheduler's lookups keep stale verdicts",
        [("            record_changes=self.rank == 0,", "            record_changes=False,")],
        in_vllm("connector", "test_connector_in_vllm.py", "test_a_byte_budget_bounds_the_dumped_files"),
    ),
    Mutation(
        "K13-the-scheduler-settles-the-workers-changes",
        "the connector's scheduler drops the workers' changes: an evicted hit still leads to a load",
        [("            for key, present in zip(meta.changed_keys, meta.changed_present):",
          "            for key, present in []:")],
        in_vllm("connector", "test_connector_in_vllm.py", "test_a_byte_budget_bounds_the_dumped_files"),
    ),
    Mutation(
        "K14-rescan-interval-reaches-the-dumps",
        "the connector reads rescan_interval and never passes it on: engines sharing a root never count each other's dumps",
        [("            rescan_interval=self.settings.rescan_interval,", "            rescan_interval=None,")],
        in_vllm("connector", "test_connector_in_vllm.py", "test_engines_sharing_a_root"),
    ),
    Mutation(
        "K15-a-device-kv-cache-is-refused-with-the-alternative",
        "the connector takes a KV cache on a device and fails later, in the native copier, without naming what to run",
        [("        if tensor.device.type != \"cpu\":", "        if False:")],
        in_vllm("own", "test_operators_in_vllm.py", "test_the_connector_refuses"),
    ),
    Mutation(
        "K16-the-connector-is-registered-for-multiconnectors-stats",
        "kvtier's connector is not in vLLM's connector registry: under MultiConnector the engine's stats logger raises at the first stats and ends the engine",
        [("        KVConnectorFactory.register_connector(cls.__name__, cls.__module__, cls.__name__)", "        pass")],
        in_vllm("own", "test_operators_in_vllm.py", "test_multiconnector_rebuilds"),
    ),
]

"""The save-completion core (src/save/): S*, and its wire format: W*."""

from ..defs import LOOM, TEST, Mutation

MUTATIONS = [
    Mutation(
        "S2-aggregator-needs-a-worker",
        "an aggregator for no workers is built (and can never free a request)",
        [("if workers == 0 {", "if false {")],
        TEST + ["-p", "kvtier", "--test", "save", "an_aggregator_for_no_workers_is_refused"],
    ),
    Mutation(
        "S1-report-while-running",
        "a finished request is reported although a task still reads its blocks",
        [("            if requests.get(request).is_some_and(RequestState::has_tasks) {\n                return true;\n            }",
          "            if requests.get(request).is_some_and(RequestState::has_tasks) && false {\n                return true;\n            }")],
        TEST + ["--release", "-p", "kvtier-models", "--test", "loom_save", "reported_only_after"],
        LOOM,
    ),
    Mutation(
        "S1-completion-wait-returns-early",
        "CompletionTask::wait returns without waiting for the completer",
        [("            if let Some(result) = outcome.take() {\n                break result;\n            }\n            outcome = self.shared.completed.wait(outcome);",
          "            break outcome.take().unwrap_or(Ok(()));")],
        TEST + ["--release", "-p", "kvtier-models", "--test", "loom_save", "blocking_get_finished"],
        LOOM,
    ),
    Mutation(
        "S1-blocking-mode-waits",
        "a blocking get_finished does not wait for the finished requests' tasks",
        [("        if self.mode == CompletionMode::Blocking {", "        if false {")],
        TEST + ["--test", "save", "blocking_mode_waits"],
    ),
    Mutation(
        "S2-deferred-remembered",
        "a finished request that cannot be reported yet is dropped instead of remembered",
        [("            if requests.get(request).is_some_and(RequestState::has_tasks) {\n                return true;\n            }",
          "            if requests.get(request).is_some_and(RequestState::has_tasks) {\n                return false;\n            }")],
        TEST + ["--test", "save", "s1_a_finished_request"],
    ),
    Mutation(
        "S2-failed-wait-closes-task",
        "a task whose wait panicked is never closed, so its requests are never reported",
        [("        self.unlink(task, members.as_slice(), failed);\n",
          "        if !matches!(ended, Ended::Panicked) {\n            self.unlink(task, members.as_slice(), failed);\n        }\n")],
        TEST + ["--test", "save", "failed_timed_out_and_panicking"],
    ),
    Mutation(
        "S2-report-once",
        "a finished id passed again while waiting is queued a second time",
        [("                Recorded::Finished => self.stats.repeated_finishes += 1,",
          "                Recorded::Finished => self.finishing.push(request.clone()),")],
        TEST + ["--test", "save", "s2_each_request"],
    ),
    Mutation(
        "S3-untracked-not-reported",
        "a finished id that never saved is queued for report",
        [("                Recorded::No => self.stats.not_delayed += 1,",
          "                Recorded::No => {\n"
          "                    let state = RequestState { recorded: Recorded::No, tasks: None, failed: false };\n"
          "                    self.requests.entry(request.clone()).or_insert(state).recorded = Recorded::Finished;\n"
          "                    self.recorded += 1;\n"
          "                    self.finishing.push(request.clone());\n"
          "                }")],
        TEST + ["--test", "save", "s3_requests"],
    ),
    Mutation(
        "S3-scheduler-forgets",
        "request_finished does not forget the request, so a second call delays again",
        [("        let delay = self.delayed.remove(request);", "        let delay = self.delayed.contains(request);")],
        TEST + ["--release", "-p", "kvtier-models", "--test", "proptest_save"],
    ),
    Mutation(
        "S4-task-kept-until-waited",
        "submit drops the task at once, releasing its handle while the save runs",
        [("        self.ledger.open_task(requests, task, Instant::now())\n",
          "        let id = self.ledger.open_task(requests, task, Instant::now());\n"
          "        self.ledger.try_close_task(id, None, Closed::Reaped, |task| {\n"
          "            drop(task);\n"
          "            Ok((Ended::Returned(Ok(())), Instant::now()))\n"
          "        });\n"
          "        id\n")],
        TEST + ["--test", "save", "completion_tasks_are_completed"],
    ),
    Mutation(
        "S6-steps-in-sequence",
        "a worker takes a step that skips one, or one it already took, losing the missed step's saving requests",
        [("        self.ledger.expect_step(step.step())?;\n", "")],
        TEST + ["--test", "save_steps", "a_worker_takes_steps_in_sequence"],
    ),
    Mutation(
        "S5-step-drives-the-fence",
        "a step's preempted requests are not fenced: the forward pass may overwrite blocks a save still reads",
        [("            self.handle_preemptions(step.preempted());", "            let _ = step.preempted();")],
        TEST + ["--test", "save_steps", "a_step_carrying_preemptions"],
    ),
    Mutation(
        "S2-step-carries-the-finish",
        "a delayed finish is not carried to the workers by the next step, so they never report it",
        [("            self.finished.push(request.clone());", "")],
        TEST + ["--test", "save_steps", "finishes_travel_in_the_step"],
    ),
    Mutation(
        "S2-fold-waits-for-every-path",
        "a worker's folded report names a request as soon as one save path reported it, while another path's save still reads its blocks",
        [("        self.finished_sending(reports).free",
          "        let mut free: Vec<R> = Vec::new();\n"
          "        for (_, request) in reports {\n"
          "            if !free.contains(&request) {\n"
          "                free.push(request);\n"
          "            }\n"
          "        }\n"
          "        free")],
        TEST + ["--test", "save_steps", "a_folding_multi_connector"],
    ),
    Mutation(
        "S2-reports-in-sequence",
        "the aggregator takes a worker's report for any step, so a lost report goes unnoticed",
        [("        if report.step != expected {", "        if false {")],
        TEST + ["--test", "save_steps", "a_lost_or_repeated_report"],
    ),
    Mutation(
        "S5-fence-waits-preempted",
        "the preemption fence returns without waiting for the preempted requests' tasks",
        [("        for (waited, id) in fenced.iter().enumerate() {",
          "        for (waited, id) in fenced.iter().take(0).enumerate() {")],
        TEST + ["--release", "-p", "kvtier-models", "--test", "loom_save", "preemption_fence"],
        LOOM,
    ),
    Mutation(
        "S5-fence-only-preempted",
        "the preemption fence waits for every running task",
        [("        let fenced = self.ledger.tasks_of(preempted);",
          "        let fenced: Vec<TaskId> = self.ledger.running().collect();")],
        TEST + ["--test", "save", "s5_preemption"],
    ),
    Mutation(
        "S6-worker-records-the-step",
        "a worker does not record the step's saving requests, so they are never delayed",
        [("        self.ledger.begin_step(step.requests());", "        self.ledger.begin_step(&step.requests()[..0]);")],
        TEST + ["--test", "save", "s6_the_scheduler"],
    ),
    Mutation(
        "S11-record-step-dedupes-by-hash",
        "record_step finds duplicates by scanning the step's requests (quadratic)",
        [("            if listed.find(hash, |&i| requests[i] == request).is_some() {",
          "            if requests.contains(&request) {")],
        TEST + ["-p", "kvtier", "--test", "save", "recording_a_large_step"],
    ),
    Mutation(
        "S12-closed-tasks-are-squeezed-out",
        "closed tasks leave holes in the running list for ever (memory grows with every task ever submitted)",
        [("        if self.holes * 2 > self.entries.len() {",
          "        if false {")],
        TEST + ["-p", "kvtier", "--lib", "holes_are_squeezed_out"],
    ),
    Mutation(
        "S6-multi-forwards-to-all",
        "MultiConnector stops forwarding request_finished at the first connector that delays",
        [("            .inner\n            .iter_mut()\n            .map(|connector| Owed::if_delayed(connector.request_finished(request)))",
          "            .inner\n            .iter_mut()\n            .take(1)\n            .map(|connector| Owed::if_delayed(connector.request_finished(request)))")],
        TEST + ["--test", "save", "a_multi_connector_forwards"],
    ),
    Mutation(
        "S2-multi-counts-per-connector",
        "MultiConnector counts reports per request: a second report from one connector stands in for another's",
        [("                    Owed::Reported => Some(ReportError::Duplicate {\n                        worker: connector,\n                        request,\n                    }),",
          "                    Owed::Reported => {\n                        if let Some(other) = owed.iter_mut().find(|o| **o == Owed::Report) {\n                            *other = Owed::Reported;\n                        }\n                        if !owed.contains(&Owed::Report) {\n                            self.outstanding.remove(&request);\n                            report.free.push(request);\n                        }\n                        None\n                    }")],
        TEST + ["--test", "save", "a_multi_connector_counts_reports_per_connector"],
    ),
    Mutation(
        "S3-aggregator-keeps-the-batch",
        "ReportAggregator::report stops at the first refused report, swallowing the frees it had taken",
        [("                    .push(ReportError::Unexpected { worker, request });\n                continue;",
          "                    .push(ReportError::Unexpected { worker, request });\n                return Ok(Report { free: Vec::new(), refused: report.refused });")],
        TEST + ["--test", "save", "a_refused_report_never_swallows"],
    ),
    Mutation(
        "S13-failed-task-fails-its-requests",
        "a task that failed does not mark its requests failed: they are reported as saved",
        [("            state.failed |= failed;\n", "")],
        TEST + ["-p", "kvtier", "--test", "save", "each_reported_request_says"],
    ),
    Mutation(
        "S13-refused-save-is-a-failure",
        "a refused save does not mark its requests failed",
        [("                state.failed = true;", "                state.failed = false;")],
        TEST + ["-p", "kvtier", "--test", "save", "each_reported_request_says"],
    ),
    Mutation(
        "S9-poll-never-waits",
        "a poll waits for a task whose check panicked",
        [("                Check::Panicked(message) => {\n",
          "                Check::Panicked(message) => {\n                    done.push((id, at));\n")],
        TEST + ["-p", "kvtier", "--test", "save", "a_panicking_check_never"],
    ),
    Mutation(
        "S14-interrupted-check-stops",
        "an interrupted check is taken as still running and the poll goes on to the next task",
        [("                Check::Interrupted => return,", "                Check::Interrupted => {}")],
        TEST + ["-p", "kvtier", "--test", "interrupts", "an_interrupted_check_stops_the_poll"],
    ),
    Mutation(
        "S14-interrupted-wait-keeps-the-task",
        "a task whose wait was interrupted is closed as if it ended: the fence passes while its save runs",
        [("""                self.tasks.restore(
                    task,
                    Open {
                        task: value,
                        members,
                        opened,
                        check_panicked,
                    },
                );
                return Closing::Kept;""", """                drop(value);
                let _ = check_panicked;
                (Ended::Returned(Ok(())), opened)""")],
        TEST + ["-p", "kvtier", "--test", "interrupts"],
    ),
    Mutation(
        "S14-interrupted-fence-takes-no-step",
        "a step whose fence was interrupted is taken all the same, so offering it again is refused as repeated",
        [("            if self.is_interrupted() {\n                return Err(StepError::Interrupted);",
          "            if false {\n                return Err(StepError::Interrupted);")],
        TEST + ["-p", "kvtier", "--test", "interrupts", "an_interrupted_fence_does_not_pass"],
    ),
    Mutation(
        "S14-interrupted-call-reports-nothing",
        "an interrupted get_finished reports what it could, which a caller raising the interrupt then loses",
        [("        if self.is_interrupted() {\n            return;\n        }\n        self.ledger.report",
          "        if false {\n            return;\n        }\n        self.ledger.report")],
        TEST + ["-p", "kvtier", "--test", "interrupts", "an_interrupted_get_finished_reports_nothing"],
    ),
    Mutation(
        "W1-version-checked",
        "a message of an unknown layout version is decoded as version 1",
        [("    if header[4] != VERSION {", "    if false {")],
        TEST + ["-p", "kvtier", "--lib", "wire::tests::the_header_is_checked"],
    ),
    Mutation(
        "W2-histogram-canonical",
        "latency buckets out of order or repeated are accepted: two encodings of one histogram, one overwriting a bucket",
        [("        if index < next || index >= SaveLatency::BUCKETS {", "        if index >= SaveLatency::BUCKETS {")],
        TEST + ["-p", "kvtier", "--lib", "wire::tests::a_report_refuses"],
    ),
    Mutation(
        "W3-list-bounded-by-input",
        "a list's claimed length is not checked against the message before allocating: a 20-byte message can ask for exabytes",
        [("        if !fits {", "        if false {")],
        TEST + ["-p", "kvtier", "--lib", "wire::codec::tests::a_list_longer_than"],
    ),
    Mutation(
        "W3-encoder-refuses-oversized",
        "an encoder writes a body over the limit, which every decoder then refuses (or, past 4 GiB, a wrapped length)",
        [("    if body > MAX_BODY {", "    if false {")],
        TEST + ["-p", "kvtier", "--lib", "wire::tests::a_message_over_the_limit"],
    ),
    Mutation(
        "W4-decoding-within-the-memory-budget",
        "a decoder allocates whatever the ids need: a 64 MiB body of empty ids holds 1.5 GiB",
        [("        match self.budget.checked_sub(bytes) {", "        match Some(self.budget) {")],
        TEST + ["-p", "kvtier", "--release", "--test", "wire_memory"],
    ),
    Mutation(
        "W4-encoder-refuses-too-costly",
        "an encoder sends a message whose ids cost a decoder more than its budget, which every worker refuses",
        [("    if cost > codec::budget(body) {", "    if false {")],
        TEST + ["-p", "kvtier", "--release", "--test", "wire_memory"],
    ),
]

#!/usr/bin/env python3
"""Remove or invert each guarding line of the lookup core (L*), of the
concurrent-group tasks driver (T*), of the save-completion core (S*), of
the file-system tier (F*), of vLLM's transfers (V*), of the KV copier
(C*) and of the Python
package's native module (P*), on a scratch copy, and show which check then
fails.

    python3 models/mutants.py            # every mutation, its named check
    python3 models/mutants.py L4-ticket  # mutations whose id starts with L4-ticket
    python3 models/mutants.py --matrix   # every mutation against every suite
    python3 models/mutants.py --anchors  # only check that every mutation applies
    python3 models/mutants.py P          # the Python package's (not in the default run)
    python3 models/mutants.py N          # vLLM's tier (needs python/integration/vllm.sh's venv)
    python3 models/mutants.py K          # kvtier's vLLM connector (the same venv)
    python3 models/mutants.py --record   # as the default run, then record it (below)
    python3 models/mutants.py --ci       # what CI runs: changed since the record, and a sample
    python3 models/mutants.py --check-selection  # the CI rule cannot skip a changed guard

Each mutation names the invariant (docs/design.md) whose guard it breaks, the
text it replaces, and the check expected to catch it. The code marks each
guard with a `// guard: <mutation id>` comment; a mutation edits only the
few lines after its tags, so it follows its guard when code moves, and a tag
or a text that is gone makes it STALE (a failure). A mutation whose
check still passes is reported as SURVIVED and makes the script exit non-zero:
that check cannot see the guard, so either the check or the guard is wrong.
The working tree is never modified; the scratch copy lives in
$KVTIER_MUTANTS_DIR (default: target/mutants/).

--matrix runs each mutation against every suite of its protocol in SUITES
instead (unit and integration tests, the differential test, proptest, the
fuzz corpus replay, loom, shuttle) and prints a markdown table per protocol
of which suites catch it: the evidence tables of docs/verification.md. It
takes about an hour.

--record adds, for each mutation just run (all of them caught), a
fingerprint of its definition and of every file its verdict depends on
(its guard's file, its check's test files: check_inputs) to
models/mutants-record.json. --ci runs every mutation whose fingerprint is
not the recorded one, and every SAMPLE_EVERY-th of the rest.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRATCH = os.environ.get("KVTIER_MUTANTS_DIR", os.path.join(ROOT, "target", "mutants"))

TEST = ["cargo", "test", "--quiet"]
LOOM = {"RUSTFLAGS": "--cfg kvtier_loom"}
SHUTTLE = {"RUSTFLAGS": "--cfg kvtier_shuttle"}
MODELS = TEST + ["--release", "-p", "kvtier-models", "--test"]

# The Python package's checks: build the extension module from the scratch
# tree into a venv of its own (maturin develop, a debug build), then run
# pytest on the tests named (`-s`, so a watchdog's report of a hang is seen).
# Each P mutant rebuilds the module, so the P
# mutations run only when asked for (`mutants.py P`), not in the default run.
PY_VENV = os.path.join(SCRATCH, "py-venv")


def pytest(*tests):
    bin = os.path.join(PY_VENV, "bin")
    return ["bash", "-c",
            f"cd python && VIRTUAL_ENV={PY_VENV} PATH={bin}:$PATH {bin}/maturin develop -q "
            f"&& {bin}/python -m pytest -x -q -s -p no:cacheprovider " + " ".join(tests)]


# The vLLM tier's Python code (N*): vLLM's own tier tests, or kvtier's checks
# inside vLLM, in the venv python/integration/vllm.sh made (run it first),
# with the scratch tree's Python code in front of the native module that
# venv has (N mutations change Python code only). Run by name, like P.
VLLM_VENV = os.environ.get("KVTIER_VLLM_VENV", os.path.join(ROOT, "target", "vllm-venv"))
VLLM_TESTS = os.path.join(os.environ.get("KVTIER_VLLM_WORK", os.path.join(ROOT, "target", "vllm-work")), "tests")


VLLM_WORK = os.environ.get("KVTIER_VLLM_WORK", os.path.join(ROOT, "target", "vllm-work"))


def in_vllm(mode, test_file, test):
    py = os.path.join(VLLM_VENV, "bin", "python")
    env = ""
    if mode == "package":
        # The package's own tests (pure Python code, no vLLM needed), with
        # the vLLM venv's native module beside the scratch tree's Python.
        where, plugin, path = "python/tests", "", "$tree/python"
    elif mode in ("own", "connector"):
        where, plugin, path = "python/integration", "", "$tree/python:$tree/python/integration"
        if mode == "connector":
            # The connector's tests drive vLLM's scheduler through the sdist's
            # helpers and an offline stand-in model config (vllm.sh makes both).
            env = (f"KVTIER_VLLM_SDIST={os.path.join(VLLM_WORK, 'sdist')} "
                   f"HF_HOME={os.path.join(VLLM_WORK, 'hf')} HF_HUB_OFFLINE=1 ")
    else:
        where, plugin, path = VLLM_TESTS, "-p kvtier_vllm_plugin", "$tree/python:$tree/python/integration"
    return ["bash", "-c",
            f"tree=$PWD && cp \"$({py} -c 'import kvtier._native as n; print(n.__file__)')\" python/kvtier/ "
            f"&& cd {where} && KVTIER_VLLM_MODE={mode} {env}PYTHONPATH={path} "
            f"{py} -m pytest -x -q -p no:cacheprovider {plugin} {test_file} -k {test}"]


def ensure_py_venv():
    if not os.path.exists(os.path.join(PY_VENV, "bin", "maturin")):
        subprocess.run([sys.executable, "-m", "venv", PY_VENV], check=True)
        subprocess.run([os.path.join(PY_VENV, "bin", "pip"), "install", "-q", "maturin", "pytest"], check=True)


# Every suite that can see each protocol's code, keyed by the first letter of
# the mutation ids (L: lookup, T: the tasks driver, S: save completion,
# E: the capacity ledger,
# F: the fs tier). The abstract protocol
# model cannot see the code: it has its own guard-removal tests in
# models/tests/protocol_model.rs.
SUITES = {
    "L": {
        "tests": (TEST + ["-p", "kvtier", "--lib", "--tests"], {}),
        "differential": (MODELS + ["differential"], {}),
        "proptest": (MODELS + ["proptest_lookup"], {}),
        "fuzz corpus": (MODELS + ["fuzz_corpus"], {}),
        "loom": (MODELS + ["loom_lookup"], LOOM),
        "shuttle": (MODELS + ["shuttle_lookup"], dict(SHUTTLE, KVTIER_SHUTTLE_ITERATIONS="20000")),
    },
    "T": {
        "tests": (TEST + ["-p", "kvtier", "--features", "tokio", "--test", "tokio_driver"], {}),
        "tokio stress": (MODELS + ["tasks_stress"], {}),
        "shuttle": (MODELS + ["shuttle_tasks"], dict(SHUTTLE, KVTIER_SHUTTLE_ITERATIONS="20000")),
    },
    "F": {
        "tests": (TEST + ["-p", "kvtier", "--test", "fs_tier", "--test", "object_tier",
                          "--test", "vllm_layout", "--lib"], {}),
        "proptest": (MODELS + ["proptest_vllm_layout"], {}),
    },
    "V": {
        "tests": (TEST + ["-p", "kvtier", "--lib", "--test", "vllm_transfers", "--test", "save"], {}),
    },
    "C": {
        "tests": (TEST + ["-p", "kvtier", "--lib"], {}),
        "proptest": (MODELS + ["proptest_offload"], {}),
    },
    "W": {
        "tests": (TEST + ["-p", "kvtier", "--lib", "--test", "save_steps"], {}),
        "proptest": (MODELS + ["proptest_wire"], {}),
        "fuzz corpus": (MODELS + ["fuzz_corpus"], {}),
    },
    "P": {
        "pytest": (pytest("tests"), {}),
    },
    "H": {
        "tests": (TEST + ["-p", "kvtier", "--features", "tokio", "--lib", "--tests"], {}),
    },
    "N": {
        "vLLM's tests, native": (in_vllm("native", "test_fs_tier.py", "test"), {}),
        "vLLM's tests, python": (in_vllm("python", "test_async_lookup.py", "test"), {}),
        "kvtier in vLLM": (in_vllm("own", "test_kvtier_in_vllm.py", "test"), {}),
    },
    "K": {
        "connector through vLLM's scheduler": (in_vllm("connector", "test_connector_in_vllm.py", "test"), {}),
        "lockstep with the save reference": (in_vllm("connector", "test_connector_lockstep.py", "test"), {}),
    },
    "E": {
        "tests": (TEST + ["-p", "kvtier", "--lib", "capacity"], {}),
        "proptest": (MODELS + ["proptest_capacity"], {}),
        "loom": (MODELS + ["loom_capacity"], LOOM),
        "shuttle": (MODELS + ["shuttle_capacity"], dict(SHUTTLE, KVTIER_SHUTTLE_ITERATIONS="20000")),
    },
    "S": {
        "tests": (TEST + ["-p", "kvtier", "--lib", "--tests"], {}),
        "proptest": (MODELS + ["proptest_save"], {}),
        "fuzz corpus": (MODELS + ["fuzz_corpus"], {}),
        "loom": (MODELS + ["loom_save"], LOOM),
        "shuttle": (MODELS + ["shuttle_save"], dict(SHUTTLE, KVTIER_SHUTTLE_ITERATIONS="20000")),
        "processes": (TEST + ["-p", "kvtier-cli", "--test", "saves"], {}),
    },
}


@dataclass
class Mutation:
    id: str
    what: str
    # (old, new) pairs. Each `old` must occur exactly once in the code that
    # follows the mutation's `// guard: <id>` tags: the GUARD_WINDOW lines
    # after each tag, in whichever file under src/ holds the tags.
    edits: list
    check: list  # command run in the scratch copy; expected to fail
    env: dict = None


MUTATIONS = [
    Mutation(
        "L1-batch-generation",
        "flush submits batch entries whose state was cleaned up (and recreated) before it",
        [("if dropped.contains(&group.generations[i].0) {",
          "if false {")],
        TEST + ["--test", "table", "a_key_cleaned_up_and_recreated"],
    ),
    Mutation(
        "L1-known-key",
        "a known key is batched again when another request asks for it",
        [("let entry = match self.keys.find(hash, key) {",
          "let entry = match self.keys.find(hash, key).filter(|&c| self.keys.entry_mut(c).first == slot) {")],
        TEST + ["--test", "table", "a_key_looked_up_twice"],
    ),
    Mutation(
        "L2-apply-generation",
        "apply ignores the generation an answer was submitted for",
        [("if state.generation() != generation {\n                // L3",
          "if false {\n                // L3")],
        TEST + ["--lib", "a_result_for_another_generation"],
    ),
    Mutation(
        "L3-inflight-retention",
        "cleanup removes in-flight states instead of keeping them as orphans",
        [("// kept as an orphan, so a later request shares the probe",
          "self.keys.remove_cell(cell);")],
        TEST + ["--release", "-p", "kvtier-models", "--test", "loom_lookup", "cleanup_while_in_flight"],
        LOOM,
    ),
    Mutation(
        "L3-orphan-removal",
        "an orphan's answer resolves it instead of removing it",
        [("if !state.has_requesters() {\n                self.keys.remove(hash, cell);",
          "if false {\n                self.keys.remove(hash, cell);")],
        TEST + ["--test", "table", "an_orphaned_result"],
    ),
    Mutation(
        "L4-ticket-generation",
        "mark_miss ignores the ticket's generation",
        [("if state.generation() == ticket.generation\n                    && state.phase",
          "if state.phase")],
        TEST + ["--test", "table", "defect_1"],
    ),
    Mutation(
        "L4-keys-resolved-only",
        "mark_miss_keys also forces pending and in-flight states to a miss",
        [("                    == (Phase::Resolved { found: true })\n            {",
          "                    != (Phase::Resolved { found: false })\n            {")],
        TEST + ["--test", "driver", "defect_1"],
    ),
    Mutation(
        "L5-apply-in-flight-only",
        "apply accepts a second answer for an already resolved generation",
        [("if phase != Phase::InFlight && phase != Phase::Overdue {\n                // A generation",
          "if false {\n                // A generation")],
        TEST + ["--lib", "a_duplicate_result"],
    ),
    Mutation(
        "L6-one-answer-per-key",
        "short answers leave the remaining keys without an answer",
        [("found.resize(self.keys.len(), false);", "")],
        TEST + ["--test", "table", "defect_5"],
    ),
    Mutation(
        "L6-catch-panics",
        "backend panics are not caught",
        [("let call = panic::catch_unwind(AssertUnwindSafe(|| {",
          "let call = no_catch(AssertUnwindSafe(|| {"),
         ("/// Probes one group, turning every fault into misses",
          "fn no_catch<T>(f: AssertUnwindSafe<impl FnOnce() -> T>) -> std::thread::Result<T> { Ok(f.0()) }\n/// Probes one group, turning every fault into misses")],
        TEST + ["--test", "driver", "defects_4_and_5"],
    ),
    Mutation(
        "L7-release-publication",
        "the publishing CAS is Relaxed: node contents are not ordered before the consumer",
        [(".compare_exchange_weak(head, node, Ordering::Release, Ordering::Relaxed)",
          ".compare_exchange_weak(head, node, Ordering::Relaxed, Ordering::Relaxed)")],
        TEST + ["--release", "-p", "kvtier-models", "--test", "loom_lookup", "two_groups"],
        LOOM,
    ),
    Mutation(
        "L7-publication-order",
        "take_all hands results back newest first",
        [("        taken.reverse();\n", "")],
        TEST + ["--lib", "take_all_returns_publication_order"],
    ),
    Mutation(
        "L7-per-group-publication",
        "the worker publishes a submission's groups only when all are done",
        [("probe_and_publish(&mut backend, group, |result| published.publish(result));",
          "probe_and_publish(&mut backend, group, |result| done.push(result));"),
         ("published.publish(group.abandoned());", "done.push(group.abandoned());"),
         ("        for group in submission.into_groups() {\n",
          "        let mut done = Vec::new();\n        for group in submission.into_groups() {\n"),
         ("        shared.queue.lock().completed += 1;\n",
          "        for result in done {\n            published.publish(result);\n        }\n        shared.queue.lock().completed += 1;\n")],
        TEST + ["--test", "driver", "seed_000"],
    ),
    Mutation(
        "L7-lookup-applies-published",
        "lookup does not apply what the worker published (results wait for flush)",
        [("        self.drain();\n        self.table.lookup(key, request)",
          "        self.table.lookup(key, request)")],
        TEST + ["--test", "driver", "defect_3"],
    ),
    Mutation(
        "L8-shutdown-applies-last-answers",
        "shutdown joins the worker but drops its last answers",
        [("        let stopped = self.prober.shutdown();\n        self.drain();",
          "        let stopped = self.prober.shutdown();")],
        TEST + ["--release", "-p", "kvtier-models", "--test", "loom_lookup", "shutdown_with_work_queued"],
        LOOM,
    ),
    Mutation(
        "L8-refused-groups-are-cancelled",
        "a submission the prober refused is dropped, its keys left in flight forever",
        [("                    self.table.apply(group.cancelled());\n", "                    drop(group);\n")],
        TEST + ["--test", "driver", "a_lost_worker_is_reported"],
    ),
    Mutation(
        "L8-prober-shut-down-once",
        "shutdown leaves the lookup open, so its Drop shuts the prober down a second time",
        [("        self.open = false;\n", "")],
        TEST + ["--test", "prober", "a_custom_prober_can_produce_every_outcome"],
    ),
    Mutation(
        "L8-shutdown-finishes-queued-work",
        "the worker exits at shutdown without serving queued submissions",
        [("        if let Some(job) = queue.pop() {\n            return Some(job);\n        }\n        if queue.closing() {\n            return None;\n        }",
          "        if queue.closing() {\n            return None;\n        }\n        if let Some(job) = queue.pop() {\n            return Some(job);\n        }")],
        TEST + ["--release", "-p", "kvtier-models", "--test", "loom_lookup", "shutdown_with_work_queued"],
        LOOM,
    ),
    Mutation(
        "L9-cursor-checks-the-key",
        "the in-order shortcut takes any key at the cursor as already linked",
        [("if self.keys.get(self.cursor) == Some(&cell) {",
          "if self.cursor < self.keys.len() {")],
        MODELS + ["proptest_lookup"],
    ),
    Mutation(
        "L9-expected-cell-holds-the-key",
        "a lookup takes the cell its request is expected to ask next without checking that it holds the key",
        [("            && let Some(entry) = self.keys.entry_if_key(cell, key)",
          "            && let Some(entry) = Some(self.keys.entry_mut(cell))")],
        MODELS + ["proptest_lookup"],
    ),
    Mutation(
        "L9-flush-moves-the-watermark",
        "a flush leaves its keys pending instead of moving the in-flight watermark",
        [("        self.flushed_below = self.next_generation;\n", "")],
        TEST + ["--test", "table"],
    ),
    Mutation(
        "L9-batch-cache-epoch",
        "a slot's cached batch group survives the flush",
        [("        self.batch_epoch += 1;\n", "")],
        TEST + ["--test", "table"],
    ),
    Mutation(
        "L12-leading-hits-stop-at-the-first-non-hit",
        "the batched lookup counts every hit, not the leading run (a scheduler would load past a miss)",
        [(".take_while(|verdict| verdict.is_hit())", ".filter(|verdict| verdict.is_hit())")],
        TEST + ["--test", "table", "the_batched_lookup_is_the_single_lookup"],
    ),
    Mutation(
        "L12-no-keys-registers-nothing",
        "a batched lookup of no keys registers the request (a request no single lookup would know)",
        [("        if keys.is_empty() {\n            return 0;", "        if false {\n            return 0;")],
        TEST + ["--test", "table", "the_batched_lookup_is_the_single_lookup"],
    ),
    Mutation(
        "L12-batched-lookup-applies-published",
        "the batched lookup does not apply what the worker published (answers wait for the next single call)",
        [("        self.drain();\n        self.table.lookup_all(", "        self.table.lookup_all(")],
        TEST + ["--test", "driver", "the_batched_lookup_applies_published"],
    ),
    Mutation(
        "L13-overdue-below-the-watermark",
        "an unanswered key past its budget stays pending (no deadline)",
        [("Outcome::Unresolved if self.generation < overdue_below => Phase::Overdue,", "")],
        TEST + ["--test", "table", "an_overdue_key_is_a_miss"],
    ),
    Mutation(
        "L13-budget-in-steps",
        "the budget in steps is one step longer than configured",
        [(".is_some_and(|budget| self.steps - mark.step >= budget);",
          ".is_some_and(|budget| self.steps - mark.step > budget);")],
        TEST + ["--test", "table", "an_overdue_key_is_a_miss"],
    ),
    Mutation(
        "L13-budget-in-time",
        "the budget in time never runs out",
        [("now.saturating_duration_since(started) >= budget", "false")],
        TEST + ["--test", "table", "the_time_budget_counts_from_the_start"],
    ),
    Mutation(
        "L13-budget-in-time-counts-from-the-step-start",
        "the budget in time counts from the flush that hands the key over, not from its step's start",
        [("let started = self.step_started.or(now);", "let started = now;")],
        TEST + ["--test", "table", "the_time_budget_counts_from_the_start"],
    ),
    Mutation(
        "L13-overdue-orphans-are-removed",
        "cleanup keeps an overdue key without requesters (state left behind by a deadline miss)",
        [("                    self.keys.remove_cell(cell);\n                }\n                Phase::Pending",
          "                }\n                Phase::Pending")],
        TEST + ["--test", "table", "a_late_answer_of_an_older_generation_stays_stale"],
    ),
    Mutation(
        "L13-flush-reads-the-clock-for-a-time-budget",
        "the scheduler's flush never says the time, so a budget in time never runs out",
        [("if self.table.limits().pending_time.is_some() {", "if false {")],
        TEST + ["--test", "driver", "with_a_time_budget_the_flush_reads_the_clock"],
    ),
    Mutation(
        "L14-admission-bounds-the-keys",
        "new keys are admitted beyond the bound on outstanding keys",
        [("if self.batched_keys + self.outstanding_keys >= self.limits.max_outstanding_keys {",
          "if false {")],
        MODELS + ["differential", "bounded"],
    ),
    Mutation(
        "L14-admission-bounds-the-groups",
        "new groups are admitted beyond the bound on outstanding groups",
        [("if self.batch.len() + self.outstanding_groups\n                        >= self.limits.max_outstanding_groups",
          "if false")],
        TEST + ["--test", "table", "admission_bounds_the_groups"],
    ),
    Mutation(
        "L14-answers-free-their-room",
        "an applied result does not free its keys' room (admission sheds for ever)",
        [("self.outstanding_keys = self.outstanding_keys.saturating_sub(keys);", "")],
        TEST + ["--test", "table", "admission_sheds_new_keys"],
    ),
    Mutation(
        "L15-claim-gives-up-only-at-zero",
        "a prober never gives up a group, however unwanted",
        [("                wanted.keys = ABANDONED;\n                false\n", "                true\n")],
        TEST + ["--test", "table", "a_group_whose_keys_all_lost_their_requests"],
    ),
    Mutation(
        "L15-prober-claims-before-probing",
        "a group's claim ignores its interest",
        [(".is_none_or(|interest| interest.claim())", ".is_none_or(|_| true)")],
        TEST + ["--test", "table", "a_group_whose_keys_all_lost_their_requests"],
    ),
    Mutation(
        "L15-cleanup-loses-interest",
        "cleanup does not tell the group that a key lost its last requester",
        [("        interest.lose();\n", "")],
        TEST + ["--test", "table", "a_group_whose_keys_all_lost_their_requests"],
    ),
    Mutation(
        "L15-joining-an-orphan-wants-it-again",
        "a request joining an orphan does not tell its group, which is then given up under it",
        [(".is_none_or(|interest| interest.gain());", ".is_none_or(|_| true);")],
        TEST + ["--test", "table", "a_request_joining_an_orphan_before_the_claim"],
    ),
    Mutation(
        "L15-thread-prober-claims",
        "the thread prober probes every group, wanted or not",
        [("if group.claim() {", "if true {")],
        TEST + ["--test", "driver", "a_queued_group_whose_request_was_cleaned_up"],
    ),
    Mutation(
        "L15-a-running-probe-is-given-up-only-at-zero",
        "a running probe is given up while a request still wants it",
        [("            0 | ABANDONED => {\n", "            _ if true => {\n")],
        TEST + ["--features", "tokio", "--test", "tokio_driver", "a_running_probe_that_another_request_joined"],
    ),
    Mutation(
        "L15-the-last-loss-wakes-the-running-probe",
        "the cleanup that leaves a running probe unwanted does not wake it",
        [("                waker.wake();\n", "                drop(waker);\n")],
        TEST + ["--features", "tokio", "--test", "tokio_driver", "a_running_probe_whose_request_was_cleaned_up"],
    ),
    Mutation(
        "L15-tokio-prober-drops-unwanted-running-probes",
        "the tokio prober probes unwanted groups and lets unwanted probes run to their end",
        [("let ended = first_of(call, group.unwanted()).await;",
          "let ended = first_of(call, std::future::pending::<()>()).await;")],
        TEST + ["--features", "tokio", "--test", "tokio_driver", "a_running_probe_whose_request_was_cleaned_up"],
    ),
    Mutation(
        "L16-no-join-on-the-worker",
        "a thread prober dropped inside its own backend call joins its worker, that is itself",
        [("if on_worker {", "if false {")],
        TEST + ["--test", "driver", "a_lookup_dropped_inside_its_own_backend_call"],
    ),
    Mutation(
        "L16-no-wait-on-the-worker",
        "wait_idle inside a backend call waits for the call making it",
        [("if self.on_worker() {", "if false {")],
        TEST + ["--test", "driver", "waiting_for_the_worker_from_inside_a_backend_call"],
    ),
    Mutation(
        "L17-publish-inside-around-group",
        "a group's answers are published after the backend's around_group returns (a Python scheduler can see the call's effects first)",
        [("""        backend.around_group(|backend| {
            if let Some((group, publish)) = pending.take() {
                publish(probe_group(backend, group));
                published = true;
            }
        });""",
          """        let mut probed = None;
        backend.around_group(|backend| {
            if let Some((group, publish)) = pending.take() {
                probed = Some((probe_group(backend, group), publish));
                published = true;
            }
        });
        if let Some((result, publish)) = probed {
            publish(result);
        }""")],
        TEST + ["--release", "-p", "kvtier-models", "--test", "loom_lookup", "a_scheduler_that_saw_a_calls_effect"],
        LOOM,
    ),
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
        "L10-apply-checks-the-table",
        "apply takes a result of another table's group as this table's answer",
        [("        if result.table != self.id {\n            // L10", "        if false {\n            // L10")],
        TEST + ["--test", "table", "tickets_and_results_are_tied"],
    ),
    Mutation(
        "L10-mark-miss-checks-the-table",
        "mark_miss takes another table's ticket of the same generation",
        [("        if ticket.table != self.id {", "        if false {")],
        TEST + ["--test", "table", "tickets_and_results_are_tied"],
    ),
    Mutation(
        "L11-shared-keys-are-indexed",
        "a long requester list is never indexed (linking and unlinking a widely shared key scan it)",
        [("        if list.len() > INDEX_ABOVE {", "        if false {")],
        TEST + ["-p", "kvtier", "--lib", "a_key_shared_by_many_requests"],
    ),
    Mutation(
        "L11-maps-shrink-after-cleanup",
        "the table's maps keep their peak capacity after every request was cleaned up",
        [("    if map.capacity() > SPARE_SLOTS && map.len() * 8 < map.capacity() {",
          "    if false {")],
        TEST + ["-p", "kvtier", "--release", "--test", "table_memory"],
    ),
    Mutation(
        "L11-the-slab-compacts-after-cleanup",
        "the key slab keeps its peak size (and its vacant cells) after every request was cleaned up",
        [("        if self.cells.len() > SPARE_SLOTS && self.len() * 8 < self.cells.len() {",
          "        if false {")],
        TEST + ["-p", "kvtier", "--release", "--test", "table_memory"],
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
        "L7-push-retries-its-cas",
        "a push stores its node over the head instead of a compare-and-swap (a racing push is lost)",
        [("            match self\n                .head\n                .compare_exchange_weak(head, node, Ordering::Release, Ordering::Relaxed)\n            {\n                Ok(_) => return,\n                Err(current) => head = current,\n            }",
          "            self.head.store(node, Ordering::Release);\n            return;")],
        TEST + ["-p", "kvtier", "--release", "--lib", "loom_models"],
        LOOM,
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
        "T1-concurrency-bound",
        "flush starts a runner for every queued group, ignoring max_concurrent_groups",
        [("let free = self.max_concurrent_groups - pool.running;",
          "let free = usize::MAX - pool.running;")],
        TEST + ["-p", "kvtier", "--features", "tokio", "--test", "tokio_driver", "with_one_slot"],
    ),
    Mutation(
        "T2-cancelled-group-published",
        "an aborted runner drops the group it was probing instead of publishing it as cancelled",
        [("for group in self.current.take().into_iter().chain(pool.queue.drain(..)) {",
          "for group in pool.queue.drain(..) {")],
        TEST + ["-p", "kvtier", "--features", "tokio", "--test", "tokio_driver", "defect_6"],
    ),
    Mutation(
        "T2-queue-cancelled-with-runner",
        "a runner dropped by a dying runtime leaves the queued groups stranded",
        [("for group in self.current.take().into_iter().chain(pool.queue.drain(..)) {",
          "for group in self.current.take() {")],
        TEST + ["-p", "kvtier", "--features", "tokio", "--test", "tokio_driver", "cancelled_if_it_goes_away"],
    ),
    Mutation(
        "T3-abort-at-shutdown",
        "shutdown does not abort running tasks, so a hung call is never cancelled",
        [("            task.abort();\n", "            drop(task);\n")],
        TEST + ["-p", "kvtier", "--features", "tokio", "--test", "tokio_driver", "defect_6"],
    ),
    Mutation(
        "T3-grace-deadline",
        "shutdown waits for every outstanding group, however long (the reference's hang)",
        [("                    if now >= deadline {\n                        break;\n                    }\n                    shared.progress.wait_timeout(pool, deadline - now)",
          "                    shared.progress.wait_timeout(pool, deadline.saturating_duration_since(now))")],
        MODELS + ["shuttle_tasks", "shutdown_cancels"],
        dict(SHUTTLE, KVTIER_SHUTTLE_ITERATIONS="20000"),
    ),
    Mutation(
        "T3-runner-exit-notifies",
        "a runner that runs out of work exits without waking a shutdown waiting for it",
        [("                        drop(pool);\n                        // Shutdown may be waiting for the runners to exit.\n                        self.shared.progress.notify_all();\n",
          "                        drop(pool);\n")],
        MODELS + ["shuttle_tasks", "concurrent_groups"],
        dict(SHUTTLE, KVTIER_SHUTTLE_ITERATIONS="20000"),
    ),
    Mutation(
        "T4-group-timeout",
        "backend calls are not bounded by the group timeout",
        [("match task::timeout(timeout, call).await {", "match Some(call.await) {")],
        MODELS + ["shuttle_tasks", "concurrent_groups"],
        dict(SHUTTLE, KVTIER_SHUTTLE_ITERATIONS="20000"),
    ),
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
        "F13-pool-finishes-queued-jobs",
        "an I/O thread exits at shutdown without running the saves still queued",
        [("                if let Some(job) = queue.pop(lane) {\n",
          "                if queue.closing {\n                    break None;\n                }\n                if let Some(job) = queue.pop(lane) {\n")],
        TEST + ["-p", "kvtier", "--test", "fs_tier", "dropping_the_tier_finishes_every_queued_save"],
    ),
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
    Mutation(
        "P7-the-copier-lets-go-of-the-tensors",
        "BlockCopier.shutdown keeps the tensors, so vLLM's offload region cannot close its mapping",
        [("        borrow(slf, \"shutdown\")?.memory.clear();\n",
          "        let _ = borrow(slf, \"shutdown\")?;\n")],
        pytest("tests/test_copier.py::test_shutdown_lets_go_of_the_tensors"),
    ),
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
        "P2-shutdown-lets-go-of-the-gil",
        "Lookup.shutdown joins the prober holding the GIL, which a Python backend's last call needs",
        [("let stopped = py.detach(move || lookup.shutdown());",
          "let stopped = lookup.shutdown();")],
        pytest("tests/test_lookup.py::test_shutdown_never_deadlocks_with_a_python_backend_that_needs_the_gil"),
    ),
    Mutation(
        "P2-wait-idle-lets-go-of-the-gil",
        "Lookup.wait_idle waits holding the GIL, so no Python thread can finish a backend's call",
        [("|lookup| py.detach(|| lookup.wait_idle_for(SIGNAL_SLICE)),",
          "|lookup| lookup.wait_idle_for(SIGNAL_SLICE),")],
        pytest("tests/test_lookup.py::test_wait_idle_releases_the_gil_for_other_python_threads"),
    ),
    Mutation(
        "P2-transfers-wait-without-the-gil",
        "VllmTransfers.drain waits for the I/O holding the GIL, so no Python thread runs meanwhile",
        [("|inner| py.detach(|| inner.wait_idle()),", "|inner| inner.wait_idle(),")],
        pytest("tests/test_transfers.py::test_drain_lets_other_python_threads_run"),
    ),
    Mutation(
        "P3-backend-shown-to-the-gc",
        "a Python backend is hidden from the garbage collector: a cycle through it keeps the worker forever",
        [("visit.call(backend)?;", "let _ = backend;")],
        pytest("tests/test_lookup.py::test_a_lookup_caught_in_a_cycle_is_collected_and_stops_its_worker"),
    ),
    Mutation(
        "P4-panics-become-kvtier-errors",
        "a Rust panic reaches Python as PyO3's PanicException (a BaseException) instead of kvtier.InternalError",
        [("match catch_unwind(AssertUnwindSafe(body)) {",
          "match Ok::<_, Box<dyn std::any::Any + Send>>(body()) {")],
        pytest("tests/test_lookup.py::test_a_rust_panic_surfaces_as_a_kvtier_exception"),
    ),
    Mutation(
        "P4-python-answers-bounded",
        "a Python backend's answers are consumed to the end: an endless iterator hangs the worker",
        [("for answer in answers.try_iter()?.take(limit) {", "for answer in answers.try_iter()? {")],
        pytest("tests/test_lookup.py::test_an_endless_answer_iterator_is_cut_at_one_past_the_keys"),
    ),
    Mutation(
        "P6-publish-under-the-gil",
        "a Python backend's answers are published after the worker lets go of the GIL",
        [("""        let attached = Python::try_attach(|_| {
            if let Some(group) = group.take() {
                group(self);
            }
        });""", "        let attached: Option<()> = None;")],
        pytest("tests/test_races.py::test_what_a_python_backend_did_is_seen_only_with_its_answers"),
    ),
    Mutation(
        "P5-request-cache-checks-the-object",
        "the request-id cache answers for any request object, so keys land on the previous request",
        [("&& object.as_ptr() == request.as_ptr()", "&& !object.as_ptr().is_null()")],
        pytest("tests/test_vllm_manager.py"),
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
        "S9-poll-never-waits",
        "a poll waits for a task whose check panicked",
        [("                Check::Panicked(message) => {\n",
          "                Check::Panicked(message) => {\n                    done.push((id, at));\n")],
        TEST + ["-p", "kvtier", "--test", "save", "a_panicking_check_never"],
    ),
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
        [("let threads = threads.clamp(1, crate::tier::MAX_IO_THREADS);", "let threads = threads.max(1);")],
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
    Mutation(
        "P8-fork-detected",
        "an object made before os.fork() is used in the child, whose threads do not exist: waits hang, stops panic",
        [("        if self.is_forked() {\n            return Err(ForkError", "        if false {\n            return Err(ForkError")],
        pytest("tests/test_hostile_lifecycle.py::test_an_inherited_lookup_raises_fork_error_in_the_child"),
    ),
    Mutation(
        "P8-no-join-after-fork",
        "an object made before os.fork() is dropped in the child by stopping threads that are not there",
        [("        if self.is_forked() {\n            std::mem::forget(value);", "        if false {\n            std::mem::forget(value);")],
        pytest("tests/test_hostile_lifecycle.py::test_dropping_inherited_objects_in_a_child_prints_nothing"),
    ),
    Mutation(
        "P9-busy-names-the-call",
        "a call on an object lent to a waiting call is let through to a shut-down error instead of naming the call in progress",
        [("        if let State::Lent(busy) = self.state {", "        if let (State::Lent(busy), false) = (&self.state, true) {")],
        pytest("tests/test_hostile_lifecycle.py::test_a_call_during_another_threads_wait_idle_raises_busy_naming_it"),
    ),
    Mutation(
        "P10-waits-answer-signals",
        "Lookup.wait_idle never looks at pending signals: Ctrl-C during a stuck wait is never raised",
        [("                py.check_signals()?;", "                let _ = py;")],
        pytest("tests/test_hostile_lifecycle.py::test_ctrl_c_during_wait_idle_is_raised"),
    ),
    Mutation(
        "P10-shutdown-answers-signals",
        "a Ctrl-C during Lookup.shutdown is raised only when some later bytecode looks",
        [("            py.check_signals()?;", "            let _ = py;")],
        pytest("tests/test_hostile_lifecycle.py::test_ctrl_c_during_shutdown_is_raised_once_its_grace_ran_out"),
    ),
    Mutation(
        "P11-answers-are-bools",
        "a backend's answers are judged by truthiness: \"False\" and a dict's keys are hits",
        [("    if !is_bool(answer)? {", "    if false {")],
        pytest("tests/test_hostile_config.py::test_an_answer_that_is_not_a_bool_makes_the_group_miss"),
    ),
    Mutation(
        "P12-req-id-errors-propagate",
        "any error of a req_id property becomes a TypeError, a KeyboardInterrupt too",
        [("        Err(error) if error.is_instance_of::<pyo3::exceptions::PyAttributeError>(request.py()) => {",
          "        Err(_) => {")],
        pytest("tests/test_hostile_lifecycle.py::test_a_req_id_property_that_raises_an_interrupt_raises_it"),
    ),
    Mutation(
        "P12-foreign-exceptions-propagate",
        "a KeyboardInterrupt inside a store task's wait() is its failure: the fence passes while the save runs",
        [("    !error.is_instance_of::<PyException>(py)", "    let _ = (py, error);\n    false")],
        pytest("tests/test_hostile_lifecycle.py::test_an_interrupted_fence_raises_and_does_not_pass"),
    ),
    Mutation(
        "P13-durations-bounded-with-clear-errors",
        "a duration too long for a Duration reaches the converter, which panics or says it is negative",
        [("    if value > MAX_SECONDS {", "    if false {")],
        pytest("tests/test_hostile_config.py::test_a_duration_too_long_says_so"),
    ),
    Mutation(
        "N7-root-dir-checked",
        "FsTier hands root_dir to vLLM's FileMapper unchecked: None becomes ./None",
        [("    if not isinstance(root_dir, (str, os.PathLike)):", "    if False:")],
        in_vllm("own", "test_kvtier_in_vllm.py", "test_a_bad_root_dir_is_a_configuration_error"),
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
        [("    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:",
          "    if False:")],
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
    # The capacity ledger (src/capacity/): E*.
    Mutation(
        "E1-a-block-larger-than-the-capacity-is-refused",
        "a block larger than the whole capacity is not refused as such: it empties the tier of every evictable block before failing",
        [("        if bytes > self.capacity {", "        if false {")],
        MODELS + ["proptest_capacity"],
    ),
    Mutation(
        "E2-one-operation-per-block",
        "a second store of a block being written or deleted gets its own reservation over the first's",
        [("                self.stats.rejected_busy += 1;\n                return Admission::Rejected(Rejection::Busy);\n", "")],
        MODELS + ["proptest_capacity"],
    ),
    Mutation(
        "E3-lru-evicts-the-least-recently-used",
        "LRU evicts the most recently used block",
        [("self.by_tick.iter().find(", "self.by_tick.iter().rev().find(")],
        MODELS + ["proptest_capacity"],
    ),
    Mutation(
        "E4-reserve-only-what-fits",
        "a reservation is granted while there is any room at all, not room for its bytes: resident plus reserved exceed the capacity",
        [("        if used + bytes <= self.capacity {", "        if used < self.capacity {")],
        MODELS + ["proptest_capacity"],
    ),
    Mutation(
        "E5-only-unpinned-resident-blocks-are-victims",
        "a block pinned by a read is chosen as a victim and deleted under the read",
        [("state: State::Resident { pins: 0, .. },", "state: State::Resident { .. },")],
        MODELS + ["proptest_capacity"],
    ),
    Mutation(
        "E6-a-reservation-is-released-once",
        "a reservation of an earlier life of a block commits or aborts the current one",
        [("                if entry.state == State::Reserved\n                    && entry.incarnation == reservation.incarnation =>",
          "                if entry.state == State::Reserved =>")],
        TEST + ["-p", "kvtier", "--lib", "capacity::tests::tokens_are_released_once"],
    ),
    Mutation(
        "E7-a-pin-is-released-once",
        "unpinning a block with no pin left is not refused",
        [("        if *pins == 0 {\n            return Err(LedgerError::Unknown(\"pin\"));\n        }\n", "")],
        TEST + ["-p", "kvtier", "--lib", "capacity::tests::tokens_are_released_once"],
    ),
    Mutation(
        "E8-a-victim-is-released-once",
        "a victim reported twice, or of an earlier life of its block, is taken as evicted",
        [("if entry.state == State::Evicting && entry.incarnation == victim.incarnation =>", "if entry.state == State::Evicting =>")],
        TEST + ["-p", "kvtier", "--lib", "capacity::tests::a_victim_is_reported_once"],
    ),
    Mutation(
        "E9-s3fifo-gives-read-blocks-another-chance",
        "S3-FIFO evicts a block read on probation or in the main queue as if never read: a scan flushes the hot set",
        [("            if meta.freq == 0 {", "            if true {")],
        TEST + ["-p", "kvtier", "--lib", "capacity::tests::s3fifo_keeps_a_hot_set"],
    ),
    Mutation(
        "E10-victims-only-when-they-make-the-room",
        "a store that cannot get room evicts every evictable block before it is refused",
        [("        if self.evictable_bytes < needed {", "        if false {")],
        MODELS + ["proptest_capacity"],
    ),
    Mutation(
        "E11-an-uncommitted-write-gives-its-room-back",
        "a write guard dropped without a commit (a failed write, a panic) keeps its reservation for ever",
        [("            let _ = self.ledger.inner.lock().abort(reservation);", "            std::mem::forget(reservation);")],
        TEST + ["-p", "kvtier", "--lib", "capacity::tests::guards_release_their_tokens_once"],
    ),
    Mutation(
        "E12-a-dropped-pin-is-released",
        "a dropped pin guard never unpins: the block can never be evicted",
        [("            let _ = self.ledger.inner.lock().unpin(pin);", "            std::mem::forget(pin);")],
        TEST + ["-p", "kvtier", "--lib", "capacity::tests::guards_release_their_tokens_once"],
    ),
    Mutation(
        "E13-victims-left-by-a-panic-are-reported",
        "victims left when the delete closure panics stay evicting for ever (their bytes never leave)",
        [("        let mut ledger = self.ledger.inner.lock();\n        for victim in self.victims.drain(..) {", "        let mut ledger = self.ledger.inner.lock();\n        for victim in self.victims.drain(..).take(0) {")],
        TEST + ["-p", "kvtier", "--lib", "capacity::tests::guards_release_their_tokens_once"],
    ),
    # The byte budget of the directory tiers (src/tier/budget.rs, fs.rs,
    # vllm/transfers.rs) and its settings in Python: E14-E21, P17, N8, K11.
    Mutation(
        "E14-only-stale-temporaries-are-swept-at-open",
        "the startup scan deletes every temporary file, a live writer's in another process too",
        [("                    if age >= stale_temp_age && delete(&file.path, Some(report)) {",
          "                    if delete(&file.path, Some(report)) {")],
        TEST + ["-p", "kvtier", "--test", "fs_capacity", "reopening_keeps_the_newest"],
    ),
    Mutation(
        "E15-the-scan-keeps-the-newest-blocks",
        "the startup scan keeps the oldest blocks that fit and deletes the newest",
        [("        found.sort_unstable_by(|a, b| b.0.cmp(&a.0)", "        found.sort_unstable_by(|a, b| a.0.cmp(&b.0)")],
        TEST + ["-p", "kvtier", "--test", "fs_capacity", "reopening_keeps_the_newest"],
    ),
    Mutation(
        "E16-a-resident-block-whose-file-went-is-written-again",
        "a block the budget holds is taken as stored though its file was removed: it is never written again",
        [("                    if fs::symlink_metadata(path).is_ok_and(|m| m.is_file()) {", "                    if true {")],
        TEST + ["-p", "kvtier", "--test", "fs_capacity", "a_vanished_or_damaged_block"],
    ),
    Mutation(
        "E17-a-load-pins-its-block",
        "an fs tier load under a budget does not pin its block: it can be evicted under the read, and a read does not make it recent",
        [("        let pin = budget.pin(&path);", "        let pin = ();")],
        TEST + ["-p", "kvtier", "--test", "fs_capacity", "a_load_refreshes_recency_and_pins"],
    ),
    Mutation(
        "E18-a-store-gets-room-before-it-writes",
        "the fs tier writes without asking its budget: the files grow past it",
        [("    let Some(budget) = &inner.budget else {", "    let Some(budget) = None::<&DirBudget> else {")],
        TEST + ["-p", "kvtier", "--test", "fs_capacity", "the_files_stay_within_the_budget"],
    ),
    Mutation(
        "E19-enospc-evicts-then-retries-once",
        "a write that finds the device full fails without making room: every later store fails too",
        [("            if is_enospc(source) && self.make_room_after_enospc(bytes) {", "            if false {")],
        TEST + ["-p", "kvtier", "--lib", "tier::budget::tests::enospc_evicts"],
    ),
    Mutation(
        "E20-vllm-stores-get-room-before-they-write",
        "vLLM-layout stores write without asking the budget: kvtier.vllm.FsTier's files grow past capacity_bytes",
        [("            TransferKind::Store => match budget {", "            TransferKind::Store => match None::<&DirBudget> {")],
        TEST + ["-p", "kvtier", "--test", "vllm_capacity"],
    ),
    Mutation(
        "E21-vllm-loads-pin-their-blocks",
        "vLLM-layout loads do not pin: a block being loaded can be evicted under the load",
        [("                let pin = budget.and_then(|budget| budget.pin(&path));", "                let pin = ();")],
        TEST + ["-p", "kvtier", "--test", "vllm_capacity"],
    ),
    Mutation(
        "P17-capacity-bytes-checked",
        "capacity_bytes=True is taken as a 1-byte budget instead of a ConfigError",
        [("    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {", "    if false {")],
        pytest("tests/test_capacity.py::test_bad_budget_settings_are_config_errors"),
    ),
    Mutation(
        "N8-capacity-bytes-reaches-the-tier",
        "kvtier.vllm.FsTier takes \"capacity_bytes\" and ignores it: its files grow without bound",
        [("            capacity_bytes=capacity_bytes,", "            capacity_bytes=None,")],
        in_vllm("own", "test_kvtier_in_vllm.py", "test_capacity_bytes_in_the_tier_config"),
    ),
    Mutation(
        "K11-the-connectors-budget-reaches-its-transfers",
        "the connector takes capacity_bytes and ignores it: its dumps grow without bound",
        [("            capacity_bytes=self.settings.capacity_bytes,", "            capacity_bytes=None,")],
        in_vllm("connector", "test_connector_in_vllm.py", "test_a_byte_budget_bounds_the_dumped_files"),
    ),
    # Lookups settled by the tier's own news (L18): the table's settle, the
    # ledger's change log, vLLM's path-to-key parser, and the vLLM tier's
    # replay of the log.
    Mutation(
        "L18-the-same-answer-keeps-its-generation",
        "settling a key the way it is already resolved gives it a new generation: valid hit tickets go stale",
        [("            Phase::Resolved { found } if found == present => return false,",
          "            Phase::Resolved { found } if false && found == present => return false,")],
        TEST + ["-p", "kvtier", "--lib", "lookup::table::settle::tests::the_same_answer_again"],
    ),
    Mutation(
        "L18-a-settled-batched-key-leaves-the-batch",
        "a key settled before the flush is probed anyway, under a generation it no longer has",
        [("                self.dropped_pending.insert(state.generation);\n                self.batched_keys -= 1;",
          "                let _ = state;")],
        TEST + ["-p", "kvtier", "--lib", "lookup::table::settle::tests::a_batched_key_settled"],
    ),
    Mutation(
        "L18-a-settled-orphan-is-forgotten",
        "an orphaned probe settled is kept, resolved, with nobody asking for it: a state no cleanup removes",
        [("                if !state.has_requesters() {", "                if false {")],
        TEST + ["-p", "kvtier", "--lib", "lookup::table::settle::tests::a_settled_orphan"],
    ),
    Mutation(
        "L18-a-settled-state-gets-a-new-generation",
        "a settled state keeps its generation: the probe in flight answers into it after the settle",
        [("        entry.generation = generation.0;", "        let _ = generation;")],
        MODELS + ["loom_coherence"],
        LOOM,
    ),
    Mutation(
        "E22-the-change-log-stays-bounded",
        "the change log grows without bound while nobody takes it",
        [("        if self.entries.len() >= self.limit {", "        if false {")],
        TEST + ["-p", "kvtier", "--lib", "capacity::changes::tests"],
    ),
    Mutation(
        "E23-a-commit-is-logged-present",
        "a committed store is not logged: lookups never learn that the block arrived",
        [("        self.note(&reservation.key, true);", "")],
        TEST + ["-p", "kvtier", "--lib", "capacity::tests::the_change_log_says"],
    ),
    Mutation(
        "E24-a-deleted-victim-is-logged-gone",
        "an evicted block is not logged: its lookups keep answering hit",
        [("        self.note(&victim.key, false);", "")],
        TEST + ["-p", "kvtier", "--test", "vllm_coherence"],
    ),
    Mutation(
        "F14-a-key-round-trips-to-its-path",
        "a path that only resembles a block's (a padded group, another fan-out) is taken as naming a key",
        [("    path.split('/').eq([fan_out, shard, file]).then_some(key)", "    Some(key)")],
        MODELS + ["fuzz_corpus", "vllm_block_path"],
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
        "E25-the-object-scan-keeps-the-newest-blocks",
        "an object tier's startup scan keeps the oldest blocks that fit and deletes the newest",
        [("            (b.last_modified.cmp(&a.last_modified)).then_with(|| a.location.cmp(&b.location))",
          "            (a.last_modified.cmp(&b.last_modified)).then_with(|| a.location.cmp(&b.location))")],
        TEST + ["-p", "kvtier", "--test", "object_capacity", "a_restart_keeps_the_newest"],
    ),
    Mutation(
        "E26-a-resident-object-that-went-is-written-again",
        "an object the budget holds is taken as stored though it was deleted behind the tier's back",
        [("                    if super::object::head(store, location).await? {", "                    if true {")],
        TEST + ["-p", "kvtier", "--test", "object_capacity", "an_object_removed_or_damaged"],
    ),
    Mutation(
        "E27-object-loads-pin-their-blocks",
        "an object tier's loads do not pin: a block being read can be evicted under the read",
        [("            .and_then(|budget| budget.pin(&location));", "            .and_then(|_| None::<()>);")],
        TEST + ["-p", "kvtier", "--test", "object_capacity", "the_objects_stay_within_the_budget_in_memory"],
    ),
    Mutation(
        "E28-object-stores-get-room-before-they-put",
        "an object tier with a budget puts without asking it: the prefix grows past the budget",
        [("    let Some(budget) = budget else {", "    let Some(budget) = None::<&ObjectBudget> else {")],
        TEST + ["-p", "kvtier", "--test", "object_capacity", "the_objects_stay_within_the_budget_in_memory"],
    ),
    Mutation(
        "E29-a-budgeted-store-outlives-its-caller",
        "a budgeted store dropped by its caller mid-put gives back its room while the put still lands: objects the books do not count",
        [("        if let (Some(budget), Ok(runtime)) = (&self.budget, runtime) {",
          "        if let (Some(budget), Ok(runtime)) = (&self.budget, runtime.ok().filter(|_| false).ok_or(())) {")],
        TEST + ["-p", "kvtier", "--test", "object_capacity", "a_store_whose_caller_stops_waiting"],
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
        "E30-a-known-block-is-not-adopted-again",
        "a listed block the books already hold is adopted again: its bytes counted twice, the books no longer their sums",
        [("            if !known && !left {", "            if !left {")],
        MODELS + ["loom_shared_dir"],
        LOOM,
    ),
    Mutation(
        "E31-only-blocks-resident-before-the-listing-are-forgotten",
        "a block committed while the listing ran, which the listing missed, is forgotten: on disk and counted by no one",
        [("                let before = entry.since < listing.mark;", "                let before = true;")],
        MODELS + ["loom_shared_dir"],
        LOOM,
    ),
    Mutation(
        "E32-a-reconcile-evicts-what-is-over-the-capacity",
        "a reconcile counts the neighbours' blocks but evicts nothing: the shared directory stays over the budget",
        [("        let victims = if over > pending {", "        let victims = if false {")],
        MODELS + ["loom_shared_dir"],
        LOOM,
    ),
    Mutation(
        "E33-a-block-that-left-during-the-listing-is-not-adopted",
        "a block evicted after the listing read it is adopted: counted, and announced to the lookups, while its file is gone",
        [("            if !known && !left {", "            if !known {")],
        MODELS + ["loom_shared_dir"],
        LOOM,
    ),
    Mutation(
        "N13-rescan-interval-reaches-the-tier",
        "the tier takes rescan_interval and never passes it on: engines sharing a directory never learn of each other's blocks",
        [("                rescan_interval=rescan_interval,\n            )",
          "                rescan_interval=None,\n            )")],
        in_vllm("own", "test_kvtier_in_vllm.py", "test_engines_sharing_a_directory"),
    ),
    Mutation(
        "K14-rescan-interval-reaches-the-dumps",
        "the connector reads rescan_interval and never passes it on: engines sharing a root never count each other's dumps",
        [("            rescan_interval=self.settings.rescan_interval,", "            rescan_interval=None,")],
        in_vllm("connector", "test_connector_in_vllm.py", "test_engines_sharing_a_root"),
    ),
    Mutation(
        "E34-a-rescan-interval-starts-the-thread",
        "rescan_interval is accepted and ignored: tiers sharing a namespace never learn of each other's blocks",
        [("        let rescanner = match (&budget, options.rescan_interval) {",
          "        let rescanner = match (&budget, None::<Duration>) {")],
        TEST + ["-p", "kvtier", "--test", "fs_reconcile", "tiers_rescanning"],
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
        "V10-only-the-layouts-temporaries-are-swept",
        "any name with a decimal temporary suffix in vLLM's layout is swept, a foreign report.bin_2.tmp too",
        [("        Some((block, _)) if block_key(fan_out, shard, block).is_some() => Entry::Temp,",
          "        Some(_) => Entry::Temp,")],
        TEST + ["-p", "kvtier", "--test", "vllm_transfers", "a_sweep_removes_stale_temporary_files"],
    ),
    Mutation(
        "E35-the-object-scan-counts-only-the-layouts-blocks",
        "the object tier's scan counts (and trims) every object below its prefix whose name ends in .bin",
        [("    kvtier_entry(fan_out.as_ref(), shard.as_ref(), name.as_ref()) == Entry::Block",
          "    name.as_ref().ends_with(\".bin\") || fan_out.as_ref().is_empty() || shard.as_ref().is_empty()")],
        TEST + ["-p", "kvtier", "--features", "object-store", "--test", "object_capacity", "the_scan_counts_and_deletes_only"],
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
    Mutation(
        "N14-settings-are-checked-before-the-scan",
        "kvtier.vllm.FsTier builds its transfers (whose startup scan trims) before its lookup checks its settings",
        [("        lookup = Lookup.vllm_fs(\n            rank_dir, concurrency=lookup_concurrency, group_timeout=lookup_timeout\n        )\n        try:",
          "        try:"),
         ("        except BaseException:\n            lookup.shutdown()\n            raise\n",
          "        except BaseException:\n            raise\n        lookup = Lookup.vllm_fs(\n"
          "            rank_dir, concurrency=lookup_concurrency, group_timeout=lookup_timeout\n        )\n")],
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


def sync_scratch():
    """Copies the working tree (without build output) into the scratch dir."""
    src = os.path.join(SCRATCH, "tree")
    shutil.rmtree(src, ignore_errors=True)
    # shutil.copy, not copy2: fresh mtimes, so cargo never mistakes a copied
    # file for one it already built from a mutated version.
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns("target", ".git"), copy_function=shutil.copy)
    return src


GUARD_WINDOW = 12
GUARD_TAG = re.compile(r"^[ \t]*(?://|#) guard: ([A-Z][A-Za-z0-9-]*)[ \t]*$")


#: Where guard tags live: the library, the Python package's native module
#: (Rust, `// guard:`) and its Python code (`# guard:`).
GUARDED = ["src", os.path.join("cli", "src"), os.path.join("python", "src"), os.path.join("python", "kvtier")]
GUARDED_SUFFIXES = (".rs", ".py")


def guard_tags(tree):
    """{id: [(file, line)]} for every `// guard: <id>` line under GUARDED,
    lines counted in the file with every tag line removed."""
    tags = {}
    for folder, _, files in (w for top in GUARDED for w in os.walk(os.path.join(tree, top))):
        for name in sorted(files):
            if not name.endswith(GUARDED_SUFFIXES):
                continue
            path = os.path.join(folder, name)
            kept = 0
            for line in open(path).read().split("\n"):
                match = GUARD_TAG.match(line)
                if match:
                    tags.setdefault(match.group(1), []).append((os.path.relpath(path, tree), kept))
                else:
                    kept += 1
    return tags


def locate(mutation, tree):
    """(file, untagged text, [(start, end)] windows) for the mutation's
    tags, or a reason why they cannot be used."""
    places = guard_tags(tree).get(mutation.id)
    if not places:
        return f"no `// guard: {mutation.id}` tag under {' or '.join(GUARDED)}"
    files = {file for file, _ in places}
    if len(files) != 1:
        return f"the tags of {mutation.id} are in several files: {sorted(files)}"
    file = places[0][0]
    lines = [l for l in open(os.path.join(tree, file)).read().split("\n") if not GUARD_TAG.match(l)]
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    windows = [(offsets[n], offsets[min(n + GUARD_WINDOW, len(lines))]) for _, n in places]
    return file, "\n".join(lines), windows


def mutated_text(mutation, tree):
    """(file, the mutated text) for the mutation in `tree` (the text without
    its guard tags, which are comments), or a string saying why the
    mutation is stale. Reads only."""
    located = locate(mutation, tree)
    if isinstance(located, str):
        return located
    file, text, windows = located
    for old, new in mutation.edits:
        hits = [start + i for start, end in windows for i in find_all(text[start:end], old)]
        hits = sorted(set(hits))
        if len(hits) != 1:
            return f"`{old.strip()[:50]}` occurs {len(hits)} times after the {mutation.id} tags in {file}"
        at = hits[0]
        text = text[:at] + new + text[at + len(old):]
        shift = len(new) - len(old)
        windows = [(s if s <= at else s + shift, e if e <= at else e + shift) for s, e in windows]
    return file, text


def mutate(mutation, tree):
    """Writes the mutated file into the scratch tree; returns (file,
    original text), or a string saying why the mutation is stale."""
    mutated = mutated_text(mutation, tree)
    if isinstance(mutated, str):
        return mutated
    file, text = mutated
    path = os.path.join(tree, file)
    # From the scratch copy, not the working tree: the tree may be edited
    # while a long run goes on.
    original = open(path).read()
    open(path, "w").write(text)
    return file, original


def check_anchors():
    """--anchors: every mutation's tags and texts are found (exactly once)
    in the working tree, without building anything. Exits non-zero naming
    the stale ones."""
    stale = [(m.id, r) for m in MUTATIONS if isinstance(r := mutated_text(m, ROOT), str)]
    for id, reason in stale:
        print(f"STALE    {id}: {reason}")
    print(f"{len(MUTATIONS) - len(stale)} of {len(MUTATIONS)} mutations anchored")
    sys.exit(1 if stale else 0)


def find_all(text, needle):
    found, at = [], text.find(needle)
    while at != -1:
        found.append(at)
        at = text.find(needle, at + 1)
    return found


def target_dir(env):
    return os.path.join(SCRATCH, "target-" + env.get("RUSTFLAGS", "std").split()[-1])


def check(command, env_extra, tree, shown=None):
    """Runs one check in the scratch tree: (verdict, detail). With `shown`
    (a list), the check's output is appended to it."""
    env = dict(os.environ)
    env.update(env_extra or {})
    env["CARGO_TARGET_DIR"] = target_dir(env_extra or {})
    output, failed = run_bounded(command, tree, env, timeout=900)
    if shown is not None:
        shown.append(output)
    if "error[E" in output and "could not compile" in output:
        return "BROKEN", "the mutant does not compile; fix the mutation"
    if not failed:
        return "SURVIVED", "the check passed with the guard removed"
    failing = [l.split(" --- ")[0].strip() for l in output.splitlines() if l.endswith(" --- FAILED")]
    # pytest names its failures, and faulthandler a hang it ended.
    failing += [l.strip() for l in output.splitlines() if l.startswith("FAILED ")]
    failing += ["hung: " + l.strip() for l in output.splitlines() if "Timeout (" in l]
    return "CAUGHT", ("failing test: " + failing[0] if failing else "the check failed")[:160]


def run_bounded(command, tree, env, timeout):
    """Runs a check in a process group of its own: (output, failed). Its
    output goes to a file, not a pipe, so a process it left behind (a forked
    child that hangs under a mutation) cannot keep the wait going once the
    check itself has ended; whatever is left of the group is then killed."""
    with tempfile.TemporaryFile(mode="w+", errors="replace") as out:
        process = subprocess.Popen(command, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            failed = process.wait(timeout=timeout) != 0
            note = ""
        except subprocess.TimeoutExpired:
            failed, note = True, "\ntimed out (counts as caught: the check did not pass)"
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        out.seek(0)
        return out.read() + note, failed


def run(mutation, tree):
    mutated = mutate(mutation, tree)
    if isinstance(mutated, str):
        return "STALE", mutated + "; update the tag or mutants.py"
    file, original = mutated
    try:
        return check(mutation.check, mutation.env, tree)
    finally:
        open(os.path.join(tree, file), "w").write(original)


def baseline(checks, tree):
    """Every check must pass on the unmutated tree, or a "caught" mutant
    would prove nothing."""
    for command, env in checks:
        output = []
        verdict, _ = check(list(command), dict(env), tree, output)
        if verdict != "SURVIVED":
            # What failed, so that a flaky or broken check can be told apart.
            print("\n".join(output[0].splitlines()[-60:]))
            sys.exit(f"baseline check fails without any mutation: {' '.join(command)}")


def matrix(selected, tree):
    uncaught = 0
    for protocol, suites in SUITES.items():
        mutations = [m for m in selected if m.id.startswith(protocol)]
        if not mutations:
            continue
        baseline([(tuple(c), tuple(sorted(e.items()))) for c, e in suites.values()], tree)
        print("| mutation | " + " | ".join(suites) + " |")
        print("|---|" + "---|" * len(suites))
        for mutation in mutations:
            mutated = mutate(mutation, tree)
            if isinstance(mutated, str):
                print(f"| {mutation.id} | STALE: {mutated} |")
                uncaught += 1
                continue
            file, original = mutated
            cells = []
            try:
                for command, env in suites.values():
                    verdict, _ = check(command, env, tree)
                    cells.append({"CAUGHT": "caught", "SURVIVED": "-", "BROKEN": "BROKEN"}[verdict])
            finally:
                open(os.path.join(tree, file), "w").write(original)
            uncaught += "caught" not in cells
            print(f"| {mutation.id} | " + " | ".join(cells) + " |", flush=True)
        print()
    print(f"{len(selected) - uncaught} of {len(selected)} mutations caught by at least one suite")
    sys.exit(1 if uncaught else 0)


# What CI runs: the mutations whose inputs changed since a recorded run,
# and a fixed sample (docs/verification.md, "Mutations in CI").

#: Fingerprints of the mutations of the last recorded run, by id.
RECORD = os.path.join(ROOT, "models", "mutants-record.json")
#: The fixed sample: every SAMPLE_EVERY-th mutation in registry order.
SAMPLE_EVERY = 13
CHANGED = "changed since the recorded run"


_INPUTS = {}


def check_inputs(mutation, tree):
    """See _check_inputs; computed once per mutation and tree."""
    if (mutation.id, tree) not in _INPUTS:
        _INPUTS[(mutation.id, tree)] = _check_inputs(mutation, tree)
    return _INPUTS[(mutation.id, tree)]


#: Where each package's library code and integration tests live.
PACKAGES = {
    "kvtier": ("src", "tests"),
    "kvtier-models": (os.path.join("models", "src"), os.path.join("models", "tests")),
    "kvtier-cli": (os.path.join("cli", "src"), os.path.join("cli", "tests")),
}


def _check_inputs(mutation, tree):
    """The files a mutation's verdict depends on that a change can touch
    without touching the mutation itself, paths relative to the tree:

    - its guard's file (where its `guard:` tags are);
    - for a cargo check: each integration test it names (`--test X`) with
      the test helpers beside it (`common/`), and for a models test the
      models' library (the reference models); for `--lib` every file of the
      package's library (its unit tests may sit in any of them); for
      `--tests`, or no target at all, all of these;
    - for a pytest check: the Python package's code, the tests it names
      (or the whole folder it names) and the Python files beside them; for
      vLLM's own tests, the plugin and helpers they run through.
    """
    files = set()
    places = cached_guard_tags(tree).get(mutation.id) or []
    files.update(file for file, _ in places)
    command = mutation.check
    if command[:2] == ["cargo", "test"]:
        package = command[command.index("-p") + 1] if "-p" in command else "kvtier"
        lib, tests = PACKAGES[package]
        names = [command[i + 1] for i, arg in enumerate(command) if arg == "--test"]
        every_target = "--tests" in command or not (names or "--lib" in command)
        if every_target:
            names += [n[:-3] for n in os.listdir(os.path.join(tree, tests)) if n.endswith(".rs")]
        for name in names:
            files.add(os.path.join(tests, name + ".rs"))
            files.update(all_files(tree, os.path.join(tests, "common")))
            if package == "kvtier-models":
                files.update(all_files(tree, lib))
        if "--lib" in command or every_target:
            files.update(all_files(tree, lib))
    else:
        script = " ".join(command)
        files.update(all_files(tree, os.path.join("python", "kvtier"), suffix=".py"))
        named = re.findall(r"(test_\w+\.py)", script)
        for folder in (os.path.join("python", "tests"), os.path.join("python", "integration")):
            whole = re.search(r"pytest .*\btests\b(?!/)", script) and folder.endswith("tests")
            for name in (n for n in named if os.path.exists(os.path.join(tree, folder, n))):
                files.add(os.path.join(folder, name))
                files.update(all_files(tree, folder, suffix=".py", top_only=True))
            if whole:
                files.update(all_files(tree, folder, suffix=".py", top_only=True))
        if "kvtier_vllm_plugin" in script:
            # vLLM's own tests, through our plugin and its helpers.
            files.update(all_files(tree, os.path.join("python", "integration"), suffix=".py", top_only=True))
        files = {f for f in files if not os.path.basename(f).startswith("bench_")}
    missing = [f for f in files if not os.path.exists(os.path.join(tree, f))]
    assert not missing, f"{mutation.id}: its check names files that do not exist: {missing}"
    return sorted(files)


_TAGS = {}


def cached_guard_tags(tree):
    if tree not in _TAGS:
        _TAGS[tree] = guard_tags(tree)
    return _TAGS[tree]


def all_files(tree, folder, suffix=".rs", top_only=False):
    found = []
    for here, dirs, names in os.walk(os.path.join(tree, folder)):
        found += [os.path.relpath(os.path.join(here, n), tree) for n in names if n.endswith(suffix)]
        if top_only:
            break
    return found


def fingerprint(mutation, tree, read=None):
    """A hash of everything a mutation's verdict depends on (see
    check_inputs) and of the mutation itself."""
    import hashlib

    read = read or (lambda path: open(os.path.join(tree, path), "rb").read())
    digest = hashlib.sha256(repr((mutation.id, mutation.edits, portable(mutation.check), mutation.env)).encode())
    for path in check_inputs(mutation, tree):
        digest.update(path.encode() + b"\0" + read(path) + b"\0")
    return digest.hexdigest()


def portable(check):
    """A check with the machine's paths (the checkout, the venvs, vLLM's
    extracted tests) replaced by names, so a record made in one checkout
    holds in another (CI clones elsewhere)."""
    places = sorted([(VLLM_TESTS, "$VLLM_TESTS"), (VLLM_VENV, "$VLLM_VENV"), (PY_VENV, "$PY_VENV"),
                     (SCRATCH, "$SCRATCH"), (ROOT, "$ROOT")], key=lambda p: -len(p[0]))
    out = []
    for arg in check:
        for path, name in places:
            arg = arg.replace(path, name)
        out.append(arg)
    return out


def ci_selection(mutations, record, tree, read=None):
    """[(mutation, why)] CI runs: every mutation whose fingerprint is not
    the recorded one (its guard, its check or the mutation changed, or it is
    new), and every SAMPLE_EVERY-th one."""
    chosen = []
    position = {m.id: i for i, m in enumerate(MUTATIONS)}
    for mutation in mutations:
        if changed(mutation, record, tree, read):
            chosen.append((mutation, CHANGED))
        elif position.get(mutation.id, 0) % SAMPLE_EVERY == 0:
            chosen.append((mutation, "fixed sample"))
    return chosen


def changed(mutation, record, tree, read=None):
    """Whether the mutation, or a file its verdict depends on, is not as
    the record has it (a new mutation is changed)."""
    return record.get(mutation.id) != fingerprint(mutation, tree, read)


def read_record():
    if not os.path.exists(RECORD):
        return {}
    import json

    return json.load(open(RECORD))["fingerprints"]


def write_record(fingerprints):
    """Adds `fingerprints` (of mutations caught just now, taken of the tree
    they were run in before the run) to the record."""
    import json
    import subprocess as sp

    record = read_record()
    record.update(fingerprints)
    commit = sp.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    data = {"recorded_at_commit": commit, "recorded": time.strftime("%Y-%m-%d"), "fingerprints": dict(sorted(record.items()))}
    with open(RECORD, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print(f"recorded {len(fingerprints)} fingerprints in {os.path.relpath(RECORD, ROOT)}")


def check_selection():
    """--check-selection: the CI rule cannot skip a changed guard. Against
    a record of the tree as it stands, CI picks exactly the fixed sample;
    then, for every mutation, a change to its guard's file, to each file its
    check names, or to the mutation itself gets it picked."""
    # A record holds in any checkout: no machine path in what is hashed.
    spelled = [m.id for m in MUTATIONS
               if any(path in arg for arg in portable(m.check) for path in (ROOT, VLLM_VENV, VLLM_TESTS))]
    assert not spelled, f"fingerprints of {spelled} would hash this machine's paths"
    record = {m.id: fingerprint(m, ROOT) for m in MUTATIONS}
    picked = {m.id for m, _ in ci_selection(MUTATIONS, record, ROOT)}
    sample = {m.id for i, m in enumerate(MUTATIONS) if i % SAMPLE_EVERY == 0}
    assert picked == sample, f"an unchanged tree picks {sorted(picked - sample)} beyond the sample"
    missed = []
    tags = guard_tags(ROOT)
    for mutation in MUTATIONS:
        inputs = check_inputs(mutation, ROOT)
        # Found here on their own, not through check_inputs: the guard's
        # file and every test file the check names must be among the inputs.
        must = {file for file, _ in tags.get(mutation.id, [])}
        assert must, f"{mutation.id} has no guard tag"
        words = " ".join(mutation.check).split()
        for i, word in enumerate(words[:-1]):
            if word == "--test":
                must |= {os.path.join(d, words[i + 1] + ".rs") for d in ("tests", "models/tests", "cli/tests")
                         if os.path.exists(os.path.join(ROOT, d, words[i + 1] + ".rs"))}
        must |= {os.path.join(d, n) for n in re.findall(r"test_\w+\.py", " ".join(words))
                 for d in ("python/tests", "python/integration") if os.path.exists(os.path.join(ROOT, d, n))}
        missed += [(mutation.id, f"{file} is not among its inputs") for file in sorted(must - set(inputs))]
        for changed_file in inputs:
            def read(path, changed_file=changed_file):
                text = open(os.path.join(ROOT, path), "rb").read()
                return text + b"\n// changed" if path == changed_file else text

            if ci_selection([mutation], record, ROOT, read) != [(mutation, CHANGED)]:
                missed.append((mutation.id, changed_file))
        edited = Mutation(mutation.id, mutation.what, mutation.edits + [("x", "y")], mutation.check, mutation.env)
        if ci_selection([edited], record, ROOT) != [(edited, CHANGED)]:
            missed.append((mutation.id, "its own definition"))
    assert not missed, f"changes the CI rule would skip: {missed[:10]}"
    stale = sorted(set(read_record()) - {m.id for m in MUTATIONS})
    assert not stale, f"{os.path.relpath(RECORD, ROOT)} records mutations that no longer exist: {stale}"
    print(f"CI rule: an unchanged tree runs the {len(sample)}-mutation sample; "
          f"a change to any of the guard or check files of each of {len(MUTATIONS)} mutations, "
          "or to the mutation, gets it run")


def main():
    args = sys.argv[1:]
    if args == ["--anchors"]:
        check_anchors()
    if args == ["--check-selection"]:
        check_selection()
        sys.exit(0)
    record = "--record" in args
    args = [a for a in args if a != "--record"]
    if "--ci" in args:
        if not os.path.exists(RECORD):
            print(f"no {os.path.relpath(RECORD, ROOT)}: every mutation is changed")
        chosen = ci_selection(MUTATIONS, read_record(), ROOT)
        for mutation, why in chosen:
            print(f"selected {mutation.id}: {why}")
        print(f"CI runs {len(chosen)} of {len(MUTATIONS)} mutations")
        args = [m.id for m, _ in chosen]
        if not args:
            sys.exit(0)
    as_matrix = "--matrix" in args
    prefixes = [a for a in args if a != "--matrix"]
    selected = [m for m in MUTATIONS if not prefixes or any(m.id.startswith(p) for p in prefixes)]
    if "--ci" in sys.argv[1:]:
        exact = set(prefixes)
        selected = [m for m in MUTATIONS if m.id in exact]
    if not prefixes:
        # Each P mutant rebuilds the extension module, and each N mutant
        # and K mutant needs vLLM's venv (python/integration/vllm.sh): asked for by name only.
        selected = [m for m in selected if not m.id.startswith(("P", "N", "K"))]
    if not selected:
        sys.exit(f"no mutation id starts with {prefixes}")
    # The P mutations' checks, and any other whose check builds the module
    # into the scratch venv (C4's), need that venv.
    if any(m.id.startswith("P") or PY_VENV in " ".join(m.check) for m in selected):
        ensure_py_venv()
    tree = sync_scratch()
    fingerprints = {m.id: fingerprint(m, tree) for m in selected} if record else {}
    if as_matrix:
        matrix(selected, tree)
    baseline({(tuple(m.check), tuple(sorted((m.env or {}).items()))) for m in selected}, tree)
    bad = 0
    caught = set()
    for mutation in selected:
        started = time.time()
        verdict, detail = run(mutation, tree)
        bad += verdict != "CAUGHT"
        if verdict == "CAUGHT":
            caught.add(mutation.id)
        print(f"{verdict:8} {mutation.id:34} {time.time() - started:5.1f}s  {mutation.what}")
        print(f"         check: {' '.join(mutation.check)}")
        print(f"         -> {detail}")
    print(f"\n{len(selected) - bad} of {len(selected)} mutations caught")
    if record:
        # Only what was caught: a mutation that survived (or broke) is run
        # again by the next selection.
        write_record({id: print_ for id, print_ in fingerprints.items() if id in caught})
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

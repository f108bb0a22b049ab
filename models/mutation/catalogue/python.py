"""The Python package's native module (python/src): P*. Each rebuilds the
module: run by name (`mutants.py P`)."""

from ..defs import Mutation, pytest

MUTATIONS = [
    Mutation(
        "P7-the-copier-lets-go-of-the-tensors",
        "BlockCopier.shutdown keeps the tensors, so vLLM's offload region cannot close its mapping",
        [("        borrow(slf, \"shutdown\")?.memory.clear();\n",
          "        let _ = borrow(slf, \"shutdown\")?;\n")],
        pytest("tests/test_copier.py::test_shutdown_lets_go_of_the_tensors"),
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
        [("    if value > MAX_DURATION.as_secs_f64() {", "    if false {")],
        pytest("tests/test_hostile_config.py::test_a_duration_too_long_says_so"),
    ),
    Mutation(
        "P17-capacity-bytes-checked",
        "a bool is taken as a whole number: io_threads=True is one thread, capacity_bytes=True a one-byte budget",
        [("    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {", "    if false {")],
        pytest("tests/test_settings.py::test_a_bool_is_never_a_number"),
    ),
    Mutation(
        "P18-booleans-are-not-settings",
        "a bool is taken as a number of seconds: stale_temp_age=True means 1 s and sweeps a live writer's file",
        [("    if value.is_instance_of::<PyBool>()\n        || !(value.is_instance_of::<PyInt>() || value.is_instance_of::<PyFloat>())",
          "    if !(value.is_instance_of::<PyInt>() || value.is_instance_of::<PyFloat>())")],
        pytest("tests/test_settings.py::test_a_bool_is_never_a_number"),
    ),
    Mutation(
        "P19-budget-settings-need-a-capacity",
        "eviction_policy or rescan_interval without capacity_bytes is silently ignored",
        [("            if set {", "            if false && set {")],
        pytest("tests/test_settings.py::test_a_budget_setting_without_a_capacity_is_refused"),
    ),
]

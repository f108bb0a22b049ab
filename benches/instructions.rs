//! Instruction counts of the scheduler's and the save tracker's calls: a
//! figure the machine's load cannot move.
//!
//! Each measured call runs inside a function named `measured_<op>`, kept
//! out of line, after its setup; `benches/instructions.py` runs this binary
//! once under callgrind with `--toggle-collect='*measured_*'`, so only those
//! functions (and what they call) are counted, reads each one's inclusive
//! count and divides it by the operations it performed, which this binary
//! prints as `ops <name> <count>` lines. Run without valgrind it only
//! checks that every bench runs.
//!
//! ```sh
//! python3 benches/instructions.py        # builds, runs under callgrind, prints the table
//! ```

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
mod workload;

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
mod bench {
    use std::collections::HashMap as StdMap;
    use std::hint::black_box;

    use hashbrown::HashMap as FoldMap;
    use kvtier::lookup::{GroupResult, LookupTable, Submission};
    use kvtier::save::{Completer, CompletionTask};
    use kvtier::{SaveTracker, Verdict};

    use super::workload::floor::Floor;
    use super::workload::reference_port::ReferencePort;
    use super::workload::{self, Trace, answers, mix, present};

    /// Keys per measured batch (as in the `op` group of `hot_path`).
    const BATCH: u64 = 1024;
    /// Requests the batch is spread over, 128 keys each.
    const REQUESTS: u64 = BATCH / 128;

    /// Makes a measured function's body unlike any other's, so the
    /// compiler does not merge two of them into one symbol (a few
    /// instructions, once per call).
    #[inline(always)]
    fn distinct(n: u32) {
        black_box(n);
    }

    fn ops(name: &str, count: u64) {
        println!("ops {name} {count}");
    }

    fn keys(from: u64) -> Vec<u64> {
        (from..from + BATCH).map(mix).collect()
    }

    fn request_of(index: usize) -> u64 {
        index as u64 / 128 % REQUESTS
    }

    type Table = LookupTable<u64, u64>;

    fn looked_up(keys: &[u64]) -> Table {
        let mut table = LookupTable::new();
        for (index, key) in keys.iter().enumerate() {
            table.lookup(key, &request_of(index));
        }
        table
    }

    /// A table where requests `0..requests` each asked for every key, all
    /// answered.
    fn shared_by(requests: u64, keys: &[u64]) -> Table {
        let mut table = Table::new();
        for request in 0..requests {
            for key in keys {
                table.lookup(key, &request);
            }
        }
        let submission = table.take_submission().expect("new keys");
        for result in answers(submission) {
            table.apply(result);
        }
        table
    }

    fn resolved(keys: &[u64]) -> Table {
        let mut table = looked_up(keys);
        let submission = table.take_submission().expect("new keys");
        for result in answers(submission) {
            table.apply(result);
        }
        table
    }

    #[inline(never)]
    fn measured_lookup_known(table: &mut Table, keys: &[u64]) {
        for (index, key) in keys.iter().enumerate() {
            black_box(table.lookup(key, &request_of(index)));
        }
    }

    #[inline(never)]
    fn measured_lookup_known_32_requesters(table: &mut Table, keys: &[u64]) {
        for key in keys {
            black_box(table.lookup(key, &31));
        }
    }

    #[inline(never)]
    fn measured_lookup_join_31_requesters(table: &mut Table, keys: &[u64]) {
        distinct(2);
        for key in keys {
            black_box(table.lookup(key, &31));
        }
    }

    #[inline(never)]
    fn measured_lookup_new(table: &mut Table, keys: &[u64]) {
        distinct(1);
        for (index, key) in keys.iter().enumerate() {
            black_box(table.lookup(key, &request_of(index)));
        }
    }

    #[inline(never)]
    fn measured_lookup_all(table: &mut Table, keys: &[u64], verdicts: &mut Vec<Verdict<u64>>) {
        for (request, keys) in keys.chunks(128).enumerate() {
            black_box(table.lookup_all(keys, &(request as u64), verdicts));
        }
    }

    #[inline(never)]
    fn measured_flush(table: &mut Table) -> Option<Submission<u64, u64>> {
        table.take_submission()
    }

    #[inline(never)]
    fn measured_apply(table: &mut Table, results: Vec<GroupResult<u64>>) {
        for result in results {
            table.apply(result);
        }
    }

    #[inline(never)]
    fn measured_cleanup(table: &mut Table) {
        for request in 0..REQUESTS {
            table.cleanup(&request);
        }
    }

    #[inline(never)]
    fn measured_baseline_foldhash_probe(map: &FoldMap<u64, bool>, keys: &[u64]) {
        for key in keys {
            black_box(map.get(key));
        }
    }

    #[inline(never)]
    fn measured_baseline_std_probe(map: &StdMap<u64, bool>, keys: &[u64]) {
        for key in keys {
            black_box(map.get(key));
        }
    }

    fn table_ops() {
        let keys = keys(0);

        let mut table = resolved(&keys);
        measured_lookup_known(&mut table, &keys);
        ops("lookup_known", BATCH);

        let mut shared = shared_by(32, &keys);
        measured_lookup_known_32_requesters(&mut shared, &keys);
        ops("lookup_known_32_requesters", BATCH);

        // A new request asking for keys 31 others asked for (a shared
        // prefix): it joins each key's requester list.
        let mut joined = shared_by(31, &keys);
        measured_lookup_join_31_requesters(&mut joined, &keys);
        ops("lookup_join_31_requesters", BATCH);

        // A table that held as many keys before, so it does not grow.
        let mut table = resolved(&self::keys(BATCH));
        for request in 0..REQUESTS {
            table.cleanup(&request);
        }
        measured_lookup_new(&mut table, &keys);
        ops("lookup_new", BATCH);

        let mut table = resolved(&keys);
        let mut verdicts = Vec::with_capacity(128);
        measured_lookup_all(&mut table, &keys, &mut verdicts);
        ops("lookup_all", BATCH);

        let mut table = looked_up(&keys);
        let submission = measured_flush(&mut table).expect("new keys");
        ops("flush", BATCH);

        measured_apply(&mut table, answers(submission));
        ops("apply", BATCH);

        measured_cleanup(&mut table);
        ops("cleanup", BATCH);

        let fold: FoldMap<u64, bool> = keys.iter().map(|&k| (k, present(k))).collect();
        measured_baseline_foldhash_probe(&fold, &keys);
        ops("baseline_foldhash_probe", BATCH);
        let std: StdMap<u64, bool> = keys.iter().map(|&k| (k, present(k))).collect();
        measured_baseline_std_probe(&std, &keys);
        ops("baseline_std_probe", BATCH);
    }

    /// Steps of the trace measured, after as many unmeasured ones.
    const STEPS: usize = 24;

    #[inline(never)]
    fn measured_step_lookup(table: &mut Table, lookups: &[(u64, u64)]) {
        for (key, request) in lookups {
            black_box(table.lookup(key, request));
        }
    }

    #[inline(never)]
    fn measured_step_flush(table: &mut Table) -> Option<Submission<u64, u64>> {
        distinct(2);
        table.take_submission()
    }

    #[inline(never)]
    fn measured_step_apply(table: &mut Table, results: Vec<GroupResult<u64>>) {
        distinct(3);
        for result in results {
            table.apply(result);
        }
    }

    #[inline(never)]
    fn measured_step_cleanup(table: &mut Table, finished: &[u64]) {
        for request in finished {
            table.cleanup(request);
        }
    }

    type Reference = ReferencePort<u64, u64, hashbrown::DefaultHashBuilder>;

    #[inline(never)]
    fn measured_step_reference_foldhash_lookup(port: &mut Reference, lookups: &[(u64, u64)]) {
        for (key, request) in lookups {
            black_box(port.lookup(key, request));
        }
    }

    #[inline(never)]
    fn measured_step_reference_foldhash_rest(port: &mut Reference, finished: &[u64]) {
        port.drain();
        for request in finished {
            port.cleanup(request);
        }
    }

    #[inline(never)]
    fn measured_step_reference_foldhash_flush(port: &mut Reference) {
        port.flush();
    }

    /// The reference design ported directly, on the same trace.
    fn reference_step_workload() {
        fn answer(keys: &[u64], _: &u64) -> Vec<bool> {
            keys.iter().map(|&k| present(k)).collect()
        }
        let mut port = Reference::new(answer);
        let mut trace = Trace::new();
        let mut lookups = 0;
        for step in 0..2 * STEPS {
            let step_trace = trace.next_step();
            if step >= STEPS {
                measured_step_reference_foldhash_lookup(&mut port, &step_trace.lookups);
                lookups += step_trace.lookups.len() as u64;
                measured_step_reference_foldhash_flush(&mut port);
                port.wait_published();
                measured_step_reference_foldhash_rest(&mut port, &step_trace.finished);
            } else {
                for (key, request) in &step_trace.lookups {
                    black_box(port.lookup(key, request));
                }
                port.flush();
                port.wait_published();
                port.drain();
                for request in &step_trace.finished {
                    port.cleanup(request);
                }
            }
        }
        for name in [
            "step_reference_foldhash_lookup",
            "step_reference_foldhash_flush",
            "step_reference_foldhash_rest",
        ] {
            ops(name, lookups);
        }
    }

    #[inline(never)]
    fn measured_step_floor_lookup(floor: &mut Floor, lookups: &[(u64, u64)]) {
        for (key, _) in lookups {
            black_box(floor.lookup(*key));
        }
    }

    #[inline(never)]
    fn measured_step_floor_flush(floor: &mut Floor, queued: &mut Vec<u64>) {
        floor.flush(queued);
    }

    #[inline(never)]
    fn measured_step_floor_rest(floor: &mut Floor, answers: &[(u64, bool)], finished: &[u64]) {
        floor.apply(answers);
        for &request in finished {
            floor.cleanup(request);
        }
    }

    #[inline(never)]
    fn measured_step_lookup_all(
        table: &mut Table,
        requests: &[(Vec<u64>, u64)],
        verdicts: &mut Vec<Verdict<u64>>,
    ) {
        for (keys, request) in requests {
            black_box(table.lookup_all(keys, request, verdicts));
        }
    }

    /// The step workload with each request's keys asked in one
    /// `lookup_all` call (gathered before the measured call).
    fn step_lookup_all_workload() {
        let mut table = Table::new();
        let mut trace = Trace::new();
        let mut verdicts = Vec::new();
        let mut lookups = 0;
        for step in 0..2 * STEPS {
            let step_trace = trace.next_step();
            let requests: Vec<(Vec<u64>, u64)> = step_trace
                .lookups
                .chunks(workload::KEYS_PER_REQUEST)
                .map(|chunk| (chunk.iter().map(|&(key, _)| key).collect(), chunk[0].1))
                .collect();
            if step >= STEPS {
                measured_step_lookup_all(&mut table, &requests, &mut verdicts);
                lookups += step_trace.lookups.len() as u64;
            } else {
                for (keys, request) in &requests {
                    table.lookup_all(keys, request, &mut verdicts);
                }
            }
            for result in table.take_submission().map(answers).unwrap_or_default() {
                table.apply(result);
            }
            for request in &step_trace.finished {
                table.cleanup(request);
            }
        }
        ops("step_lookup_all", lookups);
    }

    /// The floor (benches/workload/floor.rs) on the same trace.
    fn floor_step_workload() {
        let mut floor = Floor::new();
        let mut trace = Trace::new();
        let mut queued = Vec::new();
        let mut lookups = 0;
        for step in 0..2 * STEPS {
            let step_trace = trace.next_step();
            let measure = step >= STEPS;
            if measure {
                measured_step_floor_lookup(&mut floor, &step_trace.lookups);
                lookups += step_trace.lookups.len() as u64;
                measured_step_floor_flush(&mut floor, &mut queued);
            } else {
                for (key, _) in &step_trace.lookups {
                    black_box(floor.lookup(*key));
                }
                floor.flush(&mut queued);
            }
            // The backend's answers: not the floor's work, so not counted.
            let answers: Vec<(u64, bool)> = queued.iter().map(|&k| (k, present(k))).collect();
            if measure {
                measured_step_floor_rest(&mut floor, &answers, &step_trace.finished);
            } else {
                floor.apply(&answers);
                for &request in &step_trace.finished {
                    floor.cleanup(request);
                }
            }
            // It tracks what the table tracks: the shared prefix and the
            // own keys of every request still live.
            let own = workload::KEYS_PER_REQUEST - workload::SHARED_PREFIX;
            let live = workload::LIVE - step_trace.finished.len();
            assert_eq!(floor.len(), workload::SHARED_PREFIX + live * own);
        }
        for name in ["step_floor_lookup", "step_floor_flush", "step_floor_rest"] {
            ops(name, lookups);
        }
    }

    #[inline(never)]
    fn measured_step_baseline_foldhash_probe(map: &FoldMap<u64, bool>, lookups: &[(u64, u64)]) {
        for (key, _) in lookups {
            black_box(map.get(key));
        }
    }

    /// The step workload of `hot_path` on the table itself (no worker
    /// thread: the answers are computed between the measured calls, and
    /// applied before the next step's lookups, as the driver does).
    fn step_workload() {
        let mut table = Table::new();
        let mut trace = Trace::new();
        let mut lookups = 0;
        for step in 0..2 * STEPS {
            let measure = step >= STEPS;
            let step = trace.next_step();
            if measure {
                measured_step_lookup(&mut table, &step.lookups);
                lookups += step.lookups.len() as u64;
                let map: FoldMap<u64, bool> =
                    step.lookups.iter().map(|&(k, _)| (k, present(k))).collect();
                measured_step_baseline_foldhash_probe(&map, &step.lookups);
            } else {
                for (key, request) in &step.lookups {
                    black_box(table.lookup(key, request));
                }
            }
            let submission = if measure {
                measured_step_flush(&mut table)
            } else {
                table.take_submission()
            };
            let results = submission.map(answers).unwrap_or_default();
            if measure {
                measured_step_apply(&mut table, results);
                measured_step_cleanup(&mut table, &step.finished);
            } else {
                for result in results {
                    table.apply(result);
                }
                for request in &step.finished {
                    table.cleanup(request);
                }
            }
        }
        for name in [
            "step_lookup",
            "step_flush",
            "step_apply",
            "step_cleanup",
            "step_baseline_foldhash_probe",
        ] {
            ops(name, lookups);
        }
        assert_eq!(
            lookups,
            (STEPS * workload::LIVE * workload::KEYS_PER_REQUEST) as u64
        );
    }

    /// Outstanding tasks in the tracker the save calls are measured on.
    const OUTSTANDING: u64 = 10_000;

    type Tracker = SaveTracker<u64, CompletionTask>;

    fn tracker() -> (Tracker, Vec<Completer>) {
        workload::saving_tracker(OUTSTANDING, OUTSTANDING + BATCH)
    }

    #[inline(never)]
    fn measured_save_submit(tracker: &mut Tracker, tasks: Vec<CompletionTask>) {
        for (i, task) in tasks.into_iter().enumerate() {
            black_box(tracker.submit(task, &[OUTSTANDING + i as u64]));
        }
    }

    #[inline(never)]
    fn measured_save_poll_none_done(tracker: &mut Tracker) -> usize {
        tracker.poll()
    }

    #[inline(never)]
    fn measured_save_poll_reaping(tracker: &mut Tracker) -> usize {
        distinct(4);
        tracker.poll()
    }

    #[inline(never)]
    fn measured_save_baseline_check_loop(tasks: &[CompletionTask]) -> usize {
        use kvtier::StoreTask;
        tasks.iter().filter(|task| task.check()).count()
    }

    fn save_ops() {
        let (mut tracker, mut completers) = tracker();
        let (tasks, mut new_completers): (Vec<_>, Vec<_>) =
            (0..BATCH).map(|_| CompletionTask::new(())).unzip();
        measured_save_submit(&mut tracker, tasks);
        ops("save_submit", BATCH);

        assert_eq!(measured_save_poll_none_done(&mut tracker), 0);
        ops("save_poll_none_done", OUTSTANDING + BATCH);

        for completer in completers.drain(..BATCH as usize) {
            completer.succeed();
        }
        assert_eq!(measured_save_poll_reaping(&mut tracker), BATCH as usize);
        ops("save_poll_reaping", BATCH);

        let (tasks, _completers): (Vec<_>, Vec<_>) =
            (0..OUTSTANDING).map(|_| CompletionTask::new(())).unzip();
        assert_eq!(measured_save_baseline_check_loop(&tasks), 0);
        ops("save_baseline_check_loop", OUTSTANDING);
        new_completers.clear();
    }

    pub fn main() {
        table_ops();
        step_workload();
        reference_step_workload();
        floor_step_workload();
        step_lookup_all_workload();
        save_ops();
    }
}

fn main() {
    #[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
    bench::main();
}

//! Replays a trace of the save-core calls kvtier's vLLM connector made
//! (`python/integration/test_connector_lockstep.py` records them, with
//! their results) against the save reference model
//! (`kvtier_models::save_reference`), call by call: every result the real
//! `SaveScheduler`, `SaveTracker`s and `ReportAggregator` gave the
//! connector must be the one the reference gives for the same call.
//!
//! ```text
//! cargo run -p kvtier-models --example connector_replay -- TRACE
//! ```
//!
//! A trace is one call a line: `<call> <args…> => <results…>`, fields
//! separated by spaces, lists by commas, `-` for an empty list:
//!
//! - `sched_record <rid:blocks,…> => <step> <requests> <preempted> <finished>`
//! - `sched_preempt <rids>`; `sched_finished <rid> => <0|1>`;
//!   `sched_delayed <rid> => <0|1>`
//! - `agg_expect <rid> => <0|1>`;
//!   `agg_accept <worker> <step> <finished> => <freed> <refused count>`
//! - `w_begin <worker> <step> => <tasks waited>`;
//!   `w_submit <worker> <rids> => <task>`; `w_submit_failed <worker> <rids>`;
//!   `w_io_end <worker> <task>`; `w_poll <worker> => <reaped>`;
//!   `w_finish <worker> <step> => <reported>`;
//!   `w_stats <worker> <name=value,…>`
//!
//! Exits 0 when every call agrees, 1 naming the first that does not.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::ExitCode;

use kvtier::save::CompletionMode;
use kvtier_models::save_reference::{Rid, SchedulerSpec, SpecStep, WorkerSpec};
use kvtier_models::save_scripted::Ending;

/// The reference's count of worker reports: a delayed request is freed
/// once every worker reported it, each once; reports come one per worker
/// per step, in order.
#[derive(Default)]
struct AggregatorSpec {
    workers: usize,
    waiting: BTreeMap<Rid, BTreeSet<usize>>,
    next_step: Vec<u64>,
}

impl AggregatorSpec {
    fn expect(&mut self, request: Rid) -> bool {
        if self.waiting.contains_key(&request) {
            return false;
        }
        self.waiting.insert(request, BTreeSet::new());
        true
    }

    fn accept(
        &mut self,
        worker: usize,
        step: u64,
        finished: &[Rid],
    ) -> Result<(Vec<Rid>, usize), String> {
        if worker >= self.workers || self.next_step[worker] != step {
            return Err(format!(
                "a report of worker {worker} for step {step} out of sequence"
            ));
        }
        self.next_step[worker] += 1;
        let (mut freed, mut refused) = (Vec::new(), 0);
        for request in finished {
            let Some(reported) = self.waiting.get_mut(request) else {
                refused += 1;
                continue;
            };
            if !reported.insert(worker) {
                refused += 1;
            } else if reported.len() == self.workers {
                self.waiting.remove(request);
                freed.push(*request);
            }
        }
        Ok((freed, refused))
    }
}

struct Replay {
    scheduler: SchedulerSpec,
    steps: HashMap<u64, SpecStep>,
    workers: Vec<WorkerSpec>,
    aggregator: AggregatorSpec,
    ids: HashMap<String, Rid>,
    names: Vec<String>,
}

fn split(field: &str) -> Vec<&str> {
    if field == "-" {
        Vec::new()
    } else {
        field.split(',').collect()
    }
}

fn number(field: &str) -> Result<u64, String> {
    field
        .parse()
        .map_err(|_| format!("{field:?} is not a number"))
}

impl Replay {
    fn new(workers: usize) -> Self {
        Self {
            scheduler: SchedulerSpec::default(),
            steps: HashMap::new(),
            workers: (0..workers)
                .map(|_| WorkerSpec::new(CompletionMode::NonBlocking))
                .collect(),
            aggregator: AggregatorSpec {
                workers,
                waiting: BTreeMap::new(),
                next_step: vec![0; workers],
            },
            ids: HashMap::new(),
            names: Vec::new(),
        }
    }

    fn rid(&mut self, name: &str) -> Rid {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let id = self.names.len() as Rid;
        self.names.push(name.to_owned());
        self.ids.insert(name.to_owned(), id);
        id
    }

    fn rids(&mut self, field: &str) -> Vec<Rid> {
        split(field)
            .into_iter()
            .map(|name| self.rid(name))
            .collect()
    }

    fn show(&self, rids: &[Rid]) -> String {
        let names: Vec<&str> = rids
            .iter()
            .map(|r| self.names[*r as usize].as_str())
            .collect();
        if names.is_empty() {
            "-".to_owned()
        } else {
            names.join(",")
        }
    }

    fn worker(&mut self, field: &str) -> Result<&mut WorkerSpec, String> {
        let index = number(field)? as usize;
        self.workers
            .get_mut(index)
            .ok_or_else(|| format!("no worker {index}"))
    }

    fn agree(&self, what: &str, expected: String, got: &str) -> Result<(), String> {
        if expected == got {
            Ok(())
        } else {
            Err(format!(
                "{what}: the reference answers {expected}, the connector got {got}"
            ))
        }
    }

    fn apply(&mut self, line: &str) -> Result<(), String> {
        let (call, result) = match line.split_once(" => ") {
            Some((call, result)) => (call, result),
            None => (line, ""),
        };
        let args: Vec<&str> = call.split(' ').collect();
        match args.as_slice() {
            ["sched_record", saves] => {
                let mut list = Vec::new();
                for save in split(saves) {
                    let (name, blocks) = save.split_once(':').ok_or("a save is rid:blocks")?;
                    list.push((self.rid(name), number(blocks)? as usize));
                }
                let step = self.scheduler.record_step(&list);
                let expected = format!(
                    "{} {} {} {}",
                    step.step,
                    self.show(&step.requests),
                    self.show(&step.preempted),
                    self.show(&step.finished)
                );
                self.steps.insert(step.step, step);
                self.agree("record_step", expected, result)
            }
            ["sched_preempt", rids] => {
                let rids = self.rids(rids);
                self.scheduler.preempt(&rids);
                Ok(())
            }
            ["sched_finished", rid] => {
                let rid = self.rid(rid);
                let delay = self.scheduler.request_finished(rid);
                self.agree("request_finished", u8::from(delay).to_string(), result)
            }
            ["sched_delayed", rid] => {
                let rid = self.rid(rid);
                let delayed = self.scheduler.delayed.contains(&rid);
                self.agree("is_delayed", u8::from(delayed).to_string(), result)
            }
            ["agg_expect", rid] => {
                let rid = self.rid(rid);
                let fresh = self.aggregator.expect(rid);
                self.agree("expect", u8::from(fresh).to_string(), result)
            }
            ["agg_accept", worker, step, finished] => {
                let finished = self.rids(finished);
                let (freed, refused) =
                    self.aggregator
                        .accept(number(worker)? as usize, number(step)?, &finished)?;
                self.agree("accept", format!("{} {refused}", self.show(&freed)), result)
            }
            ["w_begin", worker, step] => {
                let step = self
                    .steps
                    .get(&number(step)?)
                    .cloned()
                    .ok_or("a worker began a step the scheduler never recorded")?;
                let fenced = self
                    .worker(worker)?
                    .begin_step(&step)
                    .map_err(|(due, got)| format!("step {got} began where {due} was due"))?;
                let expected = if fenced.is_empty() {
                    "-".to_owned()
                } else {
                    fenced
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                };
                self.agree("begin_step's fence", expected, result)
            }
            ["w_submit", worker, rids] => {
                let rids = self.rids(rids);
                let task = self.worker(worker)?.submit(&rids, Ending::Ok);
                self.agree("submit", task.to_string(), result)
            }
            ["w_submit_failed", worker, _rids] => {
                self.worker(worker)?.submit_failed();
                Ok(())
            }
            ["w_io_end", worker, task] => {
                let task = number(task)?;
                self.worker(worker)?.io_ends(task);
                Ok(())
            }
            ["w_poll", worker] => {
                let reaped = self.worker(worker)?.poll();
                self.agree("poll", reaped.to_string(), result)
            }
            ["w_finish", worker, step] => {
                let step = self
                    .steps
                    .get(&number(step)?)
                    .cloned()
                    .ok_or("a worker closed a step the scheduler never recorded")?;
                let reported = self.worker(worker)?.get_finished(&step.finished);
                let expected = self.show(&reported);
                self.agree("finish_step", expected, result)
            }
            ["w_stats", worker, counters] => {
                let spec = self.worker(worker)?.stats;
                for counter in split(counters) {
                    let (name, value) = counter.split_once('=').ok_or("a counter is name=value")?;
                    let expected = spec
                        .counters()
                        .iter()
                        .find(|(n, _)| *n == name)
                        .map(|(_, v)| *v)
                        .ok_or_else(|| format!("the reference has no counter {name}"))?;
                    if expected != number(value)? {
                        return Err(format!(
                            "counter {name}: the reference has {expected}, the tracker {value}"
                        ));
                    }
                }
                Ok(())
            }
            _ => Err("not a call this replay knows".to_owned()),
        }
    }
}

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: connector_replay TRACE");
        return ExitCode::from(2);
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) => {
            eprintln!("{path}: {error}");
            return ExitCode::from(2);
        }
    };
    let mut lines = text.lines().enumerate();
    let workers = match lines
        .next()
        .and_then(|(_, l)| l.strip_prefix("workers "))
        .map(str::parse)
    {
        Some(Ok(workers)) if workers > 0 => workers,
        _ => {
            eprintln!("{path}: the first line must be `workers N`");
            return ExitCode::from(2);
        }
    };
    let mut replay = Replay::new(workers);
    let mut calls = 0;
    for (number, line) in lines {
        if line.is_empty() {
            continue;
        }
        if let Err(error) = replay.apply(line) {
            eprintln!("{path}:{}: {line}\n  {error}", number + 1);
            return ExitCode::from(1);
        }
        calls += 1;
    }
    println!("{path}: {calls} calls agree with the reference model");
    ExitCode::SUCCESS
}

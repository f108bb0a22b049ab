//! `kvtier saves`: a scheduler process and worker processes (this crate's
//! own binary) exchanging encoded steps and reports over pipes, saving on a
//! real fs tier in a temporary directory. The scheduler checks every free
//! against the files on disk (S1), that each delayed request is freed once
//! or held (S2), and the preemption fence (S5); these tests read its JSON
//! summary, then kill a worker with SIGKILL and lose or repeat a step.
#![cfg(all(unix, not(any(kvtier_loom, kvtier_shuttle))))]

use std::process::{Command, Output};

use serde_json::Value;

fn saves(args: &[&str]) -> (Output, Value) {
    let output = Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .arg("saves")
        .arg("--json")
        .args(["--block-kib", "16"])
        .args(args)
        .output()
        .expect("run kvtier saves");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary = serde_json::from_str(stdout.trim()).unwrap_or_else(|error| {
        panic!(
            "{error}: stdout {stdout}\nstderr {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output, summary)
}

fn count(summary: &Value, field: &str) -> u64 {
    summary[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {summary}"))
}

#[test]
fn every_request_is_freed_once_and_only_after_every_workers_saves_are_on_disk() {
    for (workers, steps, seed) in [("2", "300", "7"), ("3", "200", "11")] {
        let dir = tempfile::tempdir().unwrap();
        let (output, summary) = saves(&[
            "--workers",
            workers,
            "--steps",
            steps,
            "--seed",
            seed,
            "--dir",
            dir.path().to_str().unwrap(),
        ]);
        assert!(output.status.success(), "{summary}");
        assert_eq!(summary["violations"], Value::Array(vec![]), "{summary}");
        assert_eq!(summary["lost_workers"], Value::Array(vec![]));
        let delayed = count(&summary, "delayed");
        assert!(delayed > 50, "{summary}");
        assert_eq!(count(&summary, "freed"), delayed, "S2: all freed, once");
        assert_eq!(count(&summary, "held"), 0);
        // The run exercised what the rules are about: preemptions fenced,
        // and requests finished while their saves still ran.
        assert!(count(&summary, "preemptions") > 0, "{summary}");
        assert!(count(&summary, "deferred") > 0, "{summary}");
        // The saves are real files, one namespace per rank.
        for rank in 0..workers.parse::<u32>().unwrap() {
            assert!(dir.path().join(format!("rank{rank}")).is_dir());
        }
    }
}

#[test]
fn a_worker_killed_mid_step_holds_its_requests_and_the_scheduler_says_so() {
    let (output, summary) = saves(&["--steps", "300", "--kill", "1@60"]);
    assert_eq!(output.status.code(), Some(1), "{summary}");
    assert_eq!(summary["violations"], Value::Array(vec![]), "{summary}");
    let lost = &summary["lost_workers"][0];
    assert_eq!(lost["rank"], 1, "{summary}");
    assert!(
        lost["status"].as_str().unwrap().contains("signal: 9"),
        "{summary}"
    );
    // Nothing that worker 1 had not reported was freed: every request that
    // finished after the kill is held.
    let (delayed, freed, held) = (
        count(&summary, "delayed"),
        count(&summary, "freed"),
        count(&summary, "held"),
    );
    assert!(held > 0 && freed + held == delayed, "{summary}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("worker 1 lost") && stderr.contains("never freed"),
        "{stderr}"
    );
}

#[test]
fn a_step_lost_or_repeated_on_the_wire_is_refused_by_the_worker() {
    for (fault, target, refusal) in [
        (
            "--drop-step",
            "1@30",
            "rank 1 refused step 31: step 31 arrived while step 30 was due: 1 step(s) missing",
        ),
        (
            "--repeat-step",
            "0@30",
            "rank 0 refused step 30: step 30 arrived again (step 31 was due)",
        ),
    ] {
        let (output, summary) = saves(&["--steps", "200", fault, target]);
        assert_eq!(output.status.code(), Some(1), "{summary}");
        assert_eq!(summary["violations"], Value::Array(vec![]), "{summary}");
        let lost = &summary["lost_workers"][0];
        assert!(
            lost["stderr"].as_str().unwrap().contains(refusal),
            "{fault}: {summary}"
        );
        assert!(lost["status"].as_str().unwrap().contains("exit status: 4"));
        assert_eq!(
            count(&summary, "freed") + count(&summary, "held"),
            count(&summary, "delayed")
        );
    }
}

#[test]
fn a_fault_aimed_at_a_worker_that_does_not_exist_is_bad_input() {
    let output = Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args(["saves", "--workers", "2", "--kill", "5@1"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("fault at rank 5 but there are 2 workers")
    );
    let output = Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args(["saves", "--kill", "one@1"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}

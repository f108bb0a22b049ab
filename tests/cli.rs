//! The `kvtier` binary: the demo, `probe` on a directory and on a loopback
//! S3 server, and clear errors with distinct exit codes for bad input.
#![cfg(all(feature = "cli", not(any(kvtier_loom, kvtier_shuttle))))]

mod common;

use std::process::{Command, Output};

use common::moto::{Moto, unique_bucket};

fn kvtier(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args(args)
        .env_remove("AWS_ENDPOINT")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .output()
        .expect("run kvtier")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The summary value of a demo row, e.g. `row(out, "orphaned answers dropped")`.
fn row(stdout: &str, name: &str) -> String {
    stdout
        .lines()
        .find_map(|line| line.trim_start().strip_prefix(name))
        .unwrap_or_else(|| panic!("no {name:?} row in:\n{stdout}"))
        .trim()
        .to_owned()
}

#[test]
fn the_demo_runs_both_protocols_and_prints_a_timeline_and_summary() {
    // A slow path long enough that the fast group wins even on a loaded machine.
    let output = kvtier(&["demo", "--slow-ms", "200"]);
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        text(&output.stderr)
    );
    // The timeline shows the slow group published after the fast one
    // submitted behind it, the failed load, the cancellation and the
    // delayed free.
    let r2 = stdout.find("r2's group answered").expect("r2 published");
    let r1 = stdout.find("r1's group answered").expect("r1 published");
    assert!(
        r2 < r1,
        "the fast group r2 is published before the slow r1:\n{stdout}"
    );
    assert!(
        stdout.contains("failed (") && stdout.contains("mark_miss"),
        "{stdout}"
    );
    assert!(stdout.contains("r3 cancelled"), "{stdout}");
    assert!(stdout.contains("(a delayed free)"), "{stdout}");
    assert_eq!(row(&stdout, "orphaned answers dropped"), "3");
    assert_eq!(row(&stdout, "failed loads marked miss"), "1");
    // r4 finishes while its slow saves run; the others' saves are usually
    // done by the time they finish, but may not be on a loaded machine.
    let delayed: u32 = row(&stdout, "delayed frees reported").parse().unwrap();
    assert!((1..=3).contains(&delayed), "{stdout}");
    assert_eq!(row(&stdout, "saves submitted / failed"), "18 / 0");
    assert!(row(&stdout, "time to verdict p50 / p99").contains("ms"));
}

#[test]
fn probe_measures_a_directory_tier_and_reports_json() {
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().to_str().unwrap();
    let output = kvtier(&[
        "probe",
        "--fs",
        dir_arg,
        "--keys",
        "600",
        "--groups",
        "12",
        "--concurrency",
        "3",
        "--json",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("one JSON object");
    assert_eq!(report["keys"], 600);
    assert_eq!(report["groups"], 12);
    assert_eq!(report["misses"], 600, "an empty tier holds nothing");
    assert_eq!(report["errors"], 0);
    assert!(report["keys_per_s"].as_f64().unwrap() > 0.0);
    let latency = &report["group_verdict_ms"];
    assert!(latency["p50"].as_f64().unwrap() <= latency["max"].as_f64().unwrap());

    let human = kvtier(&["probe", "--fs", dir_arg, "--keys", "50", "--groups", "5"]);
    let stdout = text(&human.stdout);
    assert!(human.status.success());
    assert!(
        stdout.contains("0 hits, 50 misses") && stdout.contains("keys/s"),
        "{stdout}"
    );
}

#[test]
fn probe_measures_an_s3_bucket_on_a_loopback_server() {
    let moto = Moto::shared_or_start();
    let bucket = unique_bucket("kvtier-probe");
    moto.create_bucket(&bucket);
    let url = format!("s3://{bucket}/probe-ns?endpoint={}", moto.endpoint);
    let output = kvtier(&[
        "probe", "--s3", &url, "--keys", "200", "--groups", "8", "--json",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["misses"], 200);
    assert_eq!(report["errors"], 0);
    assert_eq!(report["timed_out_groups"], 0);
}

#[test]
fn bad_input_is_explained_with_distinct_exit_codes() {
    let moto = Moto::shared_or_start();
    let missing_bucket = format!(
        "s3://{}?endpoint={}",
        unique_bucket("never-created"),
        moto.endpoint
    );
    let cases: &[(&[&str], i32, &str)] = &[
        (&["probe", "--fs", "/no/such/dir"], 2, "no such directory"),
        (&["probe", "--s3", "not a url"], 2, "S3 URL"),
        (&["probe", "--s3", "http://bucket/x"], 2, "scheme"),
        (
            &["probe", "--fs", "/tmp", "--keys", "5", "--groups", "9"],
            2,
            "exceeds --keys",
        ),
        (&["probe", "--fs", "/tmp", "--keys", "0"], 2, "--keys"),
        (&["probe"], 2, "--fs"),
        (
            &["probe", "--fs", "/tmp", "--s3", "s3://b"],
            2,
            "cannot be used with",
        ),
        (
            &["probe", "--fs", "/tmp", "--namespace", "../up"],
            2,
            "namespace",
        ),
        (&["frobnicate"], 2, "unrecognized subcommand"),
        // A bucket that does not exist is not an empty tier.
        (
            &["probe", "--s3", &missing_bucket, "--timeout", "5000"],
            3,
            "cannot reach",
        ),
        // Nothing listens on port 9 of loopback: refused at once.
        (
            &[
                "probe",
                "--s3",
                "s3://b?endpoint=http://127.0.0.1:9",
                "--timeout",
                "3000",
            ],
            3,
            "cannot reach",
        ),
    ];
    for (args, code, message) in cases {
        let output = kvtier(args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(*code), "{args:?}: {stderr}");
        assert!(
            stderr.contains(message),
            "{args:?}: expected {message:?} in {stderr}"
        );
    }
}

#[test]
fn help_shows_examples() {
    let output = kvtier(&["--help"]);
    let stdout = text(&output.stdout);
    assert!(output.status.success());
    assert!(
        stdout.contains("Examples:") && stdout.contains("kvtier probe --s3"),
        "{stdout}"
    );
}

#[test]
fn a_reader_that_stops_early_ends_the_demo_quietly() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    // Like `kvtier demo | head -1`: the pipe closes after the first line.
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args(["demo", "--slow-ms", "10"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("kvtier demo"), "{first}");
    let output = child.wait_with_output().unwrap();
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

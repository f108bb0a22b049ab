//! The `kvtier` binary: the demo, `probe` on a directory and on a loopback
//! S3 server, and clear errors with distinct exit codes for bad input.
#![cfg(not(any(kvtier_loom, kvtier_shuttle)))]

/// The library's test servers and backends, shared with its own tests.
#[path = "../../tests/common/mod.rs"]
mod common;

mod run;

use std::process::Command;

use run::kvtier;

use common::s3::{S3Server, unique_bucket};

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
    let server = S3Server::shared_or_start();
    let bucket = unique_bucket("kvtier-probe");
    server.create_bucket(&bucket);
    let url = format!("s3://{bucket}/probe-ns?endpoint={}", server.endpoint);
    let output = kvtier(&[
        "probe", "--s3", &url, "--keys", "200", "--groups", "8", "--json",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["misses"], 200);
    assert_eq!(report["errors"], 0);
    assert_eq!(report["timed_out_groups"], 0);
}

/// One command-line case: arguments, environment, expected exit code and a
/// substring of what it prints on stderr.
struct Case {
    args: Vec<String>,
    env: Vec<(&'static str, Option<String>)>,
    code: i32,
    message: &'static str,
}

fn case(args: &[&str], code: i32, message: &'static str) -> Case {
    Case {
        args: args.iter().map(|arg| arg.to_string()).collect(),
        env: Vec::new(),
        code,
        message,
    }
}

impl Case {
    /// Sets (`Some`) or removes (`None`) an environment variable.
    fn env(mut self, name: &'static str, value: Option<&str>) -> Case {
        self.env.push((name, value.map(str::to_owned)));
        self
    }

    /// Runs the case; `Err` says how the outcome differed from the expected one.
    fn run(&self) -> Result<(), String> {
        let mut command = Command::new(env!("CARGO_BIN_EXE_kvtier"));
        command
            .args(&self.args)
            .env_remove("AWS_ENDPOINT")
            .env_remove("AWS_ENDPOINT_URL")
            .env_remove("AWS_ENDPOINT_URL_S3")
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing");
        for (name, value) in &self.env {
            match value {
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
        let output = command.output().expect("run kvtier");
        let stderr = text(&output.stderr);
        let case = format!("{:?} {:?}", self.args, self.env);
        if output.status.code() != Some(self.code) {
            return Err(format!(
                "{case}: exit {:?}, expected {}: {stderr}",
                output.status.code(),
                self.code
            ));
        }
        if !stderr.contains(self.message) {
            return Err(format!("{case}: expected {:?} in {stderr}", self.message));
        }
        if stderr.contains("panicked") {
            return Err(format!("{case}: a panic reached the user: {stderr}"));
        }
        Ok(())
    }
}

/// Every command-line input class the hostile-input pass tried, as
/// (arguments, environment) -> (exit code, message): bad input is 2, storage
/// unreachable 3, storage failing during the run 1 or 3; never a panic, never
/// a silent success.
#[test]
fn bad_input_and_failing_storage_are_explained_with_distinct_exit_codes() {
    use common::fake_s3::{FakeS3, Script};

    let server = S3Server::shared_or_start();
    let bucket = unique_bucket("kvtier-cli");
    server.create_bucket(&bucket);
    let s3 = |suffix: &str| format!("s3://{bucket}{suffix}");
    let at = |endpoint: &str| format!("s3://{bucket}?endpoint={endpoint}");
    let missing_bucket = format!(
        "s3://{}?endpoint={}",
        unique_bucket("never-created"),
        server.endpoint
    );
    let long_namespace = "n".repeat(300);
    // A server that lists the bucket but refuses every HEAD.
    let refusing = FakeS3::start(Script {
        status: 403,
        delay: std::time::Duration::ZERO,
    });
    let refusing_url = format!("s3://b-fake?endpoint={}", refusing.endpoint);
    let port = server.endpoint.rsplit(':').next().unwrap().to_owned();

    let cases = vec![
        case(&["probe", "--fs", "/no/such/dir"], 2, "no such directory"),
        case(&["probe", "--s3", "not a url"], 2, "S3 URL"),
        case(&["probe", "--s3", "http://bucket/x"], 2, "scheme"),
        case(
            &["probe", "--fs", "/tmp", "--keys", "5", "--groups", "9"],
            2,
            "exceeds --keys",
        ),
        case(&["probe", "--fs", "/tmp", "--keys", "0"], 2, "--keys"),
        case(&["probe"], 2, "--fs"),
        case(
            &["probe", "--fs", "/tmp", "--s3", "s3://b"],
            2,
            "cannot be used with",
        ),
        case(
            &["probe", "--fs", "/tmp", "--namespace", "../up"],
            2,
            "namespace",
        ),
        case(
            &["probe", "--fs", "/tmp", "--namespace", &long_namespace],
            2,
            "300 bytes long",
        ),
        case(&["frobnicate"], 2, "unrecognized subcommand"),
        // An endpoint with a query or a fragment would turn every HEAD of a
        // block into a HEAD of the bucket: refused, never probed.
        case(
            &["probe", "--s3", &at(&format!("{}?x=1", server.endpoint))],
            2,
            "has a query",
        ),
        case(
            &["probe", "--s3", &at(&format!("{}%23frag", server.endpoint))],
            2,
            "has a fragment",
        ),
        case(
            &[
                "probe",
                "--s3",
                &at(&format!("{}/x%2520y", server.endpoint)),
            ],
            2,
            "has a path",
        ),
        case(&["probe", "--s3", &at("::::")], 2, "not http"),
        case(&["probe", "--s3", &at("http://")], 2, "not a URL"),
        case(
            &["probe", "--s3", &at(&format!("http:127.0.0.1:{port}"))],
            2,
            "not http",
        ),
        case(
            &["probe", "--s3", &at("http://b%C3%BCcher.local")],
            2,
            "ASCII",
        ),
        // The same strings from the environment.
        case(&["probe", "--s3", &s3("")], 2, "environment's endpoint")
            .env("AWS_ENDPOINT", Some("")),
        case(&["probe", "--s3", &s3("")], 2, "not http").env("AWS_ENDPOINT", Some("::::")),
        case(&["probe", "--s3", &s3("")], 2, "not a URL").env("AWS_ENDPOINT", Some("http://")),
        case(&["probe", "--s3", &s3("")], 2, "contains ' '").env("AWS_ENDPOINT", Some("not a url")),
        case(&["probe", "--s3", &s3("")], 2, "contains '\\t'")
            .env("AWS_ENDPOINT_URL", Some(&format!("{}\t", server.endpoint))),
        case(&["probe", "--s3", &s3("")], 2, "has a path").env(
            "AWS_ENDPOINT_URL_S3",
            Some(&format!("{}/x%20y", server.endpoint)),
        ),
        case(&["probe", "--s3", &s3("")], 2, "not http")
            .env("AWS_ENDPOINT", Some(&format!("http:127.0.0.1:{port}"))),
        case(&["probe", "--s3", &s3("")], 2, "ASCII")
            .env("AWS_ENDPOINT", Some("http://bücher.local")),
        // Bucket names and namespaces are the user's input too.
        case(
            &[
                "probe",
                "--s3",
                &format!("s3://adv_b!?endpoint={}", server.endpoint),
            ],
            2,
            "not a valid bucket name",
        ),
        case(&["probe", "--s3", &s3("/../x")], 2, "`..`"),
        case(&["probe", "--s3", &s3("/a//x")], 2, "empty component"),
        // No credentials anywhere: said so, without asking the cloud
        // instance-metadata address.
        case(
            &["probe", "--s3", &at(&server.endpoint)],
            2,
            "no credentials found (looked in",
        )
        .env("AWS_ACCESS_KEY_ID", None)
        .env("AWS_SECRET_ACCESS_KEY", None),
        // A bucket that does not exist is not an empty tier.
        case(
            &["probe", "--s3", &missing_bucket, "--timeout", "5000"],
            3,
            "cannot reach",
        ),
        // Nothing listens on port 9 of loopback: refused at once.
        case(
            &[
                "probe",
                "--s3",
                "s3://b-nine?endpoint=http://127.0.0.1:9",
                "--timeout",
                "3000",
            ],
            3,
            "cannot reach",
        ),
        // Reachable, then every lookup fails: not a success with a warning.
        case(
            &[
                "probe",
                "--s3",
                &refusing_url,
                "--keys",
                "20",
                "--groups",
                "4",
            ],
            3,
            "20 of 20 lookups failed (20 with an error",
        ),
    ];
    let failures: Vec<String> = cases.iter().filter_map(|case| case.run().err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    // A failed head fails its group and drops the group's other heads, so
    // the server sees at least one request per group (4), not one per key.
    assert!(
        refusing.requests() >= 4,
        "the failing case reached the server: {} requests",
        refusing.requests()
    );
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

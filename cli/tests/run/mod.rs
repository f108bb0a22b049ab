//! Running the `kvtier` binary from the CLI's tests: one way, with the
//! S3 endpoint variables removed and explicit test credentials, so no run
//! looks for cloud credentials or leaves the machine.

use std::process::{Command, Output};

/// `kvtier args...`, its output collected.
pub fn kvtier(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args(args)
        .env_remove("AWS_ENDPOINT")
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_ENDPOINT_URL_S3")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .output()
        .expect("run kvtier")
}

/// The one JSON object a successful `--json` run printed.
#[allow(dead_code)]
pub fn json(output: &Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON object")
}

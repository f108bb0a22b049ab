//! `kvtier trim` and the usage line of `kvtier probe --fs`: a tier's block
//! files brought under a budget (the newest kept), in kvtier's layout and
//! in vLLM's, and bad input refused with exit code 2.
#![cfg(not(any(kvtier_loom, kvtier_shuttle)))]

use std::fs;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use kvtier::FsTier;

fn kvtier(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args(args)
        .output()
        .expect("run kvtier")
}

fn json(output: &Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON object")
}

fn age(path: &Path, seconds_ago: u64) {
    let file = fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::now() - Duration::from_secs(seconds_ago))
        .unwrap();
}

#[test]
fn trim_keeps_the_newest_blocks_within_the_capacity_and_probe_shows_the_usage() {
    let root = tempfile::tempdir().unwrap();
    let tier = FsTier::open(root.path(), "ns").unwrap();
    for key in 0u64..10 {
        tier.store(&key, &[1; 84]).unwrap(); // 100 bytes with the header
        age(&tier.path_of(&key), 1000 - key); // key 9 the newest
    }
    let stale = tier
        .path_of(&0u64)
        .with_extension("bin.00000000000000aa.tmp");
    fs::write(&stale, b"dead").unwrap();
    age(&stale, 7200);
    let dir = root.path().to_str().unwrap();

    let usage = json(&kvtier(&[
        "trim",
        "--fs",
        dir,
        "--namespace",
        "ns",
        "--json",
    ]));
    assert_eq!(
        (usage["blocks"].as_u64(), usage["bytes"].as_u64()),
        (Some(10), Some(1000))
    );
    assert_eq!(
        (usage["trimmed"].as_u64(), usage["swept"].as_u64()),
        (Some(0), Some(0))
    );
    assert!(stale.exists(), "usage only: nothing deleted");

    let probe = json(&kvtier(&[
        "probe",
        "--fs",
        dir,
        "--namespace",
        "ns",
        "--keys",
        "20",
        "--groups",
        "2",
        "--json",
    ]));
    assert_eq!(probe["usage"]["blocks"].as_u64(), Some(10));
    assert_eq!(probe["usage"]["bytes"].as_u64(), Some(1000));

    let trimmed = json(&kvtier(&[
        "trim",
        "--fs",
        dir,
        "--namespace",
        "ns",
        "--capacity",
        "450",
        "--json",
    ]));
    assert_eq!(
        (trimmed["blocks"].as_u64(), trimmed["trimmed"].as_u64()),
        (Some(4), Some(6))
    );
    assert_eq!(trimmed["swept"].as_u64(), Some(1));
    for key in 0u64..10 {
        assert_eq!(tier.contains(&key).unwrap(), key >= 6, "key {key}");
    }

    let human = kvtier(&["trim", "--fs", dir, "--namespace", "ns", "--capacity", "1K"]);
    let stdout = String::from_utf8_lossy(&human.stdout);
    assert!(human.status.success());
    assert!(
        stdout.contains("kept          4 blocks, 400 bytes"),
        "{stdout}"
    );
}

#[test]
fn trim_reads_vllms_layout_in_a_rank_directory() {
    let root = tempfile::tempdir().unwrap();
    let rank = root.path().join("model_abc_r0");
    for i in 0..6u8 {
        let dir = rank.join(format!("a{i:02x}")).join("bc_g0");
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("a{i:02x}bc{}.bin", "0".repeat(58)));
        fs::write(&path, vec![i; 4096]).unwrap();
        age(&path, 100 - u64::from(i));
    }
    let rank_arg = rank.to_str().unwrap();
    let report = json(&kvtier(&[
        "trim",
        "--fs",
        rank_arg,
        "--layout",
        "vllm",
        "--capacity",
        "8K",
        "--json",
    ]));
    assert_eq!(
        (report["blocks"].as_u64(), report["trimmed"].as_u64()),
        (Some(2), Some(4))
    );
    assert!(
        rank.join("a05/bc_g0").read_dir().unwrap().next().is_some(),
        "the newest kept"
    );
    assert!(
        rank.join("a00/bc_g0").read_dir().unwrap().next().is_none(),
        "the oldest deleted"
    );
}

#[test]
fn bad_trim_input_exits_with_code_2() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().to_str().unwrap();
    for (args, message) in [
        (
            vec!["trim", "--fs", "/no/such/dir", "--capacity", "1G"],
            "no such directory",
        ),
        (vec!["trim", "--fs", dir, "--capacity", "0"], "at least 1"),
        (
            vec!["trim", "--fs", dir, "--capacity", "10X"],
            "unknown unit",
        ),
        (
            vec!["trim", "--fs", dir, "--capacity", "99999999999T"],
            "64 bits",
        ),
        (
            vec!["trim", "--fs", dir, "--namespace", "../up"],
            "namespace",
        ),
        (vec!["trim", "--fs", dir, "--layout", "lmcache"], "lmcache"),
    ] {
        let output = kvtier(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}

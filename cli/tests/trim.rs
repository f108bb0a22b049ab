//! `kvtier trim` and the usage line of `kvtier probe --fs`: a tier's block
//! files brought under a budget (the newest kept), in kvtier's layout and
//! in vLLM's, and bad input refused with exit code 2.
#![cfg(not(any(kvtier_loom, kvtier_shuttle)))]

mod run;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use run::{json, kvtier};

use kvtier::FsTier;

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
    let rank = vllm_rank_dir(root.path());
    for i in 0..6u8 {
        let dir = rank.join(format!("a{i:02x}")).join("bc_g0");
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("a{i:02x}bc{}.bin", "0".repeat(59)));
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
        !rank.join("a00").exists(),
        "the oldest deleted, with the directories that emptied"
    );
}

/// A rank directory of vLLM's layout, with vLLM's run config beside it.
fn vllm_rank_dir(root: &Path) -> std::path::PathBuf {
    let base = root.join("model_abc");
    fs::create_dir_all(&base).unwrap();
    fs::write(base.join("config.json"), b"{}").unwrap();
    root.join("model_abc_r0")
}

/// Writes `relative` below `dir` (and its directories), last modified
/// two hours ago.
fn plant(dir: &Path, relative: &str) -> std::path::PathBuf {
    let path = dir.join(relative);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, b"not a block of the tier").unwrap();
    age(&path, 7200);
    path
}

#[test]
fn trim_deletes_only_the_files_the_layout_writes() {
    // kvtier's layout: one real block, and files that only resemble
    // blocks and temporary files by their endings.
    let root = tempfile::tempdir().unwrap();
    let tier = FsTier::open(root.path(), "ns").unwrap();
    tier.store(&7u64, &[1; 84]).unwrap();
    let ns = root.path().join("ns");
    let foreign = [
        "photos/2024/holiday.bin",
        "firmware/images/boot.bin",
        "notes.bin.old.tmp",
        "000/00/notes.bin.old.tmp",
        "000/00/0000000000000008.bin.old.tmp",
        "000/00/notes.bin.00000000000000aa.tmp",
        "001/00/0000000000000007.bin",
    ]
    .map(|relative| plant(&ns, relative));
    let dir = root.path().to_str().unwrap();
    let report = json(&kvtier(&[
        "trim",
        "--fs",
        dir,
        "--namespace",
        "ns",
        "--capacity",
        "1",
        "--json",
    ]));
    assert_eq!(
        (report["trimmed"].as_u64(), report["swept"].as_u64()),
        (Some(1), Some(0))
    );
    assert!(!tier.contains(&7u64).unwrap(), "the real block was trimmed");
    for path in &foreign {
        assert!(path.exists(), "{} was deleted", path.display());
    }

    // vLLM's layout, the same.
    let rank = vllm_rank_dir(root.path());
    let block = plant(&rank, &format!("abc/de_g0/abcde{}.bin", "0".repeat(59)));
    let foreign = [
        "firmware/images/boot.bin",
        "docs/2024/report.bin_v2.tmp",
        "abc/de_g0/report.bin_2.tmp",
        "abc/df_g1/abcde0.bin",
        "abc/de_g0/abcde.bin",
    ]
    .map(|relative| plant(&rank, relative));
    let report = json(&kvtier(&[
        "trim",
        "--fs",
        rank.to_str().unwrap(),
        "--layout",
        "vllm",
        "--capacity",
        "1",
        "--json",
    ]));
    assert_eq!(
        (
            report["blocks"].as_u64(),
            report["trimmed"].as_u64(),
            report["swept"].as_u64()
        ),
        (Some(0), Some(1), Some(0))
    );
    assert!(!block.exists());
    for path in &foreign {
        assert!(path.exists(), "{} was deleted", path.display());
    }
}

#[test]
fn trim_refuses_a_directory_that_is_not_a_tier() {
    let root = tempfile::tempdir().unwrap();
    let planted = plant(root.path(), "ns/abc/de/abcdef.bin");
    let dir = root.path().to_str().unwrap();
    let rank = root.path().join("model_r0");
    fs::create_dir_all(&rank).unwrap();
    for (args, message) in [
        (
            vec!["trim", "--fs", dir, "--namespace", "ns", "--capacity", "1"],
            "kvtier-tier.json is missing",
        ),
        (
            vec!["trim", "--fs", "/", "--layout", "vllm", "--capacity", "1"],
            "a rank directory's name",
        ),
        (
            vec!["trim", "--fs", dir, "--layout", "vllm"],
            "a rank directory's name",
        ),
        (
            vec!["trim", "--fs", rank.to_str().unwrap(), "--layout", "vllm"],
            "model/config.json is missing",
        ),
    ] {
        let output = kvtier(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("is not a tier directory"),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    assert!(planted.exists());
}

/// Makes `dir` a directory nothing can be deleted from (immutable as root,
/// read-only otherwise); undone on drop.
struct Undeletable(std::path::PathBuf);

impl Undeletable {
    fn new(dir: &Path) -> Self {
        let root = Command::new("id")
            .arg("-u")
            .output()
            .map(|o| o.stdout == b"0\n");
        if root.unwrap_or(false) {
            let status = Command::new("chattr")
                .arg("+i")
                .arg(dir)
                .status()
                .expect("chattr");
            assert!(status.success(), "chattr +i {}", dir.display());
        } else {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(dir, fs::Permissions::from_mode(0o555)).unwrap();
        }
        assert!(
            fs::File::create(dir.join("probe")).is_err(),
            "{} can still be written: the test cannot make a deletion fail",
            dir.display()
        );
        Self(dir.to_owned())
    }
}

impl Drop for Undeletable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
        use std::os::unix::fs::PermissionsExt;
        let _ = fs::set_permissions(&self.0, fs::Permissions::from_mode(0o755));
    }
}

#[test]
fn trim_names_what_it_could_not_delete_and_fails() {
    // On the repository's file system: chattr needs one that supports it.
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let tier = FsTier::open(root.path(), "ns").unwrap();
    for key in 0u64..3 {
        tier.store(&key, &[1; 84]).unwrap();
    }
    let shard = tier.path_of(&0u64).parent().unwrap().to_owned();
    let dir = root.path().to_str().unwrap();
    let output = {
        let _held = Undeletable::new(&shard);
        kvtier(&[
            "trim",
            "--fs",
            dir,
            "--namespace",
            "ns",
            "--capacity",
            "1",
            "--json",
        ])
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("3 files could not be deleted"), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("the report");
    assert_eq!(
        (report["failed"].as_u64(), report["trimmed"].as_u64()),
        (Some(3), Some(0))
    );
    let failures = report["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 3);
    assert!(
        failures
            .iter()
            .all(|f| f.as_str().unwrap().contains(shard.to_str().unwrap())),
        "{failures:?}"
    );
    // The text form names them too.
    let output = {
        let _held = Undeletable::new(&shard);
        kvtier(&["trim", "--fs", dir, "--namespace", "ns", "--capacity", "1"])
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1));
    assert!(stdout.contains("not deleted   3 files"), "{stdout}");
    assert!(
        stdout.contains(tier.path_of(&1u64).to_str().unwrap()),
        "{stdout}"
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
            "a size is digits",
        ),
        (
            vec!["trim", "--fs", dir, "--capacity", "99999999999T"],
            "at most 18446744073709551615 bytes",
        ),
        // The operators' hostile pass (issue 41): one past 2^64 - 1 is too
        // large, not "not a size"; repeated units are not units; a negative
        // size is a size's error, not clap's "unexpected argument".
        (
            vec!["trim", "--fs", dir, "--capacity", "18446744073709551616"],
            "at most 18446744073709551615 bytes",
        ),
        (
            vec!["trim", "--fs", dir, "--capacity", "5GIBIBIB"],
            "a size is digits",
        ),
        (
            vec!["trim", "--fs", dir, "--capacity", "5BBBB"],
            "a size is digits",
        ),
        (
            vec!["trim", "--fs", dir, "--capacity", "-1"],
            "--capacity is \"-1\"; a size is not negative",
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

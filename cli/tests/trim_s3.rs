//! `kvtier trim --s3` and the usage `kvtier probe --s3` reports: an object
//! tier's namespace on a loopback S3 server brought under a budget (the
//! newest objects kept), other namespaces untouched, bad input refused.
#![cfg(not(any(kvtier_loom, kvtier_shuttle)))]

/// The library's test servers and backends, shared with its own tests.
#[path = "../../tests/common/mod.rs"]
mod common;

mod run;

use std::time::Duration;

use run::{json, kvtier};

use common::s3::{S3Server, unique_bucket};
use kvtier::ObjectTier;
use kvtier::tier::S3Options;

/// The tier the CLI opens for `url`, opened the same way by the library.
fn tier(url: &str) -> ObjectTier {
    let (options, namespace) = S3Options::from_url(url).unwrap();
    let options = options.credentials("testing", "testing");
    ObjectTier::s3(&options, &namespace).unwrap()
}

/// 84 bytes of data: 100-byte objects with the block header.
const BLOCK: u64 = 100;

#[test]
fn trim_keeps_the_newest_objects_within_the_capacity_and_probe_shows_the_usage() {
    let server = S3Server::shared_or_start();
    let bucket = unique_bucket("kvtier-trim");
    server.create_bucket(&bucket);
    let url = format!("s3://{bucket}/ns?endpoint={}", server.endpoint);
    let other = format!("s3://{bucket}/other?endpoint={}", server.endpoint);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (tier, neighbour) = (tier(&url), tier(&other));
    runtime.block_on(async {
        for key in 0u64..3 {
            tier.store(&key, vec![1; 84]).await.unwrap();
            neighbour.store(&key, vec![1; 84]).await.unwrap();
        }
        // Last-modified times are whole seconds on some servers.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        for key in 3u64..6 {
            tier.store(&key, vec![1; 84]).await.unwrap();
        }
    });

    // Without a budget: the usage, nothing deleted.
    let usage = json(&kvtier(&["trim", "--s3", &url, "--json"]));
    assert_eq!(
        (usage["blocks"].as_u64(), usage["bytes"].as_u64()),
        (Some(6), Some(6 * BLOCK))
    );
    assert_eq!(
        (usage["trimmed"].as_u64(), usage["namespace"].as_str()),
        (Some(0), Some("ns"))
    );
    assert!(usage["capacity_bytes"].is_null(), "{usage}");

    // Room for three and a half: the three newest stay.
    let trimmed = json(&kvtier(&[
        "trim",
        "--s3",
        &url,
        "--capacity",
        "350",
        "--json",
    ]));
    assert_eq!(
        (
            trimmed["blocks"].as_u64(),
            trimmed["bytes"].as_u64(),
            trimmed["trimmed"].as_u64()
        ),
        (Some(3), Some(3 * BLOCK), Some(3)),
        "{trimmed}"
    );
    runtime.block_on(async {
        for key in 0u64..6 {
            assert_eq!(tier.contains(&key).await.unwrap(), key >= 3, "block {key}");
            if key < 3 {
                assert!(
                    neighbour.contains(&key).await.unwrap(),
                    "another namespace's {key}"
                );
            }
        }
    });

    // The text form says the same, and probe reports the usage.
    let text = kvtier(&["trim", "--s3", &url, "--capacity", "350"]);
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.status.success(),
        "{}",
        String::from_utf8_lossy(&text.stderr)
    );
    assert!(
        stdout.contains("kept          3 blocks, 300 bytes"),
        "{stdout}"
    );
    assert!(
        stdout.contains("deleted       0 oldest blocks, 0 stale multipart uploads"),
        "{stdout}"
    );
    let probe = json(&kvtier(&[
        "probe", "--s3", &url, "--keys", "20", "--groups", "2", "--json",
    ]));
    assert_eq!(
        (
            probe["usage"]["blocks"].as_u64(),
            probe["usage"]["bytes"].as_u64()
        ),
        (Some(3), Some(3 * BLOCK)),
        "{probe}"
    );
}

#[test]
fn bad_s3_trim_input_exits_with_code_2_and_an_absent_bucket_with_3() {
    let server = S3Server::shared_or_start();
    let url = format!(
        "s3://{}?endpoint={}",
        unique_bucket("kvtier-x"),
        server.endpoint
    );
    for (args, code, message) in [
        (vec!["trim"], 2, "--fs"),
        (
            vec!["trim", "--fs", "/tmp", "--s3", "s3://b"],
            2,
            "cannot be used with",
        ),
        (
            vec!["trim", "--s3", "s3://bbb", "--layout", "lru"],
            2,
            "invalid value",
        ),
        (
            vec!["trim", "--s3", "s3://b", "--namespace", "x"],
            2,
            "cannot be used with",
        ),
        (
            vec!["trim", "--fs", "/tmp", "--timeout", "5"],
            2,
            "cannot be used with",
        ),
        (vec!["trim", "--s3", "not a url"], 2, "S3 URL"),
        (vec!["trim", "--s3", "s3://b/../x"], 2, "`..`"),
        (
            vec!["trim", "--s3", &url, "--capacity", "0"],
            2,
            "at least 1",
        ),
        // No such bucket: the first request fails, nothing is listed.
        (
            vec!["trim", "--s3", &url, "--capacity", "1G"],
            3,
            "cannot reach",
        ),
    ] {
        let output = kvtier(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// vLLM's layout in a bucket (kvtier.vllm.ObjectTier, the connector on a
/// bucket): `--layout vllm` trims a rank prefix, counts only vLLM's block
/// names, and reports the usage against the budget; probe reports it too.
#[test]
fn a_vllm_rank_prefix_is_trimmed_by_its_layout_and_its_usage_reported_against_the_budget() {
    use kvtier::tier::VllmObjectLayout;
    use object_store::ObjectStoreExt;

    let server = S3Server::shared_or_start();
    let bucket = unique_bucket("kvtier-trim-vllm");
    server.create_bucket(&bucket);
    let rank = "fleet/llama_0123456789ab_r0";
    let url = format!("s3://{bucket}/{rank}?endpoint={}", server.endpoint);
    let (options, _) = S3Options::from_url(&url).unwrap();
    let layout = VllmObjectLayout::s3(&options.credentials("testing", "testing"), rank).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let key = |n: u8| vec![n, 0xab, 0xcd, 0, 0, 0, 0];
    runtime.block_on(async {
        for n in 0..2 {
            let location = layout.location_of(&key(n)).unwrap();
            layout
                .store()
                .put(&location, vec![n; 100].into())
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        for n in 2..5 {
            let location = layout.location_of(&key(n)).unwrap();
            layout
                .store()
                .put(&location, vec![n; 100].into())
                .await
                .unwrap();
        }
        // Not vLLM's name of a block: never counted, never deleted.
        let notes = object_store::path::Path::from(format!("{rank}/abc/notes.bin").as_str());
        layout
            .store()
            .put(&notes, vec![0; 1000].into())
            .await
            .unwrap();
    });
    let usage = json(&kvtier(&[
        "trim", "--s3", &url, "--layout", "vllm", "--json",
    ]));
    assert_eq!(
        (usage["blocks"].as_u64(), usage["bytes"].as_u64()),
        (Some(5), Some(500))
    );
    let trimmed = json(&kvtier(&[
        "trim",
        "--s3",
        &url,
        "--layout",
        "vllm",
        "--capacity",
        "300",
        "--json",
    ]));
    assert_eq!(
        (
            trimmed["blocks"].as_u64(),
            trimmed["trimmed"].as_u64(),
            trimmed["used_percent"].as_f64()
        ),
        (Some(3), Some(2), Some(100.0))
    );
    assert_eq!(trimmed["layout"].as_str(), Some("vllm"));
    assert_eq!(trimmed["uploads"]["found"].as_u64(), Some(0));
    let left = runtime.block_on(layout.usage()).unwrap();
    assert_eq!((left.blocks, left.bytes), (3, 300), "the newest three kept");
    let probe = json(&kvtier(&[
        "probe",
        "--s3",
        &url,
        "--keys",
        "10",
        "--groups",
        "2",
        "--capacity",
        "200",
        "--json",
    ]));
    assert_eq!(probe["usage"]["capacity_bytes"].as_u64(), Some(200));
}

/// With a budget, `trim --s3` aborts the layout's unfinished multipart
/// uploads older than `--stale-temp-age` (a killed multipart writer's), and
/// leaves every other upload.
#[test]
fn trim_aborts_the_layouts_stale_uploads_and_no_other() {
    use object_store::multipart::MultipartStore;

    let Some(server) = S3Server::with_upload_listing() else {
        return;
    };
    let bucket = unique_bucket("kvtier-trim-uploads");
    server.create_bucket(&bucket);
    let rank = "fleet/llama_0123456789ab_r0";
    let url = format!("s3://{bucket}/{rank}?endpoint={}", server.endpoint);
    let (options, _) = S3Options::from_url(&url).unwrap();
    let layout =
        kvtier::tier::VllmObjectLayout::s3(&options.credentials("testing", "testing"), rank)
            .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let s3 = server.amazon_s3(&bucket);
        let block = layout.location_of(&[7, 0xab, 0xcd, 0, 0, 0, 0]).unwrap();
        s3.create_multipart(&block).await.unwrap();
        let other = object_store::path::Path::from(format!("{rank}/notes/x.txt").as_str());
        s3.create_multipart(&other).await.unwrap();
    });
    // Counted without a budget, aborted with one.
    let counted = json(&kvtier(&[
        "trim", "--s3", &url, "--layout", "vllm", "--json",
    ]));
    assert_eq!(
        (
            counted["uploads"]["found"].as_u64(),
            counted["uploads"]["aborted"].as_u64()
        ),
        (Some(1), Some(0))
    );
    let trimmed = json(&kvtier(&[
        "trim",
        "--s3",
        &url,
        "--layout",
        "vllm",
        "--capacity",
        "1G",
        "--stale-temp-age",
        "0",
        "--json",
    ]));
    assert_eq!(trimmed["uploads"]["aborted"].as_u64(), Some(1));
    let left = runtime
        .block_on(layout.abort_stale_uploads(Duration::ZERO))
        .unwrap();
    assert_eq!(left.found, 0);
}

/// Without credentials in the environment's variables, the AWS shared
/// credentials file's profile is used (`AWS_SHARED_CREDENTIALS_FILE`,
/// `AWS_PROFILE`), as the AWS SDKs do; a wrong secret there is refused by
/// the server.
#[test]
fn credentials_come_from_the_aws_shared_files_profile() {
    // A server of this test's own: the in-process one checks signatures
    // (moto, CI's shared server, accepts any).
    let server = S3Server::start();
    let bucket = unique_bucket("kvtier-profile");
    server.create_bucket(&bucket);
    let url = format!("s3://{bucket}/ns?endpoint={}", server.endpoint);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("credentials");
    std::fs::write(
        &file,
        "[default]\naws_access_key_id = nobody\naws_secret_access_key = wrong\n\n\
         [fleet]\naws_access_key_id = testing\naws_secret_access_key = testing\n",
    )
    .unwrap();
    let run = |profile: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kvtier"))
            .args(["trim", "--s3", &url, "--json", "--timeout", "5000"])
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_ENDPOINT")
            .env_remove("AWS_ENDPOINT_URL")
            .env_remove("AWS_ENDPOINT_URL_S3")
            .env("AWS_SHARED_CREDENTIALS_FILE", &file)
            .env("AWS_CONFIG_FILE", dir.path().join("no-config"))
            .env("AWS_PROFILE", profile)
            .output()
            .unwrap()
    };
    let fleet = run("fleet");
    assert!(
        fleet.status.success(),
        "{}",
        String::from_utf8_lossy(&fleet.stderr)
    );
    let default = run("default");
    assert_eq!(
        default.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&default.stderr)
    );
}

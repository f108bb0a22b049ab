//! The object-store tier: in memory, on local files, and against a real
//! S3-compatible server on loopback (s3s in this process, or moto through
//! `KVTIER_S3_ENDPOINT`), including the server going away mid-run.
#![cfg(all(feature = "object-store", not(any(kvtier_loom, kvtier_shuttle))))]

mod common;

use std::sync::mpsc::{RecvTimeoutError, channel};
use std::time::Duration;

use common::s3::{S3Server, unique_bucket};
use kvtier::{
    ObjectTier, SaveScheduler, SaveTracker, StoreTask, TierError, lookup::TokioConfig,
    lookup::TokioLookup, save::TaskError, tier::Corruption, tier::S3Options,
};
use object_store::ObjectStoreExt;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `test` on a thread and fails if it has not finished after 120 s.
fn watchdog(test: impl FnOnce() + Send + 'static) {
    let (done, finished) = channel();
    let worker = std::thread::spawn(move || {
        test();
        let _ = done.send(());
    });
    match finished.recv_timeout(Duration::from_secs(120)) {
        Ok(()) => worker.join().unwrap(),
        Err(RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(worker.join().unwrap_err())
        }
        Err(RecvTimeoutError::Timeout) => panic!("hung: the test did not finish within 120 s"),
    }
}

/// Store, contains, load and damage detection, the same on every backend.
async fn round_trip(tier: &ObjectTier) {
    assert!(!tier.contains(&1u64).await.unwrap());
    assert_eq!(tier.load(&1u64).await.unwrap(), None);
    tier.store(&1u64, b"block one".to_vec()).await.unwrap();
    assert!(tier.contains(&1u64).await.unwrap());
    assert_eq!(
        tier.load(&1u64).await.unwrap().as_deref(),
        Some(&b"block one"[..])
    );
    assert_eq!(
        tier.location_of(&1u64).to_string(),
        format!("{}/000/00/0000000000000001.bin", tier.namespace())
    );
}

#[test]
fn memory_and_local_file_stores_round_trip_and_catch_damage() {
    let runtime = runtime();
    let root = tempfile::tempdir().unwrap();
    runtime.block_on(async {
        let memory = ObjectTier::memory("ns/rank0").unwrap();
        round_trip(&memory).await;
        let local = ObjectTier::local(root.path(), "ns/rank0").unwrap();
        round_trip(&local).await;
    });
    // The local store writes the same layout and format as FsTier.
    let file = root.path().join("ns/rank0/000/00/0000000000000001.bin");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 1]).unwrap();
    runtime.block_on(async {
        let local = ObjectTier::local(root.path(), "ns/rank0").unwrap();
        assert!(local.contains(&1u64).await.unwrap(), "lookup is existence");
        assert!(matches!(
            local.load(&1u64).await,
            Err(TierError::Corrupt {
                kind: Corruption::Truncated { .. },
                ..
            })
        ));
    });
    assert!(matches!(
        ObjectTier::local(root.path().join("missing"), "ns"),
        Err(TierError::MissingRoot(_))
    ));
    assert!(matches!(
        ObjectTier::memory("../up"),
        Err(TierError::Namespace(_))
    ));
}

#[test]
fn s3_urls_are_parsed_and_bad_ones_explained() {
    let (options, namespace) = S3Options::from_url("s3://bucket").unwrap();
    assert_eq!(
        (options.get_bucket(), namespace.as_str()),
        ("bucket", "kvtier")
    );
    assert!(!options.get_allow_http() && options.get_endpoint().is_none());
    let (options, _) =
        S3Options::from_url("s3://bkt/ns?endpoint=https://minio.local:9000&region=eu-west-1")
            .unwrap();
    assert!(!options.get_allow_http());
    assert_eq!(options.get_region(), Some("eu-west-1"));
    for (url, reason) in [
        ("not a url", "relative URL"),
        ("http://bucket/ns", "scheme"),
        ("s3:///ns", "no bucket"),
        ("s3://bkt/ns?endpiont=http://x", "unknown parameter"),
        ("s3://bkt/ns?endpoint=ftp://x", "not http"),
        ("s3://bkt/a//b", "empty component"),
        ("s3://b/ns", "not a valid bucket name"),
    ] {
        match S3Options::from_url(url) {
            Err(TierError::Config(message)) => {
                assert!(message.contains(reason), "{url}: {message}")
            }
            other => panic!("{url}: expected a configuration error, got {other:?}"),
        }
    }
}

#[test]
fn an_s3_tier_on_a_loopback_server_saves_looks_up_and_loads() {
    watchdog(|| {
        let server = S3Server::shared_or_start();
        let bucket = unique_bucket("kvtier-s3");
        server.create_bucket(&bucket);
        let tier = ObjectTier::s3(&server.s3_options(&bucket), "model-a/rank0").unwrap();
        let runtime = runtime();
        runtime.block_on(round_trip(&tier));

        // Saves through the save tracker: reported only once the puts are done.
        let mut scheduler = SaveScheduler::new();
        let mut worker: SaveTracker<String, kvtier::tier::ObjectSaveTask> = SaveTracker::new();
        let request = "req-1".to_string();
        worker
            .begin_step(&scheduler.record_step([(request.clone(), 3)]))
            .expect("steps in sequence");
        for key in 10u64..13 {
            let task = tier.save(&key, vec![key as u8; 4096], runtime.handle());
            worker.submit(task, std::slice::from_ref(&request));
        }
        assert!(scheduler.request_finished(&request));
        worker.wait_all();
        assert_eq!(
            worker.get_finished(std::slice::from_ref(&request)),
            [request]
        );
        assert_eq!(worker.stats().task_failures, 0);

        // Lookups through the tokio driver, several groups at once.
        let mut lookup = TokioLookup::tokio(tier.clone(), TokioConfig::default()).unwrap();
        for key in 8u64..15 {
            lookup.lookup(&key, &format!("req-{}", key % 3));
        }
        lookup.flush().unwrap();
        lookup.wait_idle().unwrap();
        for key in 8u64..15 {
            let verdict = lookup.lookup(&key, &format!("req-{}", key % 3));
            assert_eq!(verdict.is_hit(), (10..13).contains(&key), "key {key}");
        }
        lookup.shutdown().unwrap();
        let loaded = runtime.block_on(tier.load(&11u64)).unwrap();
        assert_eq!(loaded, Some(vec![11u8; 4096]));
        assert_eq!(tier.stats().lookup_errors, 0);
    });
}

#[test]
fn a_damaged_object_is_found_but_refuses_to_load() {
    watchdog(|| {
        let server = S3Server::shared_or_start();
        let bucket = unique_bucket("kvtier-damage");
        server.create_bucket(&bucket);
        let options = server.s3_options(&bucket);
        let tier = ObjectTier::s3(&options, "ns").unwrap();
        let runtime = runtime();
        runtime.block_on(async {
            // Another program's object at a block's name.
            let raw = object_store::aws::AmazonS3Builder::new()
                .with_bucket_name(&bucket)
                .with_endpoint(&server.endpoint)
                .with_allow_http(true)
                .with_region("us-east-1")
                .with_access_key_id("testing")
                .with_secret_access_key("testing")
                .build()
                .unwrap();
            raw.put(&tier.location_of(&5u64), b"<html>".to_vec().into())
                .await
                .unwrap();
            assert!(tier.contains(&5u64).await.unwrap());
            assert!(matches!(
                tier.load(&5u64).await,
                Err(TierError::Corrupt {
                    kind: Corruption::Foreign,
                    ..
                })
            ));
        });
    });
}

#[test]
fn when_the_server_stops_mid_run_lookups_become_misses_saves_fail_and_nothing_hangs() {
    watchdog(|| {
        // A server of this test's own, so it can be stopped.
        let mut server = S3Server::start();
        let bucket = unique_bucket("kvtier-outage");
        server.create_bucket(&bucket);
        let tier = ObjectTier::s3(&server.s3_options(&bucket), "ns").unwrap();
        let runtime = runtime();
        runtime.block_on(async {
            for key in 0u64..4 {
                tier.store(&key, vec![1; 512]).await.unwrap();
            }
        });
        let config = TokioConfig::default()
            .max_concurrent_groups(2)
            .group_timeout(Some(Duration::from_secs(3)))
            .shutdown_grace(Duration::from_secs(1));
        let mut lookup = TokioLookup::tokio(tier.clone(), config).unwrap();
        let before = "before".to_string();
        for key in 0u64..4 {
            lookup.lookup(&key, &before);
        }
        lookup.flush().unwrap();
        lookup.wait_idle().unwrap();
        for key in 0u64..4 {
            assert!(lookup.lookup(&key, &before).is_hit());
        }

        server.stop();

        // Blocks that are stored but can no longer be reached: misses.
        let after = "after".to_string();
        for key in 100u64..104 {
            lookup.lookup(&key, &after);
        }
        lookup.flush().unwrap();
        lookup.wait_idle().unwrap();
        for key in 100u64..104 {
            assert!(lookup.lookup(&key, &after).is_miss(), "key {key}");
        }
        // One group: it failed (its first failed head fails it) or timed out.
        let stats = lookup.stats();
        assert!(
            (stats.backend_errors, stats.timeouts) == (1, 0)
                || (stats.backend_errors, stats.timeouts) == (0, 1),
            "{stats:?}"
        );
        assert!(stats.timeouts == 1 || tier.stats().lookup_errors >= 1);

        // A save during the outage fails; the request is still reported, so
        // its blocks are freed rather than held forever.
        let mut scheduler = SaveScheduler::new();
        let mut worker: SaveTracker<String, kvtier::tier::ObjectSaveTask> = SaveTracker::new();
        let request = "req".to_string();
        worker
            .begin_step(&scheduler.record_step([(request.clone(), 1)]))
            .expect("steps in sequence");
        let task = tier.save(&7u64, vec![7; 64], runtime.handle());
        worker.submit(task, std::slice::from_ref(&request));
        assert!(scheduler.request_finished(&request));
        worker.wait_all();
        assert_eq!(
            worker.get_finished(std::slice::from_ref(&request)),
            [request]
        );
        assert_eq!(worker.stats().task_failures, 1);

        let final_table = lookup.shutdown().unwrap();
        assert_eq!(final_table.stats().anomalies, 0);
    });
}

#[test]
fn a_save_on_a_runtime_that_shuts_down_is_abandoned_not_stranded() {
    let tier = ObjectTier::memory("ns").unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    // A current-thread runtime nobody drives: the put never runs.
    let task = tier.save(&1u64, vec![0; 16], runtime.handle());
    assert!(!task.check());
    drop(runtime);
    assert!(matches!(task.wait(), Err(TaskError::Abandoned)));
}

/// Options for a server on loopback with explicit test credentials.
fn loopback_options(endpoint: &str) -> S3Options {
    loopback_options_for("kvtier-fake", endpoint)
}

/// [`loopback_options`] for another bucket.
fn loopback_options_for(bucket: &str, endpoint: &str) -> S3Options {
    S3Options::new(bucket)
        .endpoint(endpoint)
        .allow_http(true)
        .credentials("testing", "testing")
}

#[test]
fn endpoints_that_would_panic_or_address_the_bucket_are_refused_at_construction() {
    let refused = [
        "not a url",
        "",
        "::::",
        "http://",
        "http://127.0.0.1:9/x%20y",
        "http://127.0.0.1:9?x=1",
        "http://127.0.0.1:9#frag",
        "http:127.0.0.1:9",
        "http://127.0.0.1:9\t",
        "http://bücher.local",
        "http://user:secret@127.0.0.1:9",
    ];
    for endpoint in refused {
        match ObjectTier::s3(&loopback_options(endpoint), "ns") {
            Err(TierError::Config(message)) => {
                assert!(message.contains("endpoint"), "{endpoint:?}: {message}")
            }
            other => panic!("{endpoint:?}: expected a configuration error, got {other:?}"),
        }
    }
    let options = loopback_options_for("adv_b!", "http://127.0.0.1:9");
    assert!(matches!(
        ObjectTier::s3(&options, "ns"),
        Err(TierError::Config(message)) if message.contains("bucket name")
    ));
    let options = loopback_options("http://127.0.0.1:9").request_timeout(Duration::MAX);
    assert!(
        ObjectTier::s3(&options, "ns").is_err(),
        "a timeout that would overflow"
    );
    let options = loopback_options("http://127.0.0.1:9").max_retries(u32::MAX as usize);
    assert!(
        ObjectTier::s3(&options, "ns").is_err(),
        "a retry count that would wrap"
    );
    assert!(ObjectTier::s3(&loopback_options("http://127.0.0.1:9"), "ns").is_ok());
}

#[test]
fn a_tier_bounds_its_requests_in_flight_over_all_groups() {
    use common::fake_s3::{FakeS3, Script};
    watchdog(|| {
        let server = FakeS3::start(Script {
            status: 404,
            delay: Duration::from_millis(10),
        });
        let tier = ObjectTier::s3(&loopback_options(&server.endpoint), "ns")
            .unwrap()
            .with_max_in_flight(8)
            .unwrap();
        let config = TokioConfig::default()
            .max_concurrent_groups(16)
            .group_timeout(Some(Duration::from_secs(60)));
        let mut lookup = TokioLookup::tokio(tier, config).unwrap();
        let requests: Vec<String> = (0..16).map(|r| format!("r{r}")).collect();
        for key in 0..512u64 {
            lookup.lookup(&key, &requests[key as usize % 16]);
        }
        assert_eq!(lookup.flush().unwrap(), 512);
        lookup.wait_idle().unwrap();
        for key in 0..512u64 {
            let verdict = lookup.lookup(&key, &requests[key as usize % 16]);
            assert!(verdict.is_miss(), "{key}: {verdict:?}");
        }
        assert_eq!(server.requests(), 512);
        let most = server.most_in_flight();
        assert!(
            (2..=8).contains(&most),
            "{most} requests in flight at once; the tier allows 8"
        );
        lookup.shutdown().unwrap();
    });
}

/// A head that fails with anything but "not found" fails its group, as an
/// I/O error does on the fs tier: the outage shows in the lookup's own
/// counters, not only in the tier's.
#[test]
fn a_failing_store_shows_in_the_lookup_stats_as_backend_errors() {
    use common::fake_s3::{FakeS3, Script};
    watchdog(|| {
        // 403 is not retried, so every head fails at once.
        let server = FakeS3::start(Script {
            status: 403,
            delay: Duration::ZERO,
        });
        let tier = ObjectTier::s3(&loopback_options(&server.endpoint), "ns").unwrap();
        let config = TokioConfig::default().group_timeout(Some(Duration::from_secs(60)));
        let mut lookup = TokioLookup::tokio(tier.clone(), config).unwrap();
        let request = "r".to_string();
        for key in 0..4u64 {
            lookup.lookup(&key, &request);
        }
        lookup.flush().unwrap();
        lookup.wait_idle().unwrap();
        for key in 0..4u64 {
            assert!(lookup.lookup(&key, &request).is_miss(), "{key}");
        }
        let stats = lookup.stats();
        assert_eq!((stats.backend_errors, stats.timeouts), (1, 0));
        assert!(tier.stats().lookup_errors >= 1);
        lookup.shutdown().unwrap();
    });
}

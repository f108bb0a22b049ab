//! Backends: existence checks through the lookup core next to the raw calls
//! the tiers make, over the same blocks, in the same run.
//!
//! A round is what a scheduler step does for `REQUESTS` new requests of
//! `KEYS_PER_REQUEST` keys each (half of them stored): look every key up
//! (all pending), flush, wait until every group is published, look every
//! key up again (now hits and misses, checked against what was stored), and
//! clean the requests up so the next round probes the tier again. Throughput
//! is keys per round, so the medians are the cost of one existence check
//! end to end, waiting for the worker included.
//!
//! - `fs`: an [`FsTier`] in a temporary directory (the file system of the
//!   system temp dir; its dentries are warm after the first round, as in a
//!   server that keeps asking about the same tier). Baselines: a loop of
//!   `std::fs::metadata` over the blocks' paths, computed beforehand, on
//!   one thread and split over two (the tokio driver probes up to four
//!   groups at once on two runtime threads, so it is compared with both).
//! - `object`: an [`ObjectTier`] on object_store's `InMemory`. Baseline: a
//!   loop of `head` calls over the blocks' locations on a current-thread
//!   runtime, the least any object-store lookup does.
//!
//! `cargo bench --bench backends`; `python3 benches/summarize.py fs object`.

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
mod bench {
    use std::hint::black_box;
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::thread;
    use std::time::Duration;

    use criterion::measurement::WallTime;
    use criterion::{BenchmarkGroup, Criterion, Throughput};
    use kvtier::lookup::{AsyncBackend, Prober, ThreadLookup, TokioConfig, TokioLookup};
    use kvtier::{FsTier, Lookup, ObjectTier};
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;
    use object_store::path::Path as ObjectPath;

    const REQUESTS: u64 = 16;
    const KEYS_PER_REQUEST: u64 = 128;
    const KEYS: u64 = REQUESTS * KEYS_PER_REQUEST;

    /// SplitMix64's finaliser, as in `benches/workload`.
    fn mix(mut x: u64) -> u64 {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    }

    fn key_of(request: u64, index: u64) -> u64 {
        mix(request << 16 | index)
    }

    /// Whether the block for `key` is stored (half of them).
    fn stored(key: u64) -> bool {
        mix(key ^ 0x5EED) & 1 == 0
    }

    fn all_keys() -> impl Iterator<Item = u64> {
        (0..REQUESTS).flat_map(|r| (0..KEYS_PER_REQUEST).map(move |i| key_of(r, i)))
    }

    fn stored_count() -> usize {
        all_keys().filter(|&k| stored(k)).count()
    }

    /// A group of rounds of `KEYS` keys: fewer, longer samples than
    /// criterion's default, as a round takes milliseconds.
    fn group<'c>(c: &'c mut Criterion, name: &str) -> BenchmarkGroup<'c, WallTime> {
        let mut group = c.benchmark_group(name);
        group.throughput(Throughput::Elements(KEYS));
        group.sample_size(30);
        group.measurement_time(Duration::from_secs(4));
        group
    }

    /// One round (see the module docs); panics if a verdict is wrong, so a
    /// driver that skipped the backend could not post a figure.
    fn round<P: Prober<u64, u64>>(driver: &mut Lookup<u64, u64, P>) {
        for request in 0..REQUESTS {
            for index in 0..KEYS_PER_REQUEST {
                let verdict = driver.lookup(&key_of(request, index), &request);
                assert!(verdict.is_pending(), "a new key is pending");
            }
        }
        assert_eq!(driver.flush().unwrap(), KEYS as usize);
        driver.wait_idle().unwrap();
        for request in 0..REQUESTS {
            for index in 0..KEYS_PER_REQUEST {
                let key = key_of(request, index);
                let verdict = driver.lookup(&key, &request);
                assert_eq!(verdict.is_hit(), stored(key), "verdict for {key:#x}");
                assert!(!verdict.is_pending());
            }
        }
        for request in 0..REQUESTS {
            driver.cleanup(&request);
        }
    }

    fn fs(c: &mut Criterion) {
        let dir = tempfile::tempdir().expect("temp dir");
        let tier = FsTier::open(dir.path(), "bench").expect("tier");
        for key in all_keys().filter(|&k| stored(k)) {
            tier.store(&key, &[7u8; 64]).expect("store");
        }
        let paths: Vec<PathBuf> = all_keys().map(|k| tier.path_of(&k)).collect();
        let stat = |paths: &[PathBuf]| {
            paths
                .iter()
                .filter(|path| std::fs::metadata(path).is_ok_and(|m| m.is_file()))
                .count()
        };
        assert_eq!(stat(&paths), stored_count());

        let mut group = group(c, "fs");
        group.bench_function("baseline_metadata", |b| b.iter(|| black_box(stat(&paths))));
        group.bench_function("baseline_metadata_2_threads", |b| {
            b.iter(|| {
                let (first, second) = paths.split_at(paths.len() / 2);
                thread::scope(|scope| {
                    let other = scope.spawn(|| stat(second));
                    black_box(stat(first) + other.join().unwrap())
                })
            })
        });
        group.bench_function("tier_path_of", |b| {
            b.iter(|| {
                all_keys()
                    .map(|k| tier.path_of(&k))
                    .filter(|p| p.as_os_str().len() > 3)
                    .count()
            })
        });
        group.bench_function("tier_contains", |b| {
            b.iter(|| all_keys().filter(|k| tier.contains(k).unwrap()).count())
        });
        let mut thread_driver = ThreadLookup::threaded(tier.clone()).expect("worker");
        group.bench_function("kvtier_thread", |b| b.iter(|| round(&mut thread_driver)));
        drop(thread_driver);
        let mut tokio_driver = TokioLookup::tokio(tier.clone(), TokioConfig::default()).unwrap();
        group.bench_function("kvtier_tokio_4_groups", |b| {
            b.iter(|| round(&mut tokio_driver))
        });
        drop(tokio_driver);
        group.finish();
    }

    fn object(c: &mut Criterion) {
        let store = Arc::new(InMemory::new());
        let tier = ObjectTier::new(store.clone(), "bench").expect("tier");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            for key in all_keys().filter(|&k| stored(k)) {
                tier.store(&key, vec![7u8; 64]).await.expect("store");
            }
        });
        let locations: Vec<ObjectPath> = all_keys().map(|k| tier.location_of(&k)).collect();
        let head = |locations: &[ObjectPath]| {
            runtime.block_on(async {
                let mut found = 0;
                for location in locations {
                    found += usize::from(store.head(location).await.is_ok());
                }
                found
            })
        };
        assert_eq!(head(&locations), stored_count());

        let mut group = group(c, "object");
        group.bench_function("baseline_head", |b| b.iter(|| black_box(head(&locations))));
        group.bench_function("tier_location_of", |b| {
            b.iter(|| {
                all_keys()
                    .map(|k| tier.location_of(&k))
                    .filter(|l| l.as_ref().len() > 3)
                    .count()
            })
        });
        group.bench_function("tier_batch_lookup", |b| {
            let keys: Vec<u64> = all_keys().collect();
            b.iter(|| {
                runtime.block_on(async {
                    for group in keys.chunks(KEYS_PER_REQUEST as usize) {
                        black_box(tier.batch_lookup(group, &0u64).await.unwrap());
                    }
                })
            })
        });
        let mut driver = TokioLookup::tokio(tier.clone(), TokioConfig::default()).unwrap();
        group.bench_function("kvtier_tokio_4_groups", |b| b.iter(|| round(&mut driver)));
        drop(driver);
        group.finish();
    }

    criterion::criterion_group!(all, fs, object);
}

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
criterion::criterion_main!(bench::all);

#[cfg(any(kvtier_loom, kvtier_shuttle))]
fn main() {}

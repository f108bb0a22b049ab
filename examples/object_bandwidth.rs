//! Figures for docs/performance.md §15, against a real S3 server
//! (SeaweedFS: `python3 python/integration/seaweed.py start DIR kvtier-bench`
//! prints its endpoint; the test credentials `testing` / `testing`):
//!
//! - load bandwidth of vLLM's transfers on a bucket (kvtier.vllm.ObjectTier's
//!   loads) against a raw GET loop over the same objects at the same
//!   concurrency, alternated, the median of the ratios;
//! - CPU time per GiB loaded, both ways;
//! - a lookup group's answer: concurrent HEADs (what the tier does) against
//!   one LIST of each key's shard prefix and against one LIST of the rank
//!   prefix, with the requests each makes.
//!
//! ```text
//! cargo run --release --example object_bandwidth -- ENDPOINT [BLOCKS] [BLOCK_KIB] [CONCURRENCY] [RUNS]
//! ```

/// The tiers are not built under the model checkers' shims (`--cfg
/// kvtier_loom` / `kvtier_shuttle`): there this example only builds.
#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
mod bench {
    use std::time::{Duration, Instant};

    use futures_util::stream::{self, StreamExt};
    use kvtier::lookup::AsyncBackend;
    use kvtier::tier::{PrimaryRegion, S3Options, TransferKind, VllmObjectLayout, VllmTransfers};
    use object_store::ObjectStoreExt;
    use object_store::path::Path as ObjectPath;

    const BUCKET: &str = "kvtier-bench";

    fn key(n: u64) -> Vec<u8> {
        // Spread over the fan-out as real block hashes are.
        let mut key = n.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes().to_vec();
        key.extend_from_slice(&0u32.to_be_bytes());
        key
    }

    /// User plus system CPU time of this process.
    fn cpu_time() -> Duration {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: getrusage writes a rusage into the pointer it is given.
        let usage = unsafe {
            libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
            usage.assume_init()
        };
        let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
        time(usage.ru_utime) + time(usage.ru_stime)
    }

    fn median(values: &mut [f64]) -> f64 {
        values.sort_by(|a, b| a.total_cmp(b));
        values[values.len() / 2]
    }

    pub fn main() -> Result<(), Box<dyn std::error::Error>> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let endpoint = args
            .first()
            .ok_or("usage: object_bandwidth ENDPOINT [BLOCKS] [BLOCK_KIB] [CONCURRENCY] [RUNS]")?;
        let number = |i: usize, default: usize| args.get(i).map_or(Ok(default), |a| a.parse());
        let (blocks, block_kib, concurrency, runs) = (
            number(1, 512)?,
            number(2, 1024)?,
            number(3, 16)?,
            number(4, 5)?,
        );
        let block = block_kib << 10;
        let options = S3Options::new(BUCKET)
            .endpoint(endpoint.clone())
            .allow_http(true)
            .credentials("testing", "testing")
            .region("us-east-1")
            .request_timeout(Duration::from_secs(30));
        let rank = format!("bench/run_{}_r0", std::process::id());
        let layout = VllmObjectLayout::s3(&options, &rank)?;
        let keys: Vec<Vec<u8>> = (0..blocks as u64).map(key).collect();

        // The blocks, stored once.
        let region = PrimaryRegion::zeroed(blocks, block)?;
        for i in 0..blocks {
            region.write_block(i, &vec![i as u8; block])?;
        }
        let mut writer = VllmTransfers::on_objects(layout.clone(), region, 1, concurrency)?;
        for (i, chunk) in keys.chunks(8).enumerate() {
            let ids: Vec<usize> = (i * 8..i * 8 + chunk.len()).collect();
            writer.submit(TransferKind::Store, i as u64, chunk.to_vec(), &ids)?;
        }
        writer.wait_idle();
        assert!(
            writer.finished().iter().all(|job| job.succeeded()),
            "the blocks were stored"
        );
        drop(writer);

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let locations: Vec<ObjectPath> = keys
            .iter()
            .map(|k| layout.location_of(k))
            .collect::<Result<_, _>>()?;
        let gib = (blocks * block) as f64 / (1u64 << 30) as f64;
        let (mut ratios, mut ours_cpu, mut raw_cpu, mut ours_rate, mut raw_rate) =
            (vec![], vec![], vec![], vec![], vec![]);
        let mut loader = VllmTransfers::on_objects(
            layout.clone(),
            PrimaryRegion::zeroed(blocks, block)?,
            concurrency,
            0,
        )?;
        for run in 0..runs {
            // A raw GET loop: `concurrency` requests in flight, bodies collected.
            let (cpu, started) = (cpu_time(), Instant::now());
            let store = layout.store().clone();
            let got: usize = runtime.block_on(async {
                stream::iter(&locations)
                    .map(|location| {
                        let store = store.clone();
                        async move {
                            store
                                .get(location)
                                .await
                                .unwrap()
                                .bytes()
                                .await
                                .unwrap()
                                .len()
                        }
                    })
                    .buffer_unordered(concurrency)
                    .fold(0, |total, n| async move { total + n })
                    .await
            });
            assert_eq!(got, blocks * block);
            let raw = started.elapsed();
            raw_cpu.push((cpu_time() - cpu).as_secs_f64() / gib);

            // kvtier: load jobs of 8 blocks on `concurrency` I/O threads.
            let (cpu, started) = (cpu_time(), Instant::now());
            for (i, chunk) in keys.chunks(8).enumerate() {
                let ids: Vec<usize> = (i * 8..i * 8 + chunk.len()).collect();
                loader.submit(
                    TransferKind::Load,
                    (run * blocks + i) as u64,
                    chunk.to_vec(),
                    &ids,
                )?;
            }
            loader.wait_idle();
            assert!(
                loader.finished().iter().all(|job| job.succeeded()),
                "every load succeeded"
            );
            let ours = started.elapsed();
            ours_cpu.push((cpu_time() - cpu).as_secs_f64() / gib);
            ratios.push(raw.as_secs_f64() / ours.as_secs_f64());
            ours_rate.push(gib / ours.as_secs_f64());
            raw_rate.push(gib / raw.as_secs_f64());
        }
        println!(
            "load bandwidth: kvtier {:.2} GiB/s, raw GET loop {:.2} GiB/s, kvtier/raw median {:.2} ({blocks} blocks of {block_kib} KiB, {concurrency} in flight, {runs} runs)",
            median(&mut ours_rate),
            median(&mut raw_rate),
            median(&mut ratios)
        );
        println!(
            "CPU time per GiB loaded: kvtier {:.3} s, raw GET loop {:.3} s (medians)",
            median(&mut ours_cpu),
            median(&mut raw_cpu)
        );

        // A lookup group of 18 keys (a 576-token prompt): concurrent HEADs
        // against LISTs of each key's shard prefix, and one LIST of the rank.
        let group: Vec<Vec<u8>> = keys[..18.min(blocks)].to_vec();
        let (mut heads, mut shard_lists, mut rank_lists) = (vec![], vec![], vec![]);
        for _ in 0..runs * 4 {
            let started = Instant::now();
            let answers = runtime.block_on(AsyncBackend::batch_lookup(&layout, &group, &()))?;
            assert!(answers.iter().all(|&found| found));
            heads.push(started.elapsed().as_secs_f64() * 1e3);

            let started = Instant::now();
            let store = layout.store().clone();
            let shards: Vec<ObjectPath> = group
                .iter()
                .map(|k| {
                    let location = layout.location_of(k).unwrap();
                    let (shard, _) = location.as_ref().rsplit_once('/').unwrap();
                    ObjectPath::from(shard)
                })
                .collect();
            let found: usize = runtime.block_on(async {
                stream::iter(&shards)
                    .map(|shard| {
                        let store = store.clone();
                        async move {
                            store
                                .list_with_delimiter(Some(shard))
                                .await
                                .unwrap()
                                .objects
                                .len()
                        }
                    })
                    .buffer_unordered(32)
                    .fold(0, |total, n| async move { total + n })
                    .await
            });
            assert!(found >= group.len());
            shard_lists.push(started.elapsed().as_secs_f64() * 1e3);

            let started = Instant::now();
            let rank_prefix = ObjectPath::from(rank.as_str());
            let listed = runtime.block_on(async {
                store
                    .list(Some(&rank_prefix))
                    .fold(0usize, |n, _| async move { n + 1 })
                    .await
            });
            assert_eq!(listed, blocks);
            rank_lists.push(started.elapsed().as_secs_f64() * 1e3);
        }
        println!(
            "a group of {} keys: concurrent HEADs {:.2} ms ({} requests), LIST per shard {:.2} ms ({} requests), LIST of the rank {:.2} ms ({} pages for {blocks} objects) (medians)",
            group.len(),
            median(&mut heads),
            group.len(),
            median(&mut shard_lists),
            group.len(),
            median(&mut rank_lists),
            blocks.div_ceil(1000)
        );
        println!("HEADs counted by the layout: {}", layout.stats().heads);
        loader.shutdown(Duration::ZERO);
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    #[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
    bench::main()?;
    Ok(())
}

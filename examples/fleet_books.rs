//! Figures for docs/performance.md §16, on a real S3 server (SeaweedFS:
//! `python3 python/integration/seaweed.py start DIR kvtier-bench`) and a
//! real Valkey (`python3 python/integration/valkey.py start DIR`):
//!
//! - a lookup group of `GROUP` keys answered by the fleet's books (one
//!   script call) against the same group by concurrent `HEAD`s, alternated,
//!   medians and the median of the ratios;
//! - round trips per lookup group, from the server's own command
//!   statistics (`INFO commandstats`: `evalsha` calls before and after);
//! - a store's books steps (reserve, then commit) against its `PUT` of one
//!   block, medians.
//!
//! ```text
//! cargo run --release --features fleet --example fleet_books -- S3_ENDPOINT VALKEY_URL [GROUP] [RUNS] [BLOCK_KIB]
//! ```

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
mod bench {
    use std::time::{Duration, Instant};

    use kvtier::lookup::AsyncBackend;
    use kvtier::tier::fleet::{Admission, FleetBooks, FleetBudget, IndexTimeouts};
    use kvtier::tier::{S3Options, VllmObjectLayout};
    use object_store::ObjectStoreExt;

    const BUCKET: &str = "kvtier-bench";

    fn key(n: u64) -> Vec<u8> {
        let mut key = n.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes().to_vec();
        key.extend_from_slice(&0u32.to_be_bytes());
        key
    }

    fn median(values: &mut [f64]) -> f64 {
        values.sort_by(|a, b| a.total_cmp(b));
        values[values.len() / 2]
    }

    /// `evalsha` calls the server has answered so far.
    async fn evalsha_calls(url: &str) -> Result<u64, Box<dyn std::error::Error>> {
        let client = redis::Client::open(url)?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await?;
        Ok(info
            .lines()
            .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .and_then(|calls| calls.parse().ok())
            .unwrap_or(0))
    }

    pub fn main() -> Result<(), Box<dyn std::error::Error>> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let usage = "usage: fleet_books S3_ENDPOINT VALKEY_URL [GROUP] [RUNS] [BLOCK_KIB]";
        let (endpoint, valkey) = (args.first().ok_or(usage)?, args.get(1).ok_or(usage)?);
        let number = |i: usize, default: usize| args.get(i).map_or(Ok(default), |a| a.parse());
        let (group, runs, block_kib) = (number(2, 32)?, number(3, 200)?, number(4, 256)?);
        let block = block_kib << 10;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let options = S3Options::new(BUCKET)
            .endpoint(endpoint.clone())
            .allow_http(true)
            .credentials("testing", "testing")
            .region("us-east-1")
            .request_timeout(Duration::from_secs(30));
        let rank = format!("bench/fleet_{}_r0", std::process::id());
        let heads = VllmObjectLayout::s3(&options, &rank)?;
        let store = heads.store().clone();
        let namespace = format!("{}/{rank}", heads.store());
        runtime.block_on(async {
            let books = FleetBooks::connect(valkey, &namespace, IndexTimeouts::default()).await?;
            let fleet = FleetBudget::open(books, 1 << 40, Duration::from_secs(30)).await;
            let prefix = object_store::path::Path::from(rank.as_str());
            fleet.maintain(&*store, &prefix, |_| true).await?;
            let indexed = VllmObjectLayout::s3(&options, &rank)?.with_index(fleet.clone());
            let keys: Vec<Vec<u8>> = (0..group as u64).map(key).collect();
            // The group's blocks, stored through the books; the store's
            // steps and its PUT timed apart.
            let (mut books_steps, mut puts) = (Vec::new(), Vec::new());
            for n in 0..runs.max(group) as u64 {
                let location = heads.location_of(&key(n))?;
                let started = Instant::now();
                let Admission::Write(write) = fleet.admit(&*store, &location, block as u64).await?
                else {
                    continue;
                };
                let reserved = started.elapsed();
                let started = Instant::now();
                store.put(&location, vec![n as u8; block].into()).await?;
                puts.push(started.elapsed().as_secs_f64() * 1e3);
                let started = Instant::now();
                write.commit(&*store).await?;
                books_steps.push((reserved + started.elapsed()).as_secs_f64() * 1e3);
            }
            // Lookups: the books against HEADs, alternated.
            let (mut by_books, mut by_heads, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            let calls_before = evalsha_calls(valkey).await?;
            for _ in 0..runs {
                let started = Instant::now();
                let found = indexed.batch_lookup(&keys, &()).await?;
                let books_ms = started.elapsed().as_secs_f64() * 1e3;
                assert!(found.iter().all(|hit| *hit));
                let started = Instant::now();
                let found = heads.batch_lookup(&keys, &()).await?;
                let heads_ms = started.elapsed().as_secs_f64() * 1e3;
                assert!(found.iter().all(|hit| *hit));
                by_books.push(books_ms);
                by_heads.push(heads_ms);
                ratios.push(heads_ms / books_ms);
            }
            let calls = evalsha_calls(valkey).await? - calls_before;
            println!(
                "lookup group of {group} keys, {runs} runs: books {:.3} ms, HEADs {:.3} ms (median), \
                 HEADs / books median ratio {:.1}x",
                median(&mut by_books),
                median(&mut by_heads),
                median(&mut ratios)
            );
            println!(
                "round trips per lookup group: {:.2} evalsha (server's commandstats), {} HEADs",
                calls as f64 / runs as f64,
                group
            );
            println!(
                "a store of {block_kib} KiB: reserve + commit {:.3} ms, PUT {:.3} ms (medians of {}), \
                 books steps / PUT {:.2}",
                median(&mut books_steps),
                median(&mut puts),
                puts.len(),
                median(&mut books_steps) / median(&mut puts)
            );
            Ok::<(), Box<dyn std::error::Error>>(())
        })
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    #[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
    bench::main()?;
    Ok(())
}

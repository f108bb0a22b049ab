//! Scale: memory per tracked key (counting allocator), the longest single
//! step (a flush of 10^5 new keys), and the per-lookup cost from 10^3 to
//! 10^6 tracked keys next to bare hash-map probes of the same sizes.
//!
//! `cargo bench --bench scale`. Memory and the flush stall are printed
//! first (they are not times per iteration, so criterion does not measure
//! them); the per-size lookups are criterion benches in group `scale`.

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
mod workload;

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
mod bench {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::collections::HashMap as StdMap;
    use std::hint::black_box;
    use std::sync::atomic::{AtomicIsize, Ordering};
    use std::time::{Duration, Instant};

    use criterion::{BenchmarkId, Criterion, Throughput};
    use hashbrown::HashMap as FoldMap;
    use kvtier::{Request, lookup::LookupTable, lookup::ThreadLookup};

    use super::workload::mix;

    /// Counts the bytes currently allocated by the whole process.
    pub struct Counting;

    static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

    // SAFETY: every call is forwarded unchanged to the system allocator; the
    // counter is only bookkeeping.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
            // SAFETY: same contract as ours.
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
            // SAFETY: same contract as ours.
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
            // SAFETY: same contract as ours.
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            LIVE_BYTES.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
            // SAFETY: same contract as ours.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    fn live_bytes() -> isize {
        LIVE_BYTES.load(Ordering::Relaxed)
    }

    const KEYS_PER_REQUEST: usize = 128;

    /// A table tracking `n` resolved keys, 128 per request, built through
    /// the public API (lookup, flush, answer, apply).
    fn resolved_table<K, R>(
        n: usize,
        key: impl Fn(usize) -> K,
        request: impl Fn(usize) -> R,
    ) -> LookupTable<K, R>
    where
        K: Eq + std::hash::Hash + Clone,
        R: Request,
    {
        let mut table = LookupTable::new();
        for i in 0..n {
            table.lookup(&key(i), &request(i / KEYS_PER_REQUEST));
        }
        let submission = table.take_submission().expect("new keys");
        for group in submission.into_groups() {
            let found: Vec<bool> = (0..group.len()).map(|i| i % 2 == 0).collect();
            table.apply(group.answered(found));
        }
        table
    }

    fn memory_row<K, R>(
        label: &str,
        n: usize,
        key: impl Fn(usize) -> K,
        request: impl Fn(usize) -> R,
    ) where
        K: Eq + std::hash::Hash + Clone,
        R: Request,
    {
        let before = live_bytes();
        let table = resolved_table(n, key, request);
        let bytes = (live_bytes() - before) as f64;
        let requests = n.div_ceil(KEYS_PER_REQUEST);
        let per_key = bytes / n as f64;
        let key_size = size_of::<K>() as f64;
        let ids = (requests * size_of::<R::Id>()) as f64 / n as f64;
        println!(
            "| {label} | {n} | {per_key:.1} B | {key_size} B | {ids:.2} B | {:.1} B |",
            per_key - key_size - ids
        );
        assert_eq!(table.len(), n);
        drop(table);
    }

    fn memory() {
        println!("memory per tracked key (resolved, one requester per key, 128 keys per request)");
        println!(
            "| keys / request ids | keys | bytes per key | key | request ids per key | beyond key and ids |"
        );
        println!("|---|---|---|---|---|---|");
        for n in [1_000, 10_000, 100_000, 1_000_000] {
            memory_row("u64 / u64", n, |i| mix(i as u64), |r| r as u64);
        }
        memory_row(
            "[u8; 32] / String",
            1_000_000,
            |i| {
                let mut key = [0u8; 32];
                key[..8].copy_from_slice(&mix(i as u64).to_le_bytes());
                key
            },
            |r| format!("request-{r:08}"),
        );
    }

    /// A step that looks up 10^5 new keys and flushes them to the worker,
    /// on the threaded driver; the flush is the longest single call.
    fn longest_step() {
        const NEW: u64 = 100_000;
        const ROUNDS: u64 = 11;
        let backend = |keys: &[u64], _: &u64| keys.iter().map(|k| k % 2 == 0).collect();
        let mut lookup = ThreadLookup::threaded(backend).expect("worker thread");
        let (mut flushes, mut lookups, mut cleanups) = (vec![], vec![], vec![]);
        for round in 0..ROUNDS {
            let base = round * NEW;
            let start = Instant::now();
            for key in base..base + NEW {
                black_box(lookup.lookup(&mix(key), &(key / 128)));
            }
            lookups.push(start.elapsed());
            let start = Instant::now();
            lookup.flush().expect("open");
            flushes.push(start.elapsed());
            lookup.wait_idle().expect("open");
            let start = Instant::now();
            for request in base / 128..(base + NEW).div_ceil(128) {
                lookup.cleanup(&request);
            }
            cleanups.push(start.elapsed());
        }
        let show = |name: &str, mut values: Vec<Duration>| {
            values.sort();
            println!(
                "| {name} | {:.2} ms | {:.2} ms | {:.2} ms |",
                values[values.len() / 2].as_secs_f64() * 1e3,
                values[0].as_secs_f64() * 1e3,
                values[values.len() - 1].as_secs_f64() * 1e3
            );
        };
        println!("\nlongest step: 10^5 new keys (782 requests) on ThreadLookup, {ROUNDS} rounds");
        println!("| call | median | min | max |");
        println!("|---|---|---|---|");
        show("flush (one call)", flushes);
        show("10^5 lookups (sum of calls)", lookups);
        show("cleanup of 782 requests (sum of calls)", cleanups);
        lookup.shutdown().expect("clean shutdown");
    }

    const PROBES: usize = 1024;

    fn per_op(c: &mut Criterion) {
        let mut group = c.benchmark_group("scale");
        group.throughput(Throughput::Elements(PROBES as u64));
        for n in [1_000usize, 10_000, 100_000, 1_000_000] {
            let key = |i: usize| mix(i as u64);
            // Eight requests picked across the table, each asking for its
            // 128 keys in order, as a scheduler does.
            let requests = n / KEYS_PER_REQUEST;
            let probes: Vec<(u64, u64)> = (0..PROBES / KEYS_PER_REQUEST)
                .flat_map(|r| {
                    let request = mix(r as u64 ^ 0xABCD) as usize % requests.max(1);
                    (0..KEYS_PER_REQUEST).map(move |i| {
                        let index = (request * KEYS_PER_REQUEST + i) % n;
                        (key(index), (index / KEYS_PER_REQUEST) as u64)
                    })
                })
                .collect();
            let mut table = resolved_table(n, key, |r| r as u64);
            group.bench_with_input(BenchmarkId::new("lookup_known", n), &n, |b, _| {
                b.iter(|| {
                    for (key, request) in &probes {
                        black_box(table.lookup(key, request).is_hit());
                    }
                })
            });
            drop(table);
            let std_map: StdMap<u64, bool> = (0..n).map(|i| (key(i), i % 2 == 0)).collect();
            group.bench_with_input(BenchmarkId::new("baseline_std_hashmap", n), &n, |b, _| {
                b.iter(|| {
                    for (key, _) in &probes {
                        black_box(std_map.get(key));
                    }
                })
            });
            drop(std_map);
            let fold_map: FoldMap<u64, bool> = (0..n).map(|i| (key(i), i % 2 == 0)).collect();
            group.bench_with_input(
                BenchmarkId::new("baseline_hashbrown_foldhash", n),
                &n,
                |b, _| {
                    b.iter(|| {
                        for (key, _) in &probes {
                            black_box(fold_map.get(key));
                        }
                    })
                },
            );
        }
        group.finish();
    }

    pub fn main() {
        memory();
        longest_step();
        let mut criterion = Criterion::default().configure_from_args();
        per_op(&mut criterion);
        criterion.final_summary();
    }
}

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
#[global_allocator]
static ALLOCATOR: bench::Counting = bench::Counting;

fn main() {
    #[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
    bench::main();
}

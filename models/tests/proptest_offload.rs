//! proptest: the KV copier against a byte-level reference. For any layout
//! (tensors with padded rows on both sides, groups of layers, several blocks
//! per chunk) and any job (groups of any size, starting anywhere inside a
//! chunk), a store writes exactly the bytes the reference says, and nothing
//! else in the region; a load of them back into other engine blocks gives
//! each layer's bytes back and leaves the rest of the engine untouched; a
//! job that names an id outside the memory is refused and touches nothing.
//!
//! The reference places a block by its position in its request: position
//! `p` of a group whose first block is at `b0` lives in the group's
//! `p / n - b0 / n`-th chunk, at slot `p % n` (`n` blocks per chunk).
//!
//! Run: `cargo test -p kvtier-models --release --test proptest_offload`.
#![cfg(not(any(kvtier_loom, kvtier_shuttle)))]

use kvtier::offload::{
    BlockCopier, CacheTensor, CopyLayout, Direction, Extent, LayerRef, Transfer,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct Shape {
    /// Per tensor: page bytes, engine row padding, offload row padding.
    tensors: Vec<(usize, usize, usize)>,
    /// Per group: (tensor, bytes cut from its page) per layer.
    groups: Vec<Vec<(usize, usize)>>,
    per_chunk: usize,
    engine_rows: usize,
    chunks: usize,
}

#[derive(Clone, Debug)]
struct Job {
    /// Per group: blocks, index of the first in its request.
    groups: Vec<(usize, usize)>,
    /// Seeds for choosing distinct block and chunk ids.
    seed: u64,
}

fn shapes() -> impl Strategy<Value = Shape> {
    (1usize..4, 1usize..4, 1usize..4).prop_flat_map(|(tensors, groups, per_chunk)| {
        (
            prop::collection::vec((1usize..40, 0usize..9, 0usize..9), tensors),
            prop::collection::vec(prop::collection::vec((0..tensors, 0usize..4), 1..3), groups),
            Just(per_chunk),
            12usize..20,
            12usize..20,
        )
            .prop_map(|(tensors, groups, per_chunk, engine_rows, chunks)| Shape {
                tensors,
                groups,
                per_chunk,
                engine_rows,
                chunks,
            })
    })
}

fn jobs(groups: usize) -> impl Strategy<Value = Job> {
    (
        prop::collection::vec((0usize..4, 0usize..9), groups),
        any::<u64>(),
    )
        .prop_map(|(groups, seed)| Job { groups, seed })
}

/// `count` distinct ids below `limit`, chosen by `seed`.
fn distinct(count: usize, limit: usize, seed: u64) -> Vec<i64> {
    let mut ids: Vec<i64> = (0..limit as i64).collect();
    let mut state = seed | 1;
    for i in (1..ids.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ids.swap(i, (state % (i as u64 + 1)) as usize);
    }
    ids.truncate(count);
    ids
}

struct Memory {
    engine: Vec<Vec<u8>>,
    region: Vec<u8>,
    /// Per tensor: where its offload rows start in `region`.
    offsets: Vec<usize>,
    region_stride: usize,
}

impl Shape {
    fn engine_stride(&self, t: usize) -> usize {
        self.tensors[t].0 + self.tensors[t].1
    }

    fn chunk_bytes(&self, t: usize) -> usize {
        self.tensors[t].0 * self.per_chunk
    }

    fn memory(&self, seed: u8) -> Memory {
        let engine = (0..self.tensors.len())
            .map(|t| {
                (0..self.engine_rows * self.engine_stride(t))
                    .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
                    .collect()
            })
            .collect();
        // The tensors' chunks side by side in one row, then padding: as an
        // offload region lays out one worker's tensors.
        let mut offsets = Vec::new();
        let mut row = 0;
        for (t, &(_, _, pad)) in self.tensors.iter().enumerate() {
            offsets.push(row);
            row += self.chunk_bytes(t) + pad;
        }
        Memory {
            engine,
            region: vec![0; self.chunks * row],
            offsets,
            region_stride: row,
        }
    }

    fn layout(&self, memory: &mut Memory) -> CopyLayout {
        let base = memory.region.as_mut_ptr() as usize;
        let tensors = (0..self.tensors.len())
            .map(|t| CacheTensor {
                engine: Extent {
                    base: memory.engine[t].as_mut_ptr() as usize,
                    rows: self.engine_rows,
                    stride: self.engine_stride(t),
                },
                offload: Extent {
                    base: base + memory.offsets[t],
                    rows: self.chunks,
                    stride: memory.region_stride,
                },
                page: self.tensors[t].0,
            })
            .collect();
        let groups = self
            .groups
            .iter()
            .map(|layers| {
                layers
                    .iter()
                    .map(|&(tensor, cut)| LayerRef {
                        tensor,
                        bytes: self.tensors[tensor].0.saturating_sub(cut).max(1),
                    })
                    .collect()
            })
            .collect();
        CopyLayout::new(tensors, groups, self.per_chunk).expect("a valid layout")
    }
}

/// The ids of a job: engine blocks and chunks, group after group.
fn ids(shape: &Shape, job: &Job, seed: u64) -> (Vec<i64>, Vec<i64>) {
    let blocks: usize = job.groups.iter().map(|g| g.0).sum();
    let chunks: usize = job
        .groups
        .iter()
        .filter(|g| g.0 > 0)
        .map(|&(count, first)| (first + count - 1) / shape.per_chunk - first / shape.per_chunk + 1)
        .sum();
    (
        distinct(blocks, shape.engine_rows, seed),
        distinct(chunks, shape.chunks, seed.rotate_left(17)),
    )
}

/// Every (tensor, engine byte offset, region byte offset, len) the job
/// copies, by the reference's rule.
fn reference(
    shape: &Shape,
    memory: &Memory,
    job: &Job,
    blocks: &[i64],
    chunks: &[i64],
) -> Vec<(usize, usize, usize, usize)> {
    let mut out = Vec::new();
    let (mut block_at, mut chunk_at) = (0, 0);
    for (g, &(count, first)) in job.groups.iter().enumerate() {
        if count == 0 {
            continue;
        }
        let n = shape.per_chunk;
        for &(tensor, cut) in &shape.groups[g] {
            let page = shape.tensors[tensor].0;
            let len = page.saturating_sub(cut).max(1);
            for i in 0..count {
                let position = first + i;
                let chunk = chunks[chunk_at + position / n - first / n] as usize;
                let block = blocks[block_at + i] as usize;
                out.push((
                    tensor,
                    block * shape.engine_stride(tensor),
                    chunk * memory.region_stride + memory.offsets[tensor] + (position % n) * page,
                    len,
                ));
            }
        }
        block_at += count;
        chunk_at += (first + count - 1) / n - first / n + 1;
    }
    out
}

fn transfer<'a>(
    job: &Job,
    blocks: &'a [i64],
    chunks: &'a [i64],
    sizes: &'a mut Vec<usize>,
    firsts: &'a mut Vec<usize>,
) -> Transfer<'a> {
    *sizes = job.groups.iter().map(|g| g.0).collect();
    *firsts = job.groups.iter().map(|g| g.1).collect();
    Transfer {
        engine_blocks: blocks,
        chunks,
        group_sizes: sizes,
        block_indices: firsts,
    }
}

fn run(copier: &mut BlockCopier, direction: Direction, id: u64, transfer: &Transfer<'_>) -> usize {
    let bytes = copier.submit(direction, id, transfer).expect("submitted");
    copier.wait(&[id]);
    let finished = copier.finished();
    assert_eq!(finished.len(), 1);
    assert!(finished[0].succeeded && finished[0].bytes == bytes);
    bytes
}

proptest! {
    #[test]
    fn stores_and_loads_move_exactly_the_reference_bytes(
        (shape, job) in shapes().prop_flat_map(|shape| {
            let groups = shape.groups.len();
            (Just(shape), jobs(groups))
        })
    ) {
        let mut memory = shape.memory(7);
        let engine_before = memory.engine.clone();
        let layout = shape.layout(&mut memory);
        // SAFETY: `memory` outlives the copier (shut down below), and only
        // the copier touches it while jobs run.
        let mut copier = unsafe { BlockCopier::new(layout, 2, Box::new(())) }.unwrap();
        let (blocks, chunks) = ids(&shape, &job, job.seed);
        let (mut sizes, mut firsts) = (Vec::new(), Vec::new());
        let store = transfer(&job, &blocks, &chunks, &mut sizes, &mut firsts);
        let expected = reference(&shape, &memory, &job, &blocks, &chunks);
        let bytes = run(&mut copier, Direction::Store, 1, &store);
        prop_assert_eq!(bytes, expected.iter().map(|e| e.3).sum::<usize>());

        let mut region = vec![0u8; memory.region.len()];
        for &(tensor, engine, offload, len) in &expected {
            region[offload..offload + len]
                .copy_from_slice(&engine_before[tensor][engine..engine + len]);
        }
        prop_assert!(region == memory.region, "the store wrote other bytes than the reference");

        // Load them back into other blocks of a zeroed engine.
        for tensor in &mut memory.engine {
            tensor.fill(0);
        }
        let (targets, _) = ids(&shape, &job, job.seed.wrapping_mul(3) ^ 5);
        let load = Transfer { engine_blocks: &targets, ..store };
        run(&mut copier, Direction::Load, 2, &load);
        let mut engine: Vec<Vec<u8>> = memory.engine.iter().map(|t| vec![0; t.len()]).collect();
        for &(tensor, engine_at, offload, len) in &reference(&shape, &memory, &job, &targets, &chunks) {
            engine[tensor][engine_at..engine_at + len]
                .copy_from_slice(&region[offload..offload + len]);
        }
        prop_assert!(engine == memory.engine, "the load wrote other bytes than the reference");

        // An id one past the end, anywhere in the job, is refused whole.
        if !blocks.is_empty() {
            let mut bad = blocks.clone();
            let at = (job.seed as usize) % bad.len();
            bad[at] = shape.engine_rows as i64;
            let refused = Transfer { engine_blocks: &bad, ..store };
            let before = memory.region.clone();
            prop_assert!(copier.submit(Direction::Store, 3, &refused).is_err());
            prop_assert_eq!(copier.in_flight(), 0);
            prop_assert!(before == memory.region);
        }
        copier.shutdown();
    }
}

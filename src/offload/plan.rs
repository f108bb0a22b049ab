//! Where every byte of a KV transfer goes: the copies that move a job's
//! blocks between an engine's KV cache and an offload region, worked out
//! from the job's block ids alone, with no memory touched.
//!
//! The engine keeps each KV-cache tensor as rows of one block (a *page*);
//! the offload region keeps it as rows of one *chunk*: `blocks_per_chunk`
//! pages side by side. A KV-cache group is a set of layers, each reading
//! one tensor. A job names, per group, how many engine blocks it moves and
//! the index of the first of them inside its request: a first block that
//! does not start a chunk starts inside one, so the job's first chunk is
//! entered at that offset. Everything is checked against the memory's
//! extents before a single copy is planned: a job that would reach outside
//! them is refused, not half-done.

use std::fmt;

/// Rows of equal stride at an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// The first row's address.
    pub base: usize,
    /// How many rows.
    pub rows: usize,
    /// Bytes from one row to the next.
    pub stride: usize,
}

impl Extent {
    /// The address of `offset` bytes into row `row`, if that row exists.
    fn at(&self, row: i64, offset: usize) -> Option<usize> {
        let row = usize::try_from(row).ok().filter(|&row| row < self.rows)?;
        self.base.checked_add(row * self.stride + offset)
    }

    /// The bytes from the first row to the end of the last one: `len`-byte
    /// rows at each stride.
    fn span(&self, len: usize) -> Option<usize> {
        match self.rows {
            0 => Some(0),
            rows => (rows - 1).checked_mul(self.stride)?.checked_add(len),
        }
    }
}

/// One KV-cache tensor, on both sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheTensor {
    /// The engine's rows: one block each.
    pub engine: Extent,
    /// The offload region's rows: one chunk each.
    pub offload: Extent,
    /// Bytes of one block's page (with any padding): the engine's row
    /// length, and the offset from one block to the next inside a chunk.
    pub page: usize,
}

/// A layer (or a set of layers sharing one tensor) of a KV-cache group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerRef {
    /// Index into the layout's tensors.
    pub tensor: usize,
    /// Bytes of a block's page the layer uses (its page without padding).
    pub bytes: usize,
}

/// Which way a job moves its blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Engine → offload region.
    Store,
    /// Offload region → engine.
    Load,
}

/// One copy: `len` bytes between an engine address and an offload address,
/// in the job's direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copy {
    /// Address in the engine's KV cache.
    pub engine: usize,
    /// Address in the offload region.
    pub offload: usize,
    /// Bytes.
    pub len: usize,
}

/// A job's blocks, as the engine names them.
#[derive(Clone, Copy, Debug)]
pub struct Transfer<'a> {
    /// Engine block ids, group after group.
    pub engine_blocks: &'a [i64],
    /// Offload chunk ids, group after group.
    pub chunks: &'a [i64],
    /// Engine blocks of each group (one entry per group of the layout).
    pub group_sizes: &'a [usize],
    /// Per group, the index inside its request of the group's first block.
    pub block_indices: &'a [usize],
}

/// Why a layout or a job was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// The layout does not describe memory a copy can stay inside.
    #[error("the KV copy layout is not valid: {0}")]
    Layout(String),
    /// A job's block ids do not fit the layout.
    #[error("the KV transfer does not fit the layout: {0}")]
    Transfer(String),
}

fn layout_error(message: impl fmt::Display) -> PlanError {
    PlanError::Layout(message.to_string())
}

fn transfer_error(message: impl fmt::Display) -> PlanError {
    PlanError::Transfer(message.to_string())
}

/// The KV-cache tensors and groups of one engine worker, and how many
/// blocks a chunk holds (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyLayout {
    tensors: Vec<CacheTensor>,
    groups: Vec<Vec<LayerRef>>,
    blocks_per_chunk: usize,
}

impl CopyLayout {
    /// Checks that every page fits its engine row and every chunk its
    /// offload row, and that no row reaches past the end of the address
    /// space.
    pub fn new(
        tensors: Vec<CacheTensor>,
        groups: Vec<Vec<LayerRef>>,
        blocks_per_chunk: usize,
    ) -> Result<Self, PlanError> {
        if blocks_per_chunk == 0 {
            return Err(layout_error("a chunk holds at least one block"));
        }
        for (i, tensor) in tensors.iter().enumerate() {
            let chunk = tensor
                .page
                .checked_mul(blocks_per_chunk)
                .ok_or_else(|| layout_error(format!("tensor {i}'s chunk overflows")))?;
            // guard: C1-pages-fit-their-rows
            if tensor.page == 0
                || tensor.engine.stride < tensor.page
                || tensor.offload.stride < chunk
            {
                return Err(layout_error(format!(
                    "tensor {i}: a {}-byte page does not fit an engine row of {} bytes, or \
                     {blocks_per_chunk} of them an offload row of {} bytes",
                    tensor.page, tensor.engine.stride, tensor.offload.stride
                )));
            }
            let ends = [(tensor.engine, tensor.page), (tensor.offload, chunk)]
                .iter()
                .all(|(extent, len)| {
                    extent
                        .span(*len)
                        .and_then(|span| extent.base.checked_add(span))
                        .is_some()
                });
            if !ends || tensor.engine.base == 0 || tensor.offload.base == 0 {
                return Err(layout_error(format!(
                    "tensor {i}'s rows do not lie in memory"
                )));
            }
        }
        for (g, layers) in groups.iter().enumerate() {
            for layer in layers {
                let Some(tensor) = tensors.get(layer.tensor) else {
                    return Err(layout_error(format!(
                        "group {g} names tensor {} of {}",
                        layer.tensor,
                        tensors.len()
                    )));
                };
                // guard: C1-layers-fit-their-pages
                if layer.bytes > tensor.page {
                    return Err(layout_error(format!(
                        "group {g} copies {} bytes of tensor {}'s {}-byte pages",
                        layer.bytes, layer.tensor, tensor.page
                    )));
                }
            }
        }
        Ok(Self {
            tensors,
            groups,
            blocks_per_chunk,
        })
    }

    /// The KV-cache groups.
    pub fn groups(&self) -> usize {
        self.groups.len()
    }

    /// Blocks per chunk.
    pub fn blocks_per_chunk(&self) -> usize {
        self.blocks_per_chunk
    }

    /// Appends the copies of `transfer` to `copies` and returns their bytes;
    /// on a refusal `copies` is left as it was.
    pub fn plan(
        &self,
        transfer: &Transfer<'_>,
        copies: &mut Vec<Copy>,
    ) -> Result<usize, PlanError> {
        let start = copies.len();
        let planned = self.plan_into(transfer, copies);
        if planned.is_err() {
            copies.truncate(start);
        }
        planned
    }

    fn plan_into(
        &self,
        transfer: &Transfer<'_>,
        copies: &mut Vec<Copy>,
    ) -> Result<usize, PlanError> {
        let groups = self.groups.len();
        if transfer.group_sizes.len() != groups || transfer.block_indices.len() != groups {
            return Err(transfer_error(format!(
                "{} group sizes and {} block indices for {groups} KV-cache groups",
                transfer.group_sizes.len(),
                transfer.block_indices.len()
            )));
        }
        let per_chunk = self.blocks_per_chunk;
        let (mut next_block, mut next_chunk, mut bytes) = (0usize, 0usize, 0usize);
        for (g, layers) in self.groups.iter().enumerate() {
            let count = transfer.group_sizes[g];
            if count == 0 {
                continue;
            }
            // The group's first block sits `skip` blocks into its chunk.
            // guard: C2-a-group-enters-its-first-chunk-at-its-offset
            let skip = transfer.block_indices[g] % per_chunk;
            let chunks_used = (skip + count).div_ceil(per_chunk);
            let blocks = transfer
                .engine_blocks
                .get(next_block..next_block + count)
                .ok_or_else(|| {
                    transfer_error(format!(
                        "{} engine blocks for groups that need more",
                        transfer.engine_blocks.len()
                    ))
                })?;
            let chunks = transfer
                .chunks
                .get(next_chunk..next_chunk + chunks_used)
                .ok_or_else(|| {
                    transfer_error(format!(
                        "{} offload chunks for groups that need more",
                        transfer.chunks.len()
                    ))
                })?;
            for layer in layers {
                let tensor = &self.tensors[layer.tensor];
                for (i, &block) in blocks.iter().enumerate() {
                    let slot = skip + i;
                    // guard: C3-every-copy-stays-in-its-rows
                    let engine = tensor.engine.at(block, 0).ok_or_else(|| {
                        transfer_error(format!(
                            "engine block {block} is outside the {} blocks",
                            tensor.engine.rows
                        ))
                    })?;
                    let chunk = chunks[slot / per_chunk];
                    let offload = tensor
                        .offload
                        .at(chunk, (slot % per_chunk) * tensor.page)
                        .ok_or_else(|| {
                            transfer_error(format!(
                                "offload chunk {chunk} is outside the {} chunks",
                                tensor.offload.rows
                            ))
                        })?;
                    copies.push(Copy {
                        engine,
                        offload,
                        len: layer.bytes,
                    });
                    bytes += layer.bytes;
                }
            }
            next_block += count;
            next_chunk += chunks_used;
        }
        // guard: C2-a-job-uses-every-id-it-names
        if next_block != transfer.engine_blocks.len() || next_chunk != transfer.chunks.len() {
            return Err(transfer_error(format!(
                "the groups use {next_block} engine blocks and {next_chunk} chunks of the {} and \
                 {} named",
                transfer.engine_blocks.len(),
                transfer.chunks.len()
            )));
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(base: usize, rows: usize, stride: usize) -> Extent {
        Extent { base, rows, stride }
    }

    /// Two tensors: pages of 64 and 32 bytes, 8 engine blocks, 4 chunks of
    /// 2 blocks in a region whose rows are 256 bytes apart.
    fn layout() -> CopyLayout {
        let tensors = vec![
            CacheTensor {
                engine: extent(0x1000, 8, 64),
                offload: extent(0x9000, 4, 256),
                page: 64,
            },
            CacheTensor {
                engine: extent(0x2000, 8, 32),
                offload: extent(0x9080, 4, 256),
                page: 32,
            },
        ];
        let groups = vec![
            vec![LayerRef {
                tensor: 0,
                bytes: 60,
            }],
            vec![LayerRef {
                tensor: 1,
                bytes: 32,
            }],
        ];
        CopyLayout::new(tensors, groups, 2).unwrap()
    }

    #[test]
    fn a_group_starting_inside_a_chunk_enters_it_at_its_offset() {
        let transfer = Transfer {
            engine_blocks: &[5, 6, 7],
            chunks: &[1, 2, 3],
            group_sizes: &[2, 1],
            block_indices: &[3, 4],
        };
        let mut copies = Vec::new();
        let bytes = layout().plan(&transfer, &mut copies).unwrap();
        let copy = |engine, offload, len| Copy {
            engine,
            offload,
            len,
        };
        assert_eq!(
            copies,
            [
                // Group 0, request blocks 3 and 4: chunk 1's second slot,
                // then chunk 2's first.
                copy(0x1000 + 5 * 64, 0x9000 + 256 + 64, 60),
                copy(0x1000 + 6 * 64, 0x9000 + 2 * 256, 60),
                // Group 1, request block 4: chunk 3's first slot.
                copy(0x2000 + 7 * 32, 0x9080 + 3 * 256, 32),
            ]
        );
        assert_eq!(bytes, 2 * 60 + 32);
    }

    #[test]
    fn a_job_that_reaches_outside_the_memory_is_refused_whole() {
        type Ids<'a> = (&'a [i64], &'a [i64], &'a [usize], &'a [usize]);
        let bad: [Ids<'_>; 6] = [
            (&[5, 6, 7], &[1, 2], &[2, 1], &[3, 4]), // a chunk short
            (&[5, 6, 7], &[1, 2, 3, 0], &[2, 1], &[3, 4]), // a chunk too many
            (&[8, 6, 7], &[1, 2, 3], &[2, 1], &[3, 4]), // block past the end
            (&[5, 6, -1], &[1, 2, 3], &[2, 1], &[3, 4]), // a negative block
            (&[5, 6, 7], &[1, 2, 4], &[2, 1], &[3, 4]), // chunk past the end
            (&[5, 6, 7], &[1, 2, 3], &[3], &[3]),    // one group of two
        ];
        for (case, (engine_blocks, chunks, group_sizes, block_indices)) in bad.iter().enumerate() {
            let transfer = Transfer {
                engine_blocks,
                chunks,
                group_sizes,
                block_indices,
            };
            let mut copies = vec![Copy {
                engine: 1,
                offload: 2,
                len: 3,
            }];
            let refused = layout().plan(&transfer, &mut copies);
            assert!(
                matches!(refused, Err(PlanError::Transfer(_))),
                "case {case}"
            );
            assert_eq!(copies.len(), 1, "case {case}: nothing planned");
        }
    }

    #[test]
    fn a_layout_whose_pages_overrun_their_rows_is_refused() {
        let tensor = |page, engine_stride, offload_stride| CacheTensor {
            engine: extent(0x1000, 4, engine_stride),
            offload: extent(0x9000, 4, offload_stride),
            page,
        };
        let layer = |bytes| vec![vec![LayerRef { tensor: 0, bytes }]];
        for (tensors, groups, per_chunk) in [
            (vec![tensor(64, 32, 256)], layer(64), 2), // page wider than an engine row
            (vec![tensor(64, 64, 100)], layer(64), 2), // chunk wider than an offload row
            (vec![tensor(64, 64, 128)], layer(65), 2), // layer wider than its page
            (
                vec![tensor(64, 64, 128)],
                vec![vec![LayerRef {
                    tensor: 1,
                    bytes: 1,
                }]],
                2,
            ),
            (vec![tensor(64, 64, 128)], layer(64), 0), // empty chunks
            (vec![tensor(0, 64, 128)], layer(0), 1),   // empty pages
            (
                vec![CacheTensor {
                    engine: extent(usize::MAX - 8, 4, 64),
                    ..tensor(64, 64, 128)
                }],
                layer(64),
                2,
            ),
        ] {
            assert!(matches!(
                CopyLayout::new(tensors, groups, per_chunk),
                Err(PlanError::Layout(_))
            ));
        }
        assert!(CopyLayout::new(vec![tensor(64, 64, 128)], layer(64), 2).is_ok());
    }
}

//! `kvtier._native.BlockCopier`: KV blocks copied between an engine's KV
//! cache tensors and an offload region's views on native threads, without
//! the GIL (the worker of `kvtier.vllm.CpuTieringSpec`).

use kvtier::offload::{
    BlockCopier, CacheTensor, CopyError, CopyLayout, Direction, Extent, LayerRef, Transfer,
};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::errors::{config, guard};
use crate::settings::threads_of;
use crate::slot::{Owned, borrow, lend};

/// A 2-D tensor's rows as an [`Extent`]: it must be on the CPU, its rows
/// contiguous and at least `row_bytes` long (torch's `data_ptr`, `size`,
/// `stride`, `element_size`).
fn extent_of(tensor: &Bound<'_, PyAny>, what: &str, row_bytes: usize) -> PyResult<Extent> {
    let device: String = tensor.getattr("device")?.getattr("type")?.extract()?;
    if device != "cpu" {
        return Err(config(format!("{what} is on {device}, not in host memory")));
    }
    let dims: usize = tensor.call_method0("dim")?.extract()?;
    let element: usize = tensor.call_method0("element_size")?.extract()?;
    let size = |d: usize| -> PyResult<usize> { tensor.call_method1("size", (d,))?.extract() };
    let stride = |d: usize| -> PyResult<usize> { tensor.call_method1("stride", (d,))?.extract() };
    if dims != 2 || stride(1)? != 1 || size(1)? * element < row_bytes {
        return Err(config(format!(
            "{what} must be 2-D with contiguous rows of at least {row_bytes} bytes"
        )));
    }
    Ok(Extent {
        base: tensor.call_method0("data_ptr")?.extract()?,
        rows: size(0)?,
        stride: stride(0)? * element,
    })
}

fn ids(values: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    values.try_iter()?.map(|id| id?.extract::<i64>()).collect()
}

fn counts(values: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<usize>> {
    values
        .try_iter()?
        .map(|n| {
            n?.extract::<usize>()
                .map_err(|_| config(format!("{what} are ints >= 0")))
        })
        .collect()
}

fn refusal(error: CopyError) -> PyErr {
    config(error.to_string())
}

/// Copies KV blocks between an engine's KV-cache tensors and an offload
/// region, on native threads. `tensors` is a list of `(engine, offload,
/// page_bytes)`: the engine tensor's rows are blocks (`page_bytes` each),
/// the offload view's rows are chunks of `blocks_per_chunk` pages. `groups`
/// lists, per KV-cache group, `(tensor_index, bytes)` per layer. The copier
/// holds the tensors until `shutdown()`.
#[pyclass(module = "kvtier._native", name = "BlockCopier")]
pub(crate) struct PyBlockCopier {
    inner: Owned<BlockCopier>,
    /// The tensors whose memory the copies touch: held until the copier
    /// has stopped (declared after `inner`, so dropped after it).
    memory: Vec<Py<PyAny>>,
}

impl PyBlockCopier {
    fn submit(
        &mut self,
        direction: Direction,
        job_id: u64,
        engine_blocks: &Bound<'_, PyAny>,
        chunks: &Bound<'_, PyAny>,
        group_sizes: &Bound<'_, PyAny>,
        block_indices: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let (engine_blocks, chunks) = (ids(engine_blocks)?, ids(chunks)?);
        let group_sizes = counts(group_sizes, "group sizes")?;
        let block_indices = counts(block_indices, "block indices")?;
        let transfer = Transfer {
            engine_blocks: &engine_blocks,
            chunks: &chunks,
            group_sizes: &group_sizes,
            block_indices: &block_indices,
        };
        let call = match direction {
            Direction::Load => "submit_load",
            Direction::Store => "submit_store",
        };
        self.inner
            .get(call)?
            .submit(direction, job_id, &transfer)
            .map_err(refusal)
    }
}

#[pymethods]
impl PyBlockCopier {
    #[new]
    #[pyo3(signature = (tensors, groups, blocks_per_chunk, *, threads = None))]
    fn new(
        tensors: Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>, usize)>,
        groups: Vec<Vec<(usize, usize)>>,
        blocks_per_chunk: usize,
        threads: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        guard(|| {
            let threads = threads.map_or(Ok(2), |threads| threads_of("threads", threads))?;
            let chunk = |page: usize| page.saturating_mul(blocks_per_chunk);
            let mut cache = Vec::with_capacity(tensors.len());
            let mut memory = Vec::with_capacity(2 * tensors.len());
            for (i, (engine, offload, page)) in tensors.iter().enumerate() {
                cache.push(CacheTensor {
                    engine: extent_of(engine, &format!("engine tensor {i}"), *page)?,
                    offload: extent_of(offload, &format!("offload view {i}"), chunk(*page))?,
                    page: *page,
                });
                memory.push(engine.clone().unbind());
                memory.push(offload.clone().unbind());
            }
            let groups = groups
                .into_iter()
                .map(|layers| {
                    layers
                        .into_iter()
                        .map(|(tensor, bytes)| LayerRef { tensor, bytes })
                        .collect()
                })
                .collect();
            let layout = CopyLayout::new(cache, groups, blocks_per_chunk)
                .map_err(|error| config(error.to_string()))?;
            #[allow(unsafe_code)]
            // SAFETY: every extent was read off a live CPU tensor whose rows
            // are at least the layout's lengths (checked above and by
            // `CopyLayout::new`), and `memory` holds those tensors until
            // after the copier has stopped. Engine and offload memory are
            // distinct allocations (the KV cache and the offload region).
            // vLLM pins a transfer's blocks until its job is reported or
            // waited for, which is the rest of the contract.
            let inner =
                unsafe { BlockCopier::new(layout, threads, Box::new(())) }.map_err(refusal)?;
            Ok(Self {
                inner: Owned::new("BlockCopier", "the copier was dropped", inner),
                memory,
            })
        })
    }

    /// Queues a store (engine blocks -> offload chunks); returns its bytes.
    /// Never waits. Ids that do not fit raise `ConfigError` and nothing is
    /// queued.
    fn submit_store(
        &mut self,
        job_id: u64,
        engine_blocks: &Bound<'_, PyAny>,
        chunks: &Bound<'_, PyAny>,
        group_sizes: &Bound<'_, PyAny>,
        block_indices: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        guard(|| {
            self.submit(
                Direction::Store,
                job_id,
                engine_blocks,
                chunks,
                group_sizes,
                block_indices,
            )
        })
    }

    /// Queues a load (offload chunks -> engine blocks); returns its bytes.
    fn submit_load(
        &mut self,
        job_id: u64,
        engine_blocks: &Bound<'_, PyAny>,
        chunks: &Bound<'_, PyAny>,
        group_sizes: &Bound<'_, PyAny>,
        block_indices: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        guard(|| {
            self.submit(
                Direction::Load,
                job_id,
                engine_blocks,
                chunks,
                group_sizes,
                block_indices,
            )
        })
    }

    /// The jobs done since the last call, each once, as `(job_id, is_store,
    /// success, bytes, seconds)`. Never blocks.
    fn finished<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let list = PyList::empty(py);
            for job in self.inner.get("finished")?.finished() {
                let row = (
                    job.id,
                    job.direction == Direction::Store,
                    job.succeeded,
                    job.bytes,
                    job.copy_time.as_secs_f64(),
                );
                list.append(row.into_pyobject(py)?)?;
            }
            Ok(list)
        })
    }

    /// Waits, with the GIL released, until the jobs `job_ids` no longer
    /// touch their blocks (and for no other job); their reports come with
    /// the next `finished()`. Returns how many it waited for.
    fn wait(slf: &Bound<'_, Self>, job_ids: &Bound<'_, PyAny>) -> PyResult<usize> {
        let py = slf.py();
        let ids: Vec<u64> = job_ids
            .try_iter()?
            .map(|id| id?.extract::<u64>())
            .collect::<PyResult<_>>()?;
        guard(|| {
            lend(
                slf,
                "wait",
                |this| &mut this.inner,
                |inner| py.detach(|| inner.wait(&ids)),
            )
        })
    }

    /// Jobs submitted and not reported yet.
    #[getter]
    fn in_flight(&self) -> PyResult<usize> {
        Ok(self.inner.get_ref("in_flight")?.in_flight())
    }

    /// Runs every job submitted, stops the threads (with the GIL released)
    /// and lets go of the tensors. Returns how many jobs it waited for.
    fn shutdown(slf: &Bound<'_, Self>) -> PyResult<usize> {
        let py = slf.py();
        let waited = guard(|| {
            lend(
                slf,
                "shutdown",
                |this| &mut this.inner,
                |inner| py.detach(|| inner.shutdown()),
            )
        })?;
        // guard: P7-the-copier-lets-go-of-the-tensors
        borrow(slf, "shutdown")?.memory.clear();
        Ok(waited)
    }

    fn __repr__(&self) -> String {
        match self.inner.ready() {
            Some(inner) => format!("{inner:?}"),
            None => "BlockCopier (busy, or made before a fork)".to_owned(),
        }
    }
}

impl Drop for PyBlockCopier {
    /// Stops the threads with the GIL released before the tensors go.
    fn drop(&mut self) {
        let Some(mut inner) = self.inner.take_to_drop() else {
            return;
        };
        let inner = &mut inner;
        if Python::try_attach(|py| py.detach(|| inner.shutdown())).is_none() {
            inner.shutdown();
        }
    }
}

pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<PyBlockCopier>()
}

//! PyO3 bindings: the `reprolm._core` extension module. Thin wrappers only: arguments are
//! extracted, the GIL is released, and the Rust API does the work.

mod batch;
mod callable;
mod chat;
mod decoding;
mod errors;
mod grammar;
mod params;
mod quantize;
mod sampling;
mod score;
mod session;
mod speculative;
mod tokenizer;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::exceptions::PyImportError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::batch::{BatchEngine, BatchOptions};
use crate::loaded_model::{LoadedModel, LoadOptions, Session};
use crate::error::Error;
use crate::gguf::GgufFile;
use crate::model::KvDtype;
use crate::tensor::{dequantize_row, ggml_type_info, GgmlType};
use errors::IntoPyResult;

/// Tokens per forward pass when `logits` and `Session.feed` process a long input: Ctrl-C is
/// checked between blocks (and the GIL taken back), so an interrupt takes effect within one
/// block. Any split of the input gives the same bits (docs/theory.md, "The KV cache").
pub(crate) const BLOCK_TOKENS: usize = 256;

/// A loaded model (see `reprolm.Model` for the documented Python API).
#[pyclass(frozen, name = "LoadedModel", module = "reprolm._core")]
pub(crate) struct PyLoadedModel {
    pub(crate) loaded: Arc<LoadedModel>,
    batch_options: BatchOptions,
    /// Started by the first request submitted (and again in a forked child).
    batch: Mutex<Option<Arc<BatchEngine>>>,
}

impl PyLoadedModel {
    /// The model's batch engine, started on first use. In a child forked after it started,
    /// the parent's engine thread does not exist: the child starts its own.
    pub(crate) fn batch(&self) -> PyResult<Arc<BatchEngine>> {
        let mut slot = self.batch.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(batch) = slot.as_ref().filter(|b| !b.is_stale()) {
            return Ok(Arc::clone(batch));
        }
        if let Some(stale) = slot.take() {
            std::mem::forget(stale); // requests of the parent's batch engine are never served here
        }
        let batch = Arc::new(BatchEngine::new(Arc::clone(&self.loaded), self.batch_options).py()?);
        *slot = Some(Arc::clone(&batch));
        Ok(batch)
    }
}

/// A count given from Python (at least 1); the error names the setting.
/// `LoadedModel.engine_stats`: see there.
type EngineStatsTuple = ((usize, usize, usize, u64, u64, u64, u64, u64, u64, usize), (u64, usize, usize));

fn positive(name: &str, value: i64) -> Result<usize, Error> {
    usize::try_from(value)
        .ok()
        .filter(|&v| v >= 1)
        .ok_or_else(|| Error::invalid_argument(name, format!("must be at least 1, got {value}")))
}

/// Model hyper-parameters read from the GGUF metadata.
#[pyclass(frozen, get_all, name = "ModelConfig", module = "reprolm._core")]
#[derive(Clone)]
struct PyModelConfig {
    architecture: String,
    n_layers: usize,
    d_model: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    ffn_dim: usize,
    vocab_size: usize,
    context_length: usize,
    rope_base: f64,
    rms_eps: f64,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
}

#[pymethods]
impl PyModelConfig {
    fn __repr__(&self) -> String {
        format!(
            "ModelConfig(architecture={:?}, n_layers={}, d_model={}, n_heads={}, n_kv_heads={}, head_dim={}, ffn_dim={}, vocab_size={}, context_length={}, rope_base={:?}, rms_eps={:e}, bos_id={}, eos_id={})",
            self.architecture, self.n_layers, self.d_model, self.n_heads, self.n_kv_heads, self.head_dim,
            self.ffn_dim, self.vocab_size, self.context_length, self.rope_base, self.rms_eps,
            py_option(self.bos_id), py_option(self.eos_id)
        )
    }
}

fn py_option(v: Option<u32>) -> String {
    v.map_or_else(|| "None".to_string(), |v| v.to_string())
}

/// Converts Python ints to token ids, rejecting negatives and ids past the vocabulary.
pub(crate) fn token_ids(loaded: &LoadedModel, ids: Vec<i64>) -> PyResult<Vec<u32>> {
    let vocab_size = loaded.config().vocab_size;
    ids.into_iter()
        .map(|id| {
            u32::try_from(id)
                .ok()
                .filter(|&v| (v as usize) < vocab_size)
                .ok_or(Error::TokenOutOfRange { id, vocab_size })
        })
        .collect::<Result<Vec<u32>, Error>>()
        .py()
}

#[pymethods]
impl PyLoadedModel {
    #[new]
    #[pyo3(signature = (path, *, threads=None, isa=None, precision=None, max_concurrent=None, max_queue=None,
                        max_batch_tokens=None, kv_memory=None, kv_dtype=None, prefix_cache_bytes=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        threads: Option<i64>,
        isa: Option<String>,
        precision: Option<String>,
        max_concurrent: Option<i64>,
        max_queue: Option<i64>,
        max_batch_tokens: Option<i64>,
        kv_memory: Option<i64>,
        kv_dtype: Option<String>,
        prefix_cache_bytes: Option<i64>,
    ) -> PyResult<Self> {
        let threads = threads
            .map(|t| usize::try_from(t).map_err(|_| Error::invalid_argument("threads", format!("{t} is not positive"))))
            .transpose()
            .py()?;
        let options = LoadOptions { threads, isa, precision };
        let loaded = py.detach(|| LoadedModel::load(&path, &options)).py()?;
        let mut batch_options = BatchOptions::defaults_for(&loaded);
        let set = |slot: &mut usize, name: &str, value: Option<i64>| -> PyResult<()> {
            if let Some(v) = value {
                *slot = positive(name, v).py()?;
            }
            Ok(())
        };
        set(&mut batch_options.max_concurrent, "max_concurrent", max_concurrent)?;
        set(&mut batch_options.max_queue, "max_queue", max_queue)?;
        set(&mut batch_options.max_batch_tokens, "max_batch_tokens", max_batch_tokens)?;
        set(&mut batch_options.kv_memory, "kv_memory", kv_memory)?;
        if let Some(name) = kv_dtype {
            batch_options.kv_dtype = KvDtype::parse(&name).py()?;
        }
        batch_options.prefix_cache_bytes = match prefix_cache_bytes {
            None => BatchOptions::default_prefix_cache_bytes(batch_options.kv_memory),
            Some(v) => usize::try_from(v)
                .map_err(|_| Error::invalid_argument("prefix_cache_bytes", format!("must be at least 0, got {v}")))
                .py()?,
        };
        if max_batch_tokens.is_none() {
            batch_options.max_batch_tokens = batch_options.max_batch_tokens.max(batch_options.max_concurrent);
        }
        batch_options.validate().py()?;
        Ok(PyLoadedModel { loaded: Arc::new(loaded), batch_options, batch: Mutex::new(None) })
    }

    /// The batch engine's state: ((waiting, running, kv_bytes, passes, prompt_tokens,
    /// generated_tokens, prefix_cache_hits, prefix_cache_misses, prefix_cache_evictions,
    /// prefix_cache_bytes), (preemptions, kv_blocks_used, kv_blocks_free)); zeros before the
    /// first request.
    fn engine_stats(&self) -> EngineStatsTuple {
        let batch = self.batch.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let s = batch.filter(|b| !b.is_stale()).map(|b| b.stats()).unwrap_or_default();
        let p = s.prefix_cache;
        (
            (s.waiting, s.running, s.kv_bytes, s.passes, s.prompt_tokens, s.generated_tokens, p.hits, p.misses, p.evictions, p.bytes),
            (s.preemptions, s.kv_blocks_used, s.kv_blocks_free),
        )
    }

    /// Bytes the batch engine's prefix cache may hold (0: none).
    #[getter]
    fn prefix_cache_bytes(&self) -> usize {
        self.batch_options.prefix_cache_bytes
    }

    /// Bytes of keys and values one position takes in the batch engine's caches.
    #[getter]
    fn kv_bytes_per_position(&self) -> usize {
        self.loaded.kv_bytes_per_position(self.batch_options.kv_dtype)
    }

    /// The number type of the batch engine's caches.
    #[getter]
    fn kv_dtype(&self) -> &'static str {
        self.batch_options.kv_dtype.name()
    }

    /// Ids of requests with new chunks, waiting up to `timeout` seconds (asyncio dispatcher).
    fn wait_ready(&self, py: Python<'_>, timeout: f64) -> PyResult<Vec<u64>> {
        let timeout = Duration::try_from_secs_f64(timeout.max(0.0))
            .map_err(|_| Error::invalid_argument("timeout", format!("{timeout} is not a duration")))
            .py()?;
        let batch = self.batch()?;
        Ok(py.detach(|| batch.wait_ready(timeout)))
    }

    #[getter]
    fn config(&self) -> PyModelConfig {
        let c = self.loaded.config();
        PyModelConfig {
            architecture: c.architecture.clone(),
            n_layers: c.n_layers,
            d_model: c.d_model,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            ffn_dim: c.ffn_dim,
            vocab_size: c.vocab_size,
            context_length: c.context_length,
            rope_base: c.rope_base.into(),
            rms_eps: c.rms_eps.into(),
            bos_id: c.bos_id,
            eos_id: c.eos_id,
        }
    }

    #[getter]
    fn threads(&self) -> usize {
        self.loaded.n_threads()
    }

    /// The model file's fingerprint: a 64-bit hash of all its bytes, computed when first
    /// asked for.
    #[getter]
    fn fingerprint(&self) -> PyResult<u64> {
        self.loaded.fingerprint().py()
    }

    /// Bytes of weights one decoded token reads, as the model holds them.
    #[getter]
    fn weight_bytes_per_token(&self) -> usize {
        self.loaded.transformer.weights.bytes_read_per_token()
    }

    #[getter]
    fn isa(&self) -> &'static str {
        self.loaded.transformer.isa.name()
    }

    #[getter]
    fn precision(&self) -> &'static str {
        self.loaded.transformer.precision().name()
    }

    #[getter]
    fn path(&self) -> std::path::PathBuf {
        self.loaded.file.path().to_path_buf()
    }

    #[pyo3(signature = (text, *, special=false))]
    fn tokenize(&self, py: Python<'_>, text: &str, special: bool) -> PyResult<Vec<u32>> {
        py.detach(|| self.loaded.tokenizer.encode(text, special)).py()
    }

    fn detokenize(&self, py: Python<'_>, ids: Vec<i64>) -> PyResult<String> {
        let ids = token_ids(&self.loaded, ids)?;
        py.detach(|| self.loaded.tokenizer.decode(&ids)).py()
    }

    /// Raw bytes of one token.
    fn token_bytes<'py>(&self, py: Python<'py>, id: i64) -> PyResult<Bound<'py, PyBytes>> {
        let id = token_ids(&self.loaded, vec![id])?[0];
        Ok(PyBytes::new(py, self.loaded.tokenizer.token_bytes(id).py()?))
    }

    /// Logits at every position: float32 array of shape (len(ids), vocab_size). Long inputs
    /// run in blocks of [`BLOCK_TOKENS`] with Ctrl-C checked between them; an interrupted
    /// call changes nothing.
    fn logits<'py>(&self, py: Python<'py>, ids: Vec<i64>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let ids = token_ids(&self.loaded, ids)?;
        if ids.is_empty() {
            return Err(Error::EmptyPrompt).py();
        }
        let vocab_size = self.loaded.config().vocab_size;
        let mut session = Session::new(Arc::clone(&self.loaded), ids.len()).py()?;
        // [ids.len()][vocab_size], filled block by block
        let mut logits = Vec::new();
        for (i, block) in ids.chunks(BLOCK_TOKENS).enumerate() {
            if i > 0 {
                py.check_signals()?;
            }
            py.detach(|| session.feed_all(block).map(|rows| logits.extend_from_slice(rows))).py()?;
        }
        PyArray1::from_vec(py, logits).reshape([ids.len(), vocab_size])
    }
}

/// GGUF header summary: (version, [(key, value summary)], [(name, type, dims, n_bytes)]).
#[pyfunction]
#[allow(clippy::type_complexity)]
fn gguf_info(py: Python<'_>, path: std::path::PathBuf) -> PyResult<(u32, Vec<(String, String)>, Vec<(String, String, Vec<u64>, usize)>)> {
    let file = py.detach(|| GgufFile::open(&path)).py()?;
    let metadata = file.metadata().iter().map(|(k, v)| (k.clone(), v.summary())).collect();
    // Every tensor in data order, those of types reprolm cannot compute with included.
    let mut tensors: Vec<_> = file
        .tensors()
        .iter()
        .map(|t| (t.offset, (t.name.clone(), t.ggml_type.name().to_string(), t.dims.clone(), t.n_bytes)))
        .chain(file.foreign_tensors().iter().map(|t| {
            let ty = ggml_type_info(t.type_id).map_or("?", |i| i.name);
            (t.offset, (t.name.clone(), ty.to_string(), t.dims.clone(), t.n_bytes))
        }))
        .collect();
    tensors.sort_by_key(|(offset, _)| *offset);
    Ok((file.version(), metadata, tensors.into_iter().map(|(_, t)| t).collect()))
}

/// Dequantizes raw ggml data of type `type_id` (ggml's numbering) to float32.
#[pyfunction]
fn dequantize<'py>(py: Python<'py>, type_id: u32, data: &[u8]) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let ty = GgmlType::from_id(type_id)
        .ok_or_else(|| Error::UnknownTensorType { tensor: "<bytes>".into(), type_id })
        .py()?;
    if !data.len().is_multiple_of(ty.block_bytes()) {
        return Err(Error::invalid_argument("data", format!("{} bytes is not whole {} blocks", data.len(), ty.name()))).py();
    }
    let mut out = vec![0f32; data.len() / ty.block_bytes() * ty.block_size()];
    py.detach(|| dequantize_row(ty, data, &mut out));
    Ok(PyArray1::from_vec(py, out))
}

/// Loads NumPy's C API and rust-numpy's borrow-checking capsule now, at import. rust-numpy
/// loads them on first use and panics if that fails, as it does when a Ctrl-C is pending at
/// the first array a call returns (the import it runs raises `KeyboardInterrupt`).
fn load_numpy_api(py: Python<'_>) -> PyResult<()> {
    py.import("numpy")?;
    // A pending Ctrl-C is raised here, as an ordinary exception, rather than inside rust-numpy.
    py.check_signals()?;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        drop(PyArray1::<f32>::zeros(py, 1, false).readonly());
    }))
    .map_err(|_| PyImportError::new_err("reprolm could not load the NumPy C API"))
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    load_numpy_api(m.py())?;
    m.add_class::<PyLoadedModel>()?;
    m.add_class::<PyModelConfig>()?;
    m.add_class::<session::PySession>()?;
    sampling::register(m)?;
    score::register(m)?;
    session::register(m)?;
    params::register(m)?;
    batch::register(m)?;
    chat::register(m)?;
    quantize::register(m)?;
    decoding::register(m)?;
    tokenizer::register(m)?;
    grammar::register(m)?;
    speculative::register(m)?;
    m.add_function(wrap_pyfunction!(gguf_info, m)?)?;
    m.add_function(wrap_pyfunction!(dequantize, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

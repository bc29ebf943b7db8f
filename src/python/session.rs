//! The `Session` binding: one sequence with its KV cache (see `reprolm.Session`), and the
//! streaming iterator over a session's generation (`Session.stream`): each token is computed
//! with the GIL released, and pending signals are checked between tokens, so Ctrl-C stops
//! generation within one token and leaves the session usable. (`Model.stream` runs on the
//! batch engine, see `batch.rs`.)

use std::sync::{Arc, Mutex, MutexGuard};

use numpy::PyArray1;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use super::batch::ChunkTuple;
use super::errors::IntoPyResult;
use super::params::PyGenerationParams;
use super::sampling::{step_tuple, StepTuple};
use super::speculative::{stats_tuple, StatsTuple};
use super::{token_ids, PyLoadedModel, BLOCK_TOKENS};
use crate::decode::speculative::SpeculationStats;
use crate::decode::stream::Generator;
use crate::decode::Step;
use crate::loaded_model::{Session, SessionOptions};
use crate::error::{Error, Result};
use crate::model::{KvDtype, Overflow};

/// A finished generation: (ids, text, finish reason, ln q per id, per-step statistics or [],
/// speculation statistics when speculating).
type Generated = (Vec<u32>, String, &'static str, Vec<f64>, Vec<StepTuple>, Option<StatsTuple>);

/// One sequence with its KV cache.
#[pyclass(frozen, name = "Session", module = "reprolm._core")]
pub struct PySession {
    /// `None` while `generate` runs: the generator owns the session between tokens, with the
    /// lock released (so that the GIL can be taken back between tokens without a deadlock).
    session: Mutex<Option<Session>>,
}

fn busy() -> PyErr {
    PyRuntimeError::new_err("the session is generating (an open stream, or another thread)")
}

impl PySession {
    pub(super) fn wrap(session: Session) -> Self {
        PySession { session: Mutex::new(Some(session)) }
    }

    fn guard(&self) -> MutexGuard<'_, Option<Session>> {
        self.session.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `f` on the session, or `None` while a generation holds it.
    fn with<R>(&self, f: impl FnOnce(&mut Session) -> R) -> Option<R> {
        self.guard().as_mut().map(f)
    }

    fn get<R>(&self, f: impl FnOnce(&mut Session) -> R) -> PyResult<R> {
        self.with(f).ok_or_else(busy)
    }

    /// Takes the session out for a generation; [`PySession::put_back`] returns it.
    fn take(&self) -> PyResult<Session> {
        self.guard().take().ok_or_else(busy)
    }

    /// Builds the request of `params` for `ids` and takes the session out into its generator
    /// (putting it back if the generation cannot start).
    fn start(&self, py: Python<'_>, ids: Vec<i64>, params: &PyGenerationParams) -> PyResult<Generator> {
        let loaded = self.get(|s| Arc::clone(s.loaded()))?;
        let request = params.loaded_spec(py, &loaded, ids)?;
        let speculation = params.speculative(py).map(|s| s.get()).map(|s| py.detach(|| s.for_loaded(&loaded, &request))).transpose().py()?;
        let mut generator = Generator::try_new(self.take()?, request).map_err(|failed| {
            let (e, session) = *failed;
            self.put_back(session);
            e
        }).py()?;
        if let Some(speculation) = speculation {
            if let Err(e) = generator.speculate(speculation) {
                self.put_back(generator.into_session());
                return Err(e).py();
            }
        }
        Ok(generator)
    }

    pub(super) fn put_back(&self, session: Session) {
        *self.guard() = Some(session);
    }
}


/// Feeds `ids` to `session` in blocks, checking for Ctrl-C between them; the logits after the
/// last id. With `overflow="error"` the whole input must fit, checked before any work.
fn feed_blocks(py: Python<'_>, session: &mut Session, ids: &[u32]) -> PyResult<Vec<f32>> {
    if ids.is_empty() {
        return Err(Error::EmptyPrompt).py();
    }
    let pending = session.tokens().len() - session.cache().len();
    session.cache().check_fits(pending + ids.len()).py()?;
    let mut logits = Vec::new();
    for (i, block) in ids.chunks(BLOCK_TOKENS).enumerate() {
        if i > 0 {
            py.check_signals()?;
        }
        logits = py.detach(|| session.feed(block).map(<[f32]>::to_vec)).py()?;
    }
    Ok(logits)
}

fn non_negative(name: &str, v: i64) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| Error::invalid_argument(name, format!("must be >= 0, got {v}"))).py()
}

#[pymethods]
impl PySession {
    #[new]
    #[pyo3(signature = (loaded, *, context_length=None, kv_dtype="f32", overflow="error", n_keep=4))]
    fn new(
        py: Python<'_>,
        loaded: &PyLoadedModel,
        context_length: Option<i64>,
        kv_dtype: &str,
        overflow: &str,
        n_keep: i64,
    ) -> PyResult<Self> {
        let context_length = match context_length {
            None => None,
            Some(n) => Some(
                usize::try_from(n)
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| Error::invalid_argument("context_length", format!("must be >= 1, got {n}")))
                    .py()?,
            ),
        };
        let options = SessionOptions {
            context_length,
            kv_dtype: KvDtype::parse(kv_dtype).py()?,
            overflow: Overflow::parse(overflow, non_negative("n_keep", n_keep)?).py()?,
        };
        let loaded = Arc::clone(&loaded.loaded);
        let session = py.detach(|| Session::with_options(loaded, &options)).py()?;
        Ok(PySession::wrap(session))
    }

    /// Restores a session saved with `save` for this engine's model.
    #[staticmethod]
    fn load(py: Python<'_>, loaded: &PyLoadedModel, path: std::path::PathBuf) -> PyResult<Self> {
        let loaded = Arc::clone(&loaded.loaded);
        let session = py.detach(|| Session::load(loaded, &path)).py()?;
        Ok(PySession::wrap(session))
    }

    fn save(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        py.detach(|| self.with(|s| s.save(&path))).ok_or_else(busy)?.py()
    }

    #[getter]
    fn tokens(&self) -> PyResult<Vec<u32>> {
        self.get(|s| s.tokens().to_vec())
    }

    #[getter]
    fn context_length(&self) -> PyResult<usize> {
        self.get(|s| s.capacity())
    }

    #[getter]
    fn kv_dtype(&self) -> PyResult<&'static str> {
        self.get(|s| s.cache().dtype().name())
    }

    #[getter]
    fn overflow(&self) -> PyResult<&'static str> {
        self.get(|s| s.cache().overflow().name())
    }

    #[getter]
    fn n_keep(&self) -> PyResult<usize> {
        self.get(|s| s.cache().overflow().n_keep())
    }

    #[getter]
    fn kv_bytes(&self) -> PyResult<usize> {
        self.get(|s| s.kv_bytes())
    }

    /// Appends `ids`; the logits after the last one (float32, vocab_size). Long inputs run in
    /// blocks of `BLOCK_TOKENS` with Ctrl-C checked between them; an interrupted call keeps
    /// the blocks computed so far. The session is busy meanwhile.
    fn feed<'py>(&self, py: Python<'py>, ids: Vec<i64>) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let loaded = self.get(|s| Arc::clone(s.loaded()))?;
        let ids = token_ids(&loaded, ids)?;
        let mut session = self.take()?;
        let logits = feed_blocks(py, &mut session, &ids);
        self.put_back(session);
        Ok(PyArray1::from_vec(py, logits?))
    }

    fn truncate(&self, n: i64) -> PyResult<()> {
        let n = non_negative("n", n)?;
        self.get(|s| s.truncate(n))
    }

    /// Generates from `ids` (the whole context), reusing the cached shared prefix, with the
    /// settings of `params`: (ids, text, finish reason, ln q per id, per-step statistics if
    /// asked for, speculation statistics when speculating). Ctrl-C stops it between tokens;
    /// the session stays usable.
    fn generate(&self, py: Python<'_>, ids: Vec<i64>, params: &PyGenerationParams) -> PyResult<Generated> {
        let steps = params.steps();
        let mut generator = self.start(py, ids, params)?;
        let (mut text, mut logprobs, mut stats) = (String::new(), Vec::new(), Vec::new());
        let result = loop {
            match step(py, &mut generator) {
                Ok(Some(s)) => {
                    text.push_str(&s.text);
                    logprobs.push(s.selection.logprob);
                    if steps {
                        stats.push(step_tuple(s.selection));
                    }
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        let ids = generator.generated().to_vec();
        let finish = generator.finish();
        let speculation = generator.speculation_stats().map(stats_tuple);
        self.put_back(generator.into_session());
        result?;
        let reason = finish.expect("a generator that returns None has finished").reason();
        Ok((ids, text, reason, logprobs, stats, speculation))
    }

    /// `generate` as a stream of chunks (`Stream`); the session is busy until the stream has
    /// returned its last chunk, is closed or is dropped.
    fn stream(slf: &Bound<'_, Self>, ids: Vec<i64>, params: &PyGenerationParams) -> PyResult<PyStream> {
        let generator = slf.get().start(slf.py(), ids, params)?;
        Ok(PyStream::on_session(generator, slf.clone().unbind()))
    }
}

/// A session on `engine` large enough for `prompt_len + max_tokens` positions, its cache of
/// the batch engine's number type, or `ContextOverflow` when the model's context is shorter.
pub(super) fn session_for(loaded: &PyLoadedModel, prompt_len: usize, max_tokens: usize) -> Result<Session> {
    let needed = prompt_len + max_tokens;
    let allowed = loaded.loaded.config().context_length;
    if needed > allowed {
        return Err(Error::ContextOverflow { requested: needed, allowed });
    }
    let options = SessionOptions { context_length: Some(needed), kv_dtype: loaded.batch_options.kv_dtype, ..Default::default() };
    Session::with_options(Arc::clone(&loaded.loaded), &options)
}


/// A session for one speculative generation of a prompt of `prompt_len` tokens with the
/// settings of `params` on `engine` (`ContextOverflowError` beyond the model's context).
#[pyfunction]
fn solo_session(py: Python<'_>, loaded: &PyLoadedModel, prompt_len: usize, params: &PyGenerationParams) -> PyResult<PySession> {
    let max_tokens = params.max_tokens();
    py.detach(|| session_for(loaded, prompt_len, max_tokens)).map(PySession::wrap).py()
}

fn chunk(step: Step) -> ChunkTuple {
    let Step { selection, text, finish } = step;
    (text, vec![selection.token], finish.map(|f| f.reason()), vec![selection.logprob], None)
}

/// Runs one step with the GIL released, after giving pending signals (Ctrl-C) their chance;
/// a long prompt is computed in blocks first, with the same chance between blocks.
pub(super) fn step(py: Python<'_>, generator: &mut Generator) -> PyResult<Option<Step>> {
    py.check_signals()?;
    while py.detach(|| generator.prefill_part(BLOCK_TOKENS)).py()? > 0 {
        py.check_signals()?;
    }
    py.detach(|| generator.next_step()).py()
}

/// Iterator over the chunks of one session's generation (see `reprolm.Session.stream`).
#[pyclass(name = "Stream", module = "reprolm._core")]
pub(super) struct PyStream {
    /// `None` once the session has been given back.
    generator: Option<Generator>,
    /// The chunk with the finish reason has been returned.
    done: bool,
    /// The `Session` whose session the generator holds until the stream ends or is dropped.
    owner: Py<PySession>,
    /// The speculation statistics when the generator was released.
    final_stats: Option<SpeculationStats>,
}

impl PyStream {
    /// A stream on a session taken out of `owner`, which gets it back when the stream ends.
    pub(super) fn on_session(generator: Generator, owner: Py<PySession>) -> Self {
        PyStream { generator: Some(generator), done: false, owner, final_stats: None }
    }

    /// Gives the owner its session back (after the last chunk, or when the stream is dropped).
    fn release(&mut self) {
        if let Some(generator) = self.generator.take() {
            self.final_stats = generator.speculation_stats();
            self.owner.get().put_back(generator.into_session());
        }
    }
}

impl Drop for PyStream {
    fn drop(&mut self) {
        self.release();
    }
}

#[pymethods]
impl PyStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<ChunkTuple>> {
        let Some(generator) = self.generator.as_mut().filter(|_| !self.done) else {
            return Ok(None);
        };
        let next = match step(py, generator) {
            Ok(Some(step)) => {
                self.done = step.finish.is_some();
                Ok(Some(chunk(step)))
            }
            // Finished before any token (max_tokens = 0): one empty chunk carries the reason.
            Ok(None) => {
                self.done = true;
                Ok(generator.finish().map(|f| (String::new(), Vec::new(), Some(f.reason()), Vec::new(), None)))
            }
            Err(e) => {
                // A KeyboardInterrupt leaves the generator intact: iterating again resumes.
                if !e.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py) {
                    self.done = true;
                }
                Err(e)
            }
        };
        if self.done {
            self.release();
        }
        next
    }

    /// What speculation did so far: (drafted, accepted, passes, drafting passes), or None
    /// without speculation.
    #[getter]
    fn speculation(&self) -> Option<StatsTuple> {
        self.generator.as_ref().map_or(self.final_stats, Generator::speculation_stats).map(stats_tuple)
    }

    /// Ends the stream now and gives the session back.
    fn close(&mut self) {
        self.done = true;
        self.release();
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStream>()?;
    m.add_function(wrap_pyfunction!(solo_session, m)?)?;
    Ok(())
}

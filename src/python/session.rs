//! The `Session` binding: one sequence with its KV cache (see `reprolm.Session`).

use std::sync::{Arc, Mutex, MutexGuard};

use numpy::PyArray1;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use super::errors::IntoPyResult;
use super::grammar::PyGrammarSpec;
use super::sampling::{step_tuple, PySamplerConfig, StepTuple};
use super::speculative::{stats_tuple, PySpeculative, StatsTuple};
use super::stream::{step, PyStream};
use super::request::request;
use super::{token_ids, PyEngine, BLOCK_TOKENS};
use crate::decode::stream::Generator;
use crate::engine::{Session, SessionOptions};
use crate::error::Error;
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

    /// Validates a generation's arguments and takes the session out into its generator
    /// (putting it back if the generation cannot start).
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        py: Python<'_>,
        ids: Vec<i64>,
        max_tokens: i64,
        sampler: &PySamplerConfig,
        stop_token_ids: Vec<i64>,
        stop: Vec<String>,
        grammar: Option<&PyGrammarSpec>,
        speculative: Option<&PySpeculative>,
    ) -> PyResult<Generator> {
        let engine = self.get(|s| Arc::clone(s.engine()))?;
        let request = request(py, &engine, ids, max_tokens, sampler, stop_token_ids, stop, grammar)?;
        let speculation = speculative.map(|s| py.detach(|| s.for_engine(&engine, &request))).transpose().py()?;
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
    #[pyo3(signature = (engine, *, context_length=None, kv_dtype="f32", overflow="error", n_keep=4))]
    fn new(
        py: Python<'_>,
        engine: &PyEngine,
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
        let engine = Arc::clone(&engine.engine);
        let session = py.detach(|| Session::with_options(engine, &options)).py()?;
        Ok(PySession::wrap(session))
    }

    /// Restores a session saved with `save` for this engine's model.
    #[staticmethod]
    fn load(py: Python<'_>, engine: &PyEngine, path: std::path::PathBuf) -> PyResult<Self> {
        let engine = Arc::clone(&engine.engine);
        let session = py.detach(|| Session::load(engine, &path)).py()?;
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
        let engine = self.get(|s| Arc::clone(s.engine()))?;
        let ids = token_ids(&engine, ids)?;
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
    /// stop conditions of `Model.generate`: (ids, text, finish reason, ln q per id, per-step
    /// statistics if `steps`). Ctrl-C stops it between tokens; the session stays usable.
    #[pyo3(signature = (ids, *, max_tokens, sampler, stop_token_ids, stop, steps=false, grammar=None, speculative=None))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        ids: Vec<i64>,
        max_tokens: i64,
        sampler: &PySamplerConfig,
        stop_token_ids: Vec<i64>,
        stop: Vec<String>,
        steps: bool,
        grammar: Option<PyRef<'_, PyGrammarSpec>>,
        speculative: Option<PyRef<'_, PySpeculative>>,
    ) -> PyResult<Generated> {
        let mut generator =
            self.start(py, ids, max_tokens, sampler, stop_token_ids, stop, grammar.as_deref(), speculative.as_deref())?;
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
    #[pyo3(signature = (ids, *, max_tokens, sampler, stop_token_ids, stop, grammar=None, speculative=None))]
    #[allow(clippy::too_many_arguments)]
    fn stream(
        slf: &Bound<'_, Self>,
        ids: Vec<i64>,
        max_tokens: i64,
        sampler: &PySamplerConfig,
        stop_token_ids: Vec<i64>,
        stop: Vec<String>,
        grammar: Option<PyRef<'_, PyGrammarSpec>>,
        speculative: Option<PyRef<'_, PySpeculative>>,
    ) -> PyResult<PyStream> {
        let generator = slf.get().start(
            slf.py(),
            ids,
            max_tokens,
            sampler,
            stop_token_ids,
            stop,
            grammar.as_deref(),
            speculative.as_deref(),
        )?;
        Ok(PyStream::on_session(generator, slf.clone().unbind()))
    }
}

//! Bindings for generation through [`Generator`]: the streaming iterator `Stream` and the
//! (batched) `generate` function. Each token is computed with the GIL released, and pending
//! signals are checked between tokens, so Ctrl-C stops generation within one token and leaves
//! the model usable.

use std::sync::Arc;

use pyo3::prelude::*;

use super::errors::IntoPyResult;
use super::sampling::PySamplerConfig;
use super::session::PySession;
use super::{token_ids, PyEngine};
use crate::decode::stream::{Finish, Generator, Step, StopConditions};
use crate::engine::{Engine, Session};
use crate::error::Error;
use crate::sampling::Sampler;

/// One streamed piece: (text delta, token ids, finish reason on the last chunk, ln q per id).
type Chunk = (String, Vec<u32>, Option<&'static str>, Vec<f64>);

/// One finished generation: (ids, text, finish reason, ln q per id).
type Generated = (Vec<u32>, String, &'static str, Vec<f64>);

/// Validated arguments shared by `Stream` and `generate`.
struct Request {
    engine: Arc<Engine>,
    prompts: Vec<Vec<u32>>,
    sampler: Sampler,
    stop: StopConditions,
    /// Positions the session needs for the longest prompt plus `max_tokens`.
    capacity: usize,
}

impl Request {
    #[allow(clippy::too_many_arguments)]
    fn new(
        engine: &PyEngine,
        prompts: Vec<Vec<i64>>,
        max_tokens: i64,
        sampler: &PySamplerConfig,
        stop_token_ids: Vec<i64>,
        stop: Vec<String>,
        skip_end_token_text: bool,
    ) -> PyResult<Request> {
        let engine = Arc::clone(&engine.engine);
        let prompts = prompts.into_iter().map(|ids| token_ids(&engine, ids)).collect::<PyResult<Vec<_>>>()?;
        let stop_token_ids = token_ids(&engine, stop_token_ids)?;
        let max_tokens = usize::try_from(max_tokens)
            .map_err(|_| Error::invalid_argument("max_tokens", format!("must be >= 0, got {max_tokens}")))
            .py()?;
        if stop.iter().any(String::is_empty) {
            return Err(Error::invalid_argument("stop", "stop strings must not be empty")).py();
        }
        let allowed = engine.config().context_length;
        let mut capacity = 1;
        for ids in &prompts {
            if ids.is_empty() {
                return Err(Error::EmptyPrompt).py();
            }
            let needed = ids.len().saturating_add(max_tokens);
            if needed > allowed {
                return Err(Error::ContextOverflow { requested: needed, allowed }).py();
            }
            capacity = capacity.max(needed);
        }
        let sampler = Sampler::new(sampler.config.clone(), engine.config().vocab_size).py()?;
        let stop = StopConditions { max_tokens, stop_token_ids, stop_strings: stop, skip_end_token_text };
        Ok(Request { engine, prompts, sampler, stop, capacity })
    }

    /// A generator for prompt `i` over `session` (or a new session).
    fn generator(&self, i: usize, session: Option<Session>) -> crate::Result<Generator> {
        let session = match session {
            Some(s) => s,
            None => Session::new(Arc::clone(&self.engine), self.capacity)?,
        };
        Generator::new(session, &self.prompts[i], self.sampler.clone(), self.stop.clone())
    }
}

fn chunk(step: Step) -> Chunk {
    let Step { selection, text, finish } = step;
    (text, vec![selection.token], finish.map(Finish::reason), vec![selection.logprob])
}

/// Runs one step with the GIL released, after giving pending signals (Ctrl-C) their chance.
pub(super) fn step(py: Python<'_>, generator: &mut Generator) -> PyResult<Option<Step>> {
    py.check_signals()?;
    py.detach(|| generator.next_step()).py()
}

/// Iterator over the chunks of one generation (see `reprolm.Model.stream`, `Session.stream`).
#[pyclass(name = "Stream", module = "reprolm._core")]
pub(super) struct PyStream {
    /// `None` once an owning session has been given its session back.
    generator: Option<Generator>,
    /// The chunk with the finish reason has been returned.
    done: bool,
    /// The `Session` whose session the generator holds until the stream ends or is dropped.
    owner: Option<Py<PySession>>,
}

impl PyStream {
    /// A stream on a session taken out of `owner`, which gets it back when the stream ends.
    pub(super) fn on_session(generator: Generator, owner: Py<PySession>) -> Self {
        PyStream { generator: Some(generator), done: false, owner: Some(owner) }
    }

    /// Gives the owner its session back (after the last chunk, or when the stream is dropped).
    fn release(&mut self) {
        if let (Some(owner), Some(generator)) = (&self.owner, self.generator.take()) {
            owner.get().put_back(generator.into_session());
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
    #[new]
    #[pyo3(signature = (engine, ids, *, max_tokens, sampler, stop_token_ids, stop, skip_end_token_text=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        engine: &PyEngine,
        ids: Vec<i64>,
        max_tokens: i64,
        sampler: &PySamplerConfig,
        stop_token_ids: Vec<i64>,
        stop: Vec<String>,
        skip_end_token_text: bool,
    ) -> PyResult<Self> {
        let request = Request::new(engine, vec![ids], max_tokens, sampler, stop_token_ids, stop, skip_end_token_text)?;
        let generator = py.detach(|| request.generator(0, None)).py()?;
        Ok(PyStream { generator: Some(generator), done: false, owner: None })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Chunk>> {
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
                Ok(generator.finish().map(|f| (String::new(), Vec::new(), Some(f.reason()), Vec::new())))
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

    /// Ends the stream now; a session's stream gives the session back.
    fn close(&mut self) {
        self.done = true;
        self.release();
    }
}

/// Generates a continuation of every prompt, one after the other in one session (its cache is
/// reused for the prefix a prompt shares with the previous one; results are the same bits as
/// generating each prompt alone).
#[pyfunction]
#[pyo3(signature = (engine, prompts, *, max_tokens, sampler, stop_token_ids, stop, skip_end_token_text=false))]
#[allow(clippy::too_many_arguments)]
fn generate(
    py: Python<'_>,
    engine: &PyEngine,
    prompts: Vec<Vec<i64>>,
    max_tokens: i64,
    sampler: &PySamplerConfig,
    stop_token_ids: Vec<i64>,
    stop: Vec<String>,
    skip_end_token_text: bool,
) -> PyResult<Vec<Generated>> {
    let request = Request::new(engine, prompts, max_tokens, sampler, stop_token_ids, stop, skip_end_token_text)?;
    let mut results = Vec::with_capacity(request.prompts.len());
    let mut session = None;
    for i in 0..request.prompts.len() {
        let mut generator = py.detach(|| request.generator(i, session.take())).py()?;
        let mut text = String::new();
        let mut logprobs = Vec::new();
        while let Some(step) = step(py, &mut generator)? {
            text.push_str(&step.text);
            logprobs.push(step.selection.logprob);
        }
        let finish = generator.finish().expect("a generator that returns None has finished");
        results.push((generator.generated().to_vec(), text, finish.reason(), logprobs));
        session = Some(generator.into_session());
    }
    Ok(results)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStream>()?;
    m.add_function(wrap_pyfunction!(generate, m)?)?;
    Ok(())
}

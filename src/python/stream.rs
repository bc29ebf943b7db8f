//! The streaming iterator over a session's generation (`Session.stream`): each token is
//! computed with the GIL released, and pending signals are checked between tokens, so Ctrl-C
//! stops generation within one token and leaves the session usable. (`Model.stream` runs on
//! the batch engine, see `batch.rs`.)

use pyo3::prelude::*;

use super::batch::ChunkTuple;
use super::errors::IntoPyResult;
use super::session::PySession;
use super::BLOCK_TOKENS;
use super::speculative::{stats_tuple, StatsTuple};
use crate::decode::speculative::SpeculationStats;
use crate::decode::stream::Generator;
use crate::decode::Step;

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
    Ok(())
}

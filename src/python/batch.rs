//! Bindings for the batch engine: `submit` queues a request on the model's engine thread and
//! returns a `Request` whose chunks are read as they come (GIL released while waiting, Ctrl-C
//! checked every 50 ms), and `LoadedModel.wait_ready` serves an asyncio dispatcher.

use std::time::Duration;

use pyo3::prelude::*;

use super::errors::IntoPyResult;
use super::params::PyGenerationParams;
use super::sampling::{step_tuple, StepTuple};
use super::PyLoadedModel;
use crate::batch::{Event, Poll, RequestHandle};
use crate::error::Error;

/// One chunk: (text delta, token ids, finish reason on the last chunk, ln q per id, the step's
/// statistics when the request asked for alternatives).
pub(super) type ChunkTuple = (String, Vec<u32>, Option<&'static str>, Vec<f64>, Option<StepTuple>);

/// How long a blocked reader waits before giving pending signals (Ctrl-C) their chance.
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

fn chunk(event: Event, with_steps: bool) -> PyResult<ChunkTuple> {
    match event {
        Event::Token(step) => {
            let (token, logprob) = (step.selection.token, step.selection.logprob);
            let stats = with_steps.then(|| step_tuple(step.selection));
            Ok((step.text, vec![token], step.finish.map(|f| f.reason()), vec![logprob], stats))
        }
        Event::Finished(finish) => Ok((String::new(), Vec::new(), Some(finish.reason()), Vec::new(), None)),
        Event::Error(e) => Err(e).py(),
    }
}

/// A request running on the model's batch engine (see `reprolm.Request`).
#[pyclass(frozen, name = "Request", module = "reprolm._core")]
pub struct PyRequest {
    handle: RequestHandle,
    with_steps: bool,
}

#[pymethods]
impl PyRequest {
    /// Unique among the requests of one model.
    #[getter]
    fn id(&self) -> u64 {
        self.handle.id()
    }

    /// How many prompt tokens were copied from the prefix cache (0 until admitted; final
    /// once the first chunk has come).
    #[getter]
    fn cached_tokens(&self) -> usize {
        self.handle.cached_tokens()
    }

    /// Whether the last chunk (or the error) has been produced.
    #[getter]
    fn finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// The next chunk, waiting for it with the GIL released; `None` after the last one.
    /// A pending KeyboardInterrupt is raised before a chunk is taken and while waiting (the
    /// request keeps running, and no chunk is lost), also when a C loop such as
    /// `list(iter(request.next, None))` runs no Python code between the calls.
    fn next(&self, py: Python<'_>) -> PyResult<Option<ChunkTuple>> {
        py.check_signals()?;
        loop {
            match py.detach(|| self.handle.next_event(Some(SIGNAL_CHECK))) {
                Poll::Event(event) => return chunk(event, self.with_steps).map(Some),
                Poll::Done => return Ok(None),
                Poll::Pending => py.check_signals()?,
            }
        }
    }

    /// The next chunk if one is ready: `(True, chunk)`, `(True, None)` after the last one,
    /// `(False, None)` when it has yet to come.
    fn try_next(&self) -> PyResult<(bool, Option<ChunkTuple>)> {
        match self.handle.next_event(Some(Duration::ZERO)) {
            Poll::Event(event) => Ok((true, Some(chunk(event, self.with_steps)?))),
            Poll::Done => Ok((true, None)),
            Poll::Pending => Ok((false, None)),
        }
    }

    /// Announce this request's chunks to `LoadedModel.wait_ready` (asyncio dispatcher).
    fn watch(&self) {
        self.handle.watch();
    }

    /// Stops the request; its cache is freed before the engine's next pass. Reading it then
    /// raises `RequestCancelledError` (unless it had already finished).
    fn cancel(&self) {
        self.handle.cancel();
    }
}

/// Queues a generation of `ids` with the settings of `params` on `engine`'s batch engine
/// (started on first use). The batch engine does not decode speculatively.
#[pyfunction]
fn submit(py: Python<'_>, loaded: &PyLoadedModel, ids: Vec<i64>, params: &PyGenerationParams) -> PyResult<PyRequest> {
    if params.speculative(py).is_some() {
        let message = "the batch engine (Model.submit) does not decode speculatively; use generate or stream";
        return Err(Error::invalid_argument("speculative", message)).py();
    }
    let request = params.loaded_spec(py, &loaded.loaded, ids)?;
    let batch = loaded.batch()?;
    let handle = py.detach(|| batch.submit(request)).py()?;
    Ok(PyRequest { handle, with_steps: params.steps() })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRequest>()?;
    m.add_function(wrap_pyfunction!(submit, m)?)?;
    Ok(())
}

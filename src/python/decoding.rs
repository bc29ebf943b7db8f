//! Bindings for decoding: generation with per-step statistics and beam search on a loaded
//! model, and `CallableModel`, a model given as a Python callable whose token loop runs in Rust.

use std::sync::Arc;

use numpy::{PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyList;

use super::errors::IntoPyResult;
use super::sampling::{count, ids_in_vocab, step_tuple, PySamplerConfig, StepTuple};
use super::speculative::{stats_tuple, PySpeculative, StatsTuple};
use super::PyEngine;
use crate::decode::speculative::{self, DraftModel, Drafter, SpeculationStats};
use crate::decode::{self, Beam, Generation, LanguageModel, Request, StopConditions};
use crate::engine::{Session, SessionOptions};
use crate::error::{Error, Result};

/// One beam as Python sees it: (ids, log-probability, score, finished).
type BeamTuple = (Vec<u32>, f64, f64, bool);

/// A generation as Python sees it: (ids, finish reason, per-step statistics or [],
/// speculation statistics when speculating).
type GenerationTuple = (Vec<u32>, &'static str, Vec<StepTuple>, Option<StatsTuple>);

fn generation_tuple(generation: Generation, with_steps: bool, speculation: Option<SpeculationStats>) -> GenerationTuple {
    let reason = generation.finish.reason();
    let steps = if with_steps { generation.steps.into_iter().map(step_tuple).collect() } else { Vec::new() };
    (generation.ids, reason, steps, speculation.map(stats_tuple))
}

fn beam_tuples(beams: Vec<Beam>) -> Vec<BeamTuple> {
    beams.into_iter().map(|b| (b.ids, b.logprob, b.score, b.finished)).collect()
}

/// The checked arguments of `CallableModel.generate`.
fn generate_request(
    vocab_size: usize,
    prompt: Vec<i64>,
    max_tokens: i64,
    sampler: &PySamplerConfig,
    stop_token_ids: Vec<i64>,
) -> Result<Request> {
    let stop = StopConditions {
        max_tokens: count("max_tokens", max_tokens)?,
        stop_token_ids: ids_in_vocab(stop_token_ids, vocab_size)?,
        stop_strings: Vec::new(),
    };
    Request::new(ids_in_vocab(prompt, vocab_size)?, sampler.config.clone(), stop, vocab_size)
}

/// The checked arguments shared by both models' `beam_search`.
struct BeamArgs {
    prompt: Vec<u32>,
    beam_width: usize,
    max_tokens: usize,
    length_penalty: f64,
}

impl BeamArgs {
    fn new(vocab_size: usize, prompt: Vec<i64>, beam_width: i64, max_tokens: i64, length_penalty: f64) -> Result<Self> {
        let prompt = ids_in_vocab(prompt, vocab_size)?;
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        Ok(BeamArgs {
            prompt,
            beam_width: usize::try_from(beam_width)
                .map_err(|_| Error::invalid_argument("beam_width", format!("must be at least 1, got {beam_width}")))?,
            max_tokens: count("max_tokens", max_tokens)?,
            length_penalty,
        })
    }

    fn run(&self, model: &mut impl LanguageModel) -> Result<Vec<Beam>> {
        decode::beam_search(model, &self.prompt, self.beam_width, self.max_tokens, self.length_penalty)
    }
}

/// A session on `engine` large enough for `prompt_len + max_tokens` positions, its cache of
/// the batch engine's number type, or `ContextOverflow` when the model's context is shorter.
pub(super) fn session_for(engine: &PyEngine, prompt_len: usize, max_tokens: usize) -> Result<Session> {
    let needed = prompt_len + max_tokens;
    let allowed = engine.engine.config().context_length;
    if needed > allowed {
        return Err(Error::ContextOverflow { requested: needed, allowed });
    }
    let options = SessionOptions { context_length: Some(needed), kv_dtype: engine.batch_options.kv_dtype, ..Default::default() };
    Session::with_options(Arc::clone(&engine.engine), &options)
}

/// Beam search on a loaded model: [(ids, logprob, score, finished)] ranked by score.
#[pyfunction]
#[pyo3(signature = (engine, ids, *, beam_width, max_tokens, length_penalty))]
fn engine_beam_search(
    py: Python<'_>,
    engine: &PyEngine,
    ids: Vec<i64>,
    beam_width: i64,
    max_tokens: i64,
    length_penalty: f64,
) -> PyResult<Vec<BeamTuple>> {
    let args = BeamArgs::new(engine.engine.config().vocab_size, ids, beam_width, max_tokens, length_penalty).py()?;
    let beams = py
        .detach(|| {
            let mut session = session_for(engine, args.prompt.len(), args.max_tokens)?;
            args.run(&mut session)
        })
        .py()?;
    Ok(beam_tuples(beams))
}

/// A model given as a Python callable from the context (a list of ids) to the next-token
/// logits (see `reprolm.CallableModel`).
#[pyclass(frozen, name = "CallableModel", module = "reprolm._core")]
pub struct PyCallableModel {
    function: Py<PyAny>,
    vocab_size: usize,
    eos_id: Option<u32>,
}

/// The [`LanguageModel`] that calls back into Python: the GIL is taken for each call only.
/// An exception raised by the callable is kept in `error` (the decoder sees a placeholder
/// error and stops) and re-raised as it is.
struct Callback<'a> {
    model: &'a PyCallableModel,
    error: Option<PyErr>,
}

impl Callback<'_> {
    /// Calls the function; `Err` is a Python exception, `Ok(Err)` a bad return value.
    fn call(&self, py: Python<'_>, context: &[u32]) -> PyResult<Result<Vec<f32>>> {
        let returned = self.model.function.bind(py).call1((PyList::new(py, context)?,))?;
        let values: Vec<f64> = if let Ok(array) = returned.extract::<PyReadonlyArray1<'_, f32>>() {
            array.as_array().iter().map(|&v| v as f64).collect()
        } else if let Ok(array) = returned.extract::<PyReadonlyArray1<'_, f64>>() {
            array.as_array().to_vec()
        } else {
            match returned.extract::<Vec<f64>>() {
                Ok(values) => values,
                Err(_) => {
                    let shape = returned
                        .cast::<numpy::PyUntypedArray>()
                        .map(|a| format!(" of shape {:?} and dtype {}", a.shape(), a.dtype()))
                        .unwrap_or_default();
                    return Err(PyTypeError::new_err(format!(
                        "the model function must return a 1-D sequence of floats (the logits), got {}{shape}",
                        returned.get_type().name()?
                    )));
                }
            }
        };
        Ok(to_logits(&values, self.model.vocab_size))
    }
}

/// Checks the length and values of the returned logits and rounds them to float32, the
/// precision of a model's logits. -inf is a token of probability 0; NaN, +inf and finite
/// values beyond the float32 range are rejected.
fn to_logits(values: &[f64], vocab_size: usize) -> Result<Vec<f32>> {
    if values.len() != vocab_size {
        return Err(Error::invalid_argument(
            "logits",
            format!("the model function returned {} logits for a vocabulary of {vocab_size}", values.len()),
        ));
    }
    values
        .iter()
        .enumerate()
        .map(|(id, &v)| {
            let rounded = v as f32;
            if v.is_nan() || v == f64::INFINITY {
                Err(Error::invalid_argument("logits", format!("entry {id} returned by the model function is {v}")))
            } else if v.is_finite() && rounded.is_infinite() {
                Err(Error::invalid_argument("logits", format!("entry {id} ({v}) is outside the float32 range")))
            } else {
                Ok(rounded)
            }
        })
        .collect()
}

impl LanguageModel for Callback<'_> {
    fn vocab_size(&self) -> usize {
        self.model.vocab_size
    }

    fn eos_id(&self) -> Option<u32> {
        self.model.eos_id
    }

    fn next_logits(&mut self, context: &[u32]) -> Result<Vec<f32>> {
        match Python::attach(|py| self.call(py, context)) {
            Ok(result) => result,
            Err(error) => {
                self.error = Some(error);
                Err(Error::invalid_argument("fn", "the model function raised an exception"))
            }
        }
    }
}

impl PyCallableModel {
    /// Runs `decode` over this model with the GIL released between callbacks; a Python
    /// exception from the callable wins over the error it caused.
    fn run<T: Send>(
        &self,
        py: Python<'_>,
        decode: impl FnOnce(&mut Callback<'_>) -> Result<T> + Send,
    ) -> PyResult<T> {
        let mut callback = Callback { model: self, error: None };
        let result = py.detach(|| decode(&mut callback));
        match callback.error.take() {
            Some(error) => Err(error),
            None => result.py(),
        }
    }
}

#[pymethods]
impl PyCallableModel {
    #[new]
    #[pyo3(signature = (function, vocab_size, eos_id=None))]
    fn new(function: Bound<'_, PyAny>, vocab_size: i64, eos_id: Option<i64>) -> PyResult<Self> {
        if !function.is_callable() {
            return Err(PyTypeError::new_err(format!(
                "the model function must be callable, got {}",
                function.get_type().name()?
            )));
        }
        let vocab_size = usize::try_from(vocab_size)
            .ok()
            .filter(|&n| (1..=u32::MAX as usize).contains(&n))
            .ok_or_else(|| Error::invalid_argument("vocab_size", format!("must be in 1..=2^32-1, got {vocab_size}")))
            .py()?;
        let eos_id = eos_id
            .map(|id| {
                u32::try_from(id).ok().filter(|&v| (v as usize) < vocab_size).ok_or_else(|| {
                    Error::invalid_argument("eos_id", format!("{id} is outside the vocabulary of {vocab_size}"))
                })
            })
            .transpose()
            .py()?;
        Ok(PyCallableModel { function: function.unbind(), vocab_size, eos_id })
    }

    #[getter]
    fn function(&self, py: Python<'_>) -> Py<PyAny> {
        self.function.clone_ref(py)
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    #[getter]
    fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Autoregressive generation, speculative if asked: (ids, finish reason, per-step
    /// statistics or [], speculation statistics or None).
    #[pyo3(signature = (prompt_ids, *, max_tokens, sampler, stop_token_ids, steps, speculative=None))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompt_ids: Vec<i64>,
        max_tokens: i64,
        sampler: &PySamplerConfig,
        stop_token_ids: Vec<i64>,
        steps: bool,
        speculative: Option<PyRef<'_, PySpeculative>>,
    ) -> PyResult<GenerationTuple> {
        let request = generate_request(self.vocab_size, prompt_ids, max_tokens, sampler, stop_token_ids).py()?;
        let Some(spec) = speculative else {
            let generation = self.run(py, |model| decode::generate(model, request))?;
            return Ok(generation_tuple(generation, steps, None));
        };
        let spec: &PySpeculative = &spec;
        let draft_model = spec.callable_drafter(py).map(|m| m.get());
        let mut draft = draft_model.map(|model| Callback { model, error: None });
        let eos = self.eos_id;
        let result = self.run(py, |model| {
            let drafter = match draft.as_mut() {
                Some(callback) => Some(Box::new(DraftModel::new(callback, &request.sampler, eos)?) as Box<dyn Drafter + '_>),
                None => None,
            };
            let mut speculation = spec.for_callable(&request, eos, drafter)?;
            let generation = speculative::generate(model, request, &mut speculation)?;
            Ok((generation, speculation.stats()))
        });
        if let Some(error) = draft.and_then(|d| d.error) {
            return Err(error);
        }
        let (generation, stats) = result?;
        Ok(generation_tuple(generation, steps, Some(stats)))
    }

    /// Beam search: [(ids, logprob, score, finished)] ranked by score.
    #[pyo3(signature = (prompt_ids, *, beam_width, max_tokens, length_penalty))]
    fn beam_search(
        &self,
        py: Python<'_>,
        prompt_ids: Vec<i64>,
        beam_width: i64,
        max_tokens: i64,
        length_penalty: f64,
    ) -> PyResult<Vec<BeamTuple>> {
        let args = BeamArgs::new(self.vocab_size, prompt_ids, beam_width, max_tokens, length_penalty).py()?;
        Ok(beam_tuples(self.run(py, |model| args.run(model))?))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCallableModel>()?;
    m.add_function(wrap_pyfunction!(engine_beam_search, m)?)?;
    Ok(())
}

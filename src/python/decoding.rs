//! Bindings for decoding: beam search on a loaded model, and the methods of `CallableModel`
//! (generation, speculative or not, and beam search), whose token loop runs in Rust.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::callable::{Callback, PyCallableModel};
use super::errors::IntoPyResult;
use super::params::PyGenerationParams;
use super::sampling::{count, ids_in_vocab, step_tuple, StepTuple};
use super::session::session_for;
use super::speculative::{stats_tuple, StatsTuple};
use super::PyLoadedModel;
use crate::decode::speculative::{self, DraftModel, Drafter, SpeculationStats};
use crate::decode::{self, Beam, Generation, LanguageModel};
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

/// Beam search on a loaded model: [(ids, logprob, score, finished)] ranked by score.
#[pyfunction]
#[pyo3(signature = (loaded, ids, *, beam_width, max_tokens, length_penalty))]
fn engine_beam_search(
    py: Python<'_>,
    loaded: &PyLoadedModel,
    ids: Vec<i64>,
    beam_width: i64,
    max_tokens: i64,
    length_penalty: f64,
) -> PyResult<Vec<BeamTuple>> {
    let args = BeamArgs::new(loaded.loaded.config().vocab_size, ids, beam_width, max_tokens, length_penalty).py()?;
    let beams = py
        .detach(|| {
            let mut session = session_for(loaded, args.prompt.len(), args.max_tokens)?;
            args.run(&mut session)
        })
        .py()?;
    Ok(beam_tuples(beams))
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

    /// Autoregressive generation, speculative if `params` asks: (ids, finish reason, per-step
    /// statistics or [], speculation statistics or None). A callable model has no tokenizer,
    /// so `params` can hold neither stop strings nor a grammar.
    fn generate(&self, py: Python<'_>, prompt_ids: Vec<i64>, params: &PyGenerationParams) -> PyResult<GenerationTuple> {
        if params.grammar(py).is_some() {
            return Err(Error::invalid_argument("grammar", "a CallableModel has no tokenizer to constrain")).py();
        }
        let request = params.spec(prompt_ids, self.vocab_size).py()?;
        if !request.stop.stop_strings.is_empty() {
            return Err(Error::invalid_argument("stop", "a CallableModel has no tokenizer: stop strings need text")).py();
        }
        let steps = params.steps();
        let Some(spec) = params.speculative(py) else {
            let generation = self.run(py, |model| decode::generate(model, request))?;
            return Ok(generation_tuple(generation, steps, None));
        };
        let spec = spec.get();
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

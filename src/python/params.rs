//! `GenerationParams`: every per-request setting of a generation, checked once when it is
//! built (see `reprolm.GenerationParams`), and the one conversion of those settings and a
//! prompt into a [`GenerationSpec`] for a model.

use pyo3::prelude::*;

use super::errors::IntoPyResult;
use super::grammar::{compile, PyGrammarSpec};
use super::sampling::{count, ids_in_vocab, PySamplerConfig};
use super::speculative::PySpeculative;
use crate::decode::{GenerationSpec, StopConditions};
use crate::loaded_model::LoadedModel;
use crate::error::Result;
use crate::sampling::{LogprobsMode, SamplerConfig};

/// Checked generation settings. The stop token ids are checked against a vocabulary (and the
/// grammar compiled for it) when they meet a model, in [`PyGenerationParams::spec`].
#[pyclass(frozen, name = "GenerationParams", module = "reprolm._core")]
pub struct PyGenerationParams {
    max_tokens: usize,
    /// The sampler with `logprobs` alternatives and the `logprobs_mode` applied.
    sampler: SamplerConfig,
    stop_token_ids: Vec<i64>,
    stop: Vec<String>,
    /// Whether per-step statistics were asked for (`logprobs` given).
    steps: bool,
    grammar: Option<Py<PyGrammarSpec>>,
    speculative: Option<Py<PySpeculative>>,
}

impl PyGenerationParams {
    /// Whether per-step statistics were asked for.
    pub(super) fn steps(&self) -> bool {
        self.steps
    }

    pub(super) fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    pub(super) fn speculative<'py>(&self, py: Python<'py>) -> Option<&Bound<'py, PySpeculative>> {
        self.speculative.as_ref().map(|s| s.bind(py))
    }

    pub(super) fn grammar<'py>(&self, py: Python<'py>) -> Option<&Bound<'py, PyGrammarSpec>> {
        self.grammar.as_ref().map(|g| g.bind(py))
    }

    /// The request for `prompt` on a model of `vocab_size` tokens, without the grammar: the
    /// prompt and stop token ids checked against the vocabulary, the sampler against it.
    pub(super) fn spec(&self, prompt: Vec<i64>, vocab_size: usize) -> Result<GenerationSpec> {
        let stop = StopConditions {
            max_tokens: self.max_tokens,
            stop_token_ids: ids_in_vocab(self.stop_token_ids.clone(), vocab_size)?,
            stop_strings: self.stop.clone(),
        };
        GenerationSpec::new(ids_in_vocab(prompt, vocab_size)?, self.sampler.clone(), stop, vocab_size)
    }

    /// The request for `prompt` on `engine`'s model, with the grammar compiled for its
    /// vocabulary (GIL released while compiling).
    pub(super) fn loaded_spec(&self, py: Python<'_>, loaded: &LoadedModel, prompt: Vec<i64>) -> PyResult<GenerationSpec> {
        let request = self.spec(prompt, loaded.config().vocab_size).py()?;
        match self.grammar(py) {
            Some(spec) => request.with_grammar(compile(py, loaded, spec.get())?).py(),
            None => Ok(request),
        }
    }
}

#[pymethods]
impl PyGenerationParams {
    /// Checks every setting; the errors name it. `logprobs` (alternatives per step, and
    /// per-step statistics) and `logprobs_mode` override the sampler's own.
    #[new]
    #[pyo3(signature = (*, max_tokens, sampler, stop, stop_token_ids, logprobs=None, logprobs_mode=None,
                        grammar=None, speculative=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        max_tokens: i64,
        sampler: &PySamplerConfig,
        stop: Vec<String>,
        stop_token_ids: Vec<i64>,
        logprobs: Option<i64>,
        logprobs_mode: Option<&str>,
        grammar: Option<Py<PyGrammarSpec>>,
        speculative: Option<Py<PySpeculative>>,
    ) -> PyResult<Self> {
        let max_tokens = count("max_tokens", max_tokens).py()?;
        let mut config = sampler.config.clone();
        if let Some(mode) = logprobs_mode {
            config.logprobs_mode = LogprobsMode::from_name(mode).py()?;
        }
        let alternatives = logprobs.map(|n| count("logprobs", n)).transpose().py()?;
        if let Some(n) = alternatives {
            config.top_logprobs = n;
        }
        StopConditions::check_stop_strings(&stop).py()?;
        Ok(PyGenerationParams {
            max_tokens,
            sampler: config,
            stop_token_ids,
            stop,
            steps: alternatives.is_some(),
            grammar,
            speculative,
        })
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyGenerationParams>()?;
    Ok(())
}

//! Bindings for the sampling pipeline: the settings object and the inspection functions.

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;

use super::errors::IntoPyResult;
use crate::error::{Error, Result};
use crate::sampling::{self, LogprobsMode, SamplerConfig, Selection};

/// One selection as Python sees it: (token id, ln q(token), H(q), removed mass,
/// [(id, ln q(id))] of the most probable alternatives).
pub type StepTuple = (u32, f64, f64, f64, Vec<(u32, f64)>);

/// The statistics of one step as a [`StepTuple`].
pub fn step_tuple(selection: Selection) -> StepTuple {
    (selection.token, selection.logprob, selection.entropy, selection.removed_mass, selection.alternatives)
}

/// Python ints as token ids of a vocabulary of `vocab_size`; negative or too large ids raise
/// `TokenOutOfRangeError`.
pub fn ids_in_vocab(ids: Vec<i64>, vocab_size: usize) -> Result<Vec<u32>> {
    ids.into_iter()
        .map(|id| {
            u32::try_from(id).ok().filter(|&v| (v as usize) < vocab_size).ok_or(Error::TokenOutOfRange { id, vocab_size })
        })
        .collect()
}

/// A Python int as a 64-bit generator input (seed or step); the error names it.
pub fn counter(name: &str, value: i128) -> Result<u64> {
    u64::try_from(value).map_err(|_| Error::invalid_argument(name, format!("must be in 0..2^64, got {value}")))
}

/// A Python int as a count (>= 0); the error names the setting.
pub fn count(name: &str, value: i64) -> Result<usize> {
    usize::try_from(value).map_err(|_| Error::invalid_argument(name, format!("must be >= 0, got {value}")))
}

/// Validated sampler settings (see `reprolm.Sampler`).
#[pyclass(frozen, name = "SamplerConfig", module = "reprolm._core")]
pub struct PySamplerConfig {
    pub config: SamplerConfig,
}

#[pymethods]
impl PySamplerConfig {
    #[new]
    #[pyo3(signature = (*, temperature, top_k, top_p, min_p, repetition_penalty, penalty_window,
                        presence_penalty, frequency_penalty, logit_bias, allowed_token_ids,
                        banned_token_ids, seed, top_logprobs, logprobs_mode="processed"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        temperature: f64,
        top_k: i64,
        top_p: f64,
        min_p: f64,
        repetition_penalty: f64,
        penalty_window: Option<i64>,
        presence_penalty: f64,
        frequency_penalty: f64,
        logit_bias: Vec<(i64, f64)>,
        allowed_token_ids: Option<Vec<i64>>,
        banned_token_ids: Vec<i64>,
        seed: i128,
        top_logprobs: i64,
        logprobs_mode: &str,
    ) -> PyResult<Self> {
        let id = |name: &str, v: i64| {
            u32::try_from(v).map_err(|_| crate::Error::invalid_argument(name, format!("token id {v} is out of range")))
        };
        let ids = |name: &str, v: Vec<i64>| v.into_iter().map(|x| id(name, x)).collect::<Result<Vec<u32>, _>>();
        let config = SamplerConfig {
            temperature,
            top_k: count("top_k", top_k).py()?,
            top_p,
            min_p,
            repetition_penalty,
            penalty_window: penalty_window.map(|w| count("penalty_window", w)).transpose().py()?,
            presence_penalty,
            frequency_penalty,
            logit_bias: logit_bias
                .into_iter()
                .map(|(t, b)| Ok((id("logit_bias", t)?, b)))
                .collect::<Result<Vec<_>>>()
                .py()?,
            allowed_token_ids: allowed_token_ids.map(|v| ids("allowed_token_ids", v)).transpose().py()?,
            banned_token_ids: ids("banned_token_ids", banned_token_ids).py()?,
            seed: counter("seed", seed).py()?,
            top_logprobs: count("top_logprobs", top_logprobs).py()?,
            logprobs_mode: LogprobsMode::from_name(logprobs_mode).py()?,
        };
        // Ids are checked against the model's vocabulary when the sampler is used. Here the
        // vocabulary is taken one token larger than the largest id mentioned, so every
        // other setting is validated now and no set can look exhausted by accident.
        let largest = config
            .logit_bias
            .iter()
            .map(|&(t, _)| t)
            .chain(config.allowed_token_ids.iter().flatten().copied())
            .chain(config.banned_token_ids.iter().copied())
            .max()
            .unwrap_or(0);
        config.validate(largest as usize + 2).py()?;
        Ok(PySamplerConfig { config })
    }

    /// The final distribution q (float64) for `logits`, given the context `history` of which
    /// the first `n_prompt` ids are the prompt.
    fn distribution<'py>(
        &self,
        py: Python<'py>,
        logits: PyReadonlyArray1<'py, f32>,
        history: Vec<i64>,
        n_prompt: i64,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let logits = logits.as_slice()?;
        let history = ids_in_vocab(history, logits.len()).py()?;
        let n_prompt = count("n_prompt", n_prompt).py()?;
        let mut sampler = sampling::Sampler::new(self.config.clone(), logits.len()).py()?;
        let q = sampler.distribution(logits, &history, n_prompt).py()?;
        Ok(PyArray1::from_vec(py, q))
    }

    /// One selection: the token decoding step `step` chooses after `history` (the first
    /// `n_prompt` ids are the prompt) given `logits`, with the statistics of q. The same code
    /// as a step of generation.
    fn sample(
        &self,
        logits: PyReadonlyArray1<'_, f32>,
        history: Vec<i64>,
        n_prompt: i64,
        step: i128,
    ) -> PyResult<StepTuple> {
        let step = counter("step", step).py()?;
        let logits = logits.as_slice()?;
        let history = ids_in_vocab(history, logits.len()).py()?;
        let n_prompt = count("n_prompt", n_prompt).py()?;
        let mut sampler = sampling::Sampler::new(self.config.clone(), logits.len()).py()?;
        sampler.sample(logits, &history, n_prompt, step).map(step_tuple).py()
    }
}

fn f64_array<'py>(p: &PyReadonlyArray1<'py, f64>) -> PyResult<Vec<f64>> {
    Ok(p.as_slice()?.to_vec())
}

#[pyfunction]
fn softmax<'py>(py: Python<'py>, z: PyReadonlyArray1<'py, f64>, temperature: f64) -> PyResult<Bound<'py, PyArray1<f64>>> {
    Ok(PyArray1::from_vec(py, sampling::softmax(&f64_array(&z)?, temperature).py()?))
}

#[pyfunction]
fn entropy(p: PyReadonlyArray1<'_, f64>) -> PyResult<f64> {
    sampling::entropy(&f64_array(&p)?).py()
}

#[pyfunction]
fn top_k_set(p: PyReadonlyArray1<'_, f64>, k: usize) -> PyResult<Vec<u32>> {
    sampling::top_k_set(&f64_array(&p)?, k).py()
}

#[pyfunction]
fn top_p_set(p: PyReadonlyArray1<'_, f64>, top_p: f64) -> PyResult<Vec<u32>> {
    sampling::top_p_set(&f64_array(&p)?, top_p).py()
}

#[pyfunction]
fn restrict<'py>(py: Python<'py>, p: PyReadonlyArray1<'py, f64>, subset: Vec<u32>) -> PyResult<Bound<'py, PyArray1<f64>>> {
    Ok(PyArray1::from_vec(py, sampling::restrict(&f64_array(&p)?, &subset).py()?))
}

#[pyfunction]
fn total_variation(p: PyReadonlyArray1<'_, f64>, q: PyReadonlyArray1<'_, f64>) -> PyResult<f64> {
    sampling::total_variation(&f64_array(&p)?, &f64_array(&q)?).py()
}

/// The uniform draw of step `step` for `seed` (the documented counter-based generator).
#[pyfunction]
fn uniform(seed: i128, step: i128) -> PyResult<f64> {
    Ok(sampling::rng::uniform(counter("seed", seed).py()?, counter("step", step).py()?))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySamplerConfig>()?;
    for f in [
        wrap_pyfunction!(softmax, m)?,
        wrap_pyfunction!(entropy, m)?,
        wrap_pyfunction!(top_k_set, m)?,
        wrap_pyfunction!(top_p_set, m)?,
        wrap_pyfunction!(restrict, m)?,
        wrap_pyfunction!(total_variation, m)?,
        wrap_pyfunction!(uniform, m)?,
    ] {
        m.add_function(f)?;
    }
    Ok(())
}

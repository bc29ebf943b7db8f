//! The arguments every generation binding takes, checked once into a [`Request`].

use pyo3::prelude::*;

use super::errors::IntoPyResult;
use super::grammar::{compile, PyGrammarSpec};
use super::sampling::{count, ids_in_vocab, PySamplerConfig};
use crate::decode::{Request, StopConditions};
use crate::engine::Engine;

/// A validated request for `engine`'s model: token ids in the vocabulary, a non-empty prompt,
/// `max_tokens >= 0`, valid sampler settings and stop conditions (the errors name the
/// argument), and the grammar compiled for the model's vocabulary.
#[allow(clippy::too_many_arguments)]
pub(super) fn request(
    py: Python<'_>,
    engine: &Engine,
    ids: Vec<i64>,
    max_tokens: i64,
    sampler: &PySamplerConfig,
    stop_token_ids: Vec<i64>,
    stop: Vec<String>,
    grammar: Option<&PyGrammarSpec>,
) -> PyResult<Request> {
    let vocab_size = engine.config().vocab_size;
    let build = || {
        let stop = StopConditions {
            max_tokens: count("max_tokens", max_tokens)?,
            stop_token_ids: ids_in_vocab(stop_token_ids, vocab_size)?,
            stop_strings: stop,
        };
        Request::new(ids_in_vocab(ids, vocab_size)?, sampler.config.clone(), stop, vocab_size)
    };
    let request = build().py()?;
    match grammar {
        Some(spec) => request.with_grammar(compile(py, engine, spec)?).py(),
        None => Ok(request),
    }
}

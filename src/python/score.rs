//! Binding for scoring a given continuation: one forward pass over the ids, and the raw
//! log-probability of each scored token under the logits of the position before it.

use std::sync::Arc;

use pyo3::prelude::*;

use super::errors::IntoPyResult;
use super::sampling::count;
use super::{token_ids, PyLoadedModel, BLOCK_TOKENS};
use crate::loaded_model::Session;
use crate::error::Error;
use crate::sampling::{score_rows, TokenLogprob};

/// One scored token as Python sees it: (id, ln p(id | ids before it), is_greedy,
/// [(id, ln p)] of the `top` most probable tokens there).
type ScoredTuple = (u32, f64, bool, Vec<(u32, f64)>);

/// The raw log-probabilities of `ids[start..]`, each given the ids before it (`start >= 1`),
/// from one fresh forward pass over `ids`: the context before position `start - 1` is computed
/// without logits, the rest with, in blocks of [`BLOCK_TOKENS`] with Ctrl-C checked between
/// them (any split gives the same bits, docs/theory.md, "The KV cache").
#[pyfunction]
#[pyo3(signature = (loaded, ids, *, start, top))]
fn score(py: Python<'_>, loaded: &PyLoadedModel, ids: Vec<i64>, start: i64, top: i64) -> PyResult<Vec<ScoredTuple>> {
    let ids = token_ids(&loaded.loaded, ids)?;
    let start = count("start", start).py()?;
    let top = count("top", top).py()?;
    if start == 0 || start >= ids.len() {
        return Err(Error::invalid_argument(
            "start",
            format!("must be in 1..{} (a scored token needs a token before it), got {start}", ids.len()),
        ))
        .py();
    }
    let vocab_size = loaded.loaded.config().vocab_size;
    let mut session = Session::new(Arc::clone(&loaded.loaded), ids.len()).py()?;
    // ids[..start - 1]: no logits needed.
    while py.detach(|| session.prefill_part(&ids[..start], BLOCK_TOKENS)).py()? > 0 {
        py.check_signals()?;
    }
    // Row r of a block fed from position `first` holds the logits after it, which score the id
    // at first + r + 1; the last id is never fed.
    let mut scored: Vec<TokenLogprob> = Vec::with_capacity(ids.len() - start);
    for (i, block) in ids[start - 1..ids.len() - 1].chunks(BLOCK_TOKENS).enumerate() {
        if i > 0 || start > 1 {
            py.check_signals()?;
        }
        let first = start - 1 + i * BLOCK_TOKENS;
        let targets = &ids[first + 1..first + 1 + block.len()];
        py.detach(|| -> crate::error::Result<()> {
            let rows = session.feed_all(block)?; // [block.len()][vocab_size]
            scored.extend(score_rows(rows, vocab_size, targets, top)?);
            Ok(())
        })
        .py()?;
    }
    Ok(scored.into_iter().map(|s| (s.token, s.logprob, s.is_greedy, s.alternatives)).collect())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(score, m)?)?;
    Ok(())
}

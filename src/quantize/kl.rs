//! How much quantization moves the model's predictions: the KL divergence KL(p ‖ q) of the
//! next-token distributions of the source model (p) and the quantized model (q) at every
//! position of a text, averaged over the positions.

use std::path::Path;
use std::sync::Arc;

use super::report::KlReport;
use crate::loaded_model::{LoadedModel, LoadOptions};
use crate::error::{Error, Result};

/// log-softmax of one row of logits, in f64.
fn log_softmax(z: &[f32]) -> Vec<f64> {
    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max + z.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
    z.iter().map(|&v| v as f64 - lse).collect()
}

/// KL(p ‖ q) = Σ_i p_i (log p_i - log q_i) for distributions given by their logits (a sum
/// that rounding can push a hair below its true minimum 0 is reported as 0).
pub fn kl_divergence(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let (lp, lq) = (log_softmax(p_logits), log_softmax(q_logits));
    lp.iter().zip(&lq).map(|(&a, &b)| if a == f64::NEG_INFINITY { 0.0 } else { a.exp() * (a - b) }).sum::<f64>().max(0.0)
}

/// Mean and largest KL(source ‖ quantized) over the next-token distributions at every position
/// of `text` (tokenized by the source model, without special tokens, cut to the context).
pub fn next_token_kl(source: &Path, quantized: &Path, text: &str) -> Result<KlReport> {
    let options = LoadOptions::default();
    let reference = Arc::new(LoadedModel::load(source, &options)?);
    let mut ids = reference.tokenizer.encode(text, false)?;
    if ids.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    let vocab = reference.config().vocab_size;
    let p = {
        ids.truncate(reference.config().context_length);
        reference.logits(&ids)?
    };
    drop(reference);
    let candidate = Arc::new(LoadedModel::load(quantized, &options)?);
    if candidate.config().vocab_size != vocab {
        return Err(Error::Model(format!(
            "the quantized model has {} tokens, the source {vocab}",
            candidate.config().vocab_size
        )));
    }
    ids.truncate(candidate.config().context_length);
    let q = candidate.logits(&ids)?;
    let kls: Vec<f64> =
        p.chunks_exact(vocab).zip(q.chunks_exact(vocab)).map(|(a, b)| kl_divergence(a, b)).collect();
    Ok(KlReport {
        mean: kls.iter().sum::<f64>() / kls.len() as f64,
        max: kls.iter().copied().fold(0.0, f64::max),
        n_positions: kls.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_of_known_distributions() {
        // p = (1/2, 1/2), q = (1/4, 3/4): KL = ½ ln 2 + ½ ln(2/3).
        let p = [0.0f32, 0.0];
        let q = [0.0f32, 3f32.ln()];
        let expected = 0.5 * 2f64.ln() + 0.5 * (2.0f64 / 3.0).ln();
        assert!((kl_divergence(&p, &q) - expected).abs() < 1e-7);
        assert_eq!(kl_divergence(&q, &q), 0.0);
    }
}

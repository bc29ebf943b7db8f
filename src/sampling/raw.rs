//! Raw log-probabilities: ln softmax(z) of the model's logits before any processing
//! (penalties, bias, masks, temperature, truncation), as evaluation harnesses and OpenAI's
//! `logprobs` report them.
//!
//! ln softmax(z)_i = (z_i - z_max) - ln Z with Z = sum_j exp(z_j - z_max), where the
//! exponentials and Z are exactly those of the sampler's softmax at temperature 1 (its own
//! `exp`, Z summed in blocks of 32 with TwoSum across blocks: a fixed operation order within a
//! few ulps of the exact sum) and `ln` is taken of that one number. The same logits therefore give the same bits whatever the thread count,
//! batch or SIMD path, and [`log_softmax`](crate::sampling::log_softmax) gives the same values.

use crate::error::{Error, Result};
use crate::sampling::select::argmax;
use crate::sampling::softmax::{check_logits, softmax_into};

/// One token's raw log-probability under a row of logits.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token scored.
    pub token: u32,
    /// ln softmax(z)_token.
    pub logprob: f64,
    /// Whether greedy decoding picks this token from these logits (it is the argmax; on ties
    /// the lowest id is the greedy choice).
    pub is_greedy: bool,
    /// The `top` most probable tokens as (id, ln softmax(z)_id), probability descending, ties
    /// by ascending id; tokens of probability 0 (logit -inf) are never listed.
    pub alternatives: Vec<(u32, f64)>,
}

/// Computes [`TokenLogprob`]s for rows of logits over one vocabulary, reusing its buffers.
#[derive(Clone, Debug)]
pub struct RawLogprobs {
    /// The logits widened to f64; `[vocab_size]`.
    logits: Vec<f64>,
    /// softmax(z) (only its normalizer is used); `[vocab_size]`.
    probs: Vec<f64>,
}

impl RawLogprobs {
    /// Buffers for a vocabulary of `vocab_size` tokens.
    pub fn new(vocab_size: usize) -> RawLogprobs {
        RawLogprobs { logits: vec![0.0; vocab_size], probs: vec![0.0; vocab_size] }
    }

    /// The raw log-probability of `token` under `logits` (`[vocab_size]`), and the `top` most
    /// probable tokens.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for logits of the wrong length, with a NaN or +inf entry or
    /// with every entry -inf, and for a token outside the vocabulary.
    pub fn score(&mut self, logits: &[f32], token: u32, top: usize) -> Result<TokenLogprob> {
        let vocab_size = self.logits.len();
        if logits.len() != vocab_size {
            return Err(Error::invalid_argument(
                "logits",
                format!("has {} entries for a vocabulary of {vocab_size}", logits.len()),
            ));
        }
        if token as usize >= vocab_size {
            return Err(Error::TokenOutOfRange { id: token as i64, vocab_size });
        }
        for (wide, &logit) in self.logits.iter_mut().zip(logits) {
            *wide = logit as f64;
        }
        check_logits(&self.logits, "logits")?;
        let normalization = softmax_into(&self.logits, 1.0, &mut self.probs);
        let log_normalizer = normalization.normalizer.ln();
        let logprob = |z: f64| (z - normalization.max_logit) - log_normalizer;
        let alternatives = most_probable(&self.logits, top).into_iter().map(|id| (id, logprob(self.logits[id as usize])));
        Ok(TokenLogprob {
            token,
            logprob: logprob(self.logits[token as usize]),
            is_greedy: argmax(&self.logits) == Some(token),
            alternatives: alternatives.collect(),
        })
    }
}

/// Scores `targets[r]` under row r of `logits` (`[targets.len()][vocab_size]`, row-major),
/// each row as [`RawLogprobs::score`] does.
pub fn score_rows(logits: &[f32], vocab_size: usize, targets: &[u32], top: usize) -> Result<Vec<TokenLogprob>> {
    if vocab_size == 0 || logits.len() != targets.len() * vocab_size {
        return Err(Error::invalid_argument(
            "logits",
            format!("has {} entries for {} rows of {vocab_size}", logits.len(), targets.len()),
        ));
    }
    let mut raw = RawLogprobs::new(vocab_size);
    logits.chunks_exact(vocab_size).zip(targets).map(|(row, &token)| raw.score(row, token, top)).collect()
}

/// The ids of the `n` largest values (-inf excluded), value descending, ties by ascending id: one pass keeping a sorted list of at most `n` ids.
fn most_probable(z: &[f64], n: usize) -> Vec<u32> {
    let mut best: Vec<u32> = Vec::with_capacity(n.min(z.len()) + 1);
    if n == 0 {
        return best;
    }
    for (id, &value) in z.iter().enumerate() {
        if value == f64::NEG_INFINITY {
            continue;
        }
        // Ids come in ascending order, so a tie never displaces an earlier id.
        if best.len() == n && value <= z[best[n - 1] as usize] {
            continue;
        }
        let at = best.partition_point(|&b| z[b as usize] >= value);
        best.insert(at, id as u32);
        best.truncate(n);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_probable_are_ranked_with_ties_by_ascending_id() {
        let z = [1.0, 3.0, f64::NEG_INFINITY, 3.0, 2.0, 0.5];
        assert_eq!(most_probable(&z, 3), vec![1, 3, 4]);
        assert_eq!(most_probable(&z, 10), vec![1, 3, 4, 0, 5]);
        assert_eq!(most_probable(&z, 0), Vec::<u32>::new());
    }

    #[test]
    fn raw_logprobs_match_a_float64_log_softmax() {
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 1000) as f32 / 37.0 - 13.0).collect();
        let z: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
        let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let log_z = z.iter().map(|v| (v - max).exp()).sum::<f64>().ln() + max;
        let mut raw = RawLogprobs::new(logits.len());
        for token in [0u32, 17, 999] {
            let scored = raw.score(&logits, token, 4).unwrap();
            assert!((scored.logprob - (z[token as usize] - log_z)).abs() < 1e-12);
            assert_eq!(scored.alternatives.len(), 4);
            for (id, lp) in &scored.alternatives {
                assert!((lp - (z[*id as usize] - log_z)).abs() < 1e-12);
            }
        }
        let best = raw.score(&logits, 0, 1).unwrap().alternatives[0].0;
        assert!(raw.score(&logits, best, 0).unwrap().is_greedy);
        assert!(!raw.score(&logits, (best + 1) % 1000, 0).unwrap().is_greedy);
    }

    #[test]
    fn bad_rows_are_refused() {
        let mut raw = RawLogprobs::new(3);
        assert!(raw.score(&[0.0, f32::NAN, 1.0], 0, 0).is_err());
        assert!(raw.score(&[0.0, 1.0], 0, 0).is_err());
        assert!(raw.score(&[0.0, 1.0, 2.0], 3, 0).is_err());
        assert!(score_rows(&[0.0; 5], 3, &[0, 1], 0).is_err());
    }
}

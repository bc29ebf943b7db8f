//! The first pipeline stage: penalties, logit bias and masks on the logits (in f64).
//!
//! Applied in this order to `z_i` (the model's f32 logit converted exactly to f64):
//!
//! 1. repetition penalty r (Hugging Face transformers semantics): for every *distinct* token in
//!    the last `penalty_window` tokens of the history (prompt included; all of it if `None`),
//!    `z <- z / r` if `z > 0`, else `z <- z * r`;
//! 2. frequency and presence penalties (OpenAI semantics) over the *generated* tokens only
//!    (history after the first `n_prompt` ids): `z <- z - c * frequency - presence` for every
//!    token with count c > 0;
//! 3. logit bias: `z <- z + b`;
//! 4. masks: tokens outside `allowed_token_ids` (when given) and in `banned_token_ids` get
//!    `z = -inf`, and so do the tokens outside the grammar's allowed set at this step (when
//!    decoding with a grammar, [`restrict_to_bits`]), so the softmax restricts p to the
//!    intersection S of the allowed sets: p_S, the conditional distribution given S.
//!
//! All arithmetic is f64, left to right as written above. These steps change the order of
//! the logits, unlike temperature (which keeps it).

use crate::sampling::config::SamplerConfig;

/// The configured logit processors plus a reusable per-token counter.
#[derive(Clone, Debug)]
pub(crate) struct Processors {
    repetition_penalty: f64,
    penalty_window: Option<usize>,
    presence_penalty: f64,
    frequency_penalty: f64,
    /// (token id, bias) for every biased token.
    bias: Vec<(u32, f64)>,
    /// `true` for tokens that may be chosen, `[vocab_size]`; `None` when nothing is masked.
    allowed: Option<Vec<bool>>,
    /// Zero between calls; counts occurrences during one call, `[vocab_size]`.
    counts: Vec<u32>,
}

impl Processors {
    /// Builds the processors of a validated configuration.
    pub(crate) fn new(config: &SamplerConfig, vocab_size: usize) -> Self {
        let any_mask = config.allowed_token_ids.is_some() || !config.banned_token_ids.is_empty();
        let allowed = any_mask.then(|| {
            let mut allowed = match &config.allowed_token_ids {
                Some(ids) => {
                    let mut allowed = vec![false; vocab_size];
                    ids.iter().for_each(|&id| allowed[id as usize] = true);
                    allowed
                }
                None => vec![true; vocab_size],
            };
            config.banned_token_ids.iter().for_each(|&id| allowed[id as usize] = false);
            allowed
        });
        Processors {
            repetition_penalty: config.repetition_penalty,
            penalty_window: config.penalty_window,
            presence_penalty: config.presence_penalty,
            frequency_penalty: config.frequency_penalty,
            bias: config.logit_bias.clone(),
            allowed,
            counts: vec![0; vocab_size],
        }
    }

    /// Applies steps 1-4 to `z` in place. `history` ids are in range and `n_prompt <=
    /// history.len()` (checked by the caller).
    /// Applies the stages to `z` and returns the first token whose logit they turned into NaN
    /// or +inf (extreme settings can: a repetition penalty of 1e-300 divides a positive logit
    /// to +inf), with that value; the caller must then not use `z`.
    pub(crate) fn apply(&mut self, z: &mut [f64], history: &[u32], n_prompt: usize) -> Option<(u32, f64)> {
        let mut overflow = None;
        let mut check = |id: u32, logit: f64| {
            if overflow.is_none() && (logit.is_nan() || logit == f64::INFINITY) {
                overflow = Some((id, logit));
            }
        };
        if self.repetition_penalty != 1.0 {
            let window = self.penalty_window.unwrap_or(history.len()).min(history.len());
            let recent = &history[history.len() - window..];
            for &id in recent {
                let count = &mut self.counts[id as usize];
                if *count == 0 {
                    *count = 1;
                    let logit = &mut z[id as usize];
                    *logit =
                        if *logit > 0.0 { *logit / self.repetition_penalty } else { *logit * self.repetition_penalty };
                    check(id, *logit);
                }
            }
            recent.iter().for_each(|&id| self.counts[id as usize] = 0);
        }
        if self.frequency_penalty != 0.0 || self.presence_penalty != 0.0 {
            let generated = &history[n_prompt..];
            generated.iter().for_each(|&id| self.counts[id as usize] += 1);
            for &id in generated {
                let count = std::mem::take(&mut self.counts[id as usize]);
                if count > 0 {
                    let logit = &mut z[id as usize];
                    *logit = *logit - count as f64 * self.frequency_penalty - self.presence_penalty;
                    check(id, *logit);
                }
            }
        }
        for &(id, bias) in &self.bias {
            z[id as usize] += bias;
            check(id, z[id as usize]);
        }
        if let Some(allowed) = &self.allowed {
            for (logit, &ok) in z.iter_mut().zip(allowed) {
                if !ok {
                    *logit = f64::NEG_INFINITY;
                }
            }
        }
        overflow
    }
}

/// Sets `z = -inf` for every token whose bit is clear in `allowed` (bit `id % 32` of word
/// `id / 32`; words past the end of `allowed` are zero): the grammar's part of step 4.
pub(crate) fn restrict_to_bits(z: &mut [f64], allowed: &[u32]) {
    for (block, chunk) in z.chunks_mut(32).enumerate() {
        let word = allowed.get(block).copied().unwrap_or(0);
        for (bit, logit) in chunk.iter_mut().enumerate() {
            if word >> bit & 1 == 0 {
                *logit = f64::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    /// The documented semantics written as plainly as possible.
    fn reference(config: &SamplerConfig, z: &[f32], history: &[u32], n_prompt: usize) -> Vec<f64> {
        let mut z: Vec<f64> = z.iter().map(|&v| v as f64).collect();
        let window = config.penalty_window.unwrap_or(history.len()).min(history.len());
        let distinct: HashSet<u32> = history[history.len() - window..].iter().copied().collect();
        for id in distinct {
            let v = z[id as usize];
            let r = config.repetition_penalty;
            z[id as usize] = if v > 0.0 { v / r } else { v * r };
        }
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &id in &history[n_prompt..] {
            *counts.entry(id).or_default() += 1;
        }
        for (&id, &c) in &counts {
            let v = z[id as usize];
            z[id as usize] = v - c as f64 * config.frequency_penalty - config.presence_penalty;
        }
        for &(id, b) in &config.logit_bias {
            z[id as usize] += b;
        }
        for (id, v) in z.iter_mut().enumerate() {
            let allowed = config.allowed_token_ids.as_ref().is_none_or(|a| a.contains(&(id as u32)));
            if !allowed || config.banned_token_ids.contains(&(id as u32)) {
                *v = f64::NEG_INFINITY;
            }
        }
        z
    }

    #[test]
    fn processors_match_the_reference_on_random_inputs() {
        let mut counter = 0..;
        let mut next = |m: u64| (crate::sampling::rng::uniform(3, counter.next().unwrap()) * m as f64) as u64;
        let vocab = 50;
        for case in 0..500 {
            let z: Vec<f32> = (0..vocab).map(|_| (next(2000) as f32 - 1000.0) / 97.0).collect();
            let history: Vec<u32> = (0..next(40) + 1).map(|_| next(vocab as u64) as u32).collect();
            let n_prompt = next(history.len() as u64 + 1) as usize;
            let config = SamplerConfig {
                repetition_penalty: [1.0, 1.3, 0.7][case % 3],
                penalty_window: [None, Some(0), Some(5), Some(1000)][case % 4],
                presence_penalty: (next(5) as f64 - 2.0) * 0.25,
                frequency_penalty: (next(5) as f64 - 2.0) * 0.5,
                logit_bias: vec![(next(vocab as u64) as u32, 1.5), (vocab as u32 - 1, -2.25)],
                allowed_token_ids: (case % 5 == 0).then(|| (0..vocab as u32).step_by(3).collect()),
                banned_token_ids: vec![next(vocab as u64) as u32],
                ..SamplerConfig::default()
            };
            let mut processors = Processors::new(&config, vocab);
            let mut actual: Vec<f64> = z.iter().map(|&v| v as f64).collect();
            processors.apply(&mut actual, &history, n_prompt);
            assert_eq!(actual, reference(&config, &z, &history, n_prompt), "case {case}");
            assert!(processors.counts.iter().all(|&c| c == 0), "scratch left dirty");
        }
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative_logits_once() {
        let config = SamplerConfig { repetition_penalty: 2.0, ..SamplerConfig::default() };
        let mut processors = Processors::new(&config, 3);
        let mut z = vec![4.0, -4.0, 4.0];
        processors.apply(&mut z, &[0, 0, 0, 1], 4);
        assert_eq!(z, vec![2.0, -8.0, 4.0]);
    }

    #[test]
    fn frequency_and_presence_count_generated_tokens_only() {
        let config = SamplerConfig { presence_penalty: 0.5, frequency_penalty: 1.0, ..SamplerConfig::default() };
        let mut processors = Processors::new(&config, 3);
        let mut z = vec![0.0; 3];
        // Token 0 appears in the prompt only; token 1 twice after it; token 2 once.
        processors.apply(&mut z, &[0, 0, 1, 1, 2], 2);
        assert_eq!(z, vec![0.0, -2.5, -1.5]);
    }
}

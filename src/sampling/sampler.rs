//! [`Sampler`]: the validated pipeline with its reusable buffers, and [`Selection`].

use crate::error::{Error, Result};
use crate::sampling::config::SamplerConfig;
use crate::sampling::processors::Processors;
use crate::sampling::rng::uniform;
use crate::sampling::select::{argmax, inverse_cdf};
use crate::sampling::softmax::{check_logits, softmax_in_place};
use crate::sampling::stats::{entropy_of, most_probable};
use crate::sampling::truncation::{key_id, key_probability, restrict_into, Kept, Truncation};

/// One sampled token with the statistics of the distribution q it was drawn from.
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    /// The chosen token id.
    pub token: u32,
    /// ln q(token).
    pub logprob: f64,
    /// The entropy H(q) in nats.
    pub entropy: f64,
    /// 1 - p(S): the post-temperature mass removed by top-k, top-p and min-p (0 when nothing
    /// was removed, and for the greedy branch whose post-temperature distribution is a point
    /// mass).
    pub removed_mass: f64,
    /// The `top_logprobs` most probable tokens under q as (id, ln q), probability descending,
    /// ties by ascending id; shorter when q has fewer tokens.
    pub alternatives: Vec<(u32, f64)>,
}

/// The outcome of the pipeline before selection.
enum Pipeline {
    /// Temperature 0: the point mass on this token.
    Greedy(u32),
    /// p_tau is in `Sampler::work`, the survivors S in the truncation buffer.
    Sampled(Kept),
}

/// A validated sampling pipeline (see the [module docs](crate::sampling) for the order of the
/// stages) with buffers reused across steps: after construction a step allocates nothing
/// except the `alternatives` it reports.
#[derive(Clone, Debug)]
pub struct Sampler {
    config: SamplerConfig,
    processors: Processors,
    truncation: Truncation,
    /// Logits, then the post-temperature distribution p_tau, in place; `[vocab_size]`.
    work: Vec<f64>,
}

impl Sampler {
    /// Validates `config` for a vocabulary of `vocab_size` tokens (the error names the setting)
    /// and allocates the buffers.
    pub fn new(config: SamplerConfig, vocab_size: usize) -> Result<Sampler> {
        config.validate(vocab_size)?;
        Ok(Sampler {
            processors: Processors::new(&config, vocab_size),
            truncation: Truncation::new(&config, vocab_size),
            work: vec![0.0; vocab_size],
            config,
        })
    }

    /// The settings this sampler was built with.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// The vocabulary size this sampler was built for.
    pub fn vocab_size(&self) -> usize {
        self.work.len()
    }

    /// The final distribution q over the whole vocabulary (zeros outside the support S) for
    /// these logits. `history` is the context so far (prompt then generated ids), of which the
    /// first `n_prompt` are the prompt; the penalties read it.
    pub fn distribution(&mut self, logits: &[f32], history: &[u32], n_prompt: usize) -> Result<Vec<f64>> {
        let mut q = vec![0.0; self.vocab_size()];
        match self.run(logits, history, n_prompt)? {
            Pipeline::Greedy(token) => q[token as usize] = 1.0,
            Pipeline::Sampled(kept) => restrict_into(&mut q, self.truncation.survivors(), &kept.mass),
        }
        Ok(q)
    }

    /// Chooses the token for decoding step `step` (the draw is `rng::uniform(seed, step)`) and
    /// reports the statistics of q. Arguments as for [`Sampler::distribution`].
    pub fn sample(&mut self, logits: &[f32], history: &[u32], n_prompt: usize, step: u64) -> Result<Selection> {
        let kept = match self.run(logits, history, n_prompt)? {
            Pipeline::Greedy(token) => {
                let alternatives = if self.config.top_logprobs > 0 { vec![(token, 0.0)] } else { Vec::new() };
                return Ok(Selection { token, logprob: 0.0, entropy: 0.0, removed_mass: 0.0, alternatives });
            }
            Pipeline::Sampled(kept) => kept,
        };
        let total = kept.mass.to_f64();
        let survivors = self.truncation.survivors();
        let alternatives = most_probable(survivors, self.config.top_logprobs, total);
        let entropy = entropy_of(survivors.iter().map(|&key| key_probability(key) / total));
        survivors.sort_unstable_by_key(|&key| key_id(key));
        let token = inverse_cdf(survivors, &kept.mass, uniform(self.config.seed, step));
        Ok(Selection {
            token,
            logprob: (self.work[token as usize] / total).ln(),
            entropy,
            removed_mass: if kept.removed_any { (1.0 - total).max(0.0) } else { 0.0 },
            alternatives,
        })
    }

    /// Checks the inputs and runs every stage up to selection.
    fn run(&mut self, logits: &[f32], history: &[u32], n_prompt: usize) -> Result<Pipeline> {
        let vocab_size = self.vocab_size();
        if logits.len() != vocab_size {
            return Err(Error::invalid_argument(
                "logits",
                format!("has {} entries for a vocabulary of {vocab_size}", logits.len()),
            ));
        }
        if let Some(&id) = history.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(Error::TokenOutOfRange { id: id as i64, vocab_size });
        }
        if n_prompt > history.len() {
            return Err(Error::invalid_argument(
                "n_prompt",
                format!("{n_prompt} exceeds the history length {}", history.len()),
            ));
        }
        let mut any_bad = false;
        for (slot, &logit) in self.work.iter_mut().zip(logits) {
            any_bad |= logit.is_nan() | (logit == f32::INFINITY);
            *slot = logit as f64;
        }
        if any_bad {
            check_logits(&self.work, "logits")?;
        }
        self.processors.apply(&mut self.work, history, n_prompt);
        if self.work.iter().all(|&v| v == f64::NEG_INFINITY) {
            return Err(Error::invalid_argument(
                "logits",
                "no token has a finite logit once masks and penalties are applied",
            ));
        }
        if self.config.temperature == 0.0 {
            return Ok(Pipeline::Greedy(argmax(&self.work).expect("checked: some logit is finite")));
        }
        let p_max = softmax_in_place(&mut self.work, self.config.temperature);
        Ok(Pipeline::Sampled(self.truncation.apply(&self.work, p_max)))
    }
}

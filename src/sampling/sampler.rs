//! [`Sampler`]: the validated pipeline with its reusable buffers, and [`Selection`].

use crate::error::{Error, Result};
use crate::sampling::config::{LogprobsMode, SamplerConfig};
use crate::sampling::raw::RawLogprobs;
use crate::sampling::processors::{restrict_to_bits, Processors};
use crate::sampling::rng::{uniform, uniform_for, Purpose};
use crate::sampling::speculative::verify_draft;
use crate::sampling::select::{argmax, inverse_cdf, inverse_cdf_dense};
use crate::sampling::softmax::{check_logits, softmax_into, Normalization};
use crate::sampling::exact_sum::ExactSum;
use crate::sampling::truncation::{restrict_into, Kept, Truncation};

/// One sampled token with the statistics of the distribution q it was drawn from.
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    /// The chosen token id.
    pub token: u32,
    /// ln q(token), or ln softmax(z)_token of the unprocessed logits with
    /// [`LogprobsMode::Raw`].
    pub logprob: f64,
    /// The entropy H(q) in nats.
    pub entropy: f64,
    /// 1 - p(S): the post-temperature mass removed by top-k, top-p and min-p (exactly 0 when
    /// nothing was removed, and for the greedy branch whose post-temperature distribution is a
    /// point mass).
    pub removed_mass: f64,
    /// The `top_logprobs` most probable tokens under q as (id, ln q), probability descending,
    /// ties by ascending id; shorter when q has fewer tokens. With [`LogprobsMode::Raw`], the
    /// most probable under softmax(z) of the unprocessed logits, as (id, ln softmax(z)_id).
    pub alternatives: Vec<(u32, f64)>,
}

/// The outcome of the pipeline before selection.
enum Pipeline {
    /// Temperature 0: the point mass on this token.
    Greedy(u32),
    /// p_tau is in `Sampler::probs`, the survivors S are described by `kept`.
    Sampled { kept: Kept, normalization: Normalization },
}

/// How the token is chosen from the final distribution q.
#[derive(Clone, Copy)]
enum Choice<'a> {
    /// Inverse-CDF sampling with this uniform.
    Draw(f64),
    /// Speculative sampling of `token`, drawn by a drafter from `r`.
    Drafted { token: u32, r: &'a [f64], u_accept: f64, u_residual: f64 },
}

impl Choice<'_> {
    /// The token for q given as the survivors' (id, p_i) with normalizer p(S).
    fn choose<I: Iterator<Item = (u32, f64)>>(self, support: impl FnMut() -> I, normalizer: &ExactSum, vocab: usize) -> u32 {
        match self {
            Choice::Draw(u) => inverse_cdf(support, normalizer, u),
            Choice::Drafted { token, r, u_accept, u_residual } => {
                let mut q = vec![0.0; vocab];
                let mut support = support;
                restrict_into(&mut q, support(), normalizer);
                verify_draft(&q, r, token, u_accept, u_residual)
            }
        }
    }
}

/// A validated sampling pipeline (see the [module docs](crate::sampling) for the order of the
/// stages) with buffers reused across steps: after construction a step allocates nothing
/// except the `alternatives` it reports.
#[derive(Clone, Debug)]
pub struct Sampler {
    config: SamplerConfig,
    processors: Processors,
    truncation: Truncation,
    /// The logits as f64 after the processors (-inf = excluded); `[vocab_size]`.
    logits: Vec<f64>,
    /// The post-temperature distribution p_tau; `[vocab_size]`.
    probs: Vec<f64>,
    /// With [`LogprobsMode::Raw`]: the scorer of the unprocessed logits.
    raw: Option<RawLogprobs>,
}

impl Sampler {
    /// Validates `config` for a vocabulary of `vocab_size` tokens (the error names the setting)
    /// and allocates the buffers.
    pub fn new(config: SamplerConfig, vocab_size: usize) -> Result<Sampler> {
        config.validate(vocab_size)?;
        Ok(Sampler {
            processors: Processors::new(&config, vocab_size),
            truncation: Truncation::new(&config, vocab_size),
            logits: vec![0.0; vocab_size],
            probs: vec![0.0; vocab_size],
            raw: (config.logprobs_mode == LogprobsMode::Raw).then(|| RawLogprobs::new(vocab_size)),
            config,
        })
    }

    /// The settings this sampler was built with.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// The vocabulary size this sampler was built for.
    pub fn vocab_size(&self) -> usize {
        self.logits.len()
    }

    /// The final distribution q over the whole vocabulary (zeros outside the support S) for
    /// these logits: q = p_tau when no token was truncated, else p_tau / p(S) on S. `history`
    /// is the context so far (prompt then generated ids), of which the first `n_prompt` are the
    /// prompt; the penalties read it.
    pub fn distribution(&mut self, logits: &[f32], history: &[u32], n_prompt: usize) -> Result<Vec<f64>> {
        self.distribution_restricted(logits, history, n_prompt, None)
    }

    /// [`Sampler::distribution`] with the choice further restricted to the tokens whose bit is
    /// set in `allowed` (bit `id % 32` of word `id / 32`), as a grammar restricts it: the mask
    /// joins the allowed/banned masks in the first stage, so everything after it acts on the
    /// restricted distribution.
    pub fn distribution_restricted(
        &mut self,
        logits: &[f32],
        history: &[u32],
        n_prompt: usize,
        allowed: Option<&[u32]>,
    ) -> Result<Vec<f64>> {
        let mut q = vec![0.0; self.vocab_size()];
        match self.run(logits, history, n_prompt, allowed)? {
            Pipeline::Greedy(token) => q[token as usize] = 1.0,
            Pipeline::Sampled { kept, .. } => {
                restrict_into(&mut q, self.truncation.survivors(&self.probs, &kept).iter(), &kept.normalizer)
            }
        }
        Ok(q)
    }

    /// Chooses the token for decoding step `step` (the draw is `rng::uniform(seed, step)`) and
    /// reports the statistics of q. Arguments as for [`Sampler::distribution`].
    ///
    /// The entropy uses ln q_i = x_i - ln Z - ln p(S), with x_i = (z_i - z_max) / tau the
    /// exponent the softmax used, instead of one logarithm per token (it agrees with
    /// [`entropy`](crate::sampling::entropy) of q to about 1e-15).
    pub fn sample(&mut self, logits: &[f32], history: &[u32], n_prompt: usize, step: u64) -> Result<Selection> {
        self.sample_restricted(logits, history, n_prompt, step, None)
    }

    /// [`Sampler::sample`] restricted to `allowed` as in [`Sampler::distribution_restricted`].
    pub fn sample_restricted(
        &mut self,
        logits: &[f32],
        history: &[u32],
        n_prompt: usize,
        step: u64,
        allowed: Option<&[u32]>,
    ) -> Result<Selection> {
        let u = uniform(self.config.seed, step);
        self.select(logits, history, n_prompt, allowed, Choice::Draw(u))
    }

    /// Speculative sampling at decoding step `step`: keeps `drafted`, which a drafter drew from
    /// its distribution `r` (`[vocab_size]`), with probability min(1, q(x)/r(x)) under these
    /// logits' final distribution q, else draws from the residual max(0, q - r)
    /// ([`verify_draft`]), with the uniforms of purposes [`Purpose::Accept`] and
    /// [`Purpose::Residual`] for `step`. The token is then distributed as q exactly, and equals
    /// `drafted` if and only if it was accepted. At temperature 0 it is the greedy token, as
    /// in [`Sampler::sample`]. The statistics are those of q, as there. `allowed` restricts q
    /// as in [`Sampler::sample_restricted`].
    #[allow(clippy::too_many_arguments)]
    pub fn sample_drafted(
        &mut self,
        logits: &[f32],
        history: &[u32],
        n_prompt: usize,
        step: u64,
        allowed: Option<&[u32]>,
        drafted: u32,
        r: &[f64],
    ) -> Result<Selection> {
        if r.len() != self.vocab_size() || r.get(drafted as usize).is_none_or(|&p| p.is_nan() || p <= 0.0) {
            return Err(Error::invalid_argument(
                "draft",
                format!("a drafted token must have positive probability in a distribution over {} tokens", self.vocab_size()),
            ));
        }
        let seed = self.config.seed;
        let (u_accept, u_residual) = (uniform_for(seed, step, Purpose::Accept), uniform_for(seed, step, Purpose::Residual));
        self.select(logits, history, n_prompt, allowed, Choice::Drafted { token: drafted, r, u_accept, u_residual })
    }

    /// Chooses the token and reports its statistics, the log-probabilities in the configured
    /// [`LogprobsMode`].
    fn select(
        &mut self,
        logits: &[f32],
        history: &[u32],
        n_prompt: usize,
        allowed: Option<&[u32]>,
        choice: Choice<'_>,
    ) -> Result<Selection> {
        let mut selection = self.select_processed(logits, history, n_prompt, allowed, choice)?;
        if let Some(raw) = &mut self.raw {
            let scored = raw.score(logits, selection.token, self.config.top_logprobs)?;
            selection.logprob = scored.logprob;
            selection.alternatives = scored.alternatives;
        }
        Ok(selection)
    }

    /// Chooses the token and reports the statistics of q.
    fn select_processed(
        &mut self,
        logits: &[f32],
        history: &[u32],
        n_prompt: usize,
        allowed: Option<&[u32]>,
        choice: Choice<'_>,
    ) -> Result<Selection> {
        let (kept, normalization) = match self.run(logits, history, n_prompt, allowed)? {
            Pipeline::Greedy(token) => {
                let alternatives = if self.config.top_logprobs > 0 { vec![(token, 0.0)] } else { Vec::new() };
                return Ok(Selection { token, logprob: 0.0, entropy: 0.0, removed_mass: 0.0, alternatives });
            }
            Pipeline::Sampled { kept, normalization } => (kept, normalization),
        };
        let total = kept.normalizer.to_f64();
        let vocab = self.vocab_size();
        // H(q) = sum q_i (ln Z + ln p(S) - x_i) with q_i = p_i / p(S), x_i = (z_i - z_max) / tau,
        // from the sums over S of p_i and of p_i (z_i - z_max).
        let (mass, weighted_logits, token) = if kept.removed_any {
            let survivors = self.truncation.survivors(&self.probs, &kept);
            let (mass, weighted) = survivors.iter().fold((0.0, 0.0), |(mass, weighted), (id, prob)| {
                (mass + prob, weighted + prob * (self.logits[id as usize] - normalization.max_logit))
            });
            (mass, weighted, choice.choose(|| survivors.iter(), &kept.normalizer, vocab))
        } else {
            // S is every token of positive probability: whole-vector loops, no membership tests.
            let (mass, weighted) = moments(&self.probs, &self.logits, normalization.max_logit);
            let token = match choice {
                Choice::Draw(u) => inverse_cdf_dense(&self.probs, &kept.normalizer, u),
                // q = p (normalizer 1).
                Choice::Drafted { token, r, u_accept, u_residual } => verify_draft(&self.probs, r, token, u_accept, u_residual),
            };
            (mass, weighted, token)
        };
        let log_scale = normalization.normalizer.ln() + total.ln();
        let entropy = ((mass * log_scale - weighted_logits / self.config.temperature) / total).max(0.0);
        // Last: listing the alternatives reuses the candidate buffer.
        let alternatives = self.truncation.most_probable(&self.probs, &kept, self.config.top_logprobs, total);
        Ok(Selection {
            token,
            logprob: (self.probs[token as usize] / total).ln(),
            entropy,
            removed_mass: if kept.removed_any { (1.0 - total).max(0.0) } else { 0.0 },
            alternatives,
        })
    }

    /// Checks the inputs and runs every stage up to selection.
    fn run(&mut self, logits: &[f32], history: &[u32], n_prompt: usize, allowed: Option<&[u32]>) -> Result<Pipeline> {
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
        if widen(logits, &mut self.logits) {
            check_logits(&self.logits, "logits")?;
        }
        if let Some((id, logit)) = self.processors.apply(&mut self.logits, history, n_prompt) {
            return Err(Error::invalid_argument(
                "logits",
                format!(
                    "the penalties and logit_bias made the logit of token {id} {logit}: \
                     repetition_penalty, frequency_penalty, presence_penalty or logit_bias is too extreme"
                ),
            ));
        }
        if let Some(allowed) = allowed {
            restrict_to_bits(&mut self.logits, allowed);
        }
        if self.logits.iter().all(|&v| v == f64::NEG_INFINITY) {
            return Err(Error::invalid_argument(
                "logits",
                "no token has a finite logit once masks and penalties are applied",
            ));
        }
        if self.config.temperature == 0.0 {
            return Ok(Pipeline::Greedy(argmax(&self.logits).expect("checked: some logit is finite")));
        }
        let normalization = softmax_into(&self.logits, self.config.temperature, &mut self.probs);
        let kept = self.truncation.apply(&self.probs, 1.0 / normalization.normalizer);
        Ok(Pipeline::Sampled { kept, normalization })
    }
}

multiversion! {
/// Converts the f32 logits to f64 (exactly); true if any is NaN or +inf.
fn widen(logits: &[f32], out: &mut [f64]) -> bool {
    let mut any_bad = false;
    for (slot, &logit) in out.iter_mut().zip(logits) {
        any_bad |= logit.is_nan() | (logit == f32::INFINITY);
        *slot = logit as f64;
    }
    any_bad
}
}

multiversion! {
/// (sum of p_i, sum of p_i (z_i - z_max)) over the tokens with p_i > 0, in 8 interleaved lanes
/// (a fixed order, so it vectorizes and gives the same bits everywhere).
fn moments(p: &[f64], z: &[f64], max_logit: f64) -> (f64, f64) {
    let (mut mass, mut weighted) = ([0.0; 8], [0.0; 8]);
    for (p, z) in p.chunks(8).zip(z.chunks(8)) {
        for lane in 0..p.len() {
            let prob = p[lane];
            // z is -inf where p is 0: skip those rather than form 0 * -inf.
            weighted[lane] += if prob > 0.0 { prob * (z[lane] - max_logit) } else { 0.0 };
            mass[lane] += prob;
        }
    }
    let total = |lanes: [f64; 8]| lanes.iter().fold(0.0, |sum, &x| sum + x);
    (total(mass), total(weighted))
}
}

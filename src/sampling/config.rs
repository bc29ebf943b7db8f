//! Sampler settings as plain data, and their validation.

use crate::error::{Error, Result};
use crate::sampling::softmax::check_temperature;

/// Every sampling setting. Build a [`Sampler`](crate::sampling::Sampler) from it with
/// [`Sampler::new`](crate::sampling::Sampler::new), which validates it against a vocabulary.
///
/// The defaults leave every stage off: temperature 1, no truncation, no penalties, seed 0.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Temperature tau (softmax(z / tau)); 0 selects the greedy branch (argmax, lowest id on
    /// ties). Must be finite and >= 0.
    pub temperature: f64,
    /// Keep the k most probable tokens; 0 = off.
    pub top_k: usize,
    /// Keep the smallest ranked prefix with exact cumulative mass >= top_p, in
    /// (0, 1]; 1 = off.
    pub top_p: f64,
    /// Keep the tokens with probability >= min_p times the largest probability, in [0, 1];
    /// 0 = off.
    pub min_p: f64,
    /// Repetition penalty r > 0 (transformers semantics: positive logits are divided by r,
    /// negative ones multiplied, once per distinct token in the window); 1 = off.
    pub repetition_penalty: f64,
    /// The repetition penalty looks at the last n tokens of the history, prompt included;
    /// `None` = the whole history.
    pub penalty_window: Option<usize>,
    /// Subtracted once from the logit of every token generated at least once (OpenAI
    /// semantics, generated tokens only); 0 = off.
    pub presence_penalty: f64,
    /// Subtracted per occurrence from the logit of every generated token (OpenAI semantics,
    /// generated tokens only); 0 = off.
    pub frequency_penalty: f64,
    /// Added (in f64) to the logits of the given tokens; finite values, each id at most once.
    pub logit_bias: Vec<(u32, f64)>,
    /// When given, only these tokens can be chosen (the conditional distribution given S).
    pub allowed_token_ids: Option<Vec<u32>>,
    /// These tokens are never chosen.
    pub banned_token_ids: Vec<u32>,
    /// Seed of the counter-based generator: step t draws `rng::uniform(seed, t)`.
    pub seed: u64,
    /// Number of most probable alternatives (id, log-probability) reported with each
    /// selection; 0 = none. Does not change what is sampled.
    pub top_logprobs: usize,
    /// Which distribution the reported log-probabilities (of the chosen token and of the
    /// alternatives) are taken from. Does not change what is sampled.
    pub logprobs_mode: LogprobsMode,
}

/// The distribution a [`Selection`](crate::sampling::Selection)'s log-probabilities come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogprobsMode {
    /// The final distribution q the token was drawn from (after penalties, bias, masks,
    /// temperature and truncation); the point mass for greedy decoding.
    #[default]
    Processed,
    /// The model's own distribution softmax(z) of the logits before any processing
    /// ([`RawLogprobs`](crate::sampling::RawLogprobs)).
    Raw,
}

impl LogprobsMode {
    /// The mode named `"processed"` or `"raw"`; any other name is an invalid `logprobs_mode`.
    pub fn from_name(name: &str) -> Result<LogprobsMode> {
        match name {
            "processed" => Ok(LogprobsMode::Processed),
            "raw" => Ok(LogprobsMode::Raw),
            other => Err(Error::invalid_argument(
                "logprobs_mode",
                format!("must be \"raw\" or \"processed\", got {other:?}"),
            )),
        }
    }

    /// The mode's name, as [`LogprobsMode::from_name`] takes it.
    pub fn name(self) -> &'static str {
        match self {
            LogprobsMode::Processed => "processed",
            LogprobsMode::Raw => "raw",
        }
    }
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            penalty_window: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            allowed_token_ids: None,
            banned_token_ids: Vec::new(),
            seed: 0,
            top_logprobs: 0,
            logprobs_mode: LogprobsMode::Processed,
        }
    }
}

impl SamplerConfig {
    /// Greedy decoding: temperature 0, everything else off.
    pub fn greedy() -> Self {
        SamplerConfig { temperature: 0.0, ..SamplerConfig::default() }
    }

    /// Checks every setting against a vocabulary of `vocab_size` tokens; the error names the
    /// offending setting.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        if vocab_size == 0 || vocab_size > u32::MAX as usize {
            return Err(Error::invalid_argument("vocab_size", format!("must be in 1..=2^32-1, got {vocab_size}")));
        }
        check_temperature(self.temperature)?;
        check(self.top_p > 0.0 && self.top_p <= 1.0, "top_p", "must be in (0, 1]", self.top_p)?;
        check((0.0..=1.0).contains(&self.min_p), "min_p", "must be in [0, 1]", self.min_p)?;
        check(
            self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0,
            "repetition_penalty",
            "must be finite and > 0",
            self.repetition_penalty,
        )?;
        for (name, value) in
            [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)]
        {
            check(value.is_finite(), name, "must be finite", value)?;
        }
        check_ids("logit_bias", self.logit_bias.iter().map(|&(id, _)| id), vocab_size)?;
        if let Some(&(id, bias)) = self.logit_bias.iter().find(|(_, bias)| !bias.is_finite()) {
            return Err(Error::invalid_argument("logit_bias", format!("bias of token {id} is {bias}")));
        }
        let mut seen = vec![false; vocab_size];
        for &(id, _) in &self.logit_bias {
            if std::mem::replace(&mut seen[id as usize], true) {
                return Err(Error::invalid_argument("logit_bias", format!("token {id} appears twice")));
            }
        }
        check_ids("banned_token_ids", self.banned_token_ids.iter().copied(), vocab_size)?;
        let mut banned = vec![false; vocab_size];
        self.banned_token_ids.iter().for_each(|&id| banned[id as usize] = true);
        match &self.allowed_token_ids {
            Some(allowed) => {
                check_ids("allowed_token_ids", allowed.iter().copied(), vocab_size)?;
                if allowed.iter().all(|&id| banned[id as usize]) {
                    return Err(Error::invalid_argument(
                        "allowed_token_ids",
                        "no token is left once banned_token_ids are removed",
                    ));
                }
            }
            None if banned.iter().all(|&b| b) => {
                return Err(Error::invalid_argument("banned_token_ids", "every token is banned"));
            }
            None => {}
        }
        Ok(())
    }
}

fn check(ok: bool, name: &str, rule: &str, value: f64) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_argument(name, format!("{rule}, got {value}")))
    }
}

fn check_ids(name: &str, ids: impl Iterator<Item = u32>, vocab_size: usize) -> Result<()> {
    for id in ids {
        if id as usize >= vocab_size {
            return Err(Error::invalid_argument(
                name,
                format!("token id {id} is out of range for a vocabulary of {vocab_size}"),
            ));
        }
    }
    Ok(())
}

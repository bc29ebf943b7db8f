//! Decoding drivers over any next-token model: the autoregressive token loop (definition 3.1)
//! and beam search (definition 3.2).

mod beam;
pub mod stream;

pub use beam::{beam_search, Beam};

use crate::error::{Error, Result};
use crate::sampling::{Sampler, Selection};

/// Anything that gives next-token logits: the GGUF model (with a KV cache that reuses the
/// longest common prefix of consecutive contexts), a Python callable, a test table.
pub trait LanguageModel {
    /// Number of tokens in the vocabulary; every id is below it.
    fn vocab_size(&self) -> usize;
    /// The end-of-sequence token, if the model has one.
    fn eos_id(&self) -> Option<u32>;
    /// Logits (length `vocab_size`) for the next token after `context` (never empty).
    fn next_logits(&mut self, context: &[u32]) -> Result<Vec<f32>>;
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The model's end-of-sequence token was generated.
    Eos,
    /// One of the caller's stop tokens was generated.
    StopToken,
    /// `max_tokens` tokens were generated.
    Length,
}

/// The result of [`generate`].
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The generated ids, including the EOS or stop token that ended generation.
    pub ids: Vec<u32>,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// The selection statistics of every step, one per id.
    pub steps: Vec<Selection>,
}

/// Checks that the prompt is non-empty, its ids are in the vocabulary, and so is the EOS id.
fn check_prompt<M: LanguageModel + ?Sized>(model: &M, prompt: &[u32]) -> Result<()> {
    let vocab_size = model.vocab_size();
    if prompt.is_empty() {
        return Err(Error::EmptyPrompt);
    }
    if let Some(&id) = prompt.iter().find(|&&id| id as usize >= vocab_size) {
        return Err(Error::TokenOutOfRange { id: id as i64, vocab_size });
    }
    if let Some(eos) = model.eos_id().filter(|&eos| eos as usize >= vocab_size) {
        return Err(Error::invalid_argument("eos_id", format!("{eos} is outside the vocabulary of {vocab_size}")));
    }
    Ok(())
}

/// Autoregressive generation (definition 3.1): step t = 0, 1, ... asks the model for the logits
/// after prompt + generated ids, lets `sampler` choose token t with draw `uniform(seed, t)`,
/// appends it, and stops after the model's EOS token, after a token of `stop_token_ids`, or
/// after `max_tokens` tokens. The sampler's penalties see prompt + generated ids as history.
pub fn generate<M: LanguageModel + ?Sized>(
    model: &mut M,
    prompt: &[u32],
    sampler: &mut Sampler,
    max_tokens: usize,
    stop_token_ids: &[u32],
) -> Result<Generation> {
    check_prompt(model, prompt)?;
    let vocab_size = model.vocab_size();
    if sampler.vocab_size() != vocab_size {
        return Err(Error::invalid_argument(
            "sampler",
            format!("built for {} tokens but the model has {vocab_size}", sampler.vocab_size()),
        ));
    }
    if let Some(&id) = stop_token_ids.iter().find(|&&id| id as usize >= vocab_size) {
        return Err(Error::invalid_argument("stop_token_ids", format!("token id {id} is outside the vocabulary")));
    }
    let eos = model.eos_id();
    let mut context = prompt.to_vec();
    let mut steps = Vec::with_capacity(max_tokens);
    let mut finish_reason = FinishReason::Length;
    for step in 0..max_tokens {
        let logits = model.next_logits(&context)?;
        let selection = sampler.sample(&logits, &context, prompt.len(), step as u64)?;
        context.push(selection.token);
        let token = selection.token;
        steps.push(selection);
        if Some(token) == eos {
            finish_reason = FinishReason::Eos;
            break;
        }
        if stop_token_ids.contains(&token) {
            finish_reason = FinishReason::StopToken;
            break;
        }
    }
    Ok(Generation { ids: context.split_off(prompt.len()), finish_reason, steps })
}

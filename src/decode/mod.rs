//! Decoding drivers over any next-token model: the autoregressive token loop and beam search
//! (docs/theory.md, "Autoregressive generation" and "Greedy decoding and beam search").

mod beam;
pub mod sequence;
pub mod speculative;
pub mod stream;

pub use beam::{beam_search, Beam};
pub use sequence::{Finish, GenerationSpec, SequenceDecoder, Step, StopConditions};

use crate::error::{Error, Result};
use crate::sampling::Selection;

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

impl<M: LanguageModel + ?Sized> LanguageModel for &mut M {
    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }
    fn eos_id(&self) -> Option<u32> {
        (**self).eos_id()
    }
    fn next_logits(&mut self, context: &[u32]) -> Result<Vec<f32>> {
        (**self).next_logits(context)
    }
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
    check_eos(model)
}

/// Checks that the model's EOS id, if any, is in its vocabulary.
pub(crate) fn check_eos<M: LanguageModel + ?Sized>(model: &M) -> Result<()> {
    let vocab_size = model.vocab_size();
    match model.eos_id().filter(|&eos| eos as usize >= vocab_size) {
        Some(eos) => Err(Error::invalid_argument("eos_id", format!("{eos} is outside the vocabulary of {vocab_size}"))),
        None => Ok(()),
    }
}

/// The result of [`generate`].
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The generated ids, including the EOS or stop token that ended generation.
    pub ids: Vec<u32>,
    /// Why generation stopped.
    pub finish: Finish,
    /// The selection statistics of every step, one per id.
    pub steps: Vec<Selection>,
}

/// The decoder of `request` on `model`, after checking that they fit together (the sampler's
/// vocabulary, the end-of-sequence id).
pub(crate) fn decoder_for<M: LanguageModel + ?Sized>(model: &M, request: GenerationSpec) -> Result<SequenceDecoder> {
    let vocab_size = model.vocab_size();
    if request.sampler.vocab_size() != vocab_size {
        return Err(Error::invalid_argument(
            "sampler",
            format!("built for {} tokens but the model has {vocab_size}", request.sampler.vocab_size()),
        ));
    }
    check_eos(model)?;
    Ok(SequenceDecoder::new(request, model.eos_id()))
}

/// Autoregressive generation of `request` on `model`, ids only: step t asks
/// the model for the logits after prompt + generated ids and lets the [`SequenceDecoder`]
/// choose token t with draw `uniform(seed, t)`; stops after the model's EOS token, after a
/// stop token, or after `max_tokens` tokens. (Stop strings need text: the text-producing
/// drivers are [`stream::Generator`] and the batch engine.)
pub fn generate<M: LanguageModel + ?Sized>(model: &mut M, request: GenerationSpec) -> Result<Generation> {
    let mut seq = decoder_for(model, request)?;
    let mut steps = Vec::new();
    while seq.finish().is_none() {
        let logits = model.next_logits(seq.context())?;
        steps.push(seq.accept(&logits, None)?.selection);
    }
    let finish = seq.finish().expect("the loop ends when generation has finished");
    Ok(Generation { ids: seq.generated().to_vec(), finish, steps })
}

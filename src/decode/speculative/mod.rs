//! Speculative decoding: a drafter proposes the next tokens, the target scores them all in one
//! multi-token pass, and the sequence's [`SequenceDecoder`] keeps the longest accepted prefix
//! plus one token of the target's own; the positions of rejected drafts are rolled back from
//! the target's KV cache (the next pass reuses only the prefix the context still shares).
//!
//! **Exact.** A multi-token pass gives each row the bits of a single step (docs/theory.md,
//! "The KV cache"), so row i holds the logits plain decoding would compute after the context
//! and the first i drafts. Each position's token is chosen from its row by the decoder, with
//! the draw of its own step t:
//!
//! - a drafter whose draft is a point mass (prompt lookup, and a draft model at temperature 0)
//!   is verified by the target's own selection: the token is plain decoding's (`uniform(seed,
//!   t)`), and the draft is accepted when it matches. This is speculative sampling's rule for
//!   r = the point mass on x (accept with probability q(x), else draw from q without x), with
//!   the draws coupled so that the output is exactly plain decoding's, token ids and
//!   log-probabilities, greedy or sampled, for every k;
//! - a draft model at temperature > 0 draws x_t from its final distribution r_t with
//!   `uniform_for(seed, t, Draft)`, and the target keeps it with probability min(1, q_t(x_t) /
//!   r_t(x_t)) or draws from the residual ([`Sampler::sample_drafted`]), so the token is
//!   distributed exactly as plain sampling's. Every position is decided this way, the last row
//!   of a pass included (the drafter drafts one token more than the pass feeds, where the
//!   original algorithm draws a "bonus" token from q): so the tokens depend on the seed and the
//!   drafter, never on k or on how k adapts.
//!
//! Stop tokens, end-of-sequence, stop strings and `max_tokens` are the decoder's, checked
//! after every accepted token exactly as without speculation; tokens after the one that ends
//! generation are discarded. A pass feeds at most `remaining - 1` drafts, so it never needs
//! more positions than plain decoding of the same request.

mod draft_model;
mod lookup;

use std::collections::VecDeque;

pub use draft_model::DraftModel;
pub use lookup::PromptLookup;

use crate::decode::{decoder_for, Finish, Generation, LanguageModel, GenerationSpec, SequenceDecoder, Step};
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// Drafted tokens, and the distribution each was drawn from (empty for point masses).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Draft {
    pub tokens: Vec<u32>,
    /// `[tokens.len()][vocab_size]` when the drafter samples, else empty.
    pub distributions: Vec<Vec<f64>>,
}

/// Proposes continuations of a sequence.
pub trait Drafter: Send + Sync {
    /// Up to `n` tokens to follow `seq.context()` (fewer, or none, when it has no guess).
    fn propose(&mut self, seq: &SequenceDecoder, n: usize) -> Result<Draft>;
    /// Whether its drafts are drawn from distributions (verified by speculative sampling, with
    /// one draft per row of the pass) rather than point masses (verified by the target's own
    /// selection).
    fn draws_from_distributions(&self, seq: &SequenceDecoder) -> bool;
}

/// A model that scores drafts: the logits after a context and after each draft appended.
pub trait Target {
    /// `[(drafted.len() + 1) * vocab_size]`: the logits after `context`, then after
    /// `context + drafted[..=i]` for each i. Whatever it caches beyond `context` is dropped
    /// by the next call whose context does not extend it.
    fn score(&mut self, context: &[u32], drafted: &[u32]) -> Result<Vec<f32>>;
}

/// Any [`LanguageModel`] scores drafts one prefix at a time (a table, a Python callable).
pub struct Stepwise<'a, M: ?Sized>(pub &'a mut M);

impl<M: LanguageModel + ?Sized> Target for Stepwise<'_, M> {
    fn score(&mut self, context: &[u32], drafted: &[u32]) -> Result<Vec<f32>> {
        let mut prefix = context.to_vec();
        let mut rows = self.0.next_logits(&prefix)?;
        for &x in drafted {
            prefix.push(x);
            rows.extend_from_slice(&self.0.next_logits(&prefix)?);
        }
        Ok(rows)
    }
}

/// How many tokens to draft.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftLength {
    /// The most drafts one pass verifies (k >= 1).
    pub max: usize,
    /// Adapt k to the acceptance: after a pass that accepted every draft k doubles (up to
    /// `max`), after a rejection at draft j it becomes j + 1. And when point-mass drafts (prompt
    /// lookup, a greedy draft model) are rejected at once in c passes in a row, the next
    /// 2^min(c, 4) - 1 passes draft nothing (a pass with drafts costs more than a plain step,
    /// so guesses that keep failing are paused). Off: always `max`. It changes only the speed,
    /// never the tokens.
    pub adaptive: bool,
}

impl DraftLength {
    /// # Errors
    /// [`Error::InvalidArgument`] for `max` = 0 or above 256.
    pub fn new(max: usize, adaptive: bool) -> Result<DraftLength> {
        if !(1..=256).contains(&max) {
            return Err(Error::invalid_argument("draft_tokens", format!("must be in 1..=256, got {max}")));
        }
        Ok(DraftLength { max, adaptive })
    }
}

/// What speculation did for one generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpeculationStats {
    /// Tokens the drafter proposed (verified or discarded after a rejection or the end).
    pub drafted: u64,
    /// Drafted tokens kept.
    pub accepted: u64,
    /// Target passes that produced tokens (each yields the accepted drafts plus one token).
    pub passes: u64,
    /// Passes that verified at least one draft.
    pub drafting_passes: u64,
}

/// The speculative driver of one sequence: its drafter, the draft length and the statistics.
pub struct Speculation<'a> {
    drafter: Box<dyn Drafter + 'a>,
    length: DraftLength,
    /// The next pass's k.
    k: usize,
    /// Consecutive passes whose first draft was rejected.
    cold: u32,
    /// Passes left that draft nothing (point-mass drafters only).
    pause: u32,
    stats: SpeculationStats,
}

impl<'a> Speculation<'a> {
    pub fn new(drafter: Box<dyn Drafter + 'a>, length: DraftLength) -> Speculation<'a> {
        Speculation { drafter, k: length.max, length, cold: 0, pause: 0, stats: SpeculationStats::default() }
    }

    pub fn stats(&self) -> SpeculationStats {
        self.stats
    }

    /// One pass: drafts, scores the drafts on `target`, and lets `seq` choose tokens from the
    /// rows until a draft is rejected or generation ends; returns the steps (at least one).
    pub fn round(&mut self, seq: &mut SequenceDecoder, target: &mut dyn Target, tokenizer: Option<&Tokenizer>) -> Result<Vec<Step>> {
        let remaining = seq.remaining();
        if remaining == 0 {
            return Err(Error::invalid_argument("logits", "generation has already finished"));
        }
        // At most remaining - 1 drafts are fed: the pass yields at most `remaining` tokens.
        let k = self.k.min(remaining - 1);
        let sampled = self.drafter.draws_from_distributions(seq);
        // A sampling drafter drafts every position (the tokens must not depend on k); a
        // point-mass drafter's output is plain decoding's whatever it drafts, so it may pause.
        let paused = !sampled && self.pause > 0;
        self.pause = self.pause.saturating_sub(1);
        let wanted = if sampled { k + 1 } else if paused { 0 } else { k };
        let draft = if wanted > 0 { self.drafter.propose(seq, wanted)? } else { Draft::default() };
        let fed = &draft.tokens[..draft.tokens.len().min(k)];
        let logits = target.score(seq.context(), fed)?;
        let vocab = seq.sampler().vocab_size();
        if logits.len() != (fed.len() + 1) * vocab {
            return Err(Error::invalid_argument("logits", format!("{} values for {} rows", logits.len(), fed.len() + 1)));
        }
        self.stats.passes += 1;
        self.stats.drafted += draft.tokens.len() as u64;
        self.stats.drafting_passes += u64::from(!draft.tokens.is_empty());
        let mut steps = Vec::new();
        let mut accepted = 0;
        for (i, row) in logits.chunks_exact(vocab).enumerate() {
            let drafted = draft.tokens.get(i).copied();
            let step = match (drafted, draft.distributions.get(i)) {
                (Some(x), Some(r)) => seq.accept_drafted(row, x, r, tokenizer)?,
                _ => seq.accept(row, tokenizer)?,
            };
            let kept = drafted == Some(step.selection.token);
            let done = step.finish.is_some();
            steps.push(step);
            if !kept || done {
                break;
            }
            accepted += 1;
        }
        self.stats.accepted += accepted as u64;
        if self.length.adaptive && !draft.tokens.is_empty() {
            self.k = if accepted == draft.tokens.len() { (2 * self.k).min(self.length.max) } else { accepted + 1 };
            self.cold = if accepted == 0 { self.cold + 1 } else { 0 };
            if !sampled && self.cold > 0 {
                self.pause = (1 << self.cold.min(4)) - 1;
            }
        }
        Ok(steps)
    }
}

/// A step queue for drivers that hand out one token at a time.
#[derive(Default)]
pub(crate) struct Queued(VecDeque<Step>);

impl Queued {
    /// The next step, running a pass of `speculation` when none is left.
    pub(crate) fn next(
        &mut self,
        speculation: &mut Speculation<'_>,
        seq: &mut SequenceDecoder,
        target: &mut dyn Target,
        tokenizer: Option<&Tokenizer>,
    ) -> Result<Step> {
        if self.0.is_empty() {
            self.0.extend(speculation.round(seq, target, tokenizer)?);
        }
        Ok(self.0.pop_front().expect("a pass yields at least one step"))
    }

    /// Whether steps computed by the last pass are still to be handed out.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

/// [`crate::decode::generate`] with speculation: the same ids, finish and steps as plain
/// generation when the drafts are point masses, and the same distribution of them otherwise.
pub fn generate<M: LanguageModel + ?Sized>(
    model: &mut M,
    request: GenerationSpec,
    speculation: &mut Speculation<'_>,
) -> Result<Generation> {
    let mut seq = decoder_for(model, request)?;
    let mut steps = Vec::new();
    while seq.finish().is_none() {
        let round = speculation.round(&mut seq, &mut Stepwise(&mut *model), None)?;
        steps.extend(round.into_iter().map(|s| s.selection));
    }
    let finish: Finish = seq.finish().expect("the loop ends when generation has finished");
    Ok(Generation { ids: seq.generated().to_vec(), finish, steps })
}

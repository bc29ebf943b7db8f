//! Beam search (docs/theory.md, "Greedy decoding and beam search") with transformers-style
//! handling of finished hypotheses.
//!
//! - Sequence log-probabilities are sums of `log_softmax` values in f64, added left to right.
//! - Step t ranks the candidates C_t = { (y, v) : y live beam, v token } by log p(y, v)
//!   descending; equal values are ordered by the token sequence y v, lexicographically smaller
//!   first. Only each beam's 2B best tokens can be among the 2B best candidates, so only those
//!   are ranked.
//! - Walking the ranking: a candidate ending in the EOS token becomes a *finished hypothesis*
//!   if it ranks among the first B (transformers' `beam_token_rank < num_beams`); the others
//!   become the next live beams until there are B of them.
//! - Score: log p / len^length_penalty with len the number of generated tokens (EOS
//!   included); length_penalty = 0 ranks by probability alone. At most B finished hypotheses
//!   are kept, the best by score.
//! - The search stops after `max_tokens` steps, when no live beam is left, or once B
//!   hypotheses are finished and no live beam can reach a better score than the worst of them
//!   (exact bound: log p only decreases; the length factor is bounded by the remaining steps).
//!   At `max_tokens`, the live beams join the finished ones as unfinished hypotheses.
//! - Output: up to B hypotheses by score descending, ties by the lexicographically smaller
//!   sequence. Without an EOS token and with length_penalty = 0 this is exactly the beam search
//!   of docs/theory.md: B = 1 is greedy decoding, B >= |V|^(n-1) finds the most probable
//!   sequence.

use std::cmp::Ordering;

use crate::decode::{check_prompt, LanguageModel};
use crate::error::{Error, Result};
use crate::sampling::log_softmax;

/// One hypothesis of [`beam_search`].
#[derive(Clone, Debug, PartialEq)]
pub struct Beam {
    /// The generated ids (ending with EOS when `finished`).
    pub ids: Vec<u32>,
    /// log p(ids | prompt), natural log, summed in f64.
    pub logprob: f64,
    /// `logprob / len^length_penalty` (`logprob` when the length penalty is 0 or len is 0).
    pub score: f64,
    /// Whether the hypothesis ended with the model's EOS token.
    pub finished: bool,
}

/// Orders hypotheses by score descending, then by the lexicographically smaller sequence.
fn by_score(a: &Beam, b: &Beam) -> Ordering {
    b.score.total_cmp(&a.score).then_with(|| a.ids.cmp(&b.ids))
}

/// A candidate (y, v): live beam index, token, log p(y, v).
struct Candidate {
    beam: usize,
    token: u32,
    logprob: f64,
}

/// Beam search of width `beam_width` over at most `max_tokens` generated tokens after `prompt`;
/// returns up to `beam_width` hypotheses ranked by score (see the module docs).
pub fn beam_search<M: LanguageModel + ?Sized>(
    model: &mut M,
    prompt: &[u32],
    beam_width: usize,
    max_tokens: usize,
    length_penalty: f64,
) -> Result<Vec<Beam>> {
    check_prompt(model, prompt)?;
    if beam_width == 0 {
        return Err(Error::invalid_argument("beam_width", "must be at least 1"));
    }
    if !length_penalty.is_finite() {
        return Err(Error::invalid_argument("length_penalty", format!("must be finite, got {length_penalty}")));
    }
    let (vocab_size, eos) = (model.vocab_size(), model.eos_id());
    let score = |logprob: f64, len: usize| {
        if length_penalty == 0.0 || len == 0 {
            logprob
        } else {
            logprob / (len as f64).powf(length_penalty)
        }
    };
    let hypothesis =
        |ids: Vec<u32>, logprob: f64, finished: bool| Beam { score: score(logprob, ids.len()), ids, logprob, finished };

    let mut live = vec![hypothesis(Vec::new(), 0.0, false)];
    let mut finished: Vec<Beam> = Vec::new();
    let mut context = prompt.to_vec();
    let mut stopped_early = false;
    for step in 1..=max_tokens {
        let mut candidates = Vec::with_capacity(live.len() * 2 * beam_width);
        for (beam, hyp) in live.iter().enumerate() {
            context.truncate(prompt.len());
            context.extend_from_slice(&hyp.ids);
            let logits = model.next_logits(&context)?;
            if logits.len() != vocab_size {
                return Err(Error::invalid_argument(
                    "logits",
                    format!("has {} entries for a vocabulary of {vocab_size}", logits.len()),
                ));
            }
            let logprobs = log_softmax(&logits)?;
            let mut tokens: Vec<u32> = (0..vocab_size as u32).collect();
            let by_logprob = |a: &u32, b: &u32| logprobs[*b as usize].total_cmp(&logprobs[*a as usize]).then(a.cmp(b));
            let keep = (2 * beam_width).min(vocab_size);
            if keep < vocab_size {
                tokens.select_nth_unstable_by(keep - 1, by_logprob);
            }
            candidates.extend(tokens[..keep].iter().map(|&token| Candidate {
                beam,
                token,
                logprob: hyp.logprob + logprobs[token as usize],
            }));
        }
        candidates.sort_by(|a, b| {
            b.logprob
                .total_cmp(&a.logprob)
                .then_with(|| live[a.beam].ids.cmp(&live[b.beam].ids))
                .then(a.token.cmp(&b.token))
        });

        let mut next = Vec::with_capacity(beam_width);
        for (rank, candidate) in candidates.iter().enumerate() {
            if next.len() == beam_width {
                break;
            }
            let mut ids = live[candidate.beam].ids.clone();
            ids.push(candidate.token);
            if Some(candidate.token) == eos {
                if rank < beam_width {
                    finished.push(hypothesis(ids, candidate.logprob, true));
                }
            } else {
                next.push(hypothesis(ids, candidate.logprob, false));
            }
        }
        finished.sort_by(by_score);
        finished.truncate(beam_width);
        live = next;

        if live.is_empty() {
            break;
        }
        if step < max_tokens && finished.len() == beam_width {
            // The best score any live beam can still reach: log p only decreases, and the
            // final length lies in step+1 ..= max_tokens.
            let best = live[0].logprob;
            let bound = if length_penalty > 0.0 { score(best, max_tokens) } else { score(best, step + 1) };
            if finished[beam_width - 1].score >= bound {
                stopped_early = true;
                break;
            }
        }
    }
    if !stopped_early {
        finished.append(&mut live);
    }
    finished.sort_by(by_score);
    finished.truncate(beam_width);
    Ok(finished)
}

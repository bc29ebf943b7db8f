//! Drafting with a smaller or cheaper model of the same vocabulary (for example the same
//! weights at int8 precision drafting for their F16 conversion).

use super::{Draft, Drafter};
use crate::decode::{LanguageModel, SequenceDecoder};
use crate::error::{Error, Result};
use crate::sampling::rng::{uniform_for, Purpose};
use crate::sampling::speculative::draw_proportional;
use crate::sampling::Sampler;

/// Drafts with a model: its logits go through a sampler with the target's settings, giving its
/// final distribution r; at temperature 0 the draft is r's point mass (the greedy token),
/// otherwise token t is drawn from r with the uniform of purpose [`Purpose::Draft`] at step t.
pub struct DraftModel<M> {
    model: M,
    sampler: Sampler,
}

impl<M: LanguageModel> DraftModel<M> {
    /// A drafter for a target whose sampler is `target_sampler`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the vocabularies or end-of-sequence tokens differ.
    pub fn new(model: M, target_sampler: &Sampler, target_eos: Option<u32>) -> Result<DraftModel<M>> {
        if model.vocab_size() != target_sampler.vocab_size() {
            return Err(Error::invalid_argument(
                "speculative",
                format!(
                    "the draft model has {} tokens but the target {}: they must share one vocabulary",
                    model.vocab_size(),
                    target_sampler.vocab_size()
                ),
            ));
        }
        if model.eos_id() != target_eos {
            return Err(Error::invalid_argument(
                "speculative",
                format!("the draft model's end-of-sequence token {:?} is not the target's {target_eos:?}", model.eos_id()),
            ));
        }
        Ok(DraftModel { model, sampler: target_sampler.clone() })
    }
}

impl<M: LanguageModel + Send + Sync> Drafter for DraftModel<M> {
    fn propose(&mut self, seq: &SequenceDecoder, n: usize) -> Result<Draft> {
        let mut context = seq.context().to_vec();
        let t0 = seq.generated().len() as u64;
        let greedy = self.sampler.config().temperature == 0.0;
        let eos = self.model.eos_id();
        let mut draft = Draft::default();
        for i in 0..n as u64 {
            let logits = self.model.next_logits(&context)?;
            let token = if greedy {
                self.sampler.sample(&logits, &context, seq.n_prompt(), t0 + i)?.token
            } else {
                let r = self.sampler.distribution(&logits, &context, seq.n_prompt())?;
                let u = uniform_for(self.sampler.config().seed, t0 + i, Purpose::Draft);
                let token = draw_proportional(r.iter().copied(), u).expect("a distribution has positive mass");
                draft.distributions.push(r);
                token
            };
            draft.tokens.push(token);
            context.push(token);
            if Some(token) == eos {
                break;
            }
        }
        Ok(draft)
    }

    fn draws_from_distributions(&self, _seq: &SequenceDecoder) -> bool {
        self.sampler.config().temperature != 0.0
    }
}

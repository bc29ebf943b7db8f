//! Step-by-step generation on one [`Session`]: a [`Generator`] owns the session and a
//! [`SequenceDecoder`], and each [`Generator::next_step`] computes the logits after the context
//! (reusing the session's cached prefix) and lets the decoder choose one token and release
//! the text that became final with it (see [`crate::decode::sequence`]).

use std::sync::Arc;

use crate::decode::sequence::{Finish, GenerationSpec, SequenceDecoder, Step};
use crate::decode::speculative::{Queued, Speculation, SpeculationStats};
use crate::loaded_model::{LoadedModel, Session};
use crate::error::{Error, Result};

/// Autoregressive generation one token at a time on a session.
pub struct Generator {
    loaded: Arc<LoadedModel>,
    session: Session,
    seq: SequenceDecoder,
    /// Speculative decoding, when asked for, and the steps its last pass computed.
    speculation: Option<(Speculation<'static>, Queued)>,
    /// A step failed: the generator yields nothing more.
    failed: bool,
}

impl Generator {
    /// Starts generating `request` in `session` (whose cached prefix shared with the prompt is
    /// reused).
    ///
    /// # Errors
    /// [`Error::ContextOverflow`] if the prompt and `max_tokens` do not fit in a session whose
    /// cache refuses to overflow (a sliding-window session generates past its capacity), or
    /// [`Error::InvalidArgument`] for a request built for another vocabulary.
    pub fn new(session: Session, request: GenerationSpec) -> Result<Generator> {
        Generator::try_new(session, request).map_err(|b| b.0)
    }

    /// [`Generator::new`], giving the session back with the error.
    pub fn try_new(session: Session, request: GenerationSpec) -> std::result::Result<Generator, Box<(Error, Session)>> {
        let loaded = Arc::clone(session.loaded());
        let vocab_size = loaded.config().vocab_size;
        let checked = if request.sampler.vocab_size() != vocab_size {
            Err(Error::invalid_argument(
                "sampler",
                format!("built for {} tokens but the model has {vocab_size}", request.sampler.vocab_size()),
            ))
        } else {
            session.check_generation(request.prompt.len(), request.stop.max_tokens)
        };
        match checked {
            Ok(()) => {
                let seq = SequenceDecoder::new(request, loaded.config().eos_id);
                Ok(Generator { loaded, session, seq, speculation: None, failed: false })
            }
            Err(e) => Err(Box::new((e, session))),
        }
    }

    /// Decodes speculatively from now on (see [`crate::decode::speculative`]): the same tokens
    /// (or, for a sampling draft model, the same distribution of them), fewer passes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] on a sliding-window session: rolling rejected drafts back
    /// out of a full window would recompute it.
    pub fn speculate(&mut self, speculation: Speculation<'static>) -> Result<()> {
        if self.session.cache().overflow() != crate::model::Overflow::Error {
            return Err(Error::invalid_argument("speculative", "needs a session with overflow=\"error\""));
        }
        self.speculation = Some((speculation, Queued::default()));
        Ok(())
    }

    /// What speculation did so far, if the generator speculates.
    pub fn speculation_stats(&self) -> Option<SpeculationStats> {
        self.speculation.as_ref().map(|(s, _)| s.stats())
    }

    /// Generates the next token, or returns `None` once generation has finished (or a step
    /// failed).
    pub fn next_step(&mut self) -> Result<Option<Step>> {
        let queued = self.speculation.as_ref().is_some_and(|(_, q)| !q.is_empty());
        if (self.seq.finish().is_some() && !queued) || self.failed {
            return Ok(None);
        }
        let step = self.advance();
        self.failed = step.is_err();
        step.map(Some)
    }

    /// Computes up to `max_tokens` more of the context the next step needs (the prompt, at
    /// first) without choosing a token; returns how many are still left. Optional: the next
    /// step computes whatever is left, with the same bits.
    pub fn prefill_part(&mut self, max_tokens: usize) -> Result<usize> {
        if self.seq.finish().is_some() || self.failed {
            return Ok(0);
        }
        self.session.prefill_part(self.seq.context(), max_tokens)
    }

    fn advance(&mut self) -> Result<Step> {
        if let Some((speculation, queued)) = &mut self.speculation {
            let step = queued.next(speculation, &mut self.seq, &mut self.session, Some(&self.loaded.tokenizer))?;
            if queued.is_empty() && self.seq.finish().is_some() {
                // Drafts fed after the last token are not part of the sequence.
                self.session.truncate(self.seq.context().len() - 1);
            }
            return Ok(step);
        }
        let logits = self.session.next_logits(self.seq.context())?;
        self.seq.accept(logits, Some(&self.loaded.tokenizer))
    }

    /// The ids generated so far.
    pub fn generated(&self) -> &[u32] {
        self.seq.generated()
    }

    /// Why generation stopped, once it has.
    pub fn finish(&self) -> Option<Finish> {
        self.seq.finish()
    }

    /// The session, to reuse its cache for another prompt. It holds the context of the steps
    /// handed out so far but their last token (with speculation: not the drafts fed beyond).
    pub fn into_session(mut self) -> Session {
        if let Some((_, queued)) = &self.speculation {
            let handed_out = self.seq.context().len() - queued.len();
            self.session.truncate(handed_out - 1);
        }
        self.session
    }
}

impl Iterator for Generator {
    type Item = Result<Step>;

    fn next(&mut self) -> Option<Result<Step>> {
        self.next_step().transpose()
    }
}

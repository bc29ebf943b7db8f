//! Step-by-step generation for streaming: a [`Generator`] owns a [`Session`], a [`Sampler`], the
//! context and the stop conditions, and each [`Generator::next_step`] chooses one token and
//! returns the text that became final with it.
//!
//! Tokens are chosen exactly as [`generate`](crate::decode::generate) chooses them (step t asks
//! for the logits after prompt + generated ids and samples with draw `uniform(seed, t)`), so a
//! generator and `generate` with the same settings produce the same ids.
//!
//! Text is produced incrementally and is always valid UTF-8:
//! - the [`StreamDecoder`] holds back the bytes of a character split across tokens until it is
//!   complete;
//! - stop strings are matched on the decoded text, across token boundaries. Text that might be
//!   the beginning of a stop string is held back until the match completes (generation stops,
//!   and the stop string and everything after it are dropped) or fails (the text is released);
//! - when generation ends, whatever is held back is released (an incomplete character as U+FFFD).
//!
//! The concatenation of all step texts is therefore the decoded text of the generated ids, cut
//! at the first stop string.

use std::sync::Arc;

use crate::decode::check_prompt;
use crate::engine::{Engine, Session};
use crate::error::{Error, Result};
use crate::sampling::{Sampler, Selection};
use crate::tokenizer::StreamDecoder;

/// When a [`Generator`] stops, besides the model's EOS token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopConditions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Generation stops after any of these tokens (which is kept in the ids).
    pub stop_token_ids: Vec<u32>,
    /// Generation stops once the text contains any of these strings (non-empty); the text is
    /// cut where the stop string starts.
    pub stop_strings: Vec<String>,
    /// Leave the text of the EOS or stop token that ends generation out of the text (its id is
    /// still reported). Chat uses this: the end-of-turn token is not part of the reply.
    pub skip_end_token_text: bool,
}

/// Why a [`Generator`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The model's end-of-sequence token was generated.
    Eos,
    /// This token of `stop_token_ids` was generated.
    StopToken(u32),
    /// The stop string with this index in `stop_strings` appeared in the text.
    StopString(usize),
    /// `max_tokens` tokens were generated.
    Length,
}

impl Finish {
    /// The OpenAI-style name: `"eos"`, `"stop"` (stop token or stop string) or `"length"`.
    pub fn reason(self) -> &'static str {
        match self {
            Finish::Eos => "eos",
            Finish::StopToken(_) | Finish::StopString(_) => "stop",
            Finish::Length => "length",
        }
    }
}

/// One generated token and the text it made final.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// The token and the statistics of the distribution it was drawn from.
    pub selection: Selection,
    /// Text released by this step (possibly empty: an incomplete character or a possible start
    /// of a stop string is held back).
    pub text: String,
    /// Set on the last step.
    pub finish: Option<Finish>,
}

/// Autoregressive generation one token at a time (see the [module docs](self)).
pub struct Generator {
    engine: Arc<Engine>,
    session: Session,
    sampler: Sampler,
    /// Prompt then generated ids.
    context: Vec<u32>,
    n_prompt: usize,
    stop: StopConditions,
    decoder: StreamDecoder,
    text: StopText,
    finish: Option<Finish>,
    /// A step failed: the generator yields nothing more.
    failed: bool,
}

impl Generator {
    /// Starts generating after `prompt` in `session` (whose cached prefix shared with `prompt`
    /// is reused).
    ///
    /// # Errors
    /// [`Error::EmptyPrompt`], [`Error::TokenOutOfRange`] for a prompt id outside the
    /// vocabulary, [`Error::InvalidArgument`] for a sampler built for another vocabulary, a stop
    /// token outside the vocabulary or an empty stop string, and [`Error::ContextOverflow`] if
    /// the prompt and `max_tokens` do not fit in a session whose cache refuses to overflow
    /// (a sliding-window session generates past its capacity).
    pub fn new(session: Session, prompt: &[u32], sampler: Sampler, stop: StopConditions) -> Result<Generator> {
        Generator::try_new(session, prompt, sampler, stop).map_err(|b| b.0)
    }

    /// [`Generator::new`], giving the session back with the error.
    pub fn try_new(
        session: Session,
        prompt: &[u32],
        sampler: Sampler,
        stop: StopConditions,
    ) -> std::result::Result<Generator, Box<(Error, Session)>> {
        match Generator::check(&session, prompt, &sampler, &stop) {
            Ok(()) => Ok(Generator::unchecked(session, prompt, sampler, stop)),
            Err(e) => Err(Box::new((e, session))),
        }
    }

    fn check(session: &Session, prompt: &[u32], sampler: &Sampler, stop: &StopConditions) -> Result<()> {
        check_prompt(session, prompt)?;
        let vocab_size = session.engine().config().vocab_size;
        if sampler.vocab_size() != vocab_size {
            return Err(Error::invalid_argument(
                "sampler",
                format!("built for {} tokens but the model has {vocab_size}", sampler.vocab_size()),
            ));
        }
        if let Some(&id) = stop.stop_token_ids.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(Error::invalid_argument("stop_token_ids", format!("token id {id} is outside the vocabulary")));
        }
        if stop.stop_strings.iter().any(String::is_empty) {
            return Err(Error::invalid_argument("stop", "stop strings must not be empty"));
        }
        session.check_generation(prompt.len(), stop.max_tokens)
    }

    fn unchecked(session: Session, prompt: &[u32], sampler: Sampler, stop: StopConditions) -> Generator {
        let engine = Arc::clone(session.engine());
        let finish = (stop.max_tokens == 0).then_some(Finish::Length);
        Generator {
            engine,
            session,
            sampler,
            context: prompt.to_vec(),
            n_prompt: prompt.len(),
            text: StopText::new(stop.stop_strings.clone()),
            stop,
            decoder: StreamDecoder::new(),
            finish,
            failed: false,
        }
    }

    /// Generates the next token, or returns `None` once generation has finished (or a step
    /// failed).
    pub fn next_step(&mut self) -> Result<Option<Step>> {
        if self.finish.is_some() || self.failed {
            return Ok(None);
        }
        let step = self.advance();
        self.failed = step.is_err();
        step.map(Some)
    }

    fn advance(&mut self) -> Result<Step> {
        let t = (self.context.len() - self.n_prompt) as u64;
        let logits = self.session.next_logits(&self.context)?;
        let selection = self.sampler.sample(logits, &self.context, self.n_prompt, t)?;
        let token = selection.token;
        self.context.push(token);
        let end = if Some(token) == self.engine.config().eos_id {
            Some(Finish::Eos)
        } else if self.stop.stop_token_ids.contains(&token) {
            Some(Finish::StopToken(token))
        } else if self.generated().len() >= self.stop.max_tokens {
            Some(Finish::Length)
        } else {
            None
        };

        let mut text = String::new();
        let mut stopped = None;
        if !(self.stop.skip_end_token_text && matches!(end, Some(Finish::Eos | Finish::StopToken(_)))) {
            let piece = self.decoder.push(&self.engine.tokenizer, token)?;
            (text, stopped) = self.text.push(&piece);
        }
        if stopped.is_none() && end.is_some() {
            let (more, s) = self.text.push(&self.decoder.finish());
            text.push_str(&more);
            stopped = s;
            if stopped.is_none() {
                text.push_str(&self.text.release_all());
            }
        }
        self.finish = stopped.map(Finish::StopString).or(end);
        Ok(Step { selection, text, finish: self.finish })
    }

    /// The ids generated so far.
    pub fn generated(&self) -> &[u32] {
        &self.context[self.n_prompt..]
    }

    /// Why generation stopped, once it has.
    pub fn finish(&self) -> Option<Finish> {
        self.finish
    }

    /// The session, to reuse its cache for another prompt.
    pub fn into_session(self) -> Session {
        self.session
    }
}

impl Iterator for Generator {
    type Item = Result<Step>;

    fn next(&mut self) -> Option<Result<Step>> {
        self.next_step().transpose()
    }
}

/// The text not yet released, and the stop strings it is matched against.
#[derive(Debug, Default)]
struct StopText {
    stops: Vec<String>,
    /// Decoded text that is held back: a suffix that might start a stop string.
    pending: String,
}

impl StopText {
    fn new(stops: Vec<String>) -> StopText {
        StopText { stops, pending: String::new() }
    }

    /// Appends `piece` and returns the text that is now final, and the index of the stop string
    /// if one is now complete (the text is then cut where it starts; nothing after is released).
    fn push(&mut self, piece: &str) -> (String, Option<usize>) {
        self.pending.push_str(piece);
        // Everything released earlier was no prefix of a stop string, so a match can only start
        // in `pending`. The earliest start wins.
        for (at, _) in self.pending.char_indices() {
            let rest = &self.pending[at..];
            if let Some(i) = self.stops.iter().position(|s| rest.starts_with(s.as_str())) {
                let out = self.pending[..at].to_owned();
                self.pending.clear();
                return (out, Some(i));
            }
        }
        let hold = self
            .pending
            .char_indices()
            .map(|(at, _)| at)
            .find(|&at| {
                let rest = &self.pending[at..];
                self.stops.iter().any(|s| s.starts_with(rest))
            })
            .unwrap_or(self.pending.len());
        (self.pending.drain(..hold).collect(), None)
    }

    /// Releases everything held back.
    fn release_all(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` and returns the released texts and the stop index.
    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, Option<usize>) {
        let mut t = StopText::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = Vec::new();
        for piece in pieces {
            let (text, stop) = t.push(piece);
            out.push(text);
            if stop.is_some() {
                return (out, stop);
            }
        }
        out.push(t.release_all());
        (out, None)
    }

    #[test]
    fn no_stop_strings_release_everything_at_once() {
        assert_eq!(run(&[], &["ab", "", "c"]), (vec!["ab".into(), "".into(), "c".into(), "".into()], None));
    }

    #[test]
    fn a_stop_string_across_pieces_is_held_back_then_dropped() {
        let (out, stop) = run(&["\n\nUser:"], &["Hello", "\n", "\nUs", "er:", " more"]);
        assert_eq!(out, vec!["Hello", "", "", ""]);
        assert_eq!(stop, Some(0));
    }

    #[test]
    fn a_failed_partial_match_is_released() {
        let (out, stop) = run(&["END"], &["a E", "N", "x", "EN"]);
        assert_eq!(out, vec!["a ", "", "ENx", "", "EN"]);
        assert_eq!(stop, None);
    }

    #[test]
    fn the_earliest_match_wins_and_the_text_after_is_dropped() {
        let (out, stop) = run(&["cd", "b"], &["abcd"]);
        assert_eq!((out, stop), (vec!["a".to_string()], Some(1)));
        // A match inside one piece, text before it in the same piece.
        let (out, stop) = run(&["。"], &["日本", "語。です"]);
        assert_eq!((out, stop), (vec!["日本".to_string(), "語".to_string()], Some(0)));
    }

    #[test]
    fn partial_matches_restart_inside_the_held_text() {
        // "aab" with stop "ab": the first 'a' cannot start a match once the second arrives.
        let (out, stop) = run(&["ab"], &["a", "a", "b"]);
        assert_eq!((out, stop), (vec!["".to_string(), "a".to_string(), "".to_string()], Some(0)));
    }
}

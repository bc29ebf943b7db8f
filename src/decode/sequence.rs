//! One sequence's token loop, independent of where its logits come from: a validated
//! [`GenerationSpec`] and the [`SequenceDecoder`] that turns each step's logits into a token, the
//! text it makes final, and the decision to stop.
//!
//! Every driver runs this one loop: [`generate`](crate::decode::generate) over any
//! [`LanguageModel`](crate::decode::LanguageModel), the streaming
//! [`Generator`](crate::decode::stream::Generator) on a session, and the batch engine
//! ([`crate::batch`]), which feeds many decoders from one forward pass. Step t samples with
//! draw `uniform(seed, t)` from the logits after prompt + generated ids, so a sequence's
//! tokens depend only on its own request and logits, never on the driver.
//!
//! With a [`Grammar`], step t first asks the sequence's [`GrammarState`] for the allowed set S,
//! the sampler restricts the logits to S (with the allowed/banned masks, before temperature
//! and truncation: conditioning on S), and the chosen token is fed back to the grammar.
//!
//! Text is produced incrementally and is always valid UTF-8:
//! - the [`StreamDecoder`] holds back the bytes of a character split across tokens until it is
//!   complete;
//! - stop strings are matched on the decoded text, across token boundaries. Text that might be
//!   the beginning of a stop string is held back until the match completes (generation stops,
//!   and the stop string and everything after it are dropped) or fails (the text is released);
//! - the end-of-sequence or stop token that ends generation adds no text (its id is kept);
//! - when generation ends, whatever is held back is released (an incomplete character as U+FFFD).
//!
//! The concatenation of all step texts is therefore the decoded text of the generated ids
//! without the ending token, cut at the first stop string.

use crate::error::{Error, Result};
use crate::grammar::{Grammar, GrammarState};
use crate::sampling::{Sampler, SamplerConfig, Selection};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// When generation stops, besides the model's end-of-sequence token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopConditions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Generation stops after any of these tokens (which is kept in the ids, not in the text).
    pub stop_token_ids: Vec<u32>,
    /// Generation stops once the text contains any of these strings (non-empty); the text is
    /// cut where the stop string starts.
    pub stop_strings: Vec<String>,
}

impl StopConditions {
    /// Stop strings must not be empty (an empty one would match before any text).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `stop`.
    pub fn check_stop_strings(strings: &[String]) -> Result<()> {
        if strings.iter().any(String::is_empty) {
            return Err(Error::invalid_argument("stop", "stop strings must not be empty"));
        }
        Ok(())
    }
}

/// Why generation stopped.
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

/// A generation request, validated once: the prompt, the sampler, the stop conditions and the
/// grammar the text must follow (if any).
#[derive(Clone, Debug)]
pub struct GenerationSpec {
    pub prompt: Vec<u32>,
    pub sampler: Sampler,
    pub stop: StopConditions,
    pub grammar: Option<Grammar>,
}

impl GenerationSpec {
    /// Checks everything that does not depend on the cache the request will run in.
    ///
    /// # Errors
    /// [`Error::EmptyPrompt`], [`Error::TokenOutOfRange`] for a prompt id outside the
    /// vocabulary, [`Error::InvalidArgument`] for a bad sampler setting, a stop token outside
    /// the vocabulary or an empty stop string.
    pub fn new(prompt: Vec<u32>, sampler: SamplerConfig, stop: StopConditions, vocab_size: usize) -> Result<GenerationSpec> {
        let sampler = Sampler::new(sampler, vocab_size)?;
        GenerationSpec::with_sampler(prompt, sampler, stop)
    }

    /// [`GenerationSpec::new`] with a sampler already built (for its vocabulary).
    pub fn with_sampler(prompt: Vec<u32>, sampler: Sampler, stop: StopConditions) -> Result<GenerationSpec> {
        let vocab_size = sampler.vocab_size();
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        if let Some(&id) = prompt.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(Error::TokenOutOfRange { id: id as i64, vocab_size });
        }
        if let Some(&id) = stop.stop_token_ids.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(Error::invalid_argument("stop_token_ids", format!("token id {id} is outside the vocabulary")));
        }
        StopConditions::check_stop_strings(&stop.stop_strings)?;
        Ok(GenerationSpec { prompt, sampler, stop, grammar: None })
    }

    /// The request with its text constrained by `grammar` (compiled for the same vocabulary).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a grammar compiled for another vocabulary.
    pub fn with_grammar(self, grammar: Grammar) -> Result<GenerationSpec> {
        if grammar.vocab_size() != self.sampler.vocab_size() {
            return Err(Error::invalid_argument(
                "grammar",
                format!("compiled for {} tokens but the model has {}", grammar.vocab_size(), self.sampler.vocab_size()),
            ));
        }
        Ok(GenerationSpec { grammar: Some(grammar), ..self })
    }

    /// Positions a cache needs to run the whole request: prompt plus `max_tokens`.
    pub fn positions_needed(&self) -> usize {
        self.prompt.len().saturating_add(self.stop.max_tokens)
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

/// One sequence's decoding state (see the [module docs](self)).
#[derive(Debug)]
pub struct SequenceDecoder {
    sampler: Sampler,
    /// The grammar's state after the generated ids, when the request has a grammar.
    grammar: Option<GrammarState>,
    /// Prompt then generated ids.
    context: Vec<u32>,
    n_prompt: usize,
    stop: StopConditions,
    eos: Option<u32>,
    decoder: StreamDecoder,
    text: StopText,
    finish: Option<Finish>,
}

impl SequenceDecoder {
    /// Starts decoding `request` for a model whose end-of-sequence token is `eos`.
    pub fn new(request: GenerationSpec, eos: Option<u32>) -> SequenceDecoder {
        let GenerationSpec { prompt, sampler, stop, grammar } = request;
        SequenceDecoder {
            sampler,
            grammar: grammar.as_ref().map(Grammar::start),
            n_prompt: prompt.len(),
            context: prompt,
            text: StopText::new(stop.stop_strings.clone()),
            finish: (stop.max_tokens == 0).then_some(Finish::Length),
            stop,
            eos,
            decoder: StreamDecoder::new(),
        }
    }

    /// Prompt then generated ids: the next logits are those after all of it.
    pub fn context(&self) -> &[u32] {
        &self.context
    }

    /// The ids generated so far.
    pub fn generated(&self) -> &[u32] {
        &self.context[self.n_prompt..]
    }

    pub fn n_prompt(&self) -> usize {
        self.n_prompt
    }

    /// Why generation stopped, once it has.
    pub fn finish(&self) -> Option<Finish> {
        self.finish
    }

    /// Chooses the next token from the logits after [`SequenceDecoder::context`] and returns
    /// it with the text it made final (decoded with `tokenizer`; no text without one).
    ///
    /// # Errors
    /// The sampler's errors (logits of the wrong length, NaN, nothing allowed), the grammar's
    /// ([`Error::Grammar`]), or [`Error::InvalidArgument`] if generation has already finished.
    pub fn accept(&mut self, logits: &[f32], tokenizer: Option<&Tokenizer>) -> Result<Step> {
        self.choose(tokenizer, |sampler, context, n_prompt, t, allowed| {
            sampler.sample_restricted(logits, context, n_prompt, t, allowed)
        })
    }

    /// [`SequenceDecoder::accept`] for a drafted token: speculative sampling keeps `drafted`,
    /// which a drafter drew from its distribution `r`, or replaces it, so that the token is
    /// distributed as plain sampling's ([`Sampler::sample_drafted`]); it is `drafted` exactly
    /// when the draft was accepted.
    ///
    /// # Errors
    /// Those of [`SequenceDecoder::accept`], and [`Error::InvalidArgument`] for a draft outside
    /// `r`'s support.
    pub fn accept_drafted(&mut self, logits: &[f32], drafted: u32, r: &[f64], tokenizer: Option<&Tokenizer>) -> Result<Step> {
        self.choose(tokenizer, |sampler, context, n_prompt, t, allowed| {
            sampler.sample_drafted(logits, context, n_prompt, t, allowed, drafted, r)
        })
    }

    /// Runs `select` on the sampler with the context, the prompt length, the step and the
    /// grammar's allowed set (if any), then appends the token it chose.
    fn choose(
        &mut self,
        tokenizer: Option<&Tokenizer>,
        select: impl FnOnce(&mut Sampler, &[u32], usize, u64, Option<&[u32]>) -> Result<Selection>,
    ) -> Result<Step> {
        if self.finish.is_some() {
            return Err(Error::invalid_argument("logits", "generation has already finished"));
        }
        let t = self.generated().len() as u64;
        let allowed = match &mut self.grammar {
            Some(grammar) => Some(grammar.allowed()?),
            None => None,
        };
        let selection = select(&mut self.sampler, &self.context, self.n_prompt, t, allowed)?;
        self.push(selection, tokenizer)
    }

    /// The sampler's settings (a drafter samples with the same ones).
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// Tokens that may still be generated.
    pub fn remaining(&self) -> usize {
        if self.finish.is_some() {
            0
        } else {
            self.stop.max_tokens - self.generated().len()
        }
    }

    /// Appends the chosen token (fed to the grammar) and works out the text and the finish.
    fn push(&mut self, selection: Selection, tokenizer: Option<&Tokenizer>) -> Result<Step> {
        let token = selection.token;
        if let Some(grammar) = &mut self.grammar {
            if Some(token) != self.eos {
                grammar.accept(token)?;
            }
        }
        self.context.push(token);
        let end = if Some(token) == self.eos {
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
        if let Some(tokenizer) = tokenizer {
            if !matches!(end, Some(Finish::Eos | Finish::StopToken(_))) {
                let piece = self.decoder.push(tokenizer, token)?;
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
        }
        self.finish = stopped.map(Finish::StopString).or(end);
        Ok(Step { selection, text, finish: self.finish })
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

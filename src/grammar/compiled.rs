//! [`Grammar`]: a spec compiled for one vocabulary; [`GrammarState`]: one sequence in it.

use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;

use super::{grammar_error, GrammarSpec, GrammarVocabulary};
use crate::error::{Error, Result};

/// A [`GrammarSpec`] compiled for one vocabulary, in its initial state (cheap to clone). Each
/// sequence decodes with its own [`GrammarState`] from [`Grammar::start`].
#[derive(Clone)]
pub struct Grammar {
    spec: GrammarSpec,
    initial: Matcher,
    vocab_size: usize,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").field("spec", &self.spec).field("vocab_size", &self.vocab_size).finish()
    }
}

impl Grammar {
    /// Compiles `spec` for `vocabulary`.
    ///
    /// # Errors
    /// [`Error::Grammar`] naming the problem: a JSON Schema that is not JSON, is invalid or uses
    /// an unsupported keyword; a regular expression or Lark syntax error; an empty choice; a
    /// grammar that no token of the vocabulary can start.
    pub fn compile(spec: &GrammarSpec, vocabulary: &GrammarVocabulary) -> Result<Grammar> {
        let parser = vocabulary.factory().create_parser(spec.to_llguidance()?).map_err(grammar_error)?;
        let mut initial = Matcher::new(Ok(parser));
        if let Some(e) = initial.get_error() {
            return Err(Error::Grammar(e));
        }
        match initial.compute_mask() {
            Ok(mask) if !mask.is_zero() => {}
            Ok(_) => return Err(Error::Grammar("no token of the vocabulary can start the grammar".into())),
            Err(e) => return Err(Error::Grammar(format!("no token of the vocabulary can start the grammar: {e}"))),
        }
        Ok(Grammar { spec: spec.clone(), initial, vocab_size: vocabulary.vocab_size() })
    }

    /// Checks `spec` without a model: compiles it for the vocabulary of the 256 single bytes,
    /// which finds every error but a grammar the model's tokens cannot start.
    pub fn check(spec: &GrammarSpec) -> Result<()> {
        Grammar::compile(spec, GrammarVocabulary::bytes()?).map(|_| ())
    }

    /// The size of the vocabulary it was compiled for.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// A new sequence at the start of the grammar.
    pub fn start(&self) -> GrammarState {
        GrammarState { matcher: self.initial.clone(), mask: SimpleVob::alloc(self.vocab_size), tokens: 0 }
    }
}

/// One sequence's position in a [`Grammar`]: the tokens accepted so far decide the allowed set
/// S of the next one.
#[derive(Clone)]
pub struct GrammarState {
    matcher: Matcher,
    /// S as computed by the last [`GrammarState::allowed`]: bit `id % 32` of word `id / 32`.
    mask: SimpleVob,
    /// Tokens accepted so far.
    tokens: usize,
}

impl std::fmt::Debug for GrammarState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarState").field("tokens", &self.tokens).finish()
    }
}

impl GrammarState {
    /// The allowed set S of the next token, as bits: token `id` is allowed when bit `id % 32`
    /// of word `id / 32` is set (words past the end of the slice are zero). The end-of-sequence
    /// token is in S exactly when the grammar accepts the text so far; once the grammar can
    /// take no more text, S is the end-of-sequence token alone.
    ///
    /// # Errors
    /// [`Error::Grammar`] if no token can continue the text (not expected from a checked
    /// grammar over a byte-level vocabulary) or the grammar engine hit one of its work limits.
    pub fn allowed(&mut self) -> Result<&[u32]> {
        let mask = self.matcher.compute_mask_or_eos();
        self.mask = mask.map_err(|e| self.failure(e))?;
        if self.mask.is_zero() {
            return Err(self.failure("no token can continue the text"));
        }
        Ok(self.mask.as_slice())
    }

    /// The ids in S ([`GrammarState::allowed`]), ascending.
    pub fn allowed_ids(&mut self) -> Result<Vec<u32>> {
        self.allowed()?;
        Ok(self.mask.to_list())
    }

    /// Advances past `token`, which must be in S (the end-of-sequence token ends the text).
    ///
    /// # Errors
    /// [`Error::Grammar`] for a token outside S.
    pub fn accept(&mut self, token: u32) -> Result<()> {
        let consumed = self.matcher.consume_token(token);
        consumed.map_err(|e| self.failure(e))?;
        self.tokens += 1;
        Ok(())
    }

    /// Whether the text so far is complete: the end-of-sequence token is allowed now.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    fn failure(&self, e: impl std::fmt::Display) -> Error {
        Error::Grammar(format!("after {} tokens: {e}", self.tokens))
    }
}

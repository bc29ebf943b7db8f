//! [`Grammar`]: a spec compiled for one vocabulary; [`GrammarState`]: one sequence in it.

use llguidance::toktrie::{SimpleVob, TokenId};
use llguidance::Matcher;

use std::sync::Arc;

use super::{grammar_error, GrammarSpec, GrammarVocabulary};
use crate::error::{Error, Result};

/// A [`GrammarSpec`] compiled for one vocabulary, in its initial state (cheap to clone). Each
/// sequence decodes with its own [`GrammarState`] from [`Grammar::start`].
#[derive(Clone)]
pub struct Grammar {
    spec: GrammarSpec,
    /// One matcher per part of the vocabulary (see [`GrammarVocabulary::new`]), or one for all.
    initial: Vec<Matcher>,
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
        // Each part's parser has its own lexer (deep clones), so that parts run in parallel.
        let mut initial: Vec<Matcher> = vocabulary
            .parts()
            .iter()
            .map(|bias| {
                let mut part = parser.deep_clone();
                part.bias_computer = Arc::clone(bias);
                Matcher::new(Ok(part))
            })
            .collect();
        if initial.is_empty() {
            initial.push(Matcher::new(Ok(parser)));
        }
        if let Some(e) = initial[0].get_error() {
            return Err(Error::Grammar(e));
        }
        // The first S, computed here, stays cached in the parsers every sequence starts from.
        match allowed_set(&mut initial) {
            Ok(mask) if !mask.is_zero() && lone_token_is_valid(&mut initial, &mask) => {}
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
        GrammarState { matchers: self.initial.clone(), mask: SimpleVob::alloc(self.vocab_size), tokens: 0 }
    }
}

/// One sequence's position in a [`Grammar`]: the tokens accepted so far decide the allowed set
/// S of the next one.
#[derive(Clone)]
pub struct GrammarState {
    /// One per part of the vocabulary, all fed the same tokens (or one for the whole).
    matchers: Vec<Matcher>,
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
        let mask = allowed_set(&mut self.matchers);
        self.mask = mask.map_err(|e| failure(self.tokens, e))?;
        if self.mask.is_zero() || !lone_token_is_valid(&mut self.matchers, &self.mask) {
            return Err(failure(self.tokens, "no token can continue the text"));
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
        let tokens = self.tokens;
        for matcher in &mut self.matchers {
            matcher.consume_token(token).map_err(|e| failure(tokens, e))?;
        }
        self.tokens += 1;
        Ok(())
    }

    /// Whether the text so far is complete: the end-of-sequence token is allowed now.
    pub fn is_accepting(&mut self) -> bool {
        self.matchers[0].is_accepting().unwrap_or(false)
    }
}

/// Whether S (`mask`), if it is one token forced by the grammar, is a token the grammar
/// accepts: it is not when the forced text has a byte no token of the vocabulary spells (see
/// `TokenizerEnvironment::tokenize_bytes`), and then no token can continue the text.
fn lone_token_is_valid(matchers: &mut [Matcher], mask: &SimpleVob) -> bool {
    if mask.num_set() != 1 || matchers[0].is_accepting().unwrap_or(false) {
        return true;
    }
    let token = mask.first_bit_set().expect("one bit is set") as TokenId;
    matches!(matchers[0].validate_tokens(&[token]), Ok(1))
}

/// A grammar failure after `tokens` accepted tokens.
fn failure(tokens: usize, e: impl std::fmt::Display) -> Error {
    Error::Grammar(format!("after {tokens} tokens: {e}"))
}

/// S from one matcher for the whole vocabulary, or from one per part.
fn allowed_set(matchers: &mut [Matcher]) -> std::result::Result<SimpleVob, String> {
    match matchers {
        [whole] => whole.compute_mask_or_eos().map_err(|e| e.to_string()),
        parts => union_of_parts(parts),
    }
}

/// S as the union of the parts' sets, computed on several threads
/// ([`share_items`](crate::threads::share_items)), without the spare bit the parts set.
fn union_of_parts(parts: &mut [Matcher]) -> std::result::Result<SimpleVob, String> {
    let mut sets: Vec<(&mut Matcher, Option<std::result::Result<SimpleVob, String>>)> = parts.iter_mut().map(|m| (m, None)).collect();
    crate::threads::share_items(&mut sets, |(matcher, set)| *set = Some(matcher.compute_mask_or_eos().map_err(|e| e.to_string())));
    let mut union: Option<SimpleVob> = None;
    for (_, set) in sets {
        let set = set.expect("every part is computed")?;
        match &mut union {
            Some(union) => union.or(&set),
            None => union = Some(set),
        }
    }
    let mut union = union.expect("at least one part");
    union.disallow_token(union.len() as TokenId);
    Ok(union)
}

//! Constrained decoding: grammars as producers of the allowed set S for the next token.
//!
//! Constrained decoding restricts the distribution, at each step, to the set S of tokens the
//! grammar allows there: the conditional distribution given S, which keeps the probability
//! ratios inside S (docs/theory.md, "Truncation is conditioning"). Here:
//!
//! - a [`GrammarSpec`] says what the output must be: a JSON Schema, a regular expression, a
//!   Lark grammar (llguidance's dialect) or a choice among literal strings;
//! - a [`GrammarVocabulary`] is the model's vocabulary as [llguidance] sees it: a token trie
//!   built from the exact bytes of every token of reprolm's own [`Tokenizer`], special tokens
//!   marked so that no grammar produces them as text (built once per model);
//! - a [`Grammar`] is a spec compiled for one vocabulary (checked: it must parse, and some
//!   token must be able to start it), and a [`GrammarState`] one sequence's position in it.
//!   At each step [`GrammarState::allowed`] gives S (the end-of-sequence token is in S exactly
//!   where the grammar accepts the text so far), the sampler restricts the logits to S, and the
//!   chosen token is fed back with [`GrammarState::accept`].
//!
//! S may be computed in parts, one per thread: each part of the vocabulary has its own token
//! trie and its own copy of the parser (all fed the same tokens), and S is the union of the
//! parts' sets; the parts change how fast S is found, never what it is.
//!
//! S is computed exactly from the grammar and the token bytes, with no time limits (only
//! llguidance's fixed work limits, which fail loudly), so it depends on nothing but the
//! grammar and the tokens so far: decoding with a grammar is as reproducible as without.
//!
//! [`Tokenizer`]: crate::tokenizer::Tokenizer

mod compiled;
mod spec;
mod vocabulary;

pub use compiled::{Grammar, GrammarState};
pub use spec::GrammarSpec;
pub use vocabulary::GrammarVocabulary;

/// llguidance's errors (anyhow) as [`crate::Error::Grammar`].
fn grammar_error(e: impl std::fmt::Display) -> crate::Error {
    crate::Error::Grammar(e.to_string())
}

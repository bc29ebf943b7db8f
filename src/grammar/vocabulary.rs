//! [`GrammarVocabulary`]: the model's vocabulary as llguidance's token trie, and the parser
//! factory that compiles grammars for it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::ParserFactory;

use super::grammar_error;
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// reprolm's tokenizer as llguidance's tokenizer environment: the trie of every token's exact
/// bytes, and the real tokenizer for the text a grammar forces.
struct TokenizerEnvironment {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for TokenizerEnvironment {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// The tokenizer's own tokens for the longest UTF-8 prefix of `bytes` (special-token text
    /// is plain text here), then the trie's greedy tokens for the rest (part of a character).
    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        let valid = match std::str::from_utf8(bytes) {
            Ok(_) => bytes.len(),
            Err(e) => e.valid_up_to(),
        };
        let text = std::str::from_utf8(&bytes[..valid]).expect("checked: valid UTF-8");
        match self.tokenizer.encode_fragment(text) {
            Ok(mut ids) => {
                ids.extend(self.trie.greedy_tokenize(&bytes[valid..]));
                ids
            }
            Err(_) => self.trie.greedy_tokenize(bytes),
        }
    }
}

/// A model's vocabulary prepared for grammars (see the [module docs](super)): built once per
/// model, shared by every grammar compiled for it.
pub struct GrammarVocabulary {
    factory: ParserFactory,
    vocab_size: usize,
}

impl std::fmt::Debug for GrammarVocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarVocabulary").field("vocab_size", &self.vocab_size).finish()
    }
}

impl GrammarVocabulary {
    /// The trie of `tokenizer`'s tokens: each token's exact bytes
    /// ([`Tokenizer::token_bytes`]), special tokens (control and unknown) marked with
    /// llguidance's 0xFF prefix so that no grammar produces them as text. `eos` is the model's
    /// end-of-sequence token, allowed where a grammar accepts.
    ///
    /// # Errors
    /// [`Error::Grammar`] if the model has no end-of-sequence token (a grammar needs one to
    /// say the text is complete) or the trie cannot be built.
    pub fn new(tokenizer: Arc<Tokenizer>, eos: Option<u32>) -> Result<GrammarVocabulary> {
        let eos = eos.ok_or_else(|| {
            Error::Grammar("the model has no end-of-sequence token, which constrained decoding needs".into())
        })?;
        let vocab_size = tokenizer.vocab_size();
        let words = (0..vocab_size as u32)
            .map(|id| {
                let bytes = tokenizer.token_bytes(id)?;
                Ok(if tokenizer.is_special(id) {
                    [&[TokTrie::SPECIAL_TOKEN_MARKER], bytes].concat()
                } else {
                    bytes.to_vec()
                })
            })
            .collect::<Result<Vec<Vec<u8>>>>()?;
        let info = TokRxInfo::new(vocab_size as u32, eos);
        let factory = catch_unwind(AssertUnwindSafe(|| {
            let env: TokEnv = Arc::new(TokenizerEnvironment { trie: TokTrie::from(&info, &words), tokenizer });
            quiet_factory(&env)
        }))
        .map_err(|_| Error::Grammar("the token trie could not be built from the vocabulary".into()))??;
        Ok(GrammarVocabulary { factory, vocab_size })
    }

    /// A small vocabulary of the 256 single bytes, to check a grammar's syntax before any model
    /// is involved (built once).
    pub(super) fn bytes() -> Result<&'static GrammarVocabulary> {
        static BYTES: OnceLock<GrammarVocabulary> = OnceLock::new();
        if let Some(v) = BYTES.get() {
            return Ok(v);
        }
        let env = ApproximateTokEnv::single_byte_env();
        let vocab_size = env.tok_trie().vocab_size();
        let built = GrammarVocabulary { factory: quiet_factory(&env)?, vocab_size };
        Ok(BYTES.get_or_init(|| built))
    }

    pub(super) fn factory(&self) -> &ParserFactory {
        &self.factory
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

/// A parser factory that writes no logs.
fn quiet_factory(env: &TokEnv) -> Result<ParserFactory> {
    let mut factory = ParserFactory::new_simple(env).map_err(grammar_error)?;
    factory.quiet();
    Ok(factory)
}

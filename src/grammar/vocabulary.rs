//! [`GrammarVocabulary`]: the model's vocabulary as llguidance's token trie, and the parser
//! factory that compiles grammars for it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use llguidance::earley::{BiasComputer, ParserRecognizer, SlicedBiasComputer};
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
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
    ///
    /// llguidance forces these tokens where a grammar forces `bytes`, so they must spell
    /// `bytes`. Both tokenizers skip a byte the vocabulary has no token for (SmolLM2 has none
    /// for 0x14, for one): then the tokens up to it are returned, followed by the
    /// end-of-sequence token, which [`GrammarState::allowed`](super::GrammarState::allowed)
    /// finds invalid when it is the next one forced (and which, being special, llguidance
    /// never re-tokenizes).
    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        let valid = match std::str::from_utf8(bytes) {
            Ok(_) => bytes.len(),
            Err(e) => e.valid_up_to(),
        };
        let text = std::str::from_utf8(&bytes[..valid]).expect("checked: valid UTF-8");
        let ids = match self.tokenizer.encode_fragment(text) {
            Ok(mut ids) => {
                ids.extend(self.trie.greedy_tokenize(&bytes[valid..]));
                ids
            }
            Err(_) => self.trie.greedy_tokenize(bytes),
        };
        let mut spelled = 0;
        let exact = ids
            .iter()
            .take_while(|&&id| {
                let token = self.trie.token(id);
                let fits = !token.is_empty() && bytes[spelled..].starts_with(token);
                spelled += if fits { token.len() } else { 0 };
                fits
            })
            .count();
        if exact == ids.len() && spelled == bytes.len() {
            return ids;
        }
        let mut tokens = ids[..exact].to_vec();
        tokens.push(self.trie.eos_token());
        tokens
    }
}

/// The trie of the tokens of one part of the vocabulary, for the walk that finds which of them
/// S contains.
///
/// A part's parser walks only its part's trie, so the parts of one step's S can be computed on
/// several threads and OR-ed together; each part keeps llguidance's slices (whole groups of
/// tokens added without a walk where a lexeme allows them all). Every set it returns also has
/// the bit `vocab_size` (the spare bit llguidance allocates) set, so that a part with no
/// allowed token does not stop its parser: whether S is empty is decided on the union.
struct PartBias {
    slicer: SlicedBiasComputer,
    spare: TokenId,
}

impl BiasComputer for PartBias {
    fn compute_bias(&self, rec: &mut ParserRecognizer<'_>, start: &[u8]) -> SimpleVob {
        let mut set = self.slicer.compute_bias(rec, start);
        set.allow_token(self.spare);
        set
    }

    fn trie(&self) -> &TokTrie {
        self.slicer.trie()
    }
}

/// A part's trie as a tokenizer environment (llguidance's slicer is built from one).
struct PartEnvironment {
    trie: TokTrie,
}

impl TokenizerEnv for PartEnvironment {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(bytes)
    }
}

/// Consecutive tokens (in byte order) that go to the same part: long enough that the parts'
/// tries share few nodes, short enough that any large region of the vocabulary a grammar
/// allows is spread evenly over the parts.
const PART_BLOCK: usize = 64;

/// A model's vocabulary prepared for grammars (see the [module docs](super)): built once per
/// model, shared by every grammar compiled for it.
pub struct GrammarVocabulary {
    factory: ParserFactory,
    /// With more than one part, S is computed as the union of the parts' sets, in parallel.
    parts: Vec<Arc<dyn BiasComputer>>,
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
    /// S is computed in `parts` parts (at least 1) on as many threads: the tokens, in byte
    /// order, are dealt to the parts in blocks of [`PART_BLOCK`]. S does not depend on it.
    ///
    /// # Errors
    /// [`Error::Grammar`] if the model has no end-of-sequence token (a grammar needs one to
    /// say the text is complete) or the trie cannot be built.
    pub fn new(tokenizer: Arc<Tokenizer>, eos: Option<u32>, parts: usize) -> Result<GrammarVocabulary> {
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
        let (factory, parts) = catch_unwind(AssertUnwindSafe(|| {
            let trie = TokTrie::from(&info, &words);
            let parts = if parts > 1 { part_biases(&trie, &words, parts)? } else { Vec::new() };
            let env: TokEnv = Arc::new(TokenizerEnvironment { trie, tokenizer });
            Ok::<_, Error>((quiet_factory(&env)?, parts))
        }))
        .map_err(|_| Error::Grammar("the token trie could not be built from the vocabulary".into()))??;
        Ok(GrammarVocabulary { factory, parts, vocab_size })
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
        let built = GrammarVocabulary { factory: quiet_factory(&env)?, parts: Vec::new(), vocab_size };
        Ok(BYTES.get_or_init(|| built))
    }

    pub(super) fn factory(&self) -> &ParserFactory {
        &self.factory
    }

    /// The parts' bias computers (none: S in one piece).
    pub(super) fn parts(&self) -> &[Arc<dyn BiasComputer>] {
        &self.parts
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

/// The bias computers of `n_parts` parts of `trie`'s tokens (`words`: their bytes), each with
/// llguidance's general slices. Each part's slicer builds its own filtered tries, so each part
/// costs about as much time and memory as the whole vocabulary's (docs/benchmarks.md,
/// "Constrained decoding").
fn part_biases(trie: &TokTrie, words: &[Vec<u8>], n_parts: usize) -> Result<Vec<Arc<dyn BiasComputer>>> {
    let mut by_bytes: Vec<u32> = (0..words.len() as u32).collect();
    by_bytes.sort_by(|&a, &b| words[a as usize].cmp(&words[b as usize]));
    let mut masks = vec![trie.alloc_token_set(); n_parts];
    for (rank, &id) in by_bytes.iter().enumerate() {
        masks[rank / PART_BLOCK % n_parts].allow_token(id);
    }
    masks
        .iter()
        .map(|mask| {
            let env: TokEnv = Arc::new(PartEnvironment { trie: trie.filter(mask) });
            let slicer = SlicedBiasComputer::new(&env, &SlicedBiasComputer::general_slices()).map_err(grammar_error)?;
            Ok(Arc::new(PartBias { slicer, spare: trie.vocab_size() as TokenId }) as Arc<dyn BiasComputer>)
        })
        .collect()
}

/// A parser factory that writes no logs.
fn quiet_factory(env: &TokEnv) -> Result<ParserFactory> {
    let mut factory = ParserFactory::new_simple(env).map_err(grammar_error)?;
    factory.quiet();
    Ok(factory)
}

//! Text <-> token ids for GGUF models, built from the file's `tokenizer.ggml.*` metadata and
//! matching llama.cpp's tokenization of the same file. Two kinds:
//!
//! - byte-level BPE (`tokenizer.ggml.model = "gpt2"`: Llama 3, Qwen2/3/3.5, GPT-2, SmolLM2), with
//!   the pre-tokenizer `tokenizer.ggml.pre` names, on the `tokenizers` crate ([`bpe`]);
//! - SentencePiece (`"llama"`: Llama 2, Mistral, TinyLlama, Phi-3, Gemma), scores and byte
//!   fallback, reprolm's own implementation of llama.cpp's algorithm ([`spm`]).
//!
//! Encoding runs, in order:
//! 1. special-token extraction ([`vocab`]): control and unknown tokens (GGUF token types 3
//!    and 2) are cut out of the text as single ids only when the caller asks for it
//!    (`special = true`); user-defined tokens (type 4) always are, as in llama.cpp;
//! 2. the kind's algorithm on each run of text in between (SentencePiece first puts a space
//!    before the text and after every special token, if `add_space_prefix`, and writes spaces
//!    as `▁`);
//! 3. BOS / EOS added as `add_bos_token` / `add_eos_token` say (with llama.cpp's defaults).
//!
//! Decoding does not use the `tokenizers` decoders: every token has a precomputed byte string
//! (byte-level alphabet mapped back, `▁` turned into a space, `<0xNN>` into its byte, special
//! tokens as their text), ids are decoded by concatenating those bytes, and only then is the
//! result read as UTF-8. A character split across tokens therefore comes out whole, and
//! [`StreamDecoder`] can hold back an incomplete character while streaming. Decoding keeps the
//! space SentencePiece put before the text (llama.cpp's per-token pieces do the same).

mod bpe;
mod spec;
mod spm;
mod vocab;

pub use spec::TokenizerSpec;

use bpe::{ByteLevelBpe, PreTokenizerKind};
use spm::SentencePiece;
use vocab::{Fragment, Vocab};

use crate::error::{Error, Result};

/// The tokenizer models implemented, for error messages.
const SUPPORTED_MODELS: &str = "'gpt2' (byte-level BPE) and 'llama' (SentencePiece)";

/// The algorithm that runs between special tokens.
enum Algorithm {
    /// Boxed: the `tokenizers` BPE model is large next to the SentencePiece tables.
    ByteLevelBpe { bpe: Box<ByteLevelBpe>, pre: PreTokenizerKind },
    SentencePiece { spm: SentencePiece, add_space_prefix: bool },
}

/// A tokenizer built from GGUF metadata. Immutable after construction, and `Send + Sync`:
/// one instance can serve several threads.
pub struct Tokenizer {
    vocab: Vocab,
    algorithm: Algorithm,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    /// The id [`Tokenizer::encode`] prepends, if the metadata asks for a BOS.
    bos_to_add: Option<u32>,
    /// The id [`Tokenizer::encode`] appends, if the metadata asks for an EOS.
    eos_to_add: Option<u32>,
}

/// Shows the kind, vocabulary size and BOS/EOS settings, not the vocabulary-sized tables.
impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind())
            .field("vocab_size", &self.vocab_size())
            .field("bos_to_add", &self.bos_to_add)
            .field("eos_to_add", &self.eos_to_add)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from GGUF metadata.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a model other than `"gpt2"` / `"llama"` or an unknown
    /// pre-tokenizer (named in the message, with the supported ones); [`Error::Model`] for
    /// inconsistent metadata: no tokens, duplicate token strings, a token-type or score list of
    /// the wrong length, NaN scores, a BOS/EOS id outside the vocabulary, `add_bos`/`add_eos`
    /// without the id, or a merge that is malformed or names a token (or a merged result) that
    /// is not in the vocabulary.
    pub fn from_spec(spec: TokenizerSpec) -> Result<Tokenizer> {
        let TokenizerSpec {
            model,
            pre,
            tokens,
            token_types,
            scores,
            merges,
            bos_id,
            eos_id,
            unk_id,
            add_bos,
            add_eos,
            add_space_prefix,
            model_name,
        } = spec;
        let pre_kind = match model.as_str() {
            "gpt2" => Some(PreTokenizerKind::parse(pre.as_deref())?),
            "llama" => None,
            other => {
                return Err(Error::Unsupported(format!(
                    "tokenizer model '{other}' (supported: {SUPPORTED_MODELS})"
                )))
            }
        };
        let n_tokens = tokens.len();
        // The unknown token only matters to SentencePiece (checked there).
        for (key, id) in [("bos_token_id", bos_id), ("eos_token_id", eos_id)] {
            if let Some(id) = id.filter(|&id| n_tokens > 0 && id as usize >= n_tokens) {
                return Err(Error::Model(format!(
                    "tokenizer.ggml.{key} = {id} is outside the vocabulary of {n_tokens}"
                )));
            }
        }

        let (vocab, algorithm, add_bos_default) = match pre_kind {
            Some(kind) => {
                let vocab = Vocab::new(
                    tokens,
                    token_types,
                    [bos_id, eos_id],
                    model_name.as_deref(),
                    &bpe::byte_level_decode,
                    false,
                )?;
                let bpe = ByteLevelBpe::new(&vocab, kind, &merges)?;
                (vocab, Algorithm::ByteLevelBpe { bpe: Box::new(bpe), pre: kind }, kind.adds_bos_by_default())
            }
            None => {
                let vocab = Vocab::new(
                    tokens,
                    token_types,
                    [bos_id, eos_id],
                    model_name.as_deref(),
                    &spm::unescape_spaces,
                    true,
                )?;
                let spm = SentencePiece::new(&vocab, scores, unk_id)?;
                let add_space_prefix = add_space_prefix.unwrap_or(true);
                (vocab, Algorithm::SentencePiece { spm, add_space_prefix }, true)
            }
        };

        let added = |key: &str, add: bool, id: Option<u32>| match (add, id) {
            (true, None) => Err(Error::Model(format!("tokenizer.ggml.add_{key}_token is set but there is no {key}_token_id"))),
            (true, id) => Ok(id),
            (false, _) => Ok(None),
        };
        let bos_to_add = match add_bos {
            // A default the file does not state is dropped when the id is missing.
            None if bos_id.is_none() => None,
            add => added("bos", add.unwrap_or(add_bos_default), bos_id)?,
        };
        let eos_to_add = added("eos", add_eos.unwrap_or(false), eos_id)?;
        Ok(Tokenizer { vocab, algorithm, bos_id, eos_id, bos_to_add, eos_to_add })
    }

    /// Number of tokens in the vocabulary; valid ids are `0..vocab_size()`.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// What kind of tokenizer this is: `"sentencepiece"`, or `"bpe:"` and the pre-tokenizer
    /// (`"bpe:llama-bpe"`, `"bpe:qwen2"`, `"bpe:qwen35"`, `"bpe:gpt-2"`, `"bpe:smollm"`).
    pub fn kind(&self) -> String {
        match &self.algorithm {
            Algorithm::ByteLevelBpe { pre, .. } => format!("bpe:{}", pre.name()),
            Algorithm::SentencePiece { .. } => "sentencepiece".into(),
        }
    }

    /// `tokenizer.ggml.bos_token_id`.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// `tokenizer.ggml.eos_token_id`.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Token ids of `text`, preceded by the BOS id and followed by the EOS id if the metadata
    /// asks for them (`add_bos_token`, `add_eos_token`, or llama.cpp's default for the kind).
    ///
    /// With `special = true`, the text of a control or unknown token (such as `<|im_start|>`)
    /// becomes that token's id; with `special = false` it is tokenized as ordinary text (use this
    /// for untrusted input). User-defined tokens are matched either way.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] if the `tokenizers` pipeline fails (not expected for any input), or
    /// a SentencePiece vocabulary has neither a byte token nor an unknown token for some byte.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        self.encode_with(text, special, true)
    }

    /// As [`encode`](Self::encode), but the BOS/EOS ids are added only if `add_special` (and
    /// the metadata asks for them): llama.cpp's `tokenize(text, add_special, parse_special)`.
    ///
    /// # Errors
    /// As [`encode`](Self::encode).
    pub fn encode_with(&self, text: &str, special: bool, add_special: bool) -> Result<Vec<u32>> {
        self.encode_parts(text, special, add_special, true)
    }

    /// Tokens whose bytes are exactly `text`'s: no BOS/EOS, no SentencePiece space prefix,
    /// special-token text as plain text (a piece of a longer text, such as one a grammar
    /// forces).
    ///
    /// # Errors
    /// As [`encode`](Self::encode).
    pub fn encode_fragment(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_parts(text, false, false, false)
    }

    fn encode_parts(&self, text: &str, special: bool, add_special: bool, space_prefix: bool) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if add_special {
            ids.extend(self.bos_to_add);
        }
        let fragments = self.vocab.partition(text, special);
        match &self.algorithm {
            Algorithm::ByteLevelBpe { bpe, .. } => {
                for fragment in fragments {
                    match fragment {
                        Fragment::Text(range) => bpe.encode(&text[range], &mut ids)?,
                        Fragment::Token(id) => ids.push(id),
                    }
                }
            }
            Algorithm::SentencePiece { spm, add_space_prefix } => {
                let mut after_special = true;
                let mut run = String::new();
                for fragment in fragments {
                    match fragment {
                        Fragment::Text(range) => {
                            run.clear();
                            if space_prefix && *add_space_prefix && after_special {
                                run.push(spm::SPACE_MARKER);
                            }
                            run.extend(text[range].chars().map(|c| if c == ' ' { spm::SPACE_MARKER } else { c }));
                            spm.encode(&self.vocab, &run, &mut ids)?;
                            after_special = false;
                        }
                        Fragment::Token(id) => {
                            ids.push(id);
                            after_special = true;
                        }
                    }
                }
            }
        }
        if add_special {
            ids.extend(self.eos_to_add);
        }
        Ok(ids)
    }

    /// The text of `ids`: the raw bytes of all tokens concatenated, then read as UTF-8 (invalid
    /// sequences, such as half a character at the end, become U+FFFD). Special tokens are
    /// rendered as their text.
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] for an id `>= vocab_size()`.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id)?);
        }
        Ok(String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    /// The raw bytes of one token (llama.cpp's piece with special tokens rendered): for
    /// byte-level BPE tokens the alphabet mapped back, for SentencePiece tokens the text with
    /// `▁` as a space or the byte of a `<0xNN>` token (so possibly part of a UTF-8 character),
    /// for special and user-defined tokens their text, and nothing for unused tokens.
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] for an id `>= vocab_size()`.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8]> {
        self.vocab.token_bytes(id)
    }

    /// Whether `id` is a special (control or unknown) token, such as `<|im_end|>`. False for
    /// ids outside the vocabulary.
    pub fn is_special(&self, id: u32) -> bool {
        self.vocab.types.get(id as usize).is_some_and(|t| t.is_special())
    }
}

/// Incremental detokenizer for streaming: push ids one at a time and get back only complete
/// UTF-8 text, holding back the bytes of a character whose remaining bytes are still to come.
///
/// The concatenation of every [`push`](Self::push) output and the final
/// [`finish`](Self::finish) equals [`Tokenizer::decode`] of all the ids, invalid bytes included.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    /// Bytes received but not yet returned: the start of an incomplete UTF-8 character.
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// An empty decoder.
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Adds token `id` and returns the text that is now complete (possibly empty). Bytes that
    /// can never become valid UTF-8 are returned as U+FFFD right away.
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] for an id `>= vocab_size()`; the decoder is then unchanged.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String> {
        self.pending.extend_from_slice(tokenizer.token_bytes(id)?);
        let mut text = String::new();
        let mut rest: &[u8] = &self.pending;
        while !rest.is_empty() {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    text.push_str(valid);
                    rest = &[];
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    text.push_str(std::str::from_utf8(valid).expect("valid_up_to marks UTF-8"));
                    match e.error_len() {
                        Some(invalid) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[invalid..];
                        }
                        None => {
                            // An incomplete character at the end: keep it for the next push.
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let consumed = self.pending.len() - rest.len();
        self.pending.drain(..consumed);
        Ok(text)
    }

    /// Returns whatever is still held back (an incomplete character, as U+FFFD) and empties the
    /// decoder, which can then be reused.
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

